package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"regexp/syntax"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Compiled is a contract made into checks, for one version of it.
type Compiled struct {
	*Contract
	// Version numbers the contract's registrations from 1 (0: not registered).
	Version int
	// Revision is the version's revision in the contracts' bucket (0: not registered).
	Revision uint64

	input *schema
	// shaped: answers are {"success": …} or {"failure": …}, checked by success and failure;
	// otherwise plain checks the whole answer (nil: any answer).
	shaped           bool
	success, failure *schema
	plain            *schema
}

// schema is one compiled schema and what its errors are reported against.
type schema struct {
	s *jsonschema.Schema
	// doc is the schema as JSON Schema (the short form expanded), as written otherwise.
	doc any
	// field is where it is written in the contract (input_schema, output_schema.success).
	field string
	// short: written in the short form, so a field path in the compiled schema
	// (properties/order_id/minLength) is reported as written (order_id.min_length).
	short bool
	// descriptions of the top-level fields, for recovery hints.
	descriptions map[string]string
	// plan is what checking a value may apply (what a check would cost is counted from it).
	plan *costPlan
	// patterns: the schema matches patterns somewhere (so long strings are refused first).
	patterns bool
}

// InputJSONSchema is the input schema as JSON Schema (the short form expanded), for those who
// show a tool to a model (an MCP client); an object of any properties without one.
func (c *Compiled) InputJSONSchema() json.RawMessage {
	if c.input == nil {
		return json.RawMessage(`{"type":"object"}`)
	}
	b, err := json.Marshal(c.input.doc)
	if err != nil {
		return json.RawMessage(`{"type":"object"}`)
	}
	return b
}

// ArgumentSchema is the JSON Schema of the argument name (a property of the input schema, as
// InputJSONSchema shows it), for those who pass a value on to the tool (a blueprint offered as
// a tool); nil when the input schema has no such property, or when the property's schema
// refers elsewhere ($ref, $dynamicRef) and so does not stand alone.
func (c *Compiled) ArgumentSchema(name string) json.RawMessage {
	if c.input == nil {
		return nil
	}
	doc, _ := c.input.doc.(map[string]any)
	props, _ := doc["properties"].(map[string]any)
	prop, ok := props[name].(map[string]any)
	if !ok {
		return nil
	}
	b, err := json.Marshal(prop)
	if err != nil || bytes.Contains(b, []byte(`"$ref"`)) || bytes.Contains(b, []byte(`"$dynamicRef"`)) {
		return nil
	}
	return b
}

// ArgumentSchemas looks up the argument schemas of tools (ArgumentSchema): nil for a tool not
// among them.
func ArgumentSchemas(tools []*Compiled) func(tool, arg string) json.RawMessage {
	byName := make(map[string]*Compiled, len(tools))
	for _, k := range tools {
		byName[k.Name] = k
	}
	return func(tool, arg string) json.RawMessage {
		if k := byName[tool]; k != nil {
			return k.ArgumentSchema(arg)
		}
		return nil
	}
}

// Compile checks c and compiles its schemas, recording version and revision. Errors are *Error
// naming the field (their line is left to Parse, which knows it).
func Compile(c *Contract, version int, revision uint64) (*Compiled, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	out := &Compiled{Contract: c, Version: version, Revision: revision}
	var err error
	if len(c.InputSchema) > 0 {
		v, err := decodeJSON(c.InputSchema, "input_schema")
		if err != nil {
			return nil, err
		}
		if out.input, err = compileSchema(c.Name, "input_schema", v); err != nil {
			return nil, err
		}
	}
	var props map[string]any
	if out.input != nil {
		doc, _ := out.input.doc.(map[string]any)
		props, _ = doc["properties"].(map[string]any)
	}
	if err := c.checkResource(props); err != nil {
		return nil, err
	}
	if len(c.OutputSchema) == 0 {
		return out, nil
	}
	v, err := decodeJSON(c.OutputSchema, "output_schema")
	if err != nil {
		return nil, err
	}
	obj, isObj := v.(map[string]any)
	if !isObj || isFull(obj) || len(obj) == 0 || !onlyKeys(obj, "success", "failure") {
		out.plain, err = compileSchema(c.Name, "output_schema", v)
		return out, err
	}
	out.shaped = true
	if s, ok := obj["success"]; ok {
		if out.success, err = compileSchema(c.Name, "output_schema.success", s); err != nil {
			return nil, err
		}
	}
	if f, ok := obj["failure"]; ok {
		if err := checkFailureCodes(f); err != nil {
			return nil, err
		}
		if out.failure, err = compileSchema(c.Name, "output_schema.failure", f); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// checkFailureCodes refuses a failure schema whose error_code enum (or const) holds a value
// that cannot be a tool's code: not ^[A-Z0-9_]{1,64}$, or one of Hermes' own codes (a tool must
// never pass for Hermes). Codes a schema allows otherwise are checked in every answer.
func checkFailureCodes(f any) error {
	obj, _ := f.(map[string]any)
	field, path := "output_schema.failure.properties.error_code.enum", []string{"properties", "error_code", "enum"}
	if obj != nil && !isFull(obj) {
		field, path = "output_schema.failure.error_code.enum", []string{"error_code", "enum"}
	}
	var at any = obj
	for _, k := range path {
		m, ok := at.(map[string]any)
		if !ok {
			return nil
		}
		at = m[k]
	}
	codes, _ := at.([]any)
	if m, ok := resolveParent(obj, path); ok {
		if c, ok := m["const"]; ok {
			codes, field = []any{c}, strings.TrimSuffix(field, ".enum")+".const"
		}
	}
	for i, code := range codes {
		s, _ := code.(string)
		if !declarable(s) {
			reason := "an error code is 1 to 64 upper-case letters, digits and _"
			if protocol.IsHermesCode(s) {
				reason = s + " is one of Hermes' own codes; a tool reports its own"
			}
			if strings.HasSuffix(field, ".const") {
				return &Error{Field: field, Reason: reason}
			}
			return &Error{Field: field + "[" + strconv.Itoa(i) + "]", Reason: reason}
		}
	}
	return nil
}

// declarable reports whether a tool may declare code as its own failure's.
func declarable(code string) bool {
	return code != "" && protocol.ToolCode(code) == code && !protocol.IsHermesCode(code)
}

// resolveParent returns the mapping that holds path's last key.
func resolveParent(obj map[string]any, path []string) (map[string]any, bool) {
	var at any = obj
	for _, k := range path[:len(path)-1] {
		m, ok := at.(map[string]any)
		if !ok {
			return nil, false
		}
		at = m[k]
	}
	m, ok := at.(map[string]any)
	return m, ok
}

// isFull reports whether a schema object is full JSON Schema: it names $schema, or its type is
// a JSON Schema type (a string or a list); otherwise it is the short form, field → rules (where
// a field may be called "type", its rules a mapping).
func isFull(obj map[string]any) bool {
	if _, ok := obj["$schema"]; ok {
		return true
	}
	switch obj["type"].(type) {
	case string, []any:
		return true
	}
	return false
}

func onlyKeys(obj map[string]any, keys ...string) bool {
	for k := range obj {
		if !slices.Contains(keys, k) {
			return false
		}
	}
	return true
}

// shortRules maps the short form's rules to JSON Schema keywords.
var shortRules = map[string]string{
	"type": "type", "pattern": "pattern", "enum": "enum", "description": "description",
	"min_length": "minLength", "max_length": "maxLength", "minimum": "minimum", "maximum": "maximum",
	"items": "items", "required": "",
}

var shortTypes = []string{"string", "integer", "number", "boolean", "object", "array"}

// expand turns the short form (field → rules) into JSON Schema: an object of those properties,
// the required ones required, no others allowed.
func expand(obj map[string]any, field string) (map[string]any, map[string]string, error) {
	props := map[string]any{}
	descriptions := map[string]string{}
	var required []any
	for _, name := range sortedKeys(obj) {
		at := field + "." + name
		rules, ok := obj[name].(map[string]any)
		if !ok {
			return nil, nil, &Error{Field: at, Reason: "must be a mapping of type, required, pattern, enum, min_length, max_length, minimum, maximum, description (or write the whole schema as JSON Schema, with a top-level type)"}
		}
		prop := map[string]any{}
		for _, rule := range sortedKeys(rules) {
			kw, known := shortRules[rule]
			if !known {
				return nil, nil, &Error{Field: at + "." + rule, Reason: "unknown rule; the short form has type, required, pattern, enum, min_length, max_length, minimum, maximum, description and items"}
			}
			v := rules[rule]
			switch rule {
			case "required":
				b, ok := v.(bool)
				if !ok {
					return nil, nil, &Error{Field: at + ".required", Reason: "must be true or false"}
				}
				if b {
					required = append(required, name)
				}
				continue
			case "type":
				if s, _ := v.(string); !slices.Contains(shortTypes, s) {
					return nil, nil, &Error{Field: at + ".type", Reason: "must be one of " + strings.Join(shortTypes, ", ")}
				}
			case "description":
				if s, ok := v.(string); ok {
					descriptions[name] = s
				}
			}
			prop[kw] = v
		}
		props[name] = prop
	}
	out := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		out["required"] = required
	}
	return out, descriptions, nil
}

// compileSchema compiles v, written at field, as its own resource. Nothing is loaded from
// anywhere: a $ref leads only within the schema.
func compileSchema(tool, field string, v any) (*schema, error) {
	s := &schema{field: field}
	if obj, ok := v.(map[string]any); ok && !isFull(obj) {
		var err error
		if v, s.descriptions, err = expand(obj, field); err != nil {
			return nil, err
		}
		s.short = true
	} else if ok {
		s.descriptions = descriptionsOf(obj)
	}
	s.doc = v
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noLoader{})
	c.UseRegexpEngine(ecmaRegexp)
	url := "hermes:///contracts/" + tool + "/" + field + ".json"
	if err := c.AddResource(url, v); err != nil {
		return nil, &Error{Field: field, Reason: err.Error()}
	}
	compiled, err := c.Compile(url)
	if err != nil {
		return nil, s.compileError(err)
	}
	plan, err := checkCost(compiled)
	if err != nil {
		return nil, &Error{Field: field, Reason: err.Error()}
	}
	s.s, s.plan, s.patterns = compiled, plan, plan.hasPatterns()
	return s, nil
}

// descriptionsOf reads the descriptions of a full schema's top-level properties.
func descriptionsOf(obj map[string]any) map[string]string {
	out := map[string]string{}
	props, _ := obj["properties"].(map[string]any)
	for name, p := range props {
		if m, ok := p.(map[string]any); ok {
			if d, ok := m["description"].(string); ok {
				out[name] = d
			}
		}
	}
	return out
}

// compileError reports a schema that does not compile against the field it is written at.
func (s *schema) compileError(err error) error {
	var sve *jsonschema.SchemaValidationError
	if errors.As(err, &sve) {
		var ve *jsonschema.ValidationError
		if errors.As(sve.Err, &ve) {
			if leaf := leaves(ve); len(leaf) > 0 {
				return &Error{Field: s.written(leaf[0].InstanceLocation), Reason: "not valid JSON Schema: " + message(leaf[0])}
			}
		}
	}
	var re *jsonschema.InvalidRegexError
	if errors.As(err, &re) {
		_, frag, _ := strings.Cut(re.URL, "#")
		return &Error{Field: s.written(pointer(frag)), Reason: fmt.Sprintf("invalid pattern %q: %v", protocol.Shorten(re.Regex, 128), re.Err)}
	}
	var le *jsonschema.LoadURLError
	if errors.As(err, &le) {
		return &Error{Field: s.field, Reason: fmt.Sprintf("$ref %s leads outside the contract; Hermes loads no schema from anywhere (use $defs)", protocol.Shorten(le.URL, 128))}
	}
	return &Error{Field: s.field, Reason: protocol.Shorten(err.Error(), 512)}
}

// written turns a location in the compiled schema into the field path as written.
func (s *schema) written(tokens []string) string {
	if s.short && len(tokens) >= 2 && tokens[0] == "properties" {
		tokens = slices.Clone(tokens[1:])
		if len(tokens) >= 2 {
			for rule, kw := range shortRules {
				if kw == tokens[1] && kw != "" {
					tokens[1] = rule
				}
			}
		}
	}
	field := s.field
	for _, t := range tokens {
		if _, err := strconv.Atoi(t); err == nil {
			field += "[" + t + "]"
		} else {
			field += "." + t
		}
	}
	return field
}

func pointer(frag string) []string {
	frag = strings.TrimPrefix(frag, "/")
	if frag == "" {
		return nil
	}
	parts := strings.Split(frag, "/")
	for i, p := range parts {
		parts[i] = strings.ReplaceAll(strings.ReplaceAll(p, "~1", "/"), "~0", "~")
	}
	return parts
}

// noLoader loads nothing: a schema in a contract is all there is (no file, no URL is read on
// behalf of whoever registered it).
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, errors.New("schemas are not loaded from anywhere")
}

// ecmaRegexp compiles a JSON Schema pattern (ECMA-262) with Go's regexp (RE2: linear time, no
// lookaround or backreferences), after writing \uXXXX as \x{XXXX}, so that patterns written for
// Chinese text (\u4e00-\u9fa5) compile.
func ecmaRegexp(src string) (jsonschema.Regexp, error) {
	p := src
	if strings.Contains(p, `\u`) {
		var b strings.Builder
		for i := 0; i < len(p); i++ {
			switch {
			case p[i] == '\\' && i+1 < len(p) && p[i+1] == '\\':
				b.WriteString(`\\`)
				i++
			case p[i] == '\\' && i+1 < len(p) && p[i+1] == 'u' && isHex4(p[i+2:]):
				b.WriteString(`\x{` + p[i+2:i+6] + `}`)
				i += 5
			default:
				b.WriteByte(p[i])
			}
		}
		p = b.String()
	}
	re, err := regexp.Compile(p)
	if err != nil {
		return nil, err
	}
	if n := programSize(p); n > MaxPatternProgram {
		return nil, fmt.Errorf("too complex: %d steps to match one character, at most %d (a shorter repeat count, or fewer alternatives)", n, MaxPatternProgram)
	}
	return pattern{re, src}, nil
}

// Bounds of what a check may cost: patterns run in time proportional to the string times the
// pattern's program, schemas in time proportional to the value times the schema's expansion.
// A schema's cost is bounded twice: when it is compiled (a schema that could make one value
// expensive whatever its size is refused) and before each check (a value that would be
// expensive to check against it is refused, the refusal naming the bound).
const (
	// MaxPatternProgram bounds a pattern's compiled program (RE2 instructions).
	MaxPatternProgram = 4000
	// MaxPatternInput is the longest string a pattern is matched against; a longer one
	// does not match.
	MaxPatternInput = 64 << 10
	// MaxSchemaExpansion bounds the subschemas a schema applies to one value, and to one
	// value and the parts along one path of it, a recursion counted once (a schema whose
	// branches fan out is refused, and so is a recursion that comes back by two ways for one
	// part of the value: exponential in the value's depth).
	MaxSchemaExpansion = 20_000
	// MaxCheckSteps bounds the schema steps of one check, counted before it runs: for every
	// subschema applied to every part of the value (itself, each property's value and name,
	// each item), the application, each key or item it goes over, each node of an enum's or a
	// const's values it compares, each 4 bytes of a string, weighted by what each costs the
	// validator (a step is some 10 to 40 ns). A value that would take more is refused before
	// it is checked: a check takes a few tenths of a second at most. The largest arguments a
	// request may carry (256 KiB), checked against an ordinary schema, take a few million.
	MaxCheckSteps = 10_000_000
	// MaxCheckDepth bounds how deep below the value a check may go (where the schema has
	// subschemas for the parts there): the validator's time per level grows with the depth.
	MaxCheckDepth = 128
)

func programSize(p string) int {
	re, err := syntax.Parse(p, syntax.Perl)
	if err != nil {
		return 0
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return 0
	}
	return len(prog.Inst)
}

// pattern is a compiled pattern that shows as written.
type pattern struct {
	*regexp.Regexp
	src string
}

func (p pattern) String() string { return p.src }

// MatchString matches s, refusing strings longer than MaxPatternInput.
func (p pattern) MatchString(s string) bool {
	return len(s) <= MaxPatternInput && p.Regexp.MatchString(s)
}

func isHex4(s string) bool {
	if len(s) < 4 {
		return false
	}
	for i := range 4 {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// decodeJSON reads a schema as the validator's values (numbers as json.Number).
func decodeJSON(raw []byte, field string) (any, error) {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, &Error{Field: field, Reason: "not JSON: " + protocol.Shorten(err.Error(), 256)}
	}
	return v, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// sameValue lists the subschemas s applies to the value it checks.
func sameValue(s *jsonschema.Schema) []*jsonschema.Schema {
	out := []*jsonschema.Schema{s.Ref, s.RecursiveRef, s.Not, s.If, s.Then, s.Else}
	if s.DynamicRef != nil {
		out = append(out, s.DynamicRef.Ref)
	}
	out = append(append(append(out, s.AllOf...), s.AnyOf...), s.OneOf...)
	for _, k := range sortedKeys(s.DependentSchemas) {
		out = append(out, s.DependentSchemas[k])
	}
	for _, k := range sortedKeys(s.Dependencies) {
		if d, ok := s.Dependencies[k].(*jsonschema.Schema); ok {
			out = append(out, d)
		}
	}
	out = slices.DeleteFunc(out, func(s *jsonschema.Schema) bool { return s == nil })
	return out
}
