package contract

import (
	"encoding/json"
	"fmt"
	"math/big"
	"regexp/syntax"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// CaseKind says what a generated case tries.
type CaseKind string

const (
	// CaseValid: arguments the input schema accepts, as a caller would send them.
	CaseValid CaseKind = "valid"
	// CaseBoundary: valid arguments at an edge — a bound, an enum value, an empty value.
	CaseBoundary CaseKind = "boundary"
	// CaseInvalid: arguments the input schema refuses, which the tool should refuse too.
	CaseInvalid CaseKind = "invalid"
)

// Case is one set of arguments the sandbox tries a tool with.
type Case struct {
	Kind CaseKind `json:"kind"`
	// Name says what the case tries ("order_id at its pattern", "amount at its minimum 0").
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// MaxCases bounds the cases Cases makes.
const MaxCases = 40

// maxCaseName bounds a case's name (it names a field, and a value).
const maxCaseName = 256

// Cases generates arguments from the input schema: the schema's examples and a typical valid
// value (once with the required fields only, once with every field), boundary values of each
// top-level field, and invalid values (a required field missing, a wrong type, a value off its
// pattern, enum or bounds, an unknown field where none is allowed). Every valid and boundary
// case passes CheckInput and every invalid one fails it; what cannot be made so is left out.
// At most MaxCases, in that order. A contract without an input schema gets one case, {}.
func (c *Compiled) Cases() []Case {
	if c.input == nil {
		return []Case{{Kind: CaseValid, Name: "no arguments (the contract has no input_schema)", Arguments: json.RawMessage(`{}`)}}
	}
	g := &caseGen{c: c, seen: map[string]bool{}}
	root := c.input.s
	for i, ex := range root.Examples {
		if i == 3 {
			break
		}
		g.add(CaseValid, fmt.Sprintf("example %d of input_schema", i+1), ex)
	}
	minimal, ok := g.value(root, false, 0)
	if ok {
		g.add(CaseValid, "typical arguments, required fields only", minimal)
	}
	full, fullOK := g.value(root, true, 0)
	if fullOK {
		g.add(CaseValid, "typical arguments, every field", full)
	}
	base, isObj := full.(map[string]any)
	if !fullOK || !isObj || !g.valid(base) {
		base, isObj = minimal.(map[string]any)
	}
	// Cases of one field are made from valid arguments only: an invalid case must be invalid
	// for what it says, not for another field.
	if isObj && ok && g.valid(base) {
		for _, name := range sortedProps(root) {
			g.boundaries(base, name, resolve(root.Properties[name]))
		}
		g.invalid(root, base)
	}
	g.add(CaseInvalid, "no arguments", map[string]any{})
	g.add(CaseValid, "no arguments", map[string]any{})
	return g.cases
}

// valid reports whether v passes the input schema.
func (g *caseGen) valid(v any) bool {
	b, err := json.Marshal(v)
	return err == nil && g.c.CheckInput(b) == nil
}

type caseGen struct {
	c     *Compiled
	cases []Case
	seen  map[string]bool
}

// add keeps a case when it is new and the input schema says of it what its kind claims.
func (g *caseGen) add(kind CaseKind, name string, v any) {
	if len(g.cases) >= MaxCases {
		return
	}
	b, err := json.Marshal(v)
	if err != nil || g.seen[string(b)] {
		return
	}
	if valid := g.c.CheckInput(b) == nil; valid != (kind != CaseInvalid) {
		return
	}
	g.seen[string(b)] = true
	g.cases = append(g.cases, Case{Kind: kind, Name: brief(name, maxCaseName), Arguments: b})
}

// with returns base with field name set to v.
func with(base map[string]any, name string, v any) map[string]any {
	out := make(map[string]any, len(base)+1)
	for k, x := range base {
		out[k] = x
	}
	out[name] = v
	return out
}

func without(base map[string]any, name string) map[string]any {
	out := with(base, name, nil)
	delete(out, name)
	return out
}

// boundaries adds the edge values of field name of the arguments.
func (g *caseGen) boundaries(base map[string]any, name string, s *jsonschema.Schema) {
	if s == nil {
		return
	}
	if s.Enum != nil {
		for i, v := range s.Enum.Values {
			if i == 8 {
				break
			}
			g.add(CaseBoundary, fmt.Sprintf("%s = %s (of its enum)", name, short(v)), with(base, name, v))
		}
	}
	types := typesOf(s)
	switch {
	case slices.Contains(types, "integer") || slices.Contains(types, "number"):
		for _, b := range []struct {
			r    *big.Rat
			step int64
			what string
		}{{s.Minimum, 0, "its minimum"}, {s.Maximum, 0, "its maximum"}, {s.ExclusiveMinimum, 1, "just above its exclusive minimum"}, {s.ExclusiveMaximum, -1, "just below its exclusive maximum"}} {
			if b.r == nil {
				continue
			}
			v := new(big.Rat).Add(b.r, big.NewRat(b.step, 1))
			if !slices.Contains(types, "integer") && b.step != 0 {
				v = new(big.Rat).Add(b.r, big.NewRat(b.step, 1000))
			}
			g.add(CaseBoundary, fmt.Sprintf("%s at %s %s", name, b.what, rat(v)), with(base, name, ratValue(v)))
		}
		g.add(CaseBoundary, name+" = 0", with(base, name, 0))
		g.add(CaseBoundary, name+" = -1", with(base, name, -1))
	case slices.Contains(types, "string"):
		if s.MinLength != nil {
			if v, ok := g.stringOfLength(s, *s.MinLength); ok {
				g.add(CaseBoundary, fmt.Sprintf("%s at its min length %d", name, *s.MinLength), with(base, name, v))
			}
		}
		if s.MaxLength != nil && *s.MaxLength <= 4096 {
			if v, ok := g.stringOfLength(s, *s.MaxLength); ok {
				g.add(CaseBoundary, fmt.Sprintf("%s at its max length %d", name, *s.MaxLength), with(base, name, v))
			}
		}
		g.add(CaseBoundary, name+" empty", with(base, name, ""))
	case slices.Contains(types, "array"):
		g.add(CaseBoundary, name+" empty", with(base, name, []any{}))
		if item, ok := g.value(resolve(s.Items2020), false, 1); ok && s.MaxItems != nil && *s.MaxItems <= 16 {
			g.add(CaseBoundary, fmt.Sprintf("%s at its max items %d", name, *s.MaxItems), with(base, name, slices.Repeat([]any{item}, *s.MaxItems)))
		}
	}
}

// invalid adds arguments the input schema refuses.
func (g *caseGen) invalid(root *jsonschema.Schema, base map[string]any) {
	for _, name := range root.Required {
		g.add(CaseInvalid, name+" missing", without(base, name))
	}
	for _, name := range sortedProps(root) {
		s := resolve(root.Properties[name])
		if s == nil {
			continue
		}
		types := typesOf(s)
		wrong := map[string]any{"string": 12345, "integer": "not a number", "number": "not a number", "boolean": "yes", "object": "not an object", "array": "not an array"}
		for _, t := range types {
			if w, ok := wrong[t]; ok {
				g.add(CaseInvalid, fmt.Sprintf("%s of the wrong type (%s)", name, short(w)), with(base, name, w))
				break
			}
		}
		if s.Enum != nil && len(s.Enum.Values) > 0 {
			if str, ok := s.Enum.Values[0].(string); ok {
				g.add(CaseInvalid, fmt.Sprintf("%s = %q (not in its enum)", name, str+" "), with(base, name, str+" "))
			}
			g.add(CaseInvalid, name+" not in its enum", with(base, name, "not_a_listed_value"))
		}
		if s.Pattern != nil {
			for _, v := range []string{"INVALID-!", "!"} {
				g.add(CaseInvalid, fmt.Sprintf("%s = %q (off its pattern)", name, v), with(base, name, v))
			}
		}
		if s.Minimum != nil {
			v := new(big.Rat).Sub(s.Minimum, big.NewRat(1, 1))
			g.add(CaseInvalid, fmt.Sprintf("%s below its minimum (%s)", name, rat(v)), with(base, name, ratValue(v)))
		}
		if s.Maximum != nil {
			v := new(big.Rat).Add(s.Maximum, big.NewRat(1, 1))
			g.add(CaseInvalid, fmt.Sprintf("%s above its maximum (%s)", name, rat(v)), with(base, name, ratValue(v)))
		}
		if s.MinLength != nil && *s.MinLength > 0 {
			if v, ok := g.stringOfLength(&jsonschema.Schema{}, *s.MinLength-1); ok {
				g.add(CaseInvalid, fmt.Sprintf("%s shorter than its min length %d", name, *s.MinLength), with(base, name, v))
			}
		}
		if s.MaxLength != nil && *s.MaxLength < 4096 {
			if v, ok := g.stringOfLength(&jsonschema.Schema{}, *s.MaxLength+1); ok {
				g.add(CaseInvalid, fmt.Sprintf("%s longer than its max length %d", name, *s.MaxLength), with(base, name, v))
			}
		}
	}
	if ap, ok := root.AdditionalProperties.(bool); ok && !ap {
		g.add(CaseInvalid, "an unknown field", with(base, "unknown_field", "x"))
	}
}

// value makes a typical valid value of s: with every property of objects when full, the
// required ones otherwise. Depth bounds nesting (and $ref cycles).
func (g *caseGen) value(s *jsonschema.Schema, full bool, depth int) (any, bool) {
	s = resolve(s)
	if s == nil || depth > 8 {
		return nil, false
	}
	if s.Bool != nil {
		return "sample", *s.Bool
	}
	switch {
	case s.Const != nil:
		return *s.Const, true
	case s.Enum != nil && len(s.Enum.Values) > 0:
		return s.Enum.Values[0], true
	case len(s.Examples) > 0:
		return s.Examples[0], true
	case s.Default != nil:
		return *s.Default, true
	case len(s.AllOf) > 0 && s.Types == nil && s.Properties == nil:
		return g.value(s.AllOf[0], full, depth+1)
	case len(s.AnyOf) > 0 && s.Types == nil:
		return g.value(s.AnyOf[0], full, depth+1)
	case len(s.OneOf) > 0 && s.Types == nil:
		return g.value(s.OneOf[0], full, depth+1)
	}
	types := typesOf(s)
	if len(types) == 0 {
		return "sample", true
	}
	switch types[0] {
	case "object":
		obj := map[string]any{}
		for _, name := range sortedProps(s) {
			if !full && !slices.Contains(s.Required, name) {
				continue
			}
			v, ok := g.value(s.Properties[name], full, depth+1)
			if !ok {
				return nil, false
			}
			obj[name] = v
		}
		for _, name := range s.Required {
			if _, ok := obj[name]; !ok {
				obj[name] = "sample" // required without a schema of its own
			}
		}
		return obj, true
	case "array":
		n := 1
		if s.MinItems != nil {
			n = max(n, *s.MinItems)
		}
		if s.MaxItems != nil {
			n = min(n, *s.MaxItems)
		}
		if n == 0 || s.Items2020 == nil {
			return []any{}, n == 0 || s.Items2020 == nil
		}
		item, ok := g.value(s.Items2020, full, depth+1)
		if !ok || n > 16 {
			return nil, false
		}
		return slices.Repeat([]any{item}, n), true
	case "string":
		return g.typicalString(s)
	case "integer", "number":
		return typicalNumber(s, types[0] == "integer"), true
	case "boolean":
		return true, true
	default:
		return nil, true
	}
}

// typicalString makes a string s accepts: one its pattern matches, a value of its format, or a
// word, within its lengths.
func (g *caseGen) typicalString(s *jsonschema.Schema) (any, bool) {
	if s.Pattern != nil {
		v, ok := fromPattern(s.Pattern)
		switch {
		case !ok:
			return nil, false
		case lengthOK(s, v):
			return v, true
		case s.MinLength != nil && utf8.RuneCountInString(v) < *s.MinLength:
			return g.stringOfLength(s, *s.MinLength)
		}
		return nil, false
	}
	if s.Format != nil {
		if v, ok := formatSamples[s.Format.Name]; ok {
			return v, true
		}
	}
	lo := 0
	if s.MinLength != nil {
		lo = *s.MinLength
	}
	return g.stringOfLength(s, max(lo, min(6, maxLen(s))))
}

var formatSamples = map[string]string{
	"date-time": "2026-01-15T09:30:00Z", "date": "2026-01-15", "time": "09:30:00Z", "email": "user@example.com",
	"uri": "https://example.com/", "uri-reference": "/example", "uuid": "123e4567-e89b-42d3-a456-426614174000",
	"hostname": "example.com", "ipv4": "192.0.2.1", "ipv6": "2001:db8::1", "duration": "P1D",
}

// stringOfLength makes a string of n characters s's pattern (if any) accepts: its typical
// match repeated and cut; ok is false when that does not match.
func (g *caseGen) stringOfLength(s *jsonschema.Schema, n int) (string, bool) {
	if n < 0 || n > 1<<16 {
		return "", false
	}
	seed := "sample"
	if s.Pattern != nil {
		v, ok := fromPattern(s.Pattern)
		if !ok || v == "" {
			return "", false
		}
		seed = v
	}
	runes := []rune(strings.Repeat(seed, n/utf8.RuneCountInString(seed)+1))
	v := string(runes[:n])
	if s.Pattern != nil && !s.Pattern.MatchString(v) {
		return "", false
	}
	return v, true
}

func maxLen(s *jsonschema.Schema) int {
	if s.MaxLength != nil {
		return *s.MaxLength
	}
	return 1 << 16
}

func lengthOK(s *jsonschema.Schema, v string) bool {
	n := utf8.RuneCountInString(v)
	return (s.MinLength == nil || n >= *s.MinLength) && (s.MaxLength == nil || n <= *s.MaxLength)
}

// typicalNumber is 1 moved within s's bounds.
func typicalNumber(s *jsonschema.Schema, integer bool) any {
	v := big.NewRat(1, 1)
	step := big.NewRat(1, 1)
	if !integer {
		step = big.NewRat(1, 1000)
	}
	if s.Minimum != nil && v.Cmp(s.Minimum) < 0 {
		v.Set(s.Minimum)
	}
	if s.ExclusiveMinimum != nil && v.Cmp(s.ExclusiveMinimum) <= 0 {
		v.Add(s.ExclusiveMinimum, step)
	}
	if s.Maximum != nil && v.Cmp(s.Maximum) > 0 {
		v.Set(s.Maximum)
	}
	if s.ExclusiveMaximum != nil && v.Cmp(s.ExclusiveMaximum) >= 0 {
		v.Sub(s.ExclusiveMaximum, step)
	}
	if integer && !v.IsInt() {
		// Up within a minimum, down when that passes a maximum.
		up := new(big.Int).Quo(v.Num(), v.Denom())
		up.Add(up, big.NewInt(1))
		if r := new(big.Rat).SetInt(up); (s.Maximum == nil || r.Cmp(s.Maximum) <= 0) && (s.ExclusiveMaximum == nil || r.Cmp(s.ExclusiveMaximum) < 0) {
			v.SetInt(up)
		} else {
			v.SetInt(up.Sub(up, big.NewInt(1)))
		}
	}
	return ratValue(v)
}

// ratValue is r as JSON writes it: an integer, exactly, when it is one.
func ratValue(r *big.Rat) any {
	if r.IsInt() {
		return json.Number(r.Num().String())
	}
	f, _ := r.Float64()
	return f
}

// resolve follows a schema that is only a $ref.
func resolve(s *jsonschema.Schema) *jsonschema.Schema {
	for i := 0; s != nil && s.Ref != nil && s.Types == nil && s.Properties == nil && i < 8; i++ {
		s = s.Ref
	}
	return s
}

// typesOf lists the types s allows, the most telling first; an object's properties or an
// array's items say so without a type.
func typesOf(s *jsonschema.Schema) []string {
	var out []string
	if s.Types != nil {
		all := s.Types.ToStrings()
		for _, t := range []string{"object", "array", "string", "integer", "number", "boolean", "null"} {
			if slices.Contains(all, t) {
				out = append(out, t)
			}
		}
		return out
	}
	switch {
	case s.Properties != nil || len(s.Required) > 0:
		return []string{"object"}
	case s.Items2020 != nil:
		return []string{"array"}
	case s.Pattern != nil || s.MinLength != nil || s.MaxLength != nil:
		return []string{"string"}
	case s.Minimum != nil || s.Maximum != nil:
		return []string{"number"}
	}
	return nil
}

func sortedProps(s *jsonschema.Schema) []string {
	names := make([]string, 0, len(s.Properties))
	for k := range s.Properties {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// short writes v as JSON for a case's name, cut.
func short(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 40 {
		return string(b[:40]) + "…"
	}
	return string(b)
}

// fromPattern makes a short string a pattern matches: the first branch of each alternation,
// the fewest repetitions, a plain character of each class. ok is false when what it makes does
// not match.
func fromPattern(p jsonschema.Regexp) (string, bool) {
	src := p.String()
	if own, isOwn := p.(pattern); isOwn {
		src = own.Regexp.String() // as compiled: \uXXXX written as \x{XXXX}
	}
	re, err := syntax.Parse(src, syntax.Perl)
	if err != nil {
		return "", false
	}
	var b strings.Builder
	if !writeMatch(&b, re.Simplify(), 0) || b.Len() > 4096 || !p.MatchString(b.String()) {
		return "", false
	}
	return b.String(), true
}

func writeMatch(b *strings.Builder, re *syntax.Regexp, depth int) bool {
	if depth > 64 || b.Len() > 4096 {
		return false
	}
	switch re.Op {
	case syntax.OpLiteral:
		b.WriteString(string(re.Rune))
	case syntax.OpCharClass:
		if len(re.Rune) < 2 {
			return false
		}
		b.WriteRune(plainRune(re.Rune))
	case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		b.WriteByte('a')
	case syntax.OpCapture:
		return writeMatch(b, re.Sub[0], depth+1)
	case syntax.OpPlus:
		return writeMatch(b, re.Sub[0], depth+1)
	case syntax.OpRepeat:
		for range re.Min {
			if !writeMatch(b, re.Sub[0], depth+1) {
				return false
			}
		}
	case syntax.OpConcat:
		for _, s := range re.Sub {
			if !writeMatch(b, s, depth+1) {
				return false
			}
		}
	case syntax.OpAlternate:
		return writeMatch(b, re.Sub[0], depth+1)
	case syntax.OpStar, syntax.OpQuest, syntax.OpEmptyMatch, syntax.OpBeginLine, syntax.OpEndLine,
		syntax.OpBeginText, syntax.OpEndText, syntax.OpWordBoundary, syntax.OpNoWordBoundary:
	default:
		return false
	}
	return true
}

// plainRune picks a character of a class given as ranges: a lower-case letter, a digit, an
// upper-case letter, a space or a CJK character when the class has one, its first character
// otherwise.
func plainRune(ranges []rune) rune {
	for _, want := range []rune{'a', '0', 'A', ' ', '中', '一'} {
		for i := 0; i+1 < len(ranges); i += 2 {
			if ranges[i] <= want && want <= ranges[i+1] {
				return want
			}
		}
	}
	return ranges[0]
}
