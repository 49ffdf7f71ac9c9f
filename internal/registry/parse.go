package registry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/hermesbus/hermes/internal/routes"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// fields are the keys a contract document may have.
var fields = []string{"kind", "name", "description", "input_schema", "output_schema", "execution_policy", "effects", "reach", "sandbox", "recipients", "policy", "resource_key", "changes", "precedence", "on_conflict"}

// Kind is what a document's optional kind field says of a contract (hermes apply reads files
// of several kinds).
const Kind = "contract"

// Limits of a contract's schemas as written.
const (
	maxDepth = 32
	maxNodes = 20_000
	// maxExpandedBytes bounds a schema as JSON, its aliases expanded.
	maxExpandedBytes = contract.MaxSourceBytes
)

// Parse reads one contract, YAML or JSON (JSON is YAML), and compiles it: what it returns is
// ready to register. Errors are *contract.Error with the line and field of the problem.
func Parse(data []byte) (*contract.Contract, error) {
	all, err := ParseAll(data)
	if err != nil {
		return nil, err
	}
	switch len(all) {
	case 0:
		return nil, &contract.Error{Line: 1, Reason: "no contract: the document is empty"}
	case 1:
		return all[0], nil
	}
	return nil, &contract.Error{Reason: fmt.Sprintf("%d contracts in one document; register them one by one, or with hermes apply", len(all))}
}

// ParseAll reads every contract of a YAML stream ("---" between documents), each compiled.
func ParseAll(data []byte) ([]*contract.Contract, error) {
	if len(data) > contract.MaxSourceBytes {
		return nil, &contract.Error{Reason: fmt.Sprintf("%d bytes; a contract has at most %d", len(data), contract.MaxSourceBytes)}
	}
	docs, err := routes.Documents("", data)
	if err != nil {
		return nil, fromRoutes(err)
	}
	var out []*contract.Contract
	for _, doc := range docs {
		c, err := decode(doc)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// Document is one YAML document of a file: its root node and its text (the file's own when it
// holds one document; written again from the node, comments kept, when it holds several).
type Document struct {
	Node   *yaml.Node
	Source []byte
}

// Split reads data as YAML documents ("---" between them), checked as Parse checks them.
func Split(data []byte) ([]Document, error) {
	if len(data) > contract.MaxSourceBytes {
		return nil, &contract.Error{Reason: fmt.Sprintf("%d bytes; a contract file has at most %d", len(data), contract.MaxSourceBytes)}
	}
	nodes, err := routes.Documents("", data)
	if err != nil {
		return nil, fromRoutes(err)
	}
	out := make([]Document, len(nodes))
	for i, n := range nodes {
		out[i].Node, out[i].Source = n, data
		if len(nodes) > 1 {
			if out[i].Source, err = yaml.Marshal(n); err != nil {
				return nil, &contract.Error{Line: n.Line, Reason: "cannot be written again as YAML: " + err.Error()}
			}
		}
	}
	return out, nil
}

// KindOf says what a document is: its kind field, or "contract" for a mapping without one
// that names any of a contract's own fields (input_schema, output_schema, execution_policy,
// effects, reach); "" when it cannot tell.
func KindOf(doc *yaml.Node) string {
	if doc == nil || doc.Kind != yaml.MappingNode {
		return ""
	}
	has := map[string]string{}
	for i := 0; i+1 < len(doc.Content); i += 2 {
		has[doc.Content[i].Value] = doc.Content[i+1].Value
	}
	if kind, ok := has["kind"]; ok {
		return kind
	}
	for _, f := range []string{"input_schema", "output_schema", "execution_policy", "effects", "reach"} {
		if _, ok := has[f]; ok {
			return Kind
		}
	}
	return ""
}

// ParseDocument reads one document of Split as a contract, compiled.
func ParseDocument(d Document) (*contract.Contract, error) { return decode(d.Node) }

// decode reads one document's contract and compiles it, reporting errors with their lines.
func decode(doc *yaml.Node) (*contract.Contract, error) {
	if doc.Kind != yaml.MappingNode {
		return nil, &contract.Error{Line: doc.Line, Reason: "a contract is a mapping of name, description, input_schema, output_schema, execution_policy, effects, reach, sandbox, recipients, policy, resource_key, changes, precedence and on_conflict"}
	}
	lines := map[string]int{}
	c := &contract.Contract{}
	byKey := map[string]*yaml.Node{}
	keys := map[string]*yaml.Node{}
	for i := 0; i+1 < len(doc.Content); i += 2 {
		k, v := doc.Content[i], doc.Content[i+1]
		if k.Kind != yaml.ScalarNode || !slices.Contains(fields, k.Value) {
			return nil, &contract.Error{Line: k.Line, Field: protocol.Shorten(k.Value, 64), Reason: "unknown field; a contract has " + strings.Join(fields[1:], ", ")}
		}
		if _, dup := byKey[k.Value]; dup {
			return nil, &contract.Error{Line: k.Line, Field: k.Value, Reason: fmt.Sprintf("duplicate key (first at line %d)", keys[k.Value].Line)}
		}
		byKey[k.Value], keys[k.Value] = v, k
		lines[k.Value] = k.Line
	}
	str := func(key string, required bool) (string, error) {
		n, ok := byKey[key]
		if !ok || n.Tag == "!!null" {
			if required {
				return "", &contract.Error{Line: doc.Line, Field: key, Reason: "is required"}
			}
			return "", nil
		}
		if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
			return "", &contract.Error{Line: n.Line, Field: key, Reason: "must be a string"}
		}
		return n.Value, nil
	}
	var err error
	if kind, err := str("kind", false); err != nil {
		return nil, err
	} else if kind != "" && kind != Kind {
		return nil, &contract.Error{Line: byKey["kind"].Line, Field: "kind", Reason: fmt.Sprintf("is %q; this is read as a contract", protocol.Shorten(kind, 32))}
	}
	if c.Name, err = str("name", true); err != nil {
		return nil, err
	}
	if c.Description, err = str("description", false); err != nil {
		return nil, err
	}
	var effects string
	if effects, err = str("effects", false); err != nil {
		return nil, err
	}
	c.Effects = contract.Effects(effects)
	for _, s := range []struct {
		key string
		dst *json.RawMessage
	}{{"input_schema", &c.InputSchema}, {"output_schema", &c.OutputSchema}} {
		n, ok := byKey[s.key]
		if !ok || n.Tag == "!!null" {
			continue
		}
		var b bytes.Buffer
		count := 0
		if err := writeJSON(&b, n, s.key, lines, 0, &count); err != nil {
			return nil, err
		}
		*s.dst = b.Bytes()
	}
	if n, ok := byKey["execution_policy"]; ok && n.Tag != "!!null" {
		if c.ExecutionPolicy, err = decodePolicy(n, lines); err != nil {
			return nil, err
		}
	}
	if n, ok := byKey["recipients"]; ok && n.Tag != "!!null" {
		if c.Recipients, err = names(n, "recipients", "must be a list of the arguments that name recipients, such as [user_ids]"); err != nil {
			return nil, err
		}
	}
	if c.ResourceKey, err = str("resource_key", false); err != nil {
		return nil, err
	}
	if c.OnConflict, err = str("on_conflict", false); err != nil {
		return nil, err
	}
	if n, ok := byKey["changes"]; ok && n.Tag != "!!null" {
		if c.Changes, err = names(n, "changes", "must be a list of the fields the tool changes, such as [shipping_address]"); err != nil {
			return nil, err
		}
	}
	if n, ok := byKey["precedence"]; ok && n.Tag != "!!null" {
		if c.Precedence, err = decodePrecedence(n); err != nil {
			return nil, err
		}
	}
	if n, ok := byKey["policy"]; ok && n.Tag != "!!null" {
		p, err := policy.FromNode(n, "policy")
		var pe *policy.Error
		if errors.As(err, &pe) {
			return nil, &contract.Error{Line: pe.Line, Field: pe.Field, Reason: pe.Reason}
		}
		if err != nil {
			return nil, err
		}
		c.Policy = p
	}
	if n, ok := byKey["reach"]; ok && n.Tag != "!!null" {
		a, err := routes.ParseAction("", keys["reach"], n, "reach")
		if err != nil {
			return nil, fromRoutes(err)
		}
		c.Reach = &a
	}
	if n, ok := byKey["sandbox"]; ok && n.Tag != "!!null" {
		a, err := routes.ParseAction("", keys["sandbox"], n, "sandbox")
		if err != nil {
			return nil, fromRoutes(err)
		}
		c.Sandbox = &a
	}
	if _, err := contract.Compile(c, 0, 0); err != nil {
		var e *contract.Error
		if errors.As(err, &e) && e.Line == 0 {
			e.Line = lineOf(lines, e.Field)
		}
		return nil, err
	}
	return c, nil
}

// names reads a list of names at field.
func names(n *yaml.Node, field, reason string) ([]string, error) {
	if n.Kind != yaml.SequenceNode {
		return nil, &contract.Error{Line: n.Line, Field: field, Reason: reason}
	}
	out := make([]string, 0, len(n.Content))
	for _, e := range n.Content {
		if e.Kind != yaml.ScalarNode || e.Tag != "!!str" {
			return nil, &contract.Error{Line: e.Line, Field: field, Reason: reason}
		}
		out = append(out, e.Value)
	}
	return out, nil
}

// decodePrecedence reads precedence: {before: [tools], after: [tools]}.
func decodePrecedence(n *yaml.Node) (*contract.Precedence, error) {
	const shape = "is a mapping of before and after, each a list of tools: {before: [refund_apply]}"
	if n.Kind != yaml.MappingNode {
		return nil, &contract.Error{Line: n.Line, Field: "precedence", Reason: shape}
	}
	p := &contract.Precedence{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		var dst *[]string
		switch k.Value {
		case "before":
			dst = &p.Before
		case "after":
			dst = &p.After
		default:
			return nil, &contract.Error{Line: k.Line, Field: "precedence." + protocol.Shorten(k.Value, 32), Reason: "unknown field; precedence " + shape}
		}
		list, err := names(v, "precedence."+k.Value, "must be a list of tools")
		if err != nil {
			return nil, err
		}
		*dst = append(*dst, list...)
	}
	return p, nil
}

// decodePolicy reads execution_policy: timeout_ms, max_retries, resource_level.
func decodePolicy(n *yaml.Node, lines map[string]int) (*contract.Policy, error) {
	if n.Kind != yaml.MappingNode {
		return nil, &contract.Error{Line: n.Line, Field: "execution_policy", Reason: "must be a mapping of timeout_ms, max_retries, resource_level and max_in_flight"}
	}
	p := &contract.Policy{}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		field := "execution_policy." + protocol.Shorten(k.Value, 64)
		lines[field] = k.Line
		if seen[k.Value] {
			return nil, &contract.Error{Line: k.Line, Field: field, Reason: "duplicate key"}
		}
		seen[k.Value] = true
		integer := func() (int, error) {
			i, err := strconv.Atoi(v.Value)
			if v.Kind != yaml.ScalarNode || v.Tag != "!!int" || err != nil {
				return 0, &contract.Error{Line: v.Line, Field: field, Reason: "must be an integer"}
			}
			return i, nil
		}
		switch k.Value {
		case "timeout_ms":
			t, err := integer()
			if err != nil {
				return nil, err
			}
			if t <= 0 {
				return nil, &contract.Error{Line: v.Line, Field: field, Reason: "must be positive"}
			}
			p.TimeoutMS = t
		case "max_retries":
			r, err := integer()
			if err != nil {
				return nil, err
			}
			p.MaxRetries = &r
		case "max_in_flight":
			n, err := integer()
			if err != nil {
				return nil, err
			}
			if n <= 0 {
				return nil, &contract.Error{Line: v.Line, Field: field, Reason: "must be positive"}
			}
			p.MaxInFlight = n
		case "resource_level":
			if v.Kind != yaml.ScalarNode || v.Tag != "!!str" {
				return nil, &contract.Error{Line: v.Line, Field: field, Reason: "must be L, M or H"}
			}
			p.ResourceLevel = v.Value
		default:
			return nil, &contract.Error{Line: k.Line, Field: field, Reason: "unknown field; execution_policy has timeout_ms, max_retries, resource_level and max_in_flight"}
		}
	}
	return p, nil
}

// writeJSON writes n as JSON, keys in the order written, recording the line of every field
// path. It refuses what JSON cannot say (non-string keys, infinities), repeated keys, merge
// keys, and documents deeper or larger than a contract needs (an alias counts each time it
// is used, so no alias bomb gets through).
func writeJSON(b *bytes.Buffer, n *yaml.Node, path string, lines map[string]int, depth int, count *int) error {
	*count++
	if b.Len() > maxExpandedBytes {
		return &contract.Error{Line: n.Line, Field: path, Reason: fmt.Sprintf("expands to more than %d bytes (aliases repeat what they name)", maxExpandedBytes)}
	}
	if *count > maxNodes {
		return &contract.Error{Line: n.Line, Field: path, Reason: fmt.Sprintf("more than %d values in one contract", maxNodes)}
	}
	if depth > maxDepth {
		return &contract.Error{Line: n.Line, Field: path, Reason: fmt.Sprintf("nested more than %d deep", maxDepth)}
	}
	if _, ok := lines[path]; !ok {
		lines[path] = n.Line
	}
	switch n.Kind {
	case yaml.AliasNode:
		if n.Alias == nil {
			return &contract.Error{Line: n.Line, Field: path, Reason: "unknown alias"}
		}
		return writeJSON(b, n.Alias, path, lines, depth+1, count)
	case yaml.MappingNode:
		b.WriteByte('{')
		seen := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode || k.Tag == "!!null" || k.Tag == "!!merge" {
				return &contract.Error{Line: k.Line, Field: path, Reason: "keys must be strings (merge keys are not supported)"}
			}
			field := path + "." + k.Value
			if first, dup := seen[k.Value]; dup {
				return &contract.Error{Line: k.Line, Field: field, Reason: fmt.Sprintf("duplicate key (first at line %d)", first)}
			}
			seen[k.Value] = k.Line
			lines[field] = k.Line
			if i > 0 {
				b.WriteByte(',')
			}
			key, _ := json.Marshal(k.Value)
			b.Write(key)
			b.WriteByte(':')
			if err := writeJSON(b, v, field, lines, depth+1, count); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case yaml.SequenceNode:
		b.WriteByte('[')
		for i, v := range n.Content {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeJSON(b, v, path+"["+strconv.Itoa(i)+"]", lines, depth+1, count); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			b.WriteString("null")
		case "!!bool":
			var v bool
			if err := n.Decode(&v); err != nil {
				return &contract.Error{Line: n.Line, Field: path, Reason: "not a boolean"}
			}
			b.WriteString(strconv.FormatBool(v))
		case "!!int":
			var v int64
			if err := n.Decode(&v); err != nil {
				return &contract.Error{Line: n.Line, Field: path, Reason: "an integer out of range"}
			}
			b.WriteString(strconv.FormatInt(v, 10))
		case "!!float":
			var v float64
			if err := n.Decode(&v); err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
				return &contract.Error{Line: n.Line, Field: path, Reason: "not a number JSON can hold"}
			}
			b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
		default: // strings, and what YAML would read as a date: JSON has strings only
			s, _ := json.Marshal(n.Value)
			b.Write(s)
		}
	default:
		return &contract.Error{Line: n.Line, Field: path, Reason: "not a value"}
	}
	return nil
}

// lineOf returns the line of field, or of the nearest field above it that has one.
func lineOf(lines map[string]int, field string) int {
	for field != "" {
		if l, ok := lines[field]; ok {
			return l
		}
		i := strings.LastIndexAny(field, ".[")
		if i < 0 {
			break
		}
		field = field[:i]
	}
	return 0
}

// fromRoutes turns a routes.LoadError (what the YAML reader and the action decoder give) into
// a *contract.Error.
func fromRoutes(err error) error {
	var le *routes.LoadError
	if errors.As(err, &le) {
		return &contract.Error{Line: le.Line, Field: le.Field, Reason: le.Reason}
	}
	return &contract.Error{Reason: err.Error()}
}
