package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Limits of a policy file.
const (
	// MaxFileBytes bounds a policy file.
	MaxFileBytes = 256 << 10
	// MaxPolicies bounds the tools one file sets policies for.
	MaxPolicies = 1000
)

// Fields lists the keys a policy may have, as written.
var Fields = []string{"allowed_roles", "rate_limit", "scope", "on_limit", "max_wait", "max_recipients", "confirm_required", "approvers", "expires_in"}

// File is a policy file: policies by tool, in the order written.
type File struct {
	Tools    []string
	Policies map[string]*Policy
}

// ParseFile reads a policy file, YAML or JSON: a mapping with one key, policies, which maps
// tool names to policies (seed-examples/tool-policies.yaml). Every policy is checked (Check);
// errors are *Error with the line and field of the problem.
func ParseFile(data []byte) (*File, error) {
	if len(data) > MaxFileBytes {
		return nil, &Error{Reason: fmt.Sprintf("%d bytes; a policy file has at most %d", len(data), MaxFileBytes)}
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
		return nil, &Error{Line: 1, Reason: "no policies: the document is empty"}
	} else if err != nil {
		return nil, &Error{Reason: "not YAML or JSON: " + yamlReason(err)}
	}
	var more yaml.Node
	if err := dec.Decode(&more); err == nil {
		return nil, &Error{Line: more.Line, Reason: "more than one document; a policy file is one mapping of policies"}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, &Error{Line: 1, Reason: "no policies: the document is empty"}
	}
	root := doc.Content[0]
	if err := noAliases(root, 0); err != nil {
		return nil, err
	}
	if root.Kind != yaml.MappingNode {
		return nil, &Error{Line: root.Line, Reason: "a policy file is a mapping with one key, policies"}
	}
	var body *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Value != "policies" {
			return nil, &Error{Line: k.Line, Field: protocol.Shorten(k.Value, 64), Reason: "unknown field; a policy file has policies"}
		}
		if body != nil {
			return nil, &Error{Line: k.Line, Field: "policies", Reason: "duplicate key"}
		}
		body = v
	}
	if body == nil {
		return nil, &Error{Line: root.Line, Field: "policies", Reason: "is required"}
	}
	if body.Kind != yaml.MappingNode {
		return nil, &Error{Line: body.Line, Field: "policies", Reason: "must map tool names to their policies"}
	}
	f := &File{Policies: map[string]*Policy{}}
	for i := 0; i+1 < len(body.Content); i += 2 {
		k, v := body.Content[i], body.Content[i+1]
		tool := k.Value
		field := "policies." + protocol.Shorten(tool, 64)
		if err := protocol.CheckToolName("tool", tool); err != nil {
			return nil, &Error{Line: k.Line, Field: field, Reason: "is no tool name: " + err.Error()}
		}
		if _, dup := f.Policies[tool]; dup {
			return nil, &Error{Line: k.Line, Field: field, Reason: "duplicate key"}
		}
		if len(f.Tools) == MaxPolicies {
			return nil, &Error{Line: k.Line, Field: field, Reason: fmt.Sprintf("more than %d policies in one file", MaxPolicies)}
		}
		p, err := FromNode(v, field)
		if err != nil {
			return nil, err
		}
		f.Tools = append(f.Tools, tool)
		f.Policies[tool] = p
	}
	return f, nil
}

// FromNode reads one policy from its YAML node (field names it in errors: "policy" in a
// contract, "policies.<tool>" in a file) and checks it.
func FromNode(n *yaml.Node, field string) (*Policy, error) {
	if err := noAliases(n, 0); err != nil {
		return nil, err
	}
	if n.Kind != yaml.MappingNode {
		return nil, &Error{Line: n.Line, Field: field, Reason: "must be a mapping of " + strings.Join(Fields, ", ")}
	}
	p := &Policy{}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		f := field + "." + protocol.Shorten(k.Value, 64)
		if seen[k.Value] {
			return nil, &Error{Line: k.Line, Field: f, Reason: "duplicate key"}
		}
		seen[k.Value] = true
		bad := func(reason string) error { return &Error{Line: v.Line, Field: f, Reason: reason} }
		scalar := v.Kind == yaml.ScalarNode
		var err error
		switch k.Value {
		case "allowed_roles", "approvers":
			roles, rerr := roleList(v)
			if rerr != nil {
				return nil, bad(rerr.Error())
			}
			if k.Value == "allowed_roles" {
				p.AllowedRoles = roles
			} else {
				p.Approvers = roles
			}
		case "rate_limit":
			if !scalar || v.Tag != "!!int" && v.Tag != "!!str" {
				return nil, bad("must be a number of calls per minute, or a string such as 10/s, 10/min or 100/h")
			}
			if p.RateLimit, err = ParseRate(v.Value); err != nil {
				return nil, bad(err.Error())
			}
		case "scope":
			if !scalar || v.Tag != "!!str" {
				return nil, bad("must be caller or tool")
			}
			p.Scope = Scope(v.Value)
		case "on_limit":
			if !scalar || v.Tag != "!!str" {
				return nil, bad("must be refuse or wait")
			}
			p.OnLimit = OnLimit(v.Value)
		case "max_wait", "expires_in":
			d, derr := duration(v)
			if derr != nil {
				return nil, bad(derr.Error())
			}
			if k.Value == "max_wait" {
				p.MaxWait = d
			} else {
				p.ExpiresIn = d
			}
		case "max_recipients":
			n, ierr := strconv.Atoi(v.Value)
			if !scalar || v.Tag != "!!int" || ierr != nil || n < 1 {
				return nil, bad(fmt.Sprintf("must be a whole number from 1 to %d", MaxMaxRecipients))
			}
			p.MaxRecipients = n
		case "confirm_required":
			b, berr := strconv.ParseBool(v.Value)
			if !scalar || v.Tag != "!!bool" || berr != nil {
				return nil, bad("must be true or false")
			}
			p.ConfirmRequired = b
		default:
			return nil, &Error{Line: k.Line, Field: f, Reason: "unknown field; a policy has " + strings.Join(Fields, ", ")}
		}
	}
	if err := p.Check(field); err != nil {
		if e, ok := err.(*Error); ok && e.Line == 0 {
			e.Line = lineOf(n, strings.TrimPrefix(e.Field, field+"."))
		}
		return nil, err
	}
	return p, nil
}

// roleList reads a list of roles (a single string is a list of one).
func roleList(v *yaml.Node) ([]string, error) {
	const want = "must be a list of roles, such as [admin, operator]"
	if v.Kind == yaml.ScalarNode && v.Tag == "!!str" {
		return []string{v.Value}, nil
	}
	if v.Kind != yaml.SequenceNode {
		return nil, errors.New(want)
	}
	if len(v.Content) > MaxRoles {
		return nil, fmt.Errorf("names %d roles; at most %d", len(v.Content), MaxRoles)
	}
	out := make([]string, 0, len(v.Content))
	for _, e := range v.Content {
		if e.Kind != yaml.ScalarNode || e.Tag != "!!str" {
			return nil, errors.New(want)
		}
		out = append(out, e.Value)
	}
	return out, nil
}

// duration reads "15m", "90s"; a bare whole number is seconds.
func duration(v *yaml.Node) (Duration, error) {
	if v.Kind != yaml.ScalarNode {
		return 0, fmt.Errorf("must be a duration such as 15m or 90s")
	}
	if v.Tag == "!!int" {
		n, err := strconv.Atoi(v.Value)
		if err != nil || n < 1 {
			return 0, fmt.Errorf("must be a positive number of seconds, or a duration such as 15m")
		}
		return Duration(time.Duration(n) * time.Second), nil
	}
	d, err := time.ParseDuration(v.Value)
	if v.Tag != "!!str" || err != nil {
		return 0, fmt.Errorf("%q is no duration: write one such as 15m or 90s", protocol.Shorten(v.Value, 32))
	}
	return Duration(d), nil
}

// lineOf is the line of key within mapping n (its first segment), 0 when it has none.
func lineOf(n *yaml.Node, key string) int {
	key, _, _ = strings.Cut(key, ".")
	key, _, _ = strings.Cut(key, "[")
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1].Line
		}
	}
	return n.Line
}

// maxDepth bounds how deep a policy file goes (it needs 4 levels).
const maxDepth = 8

// noAliases refuses anchors' aliases and documents deeper than a policy file needs.
func noAliases(n *yaml.Node, depth int) error {
	if depth > maxDepth {
		return &Error{Line: n.Line, Reason: "nested deeper than a policy needs"}
	}
	if n.Kind == yaml.AliasNode || n.Anchor != "" {
		return &Error{Line: n.Line, Reason: "anchors and aliases are not read in policies; write each value out"}
	}
	for _, c := range n.Content {
		if err := noAliases(c, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// yamlReason is a YAML error without its package's prefix.
func yamlReason(err error) string {
	return protocol.Shorten(strings.TrimPrefix(err.Error(), "yaml: "), 512)
}
