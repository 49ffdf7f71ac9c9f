package blueprint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// The fields each part of a blueprint may have, as written.
var (
	blueprintFields = []string{"name", "description", "steps", "fallback"}
	stepFields      = []string{"tool", "input_mapping", "condition", "output_key", "default_value", "timeout", "retry", "parallel", "fallback"}
	fallbackFields  = []string{"message", "transfer_to", "step"}
)

// maxDepth bounds how deeply a blueprint nests, its mappings' values and default values
// included.
const maxDepth = 64

// Load parses data (Parse) and compiles it (Compile) with tools: the blueprint ready to run,
// or the first error either finds.
func Load(data []byte, tools func(name string) bool) (*Blueprint, error) {
	b, err := Parse(data)
	if err != nil {
		return nil, err
	}
	if err := b.Compile(tools); err != nil {
		return nil, err
	}
	return b, nil
}

// Parse reads a blueprint, JSON or YAML (one document, no anchors or aliases, no duplicate
// keys, no unknown fields), of at most MaxBytes. It reads the shape only: what each field
// holds and what it is written as. Compile checks the rest. Errors are *Error with the line.
func Parse(data []byte) (*Blueprint, error) {
	if len(data) > MaxBytes {
		return nil, &Error{Reason: fmt.Sprintf("%d bytes; a blueprint has at most %d", len(data), MaxBytes)}
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
		return nil, &Error{Line: 1, Reason: "the document is empty"}
	} else if err != nil {
		return nil, &Error{Reason: "not YAML or JSON: " + protocol.Shorten(strings.TrimPrefix(err.Error(), "yaml: "), 512)}
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return nil, &Error{Line: more.Line, Reason: "more than one document; a blueprint is one mapping"}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, &Error{Line: 1, Reason: "the document is empty"}
	}
	root := doc.Content[0]
	if err := noAliases(root, 0); err != nil {
		return nil, err
	}
	return readBlueprint(root)
}

func readBlueprint(n *yaml.Node) (*Blueprint, error) {
	b := &Blueprint{lines: map[string]int{"": n.Line}}
	err := eachField(n, "", "", "a blueprint", blueprintFields, func(key string, v *yaml.Node) error {
		b.lines[key] = v.Line
		var err error
		switch key {
		case "name":
			b.Name, err = str(v, "", key)
		case "description":
			b.Description, err = str(v, "", key)
		case "steps":
			b.Steps, err = readSteps(v, "steps", key)
		case "fallback":
			b.Fallback, err = readFallback(v, "", key, b.lines)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

func readSteps(v *yaml.Node, place, field string) ([]Step, error) {
	if v.Kind != yaml.SequenceNode {
		return nil, &Error{Field: field, Line: v.Line, Reason: "must be a list of steps"}
	}
	steps := make([]Step, 0, len(v.Content))
	for i, e := range v.Content {
		s, err := readStep(e, fmt.Sprintf("%s[%d]", place, i))
		if err != nil {
			return nil, err
		}
		steps = append(steps, *s)
	}
	return steps, nil
}

func readStep(n *yaml.Node, place string) (*Step, error) {
	s := &Step{line: n.Line, lines: map[string]int{}}
	err := eachField(n, place, "", "a step", stepFields, func(key string, v *yaml.Node) error {
		s.lines[key] = v.Line
		var err error
		switch key {
		case "tool":
			s.Tool, err = str(v, place, key)
		case "condition":
			s.Condition, err = str(v, place, key)
		case "output_key":
			s.OutputKey, err = str(v, place, key)
		case "timeout":
			s.Timeout, err = str(v, place, key)
		case "input_mapping":
			if v.Kind != yaml.MappingNode {
				return &Error{Step: place, Field: key, Line: v.Line, Reason: "must be a mapping of argument names to paths or values"}
			}
			m, err := value(v, place, key)
			if err != nil {
				return err
			}
			s.InputMapping = m.(map[string]any)
			for i := 0; i+1 < len(v.Content); i += 2 {
				s.lines[key+"."+v.Content[i].Value] = v.Content[i+1].Line
			}
		case "default_value":
			d, err := value(v, place, key)
			if err != nil {
				return err
			}
			raw, err := json.Marshal(d)
			if err != nil {
				return &Error{Step: place, Field: key, Line: v.Line, Reason: "is not JSON: " + err.Error()}
			}
			s.DefaultValue = raw
		case "retry":
			s.Retry, err = readRetry(v, place, key)
		case "parallel":
			s.Parallel, err = readSteps(v, place+".parallel", key)
		case "fallback":
			s.Fallback, err = readFallback(v, place, key, s.lines)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

func readRetry(n *yaml.Node, place, field string) (*Retry, error) {
	r := &Retry{}
	seen := false
	err := eachField(n, place, field, "a retry", []string{"max_attempts"}, func(key string, v *yaml.Node) error {
		if v.Kind != yaml.ScalarNode || v.Tag != "!!int" {
			return &Error{Step: place, Field: field + "." + key, Line: v.Line, Reason: fmt.Sprintf("must be a whole number from 1 to %d", MaxAttempts)}
		}
		if err := v.Decode(&r.MaxAttempts); err != nil {
			return &Error{Step: place, Field: field + "." + key, Line: v.Line, Reason: fmt.Sprintf("must be a whole number from 1 to %d", MaxAttempts)}
		}
		seen = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !seen {
		return nil, &Error{Step: place, Field: field + ".max_attempts", Line: n.Line, Reason: "is required"}
	}
	return r, nil
}

// readFallback reads the fallback in field of place, keeping its fields' lines in lines.
func readFallback(n *yaml.Node, place, field string, lines map[string]int) (*Fallback, error) {
	f := &Fallback{}
	stepPlace := field + ".step"
	if place != "" {
		stepPlace = place + "." + stepPlace
	}
	err := eachField(n, place, field, "a fallback", fallbackFields, func(key string, v *yaml.Node) error {
		lines[field+"."+key] = v.Line
		var err error
		switch key {
		case "message":
			f.Message, err = str(v, place, field+"."+key)
		case "transfer_to":
			f.TransferTo, err = str(v, place, field+"."+key)
		case "step":
			f.Step, err = readStep(v, stepPlace)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return f, nil
}

// eachField calls f for each key of mapping n (the part what, in field of place), in order,
// refusing a key that is not a string, a duplicate and a key not among known.
func eachField(n *yaml.Node, place, field, what string, known []string, f func(key string, v *yaml.Node) error) error {
	if n.Kind != yaml.MappingNode {
		return &Error{Step: place, Field: field, Line: n.Line, Reason: what + " is a mapping of " + strings.Join(known, ", ")}
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name := join(field, protocol.Shorten(k.Value, 64))
		switch {
		case k.Kind != yaml.ScalarNode || k.Tag != "!!str":
			return &Error{Step: place, Field: field, Line: k.Line, Reason: "a key is a string"}
		case seen[k.Value]:
			return &Error{Step: place, Field: name, Line: k.Line, Reason: "duplicate key"}
		case !slices.Contains(known, k.Value):
			return &Error{Step: place, Field: name, Line: k.Line, Reason: "unknown field; " + what + " has " + strings.Join(known, ", ")}
		}
		seen[k.Value] = true
		if err := f(k.Value, v); err != nil {
			return err
		}
	}
	return nil
}

// str reads a string.
func str(v *yaml.Node, place, field string) (string, error) {
	if v.Kind != yaml.ScalarNode || v.Tag != "!!str" {
		return "", &Error{Step: place, Field: field, Line: v.Line, Reason: "must be a string"}
	}
	return v.Value, nil
}

// jsonNumber matches the numbers JSON writes.
var jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?$`)

// value reads any JSON value: strings, numbers (as json.Number, as written when JSON writes
// them so), true, false, null, mappings with string keys and sequences.
func value(v *yaml.Node, place, field string) (any, error) {
	bad := func(reason string) error { return &Error{Step: place, Field: field, Line: v.Line, Reason: reason} }
	switch v.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(v.Content)/2)
		for i := 0; i+1 < len(v.Content); i += 2 {
			k, e := v.Content[i], v.Content[i+1]
			if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
				return nil, &Error{Step: place, Field: field, Line: k.Line, Reason: "a key is a string"}
			}
			name := field + "." + protocol.Shorten(k.Value, 64)
			if _, dup := m[k.Value]; dup {
				return nil, &Error{Step: place, Field: name, Line: k.Line, Reason: "duplicate key"}
			}
			x, err := value(e, place, name)
			if err != nil {
				return nil, err
			}
			m[k.Value] = x
		}
		return m, nil
	case yaml.SequenceNode:
		list := make([]any, 0, len(v.Content))
		for i, e := range v.Content {
			x, err := value(e, place, fmt.Sprintf("%s[%d]", field, i))
			if err != nil {
				return nil, err
			}
			list = append(list, x)
		}
		return list, nil
	case yaml.ScalarNode:
		tag := v.Tag
		if tag == "!!str" && v.Style == 0 && jsonNumber.MatchString(v.Value) {
			// A JSON number out of float64's range, which YAML reads as a string.
			tag = "!!float"
		}
		switch tag {
		case "!!str", "!!timestamp":
			return v.Value, nil
		case "!!null":
			return nil, nil
		case "!!bool":
			var b bool
			if err := v.Decode(&b); err != nil {
				return nil, bad("is no boolean")
			}
			return b, nil
		case "!!int", "!!float":
			if jsonNumber.MatchString(v.Value) {
				if _, err := strconv.ParseFloat(v.Value, 64); err != nil {
					return nil, bad(fmt.Sprintf("%s is beyond the numbers JSON readers hold (float64)", protocol.Shorten(v.Value, 32)))
				}
				return json.Number(v.Value), nil
			}
			var f float64
			if err := v.Decode(&f); err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
				return nil, bad(fmt.Sprintf("%q is no JSON number", protocol.Shorten(v.Value, 32)))
			}
			b, _ := json.Marshal(f)
			return json.Number(b), nil
		}
		return nil, bad(fmt.Sprintf("a value tagged %s is not JSON", protocol.Shorten(v.Tag, 32)))
	}
	return nil, bad("is not a JSON value")
}

// noAliases refuses anchors, aliases and documents nested deeper than maxDepth.
func noAliases(n *yaml.Node, depth int) error {
	if depth > maxDepth {
		return &Error{Line: n.Line, Reason: fmt.Sprintf("nested more than %d deep", maxDepth)}
	}
	if n.Kind == yaml.AliasNode || n.Anchor != "" {
		return &Error{Line: n.Line, Reason: "anchors and aliases are not read in blueprints; write each value out"}
	}
	for _, c := range n.Content {
		if err := noAliases(c, depth+1); err != nil {
			return err
		}
	}
	return nil
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}
