package contract

import (
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// What a contract says about the resource its tool changes (state coordination): calls that
// change the same resource run one at a time, in the order their proposals were accepted.
//
//	resource_key: order_id            # or a template: "order:{order_id}"
//	changes: [shipping_address]
//	precedence: {before: [refund_apply]}
//	on_conflict: refuse               # or order
//
// resource_key names the resource from a call's arguments: an argument's name (the key is its
// value), or a template whose {argument} parts are filled in from the call. changes names the
// resource's fields the tool changes (recorded with each grant). precedence orders this
// tool's changes against other tools' on the same resource, when one request changes it
// through several; on_conflict says what Hermes does then: refuse (the default) answers each
// such call CONFLICT_RESOLVE_REQUIRED with the suggested order, and order runs them one after
// another in that order. A tool with effects: none changes nothing and is never serialized.

// Conflict handling (Contract.OnConflict).
const (
	OnConflictRefuse = "refuse"
	OnConflictOrder  = "order"
)

// MaxPrecedence bounds the tools a contract's precedence names.
const MaxPrecedence = 64

// Precedence orders a tool's changes of a resource against other tools' in one request.
type Precedence struct {
	// Before: this tool's change commits before theirs.
	Before []string `json:"before,omitempty"`
	// After: this tool's change commits after theirs.
	After []string `json:"after,omitempty"`
}

// Coordinated reports whether the contract's tool changes a resource it names (resource_key),
// so that its calls are serialized per resource.
func (c *Contract) Coordinated() bool {
	return c.ResourceKey != "" && c.EffectsOrDefault() != EffectsNone
}

// OnConflictOrDefault is the contract's on_conflict, OnConflictRefuse when not written.
func (c *Contract) OnConflictOrDefault() string {
	if c.OnConflict == "" {
		return OnConflictRefuse
	}
	return c.OnConflict
}

// keyParts splits a resource_key into literal text and argument names: a template's {name}
// parts, or the whole key when it has no braces (an argument's name).
type keyPart struct {
	text string
	arg  bool
}

func parseResourceKey(key string) ([]keyPart, error) {
	if !strings.ContainsAny(key, "{}") {
		return []keyPart{{text: key, arg: true}}, nil
	}
	var parts []keyPart
	rest := key
	for rest != "" {
		open := strings.IndexByte(rest, '{')
		if close := strings.IndexByte(rest, '}'); close >= 0 && (open < 0 || close < open) {
			return nil, fmt.Errorf("a '}' with no '{' before it")
		}
		if open < 0 {
			parts = append(parts, keyPart{text: rest})
			break
		}
		if open > 0 {
			parts = append(parts, keyPart{text: rest[:open]})
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return nil, fmt.Errorf("a '{' with no '}' after it")
		}
		name := rest[open+1 : open+end]
		if name == "" || strings.ContainsAny(name, "{") {
			return nil, fmt.Errorf("{%s} does not name an argument", name)
		}
		parts = append(parts, keyPart{text: name, arg: true})
		rest = rest[open+end+1:]
	}
	return parts, nil
}

// checkResource checks resource_key, changes, precedence and on_conflict against the compiled
// input schema (props: its top-level properties; nil when it declares none).
func (c *Contract) checkResource(props map[string]any) error {
	if c.ResourceKey == "" {
		switch {
		case len(c.Changes) > 0:
			return &Error{Field: "changes", Reason: "says what the tool changes in the resource resource_key names, and there is no resource_key"}
		case c.Precedence != nil:
			return &Error{Field: "precedence", Reason: "orders changes of the resource resource_key names, and there is no resource_key"}
		case c.OnConflict != "":
			return &Error{Field: "on_conflict", Reason: "says what to do when one request changes the resource resource_key names twice, and there is no resource_key"}
		}
		return nil
	}
	if c.EffectsOrDefault() == EffectsNone {
		return &Error{Field: "resource_key", Reason: "the tool changes nothing (effects: none), so its calls are never serialized; drop resource_key or the effects"}
	}
	if len(c.ResourceKey) > protocol.MaxResourceKeyLen || !protocol.Printable(c.ResourceKey) {
		return &Error{Field: "resource_key", Reason: fmt.Sprintf("is 1 to %d printable bytes", protocol.MaxResourceKeyLen)}
	}
	parts, err := parseResourceKey(c.ResourceKey)
	if err != nil {
		return &Error{Field: "resource_key", Reason: err.Error()}
	}
	for _, p := range parts {
		if !p.arg {
			continue
		}
		if _, ok := props[p.text]; !ok {
			return &Error{Field: "resource_key", Reason: fmt.Sprintf("names the argument %q, which the input_schema does not declare", protocol.Shorten(p.text, 64))}
		}
	}
	if len(c.Changes) > protocol.MaxChanges {
		return &Error{Field: "changes", Reason: fmt.Sprintf("names %d fields; at most %d", len(c.Changes), protocol.MaxChanges)}
	}
	for i, f := range c.Changes {
		if f == "" || len(f) > 128 || !protocol.Printable(f) {
			return &Error{Field: fmt.Sprintf("changes[%d]", i), Reason: "a field's name is 1 to 128 printable characters"}
		}
		if slices.Index(c.Changes, f) < i {
			return &Error{Field: fmt.Sprintf("changes[%d]", i), Reason: fmt.Sprintf("%q is named twice", f)}
		}
	}
	if c.OnConflict != "" && c.OnConflict != OnConflictRefuse && c.OnConflict != OnConflictOrder {
		return &Error{Field: "on_conflict", Reason: fmt.Sprintf("must be refuse or order; got %q", protocol.Shorten(c.OnConflict, 32))}
	}
	if p := c.Precedence; p != nil {
		if len(p.Before)+len(p.After) > MaxPrecedence {
			return &Error{Field: "precedence", Reason: fmt.Sprintf("names %d tools; at most %d", len(p.Before)+len(p.After), MaxPrecedence)}
		}
		for _, list := range []struct {
			name  string
			tools []string
		}{{"precedence.before", p.Before}, {"precedence.after", p.After}} {
			for i, t := range list.tools {
				field := fmt.Sprintf("%s[%d]", list.name, i)
				if err := protocol.CheckToolName(field, t); err != nil {
					return &Error{Field: field, Reason: "is not a tool's name"}
				}
				if t == c.Name {
					return &Error{Field: field, Reason: "names the tool itself"}
				}
				if slices.Contains(p.Before, t) && slices.Contains(p.After, t) {
					return &Error{Field: field, Reason: fmt.Sprintf("%s is both before and after %s: a precedence cycle", c.Name, t)}
				}
			}
		}
	}
	return nil
}

// Resource is the resource a call of the tool with arguments args changes: resource_key filled
// in from the arguments. An error says the call does not name it (an argument missing, empty,
// or neither a string nor a number): such a call must not run.
func (c *Compiled) Resource(args json.RawMessage) (string, error) {
	parts, err := parseResourceKey(c.ResourceKey)
	if err != nil {
		return "", err
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(args, &obj); err != nil || obj == nil {
		return "", fmt.Errorf("the arguments are not a JSON object, so they name no resource (%s)", c.ResourceKey)
	}
	var b strings.Builder
	for _, p := range parts {
		if !p.arg {
			b.WriteString(p.text)
			continue
		}
		raw, ok := obj[p.text]
		if !ok {
			return "", fmt.Errorf("the argument %s names the resource the call changes, and it is missing", p.text)
		}
		var s string
		var n json.Number
		switch {
		case json.Unmarshal(raw, &s) == nil:
		case json.Unmarshal(raw, &n) == nil:
			// One number, one key: 123, 123.0 and 1.23e2 name the same resource.
			s = canonicalNumber(n)
		default:
			return "", fmt.Errorf("the argument %s names the resource the call changes: it must be a string or a number", p.text)
		}
		if strings.TrimSpace(s) == "" {
			return "", fmt.Errorf("the argument %s names the resource the call changes, and it is empty", p.text)
		}
		b.WriteString(s)
	}
	key := b.String()
	if err := protocol.CheckResourceKey("resource", key); err != nil {
		return "", fmt.Errorf("the resource the call changes (%s): %s", protocol.Shorten(key, 64), strings.TrimPrefix(err.Error(), "resource: "))
	}
	return key, nil
}

// PrecedenceCycle finds a cycle in the precedence the contracts declare together (each
// contract's before and after lists): the tools around it, first repeated last, or nil.
func PrecedenceCycle(contracts []*Contract) []string {
	edges := precedenceEdges(contracts)
	const (
		unseen = iota
		open
		done
	)
	state := map[string]int{}
	var path []string
	var visit func(t string) []string
	visit = func(t string) []string {
		state[t] = open
		path = append(path, t)
		for _, next := range edges[t] {
			switch state[next] {
			case open:
				i := slices.Index(path, next)
				return append(slices.Clone(path[i:]), next)
			case unseen:
				if cyc := visit(next); cyc != nil {
					return cyc
				}
			}
		}
		path = path[:len(path)-1]
		state[t] = done
		return nil
	}
	names := make([]string, 0, len(edges))
	for t := range edges {
		names = append(names, t)
	}
	slices.Sort(names)
	for _, t := range names {
		if state[t] == unseen {
			if cyc := visit(t); cyc != nil {
				return cyc
			}
		}
	}
	return nil
}

// precedenceEdges maps each tool to the tools whose changes commit after its own.
func precedenceEdges(contracts []*Contract) map[string][]string {
	edges := map[string][]string{}
	add := func(from, to string) {
		if !slices.Contains(edges[from], to) {
			edges[from] = append(edges[from], to)
		}
		if _, ok := edges[to]; !ok {
			edges[to] = nil
		}
	}
	for _, c := range contracts {
		if c == nil || c.Precedence == nil {
			continue
		}
		for _, t := range c.Precedence.Before {
			add(c.Name, t)
		}
		for _, t := range c.Precedence.After {
			add(t, c.Name)
		}
	}
	for _, v := range edges {
		slices.Sort(v)
	}
	return edges
}

// Order puts tools (the tools of calls that change one resource, in the request's order) in
// the order the contracts' precedence says, keeping the request's order where it says
// nothing; contracts are looked up by tool (nil for a tool without one).
func Order(tools []string, contractOf func(string) *Contract) []int {
	var cs []*Contract
	for _, t := range tools {
		if c := contractOf(t); c != nil && !slices.Contains(cs, c) {
			cs = append(cs, c)
		}
	}
	edges := precedenceEdges(cs)
	// before[i][j]: call i's tool commits before call j's.
	before := func(i, j int) bool { return slices.Contains(edges[tools[i]], tools[j]) }
	placed := make([]bool, len(tools))
	out := make([]int, 0, len(tools))
	for len(out) < len(tools) {
		pick := -1
		for i := range tools {
			if placed[i] {
				continue
			}
			free := true
			for j := range tools {
				if !placed[j] && j != i && before(j, i) {
					free = false
					break
				}
			}
			if free {
				pick = i
				break
			}
		}
		if pick < 0 { // a cycle (refused at registration; contracts changed since): request order
			for i := range tools {
				if !placed[i] {
					pick = i
					break
				}
			}
		}
		placed[pick] = true
		out = append(out, pick)
	}
	return out
}

// canonicalNumber writes a JSON number one way: an integer of at most 2^53 in magnitude in
// full, digit by digit; any other number in the shortest form that reads back as the same
// float64. Numbers a tool reading float64 cannot tell apart (9007199254740993 and
// 9007199254740992) so name one resource: coarser keys only serialize more.
func canonicalNumber(n json.Number) string {
	f, _, err := big.ParseFloat(n.String(), 10, 256, big.ToNearestEven)
	if err != nil {
		return n.String()
	}
	if f.IsInt() && f.MantExp(nil) <= 53 {
		i, _ := f.Int(nil)
		return i.String()
	}
	v, _ := f.Float64()
	return strconv.FormatFloat(v, 'g', -1, 64)
}
