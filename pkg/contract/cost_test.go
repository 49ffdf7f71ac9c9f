package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// compileInput compiles a contract whose input_schema is schema.
func compileInput(t testing.TB, schema string) (*Compiled, error) {
	t.Helper()
	return Compile(&Contract{Name: "t", InputSchema: json.RawMessage(schema)}, 1, 1)
}

// bombs are schemas whose recursion checks the part below each level two or more times: a
// value nested d deep takes 2^d checks or more (before checkCost counted them, 16 levels of
// the first kept a core busy for a minute and a half).
var bombs = []struct{ name, schema, where string }{
	{"if/then/else", `{"type":"object","$defs":{"n":{"type":"object",
		"if":{"properties":{"c":{"$ref":"#/$defs/n"}}},
		"then":{"properties":{"c":{"$ref":"#/$defs/n"}}},
		"else":{"properties":{"c":{"$ref":"#/$defs/n"}}}}},
		"properties":{"x":{"$ref":"#/$defs/n"}}}`, "#/$defs/n"},
	{"items and contains", `{"type":"object","$defs":{"n":{"type":"array",
		"items":{"$ref":"#/$defs/n"},"contains":{"$ref":"#/$defs/n"}}},
		"properties":{"x":{"$ref":"#/$defs/n"}}}`, "#/$defs/n"},
	{"properties and patternProperties", `{"type":"object","$defs":{"n":{"type":"object",
		"properties":{"c":{"$ref":"#/$defs/n"}},"patternProperties":{"^c":{"$ref":"#/$defs/n"}}}},
		"properties":{"x":{"$ref":"#/$defs/n"}}}`, "#/$defs/n"},
	{"dependentSchemas", `{"type":"object","$defs":{"n":{"type":"object",
		"properties":{"c":{"$ref":"#/$defs/n"}},
		"dependentSchemas":{"c":{"properties":{"c":{"$ref":"#/$defs/n"}}}}}},
		"properties":{"x":{"$ref":"#/$defs/n"}}}`, "#/$defs/n"},
}

// nested is {"x": v}, v d levels of {"c": …} ([…] when array).
func nested(d int, array bool) string {
	open, inner, end := `{"c":`, `{}`, `}`
	if array {
		open, inner, end = `[`, `[]`, `]`
	}
	return `{"x":` + strings.Repeat(open, d) + inner + strings.Repeat(end, d) + `}`
}

func TestSchemaBombsAreRefused(t *testing.T) {
	for _, b := range bombs {
		_, err := compileInput(t, b.schema)
		var ce *Error
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "recursion") || !strings.Contains(err.Error(), b.where) {
			t.Errorf("%s: %v, want a recursion refused at %s", b.name, err, b.where)
		}
	}
}

// What else cannot be bounded is refused, naming where.
func TestCompileRefusesUnboundedSchemas(t *testing.T) {
	var fan []string
	for i := range 200 {
		fan = append(fan, fmt.Sprintf(`"p%d":{"$ref":"#/$defs/e"}`, i))
	}
	for _, tc := range []struct{ name, schema, want string }{
		{"a loop on one value", `{"type":"object","$defs":{"a":{"allOf":[{"$ref":"#/$defs/b"}]},"b":{"anyOf":[{"type":"null"},{"$ref":"#/$defs/a"}]}},"properties":{"x":{"$ref":"#/$defs/a"}}}`,
			"a loop"},
		{"a recursion through allOf twice", `{"type":"object","$defs":{"n":{"type":"object","properties":{"c":{"allOf":[{"$ref":"#/$defs/n"},{"$ref":"#/$defs/n"}]}}}},"properties":{"x":{"$ref":"#/$defs/n"}}}`,
			"recursion comes back to #/$defs/n through 2 subschemas"},
		{"a recursion through oneOf's branches, each with the same property", `{"type":"object","$defs":{"n":{"oneOf":[
			{"properties":{"kind":{"const":"a"},"next":{"$ref":"#/$defs/n"}}},
			{"properties":{"kind":{"const":"b"},"next":{"$ref":"#/$defs/n"}}}]}},"properties":{"x":{"$ref":"#/$defs/n"}}}`,
			"recursion comes back"},
		{"a recursion through a mutual reference", `{"type":"object","$defs":{"a":{"properties":{"c":{"$ref":"#/$defs/b"}}},"b":{"allOf":[{"$ref":"#/$defs/a"}],"additionalProperties":{"$ref":"#/$defs/a"}}},"properties":{"x":{"$ref":"#/$defs/a"}}}`,
			"recursion comes back"},
		{"additional properties of one, a pattern of another", `{"type":"object","$defs":{"n":{"allOf":[{"additionalProperties":{"$ref":"#/$defs/n"}},{"patternProperties":{"^k":{"$ref":"#/$defs/n"}}}]}},"properties":{"x":{"$ref":"#/$defs/n"}}}`,
			"recursion comes back"},
		{"prefixItems and contains", `{"type":"object","$defs":{"n":{"type":"array","prefixItems":[{"$ref":"#/$defs/n"}],"contains":{"$ref":"#/$defs/n"}}},"properties":{"x":{"$ref":"#/$defs/n"}}}`,
			"recursion comes back"},
		{"a fan-out", `{"type":"object","$defs":{"e":{"anyOf":[` + strings.Repeat(`{"type":"string"},`, 300) + `{"type":"null"}]}},"properties":{` + strings.Join(fan, ",") + `},"additionalProperties":{"allOf":[` + strings.TrimSuffix(strings.Repeat(`{"$ref":"#/$defs/e"},`, 100), ",") + `]}}`,
			"subschemas to check one value"},
		{"$dynamicRef", `{"type":"object","$dynamicAnchor":"node","properties":{"c":{"$dynamicRef":"#node"}}}`,
			"$dynamicRef at #/properties/c"},
	} {
		_, err := compileInput(t, tc.schema)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want …%s…", tc.name, err, tc.want)
		}
	}
}

// A recursion through one subschema per part costs in proportion to the value: taken, and a
// value as deep as a check goes passes.
func TestRecursiveSchemasAreTaken(t *testing.T) {
	for _, tc := range []struct{ name, schema, value string }{
		{"a tree", `{"type":"object","$defs":{"node":{"properties":{"children":{"items":{"$ref":"#/$defs/node"}}}}},"properties":{"root":{"$ref":"#/$defs/node"}}}`,
			`{"root":` + strings.Repeat(`{"children":[{"children":[]},`, 60) + `{}` + strings.Repeat(`]}`, 60) + `}`},
		{"a nullable linked list", `{"type":"object","$defs":{"n":{"anyOf":[{"type":"null"},{"type":"object","properties":{"v":{"type":"integer"},"next":{"$ref":"#/$defs/n"}},"required":["v","next"]}]}},"properties":{"list":{"$ref":"#/$defs/n"}}}`,
			`{"list":` + strings.Repeat(`{"v":1,"next":`, MaxCheckDepth-1) + `null` + strings.Repeat(`}`, MaxCheckDepth-1) + `}`},
		{"a discriminated union through if and then", `{"type":"object","$defs":{"e":{"type":"object",
			"if":{"properties":{"op":{"const":"not"}}},"then":{"properties":{"arg":{"$ref":"#/$defs/e"}}},
			"else":{"properties":{"left":{"$ref":"#/$defs/e"},"right":{"$ref":"#/$defs/e"}}}}},"properties":{"expr":{"$ref":"#/$defs/e"}}}`,
			`{"expr":{"op":"and","left":{"op":"not","arg":{"op":"x"}},"right":{"op":"y"}}}`},
		{"a map of nodes with a named child", `{"type":"object","$defs":{"n":{"type":"object","properties":{"self":{"$ref":"#/$defs/n"}},"additionalProperties":{"$ref":"#/$defs/n"}}},"properties":{"x":{"$ref":"#/$defs/n"}}}`,
			`{"x":{"self":{"a":{"b":{}}},"c":{"self":{}}}}`},
		{"an array of pairs", `{"type":"object","$defs":{"p":{"type":"array","prefixItems":[{"type":"string"},{"$ref":"#/$defs/p"}],"items":false}},"properties":{"x":{"$ref":"#/$defs/p"}}}`,
			`{"x":["a",["b",["c"]]]}`},
	} {
		k, err := compileInput(t, tc.schema)
		if err != nil {
			t.Errorf("%s: refused: %v", tc.name, err)
			continue
		}
		if err := k.CheckInput([]byte(tc.value)); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// A value too large for an accepted schema is refused before it is checked, as bad
// arguments naming the bound: too many steps, or too deep.
func TestChecksRefuseWhatWouldCostTooMuch(t *testing.T) {
	var enum []string
	for i := range 100 {
		enum = append(enum, fmt.Sprint(i+1))
	}
	k, err := compileInput(t, `{"type":"object","properties":{"a":{"type":"array","items":{"enum":[`+strings.Join(enum, ",")+`]}}}}`)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.CheckInput([]byte(`{"a":[1,2,3]}`)); err != nil {
		t.Errorf("a small value: %v", err)
	}
	// Each item is compared with a hundred numbers, each comparison reading both as exact
	// rationals: some second of a core, before the bound.
	items := strings.TrimSuffix(strings.Repeat("0,", 5000), ",")
	err = k.CheckInput([]byte(`{"a":[` + items + `]}`))
	var ae *ArgumentsError
	if !errors.As(err, &ae) || err.Error() != "(the arguments): checking it would take more than 10000000 schema steps, more than one check may take (contract.MaxCheckSteps)" {
		t.Errorf("5000 items against an enum of 100 numbers: %v", err)
	}
	if v := (&Compiled{Contract: &Contract{Name: "t"}, plain: k.input}).CheckValue([]byte(`{"a":[` + items + `]}`)); !strings.Contains(v.Violation, "(the answer): checking it would take more than 10000000 schema steps") {
		t.Errorf("an answer as large: %+v", v)
	}
	tree, err := compileInput(t, `{"type":"object","$defs":{"n":{"type":"object","properties":{"c":{"$ref":"#/$defs/n"}}}},"properties":{"x":{"$ref":"#/$defs/n"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	if err := tree.CheckInput([]byte(nested(MaxCheckDepth-1, false))); err != nil {
		t.Errorf("%d levels: %v", MaxCheckDepth, err)
	}
	if err := tree.CheckInput([]byte(nested(MaxCheckDepth, false))); err == nil || !strings.Contains(err.Error(), "nested more than 128 levels deep where the schema checks it, deeper than a check goes (contract.MaxCheckDepth)") {
		t.Errorf("%d levels: %v", MaxCheckDepth+1, err)
	}
	// Where no subschema goes, depth costs nothing.
	if err := tree.CheckInput([]byte(`{"y":` + strings.Repeat("[", 1000) + strings.Repeat("]", 1000) + `}`)); err != nil {
		t.Errorf("a deep value the schema does not look into: %v", err)
	}
}

// countingCompiler compiles schemas as compileSchema does, and counts the subschemas
// (objects) the validator applies.
func countingCompiler(applied *atomic.Int64) *jsonschema.Compiler {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noLoader{})
	c.UseRegexpEngine(ecmaRegexp)
	c.RegisterVocabulary(&jsonschema.Vocabulary{
		URL: "hermes:///test/count",
		Compile: func(*jsonschema.CompilerContext, map[string]any) (jsonschema.SchemaExt, error) {
			return counter{applied}, nil
		},
	})
	c.AssertVocabs()
	return c
}

type counter struct{ n *atomic.Int64 }

func (c counter) Validate(*jsonschema.ValidatorContext, any) { c.n.Add(1) }

// FuzzSchemaCost builds schemas (from a grammar of applicators, or as given when the bytes
// are a JSON object) and values, and checks the bound: a schema Compile accepts is checked
// within the steps counted for it (the validator applies no more subschemas than the plan
// counts), and quickly.
func FuzzSchemaCost(f *testing.F) {
	for _, b := range bombs {
		f.Add([]byte(b.schema), []byte(nested(12, b.name == "items and contains")))
	}
	f.Add([]byte(`{"type":"object","$defs":{"node":{"properties":{"children":{"items":{"$ref":"#/$defs/node"}}}}},"properties":{"root":{"$ref":"#/$defs/node"}}}`),
		[]byte(`{"root":{"children":[{"children":[]},{"children":[{}]}]}}`))
	f.Add([]byte{0x13, 0x57, 0x9b, 0xdf, 0x24, 0x68, 0xac, 0xe0, 0x11, 0x22, 0x33}, []byte{7, 3, 1, 4, 1, 5, 9, 2, 6})
	f.Fuzz(func(t *testing.T, schemaBytes, valueBytes []byte) {
		doc := genSchema(schemaBytes)
		if doc == nil {
			return
		}
		raw, _ := json.Marshal(doc)
		k, err := compileInput(t, string(raw))
		if err != nil || k.input == nil {
			return
		}
		var v any
		if err := json.Unmarshal(valueBytes, &v); err != nil || !isObject(v) {
			v = genValue(valueBytes)
		}
		v, _ = jsonschema.UnmarshalJSON(strings.NewReader(mustJSON(v)))
		steps, err := k.input.plan.checkSteps(v, saturated)
		if err != nil || steps > MaxCheckSteps {
			// Too deep, or too many steps: the check refuses it without running the validator.
			start := time.Now()
			if err := k.CheckInput([]byte(mustJSON(v))); err == nil || time.Since(start) > 2*time.Second {
				t.Fatalf("%d steps (%v), refused in %v as %v", steps, err, time.Since(start), err)
			}
			return
		}
		var applied atomic.Int64
		c := countingCompiler(&applied)
		if err := c.AddResource("hermes:///fuzz.json", doc); err != nil {
			t.Fatal(err)
		}
		s, err := c.Compile("hermes:///fuzz.json")
		if err != nil {
			t.Fatalf("compiles as a contract, not with the counter: %v", err)
		}
		start := time.Now()
		_ = s.Validate(v)
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("%d steps counted, checked in %v: %s", steps, took, raw)
		}
		if n := applied.Load(); n*applySteps > steps {
			t.Fatalf("%d subschemas applied, %d steps counted (%d applications at most): %s against %s", n, steps, steps/applySteps, raw, mustJSON(v))
		}
		start = time.Now()
		_ = k.CheckInput([]byte(mustJSON(v)))
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("checked in %v: %s", took, raw)
		}
	})
}

func isObject(v any) bool { _, ok := v.(map[string]any); return ok }

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// gen reads choices from fuzz bytes (zeros once they run out).
type gen struct {
	b []byte
	i int
}

func (g *gen) next(n int) int {
	if g.i >= len(g.b) || n <= 0 {
		g.i++
		return 0
	}
	c := int(g.b[g.i]) % n
	g.i++
	return c
}

var (
	genNames    = []string{"a", "b", "c", "ab"}
	genPatterns = []string{"^a", "b", ".", "^c$"}
	genRefs     = []string{"#/$defs/d0", "#/$defs/d1", "#/$defs/d2", "#"}
	genTypes    = []string{"object", "array", "string", "integer", "null"}
)

// genSchema is b as a schema: b itself when it is a JSON object, else a root with $defs d0 to
// d2 (which may refer to themselves and to each other) built from b.
func genSchema(b []byte) map[string]any {
	var doc map[string]any
	if json.Unmarshal(b, &doc) == nil && doc != nil {
		if _, ok := doc["type"]; !ok {
			doc["type"] = []any{"object", "array", "string", "integer", "null", "boolean"}
		}
		return doc
	}
	g := &gen{b: b}
	doc = g.schema(3)
	doc["$defs"] = map[string]any{"d0": g.schema(3), "d1": g.schema(3), "d2": g.schema(2)}
	doc["type"] = []any{"object", "array", "string", "integer", "null", "boolean"}
	return doc
}

func (g *gen) sub(depth int) any {
	if depth <= 0 || g.next(4) == 0 {
		if g.next(3) == 0 {
			return map[string]any{"type": genTypes[g.next(len(genTypes))]}
		}
		return map[string]any{"$ref": genRefs[g.next(len(genRefs))]}
	}
	return g.schema(depth - 1)
}

func (g *gen) subs(depth int) []any {
	out := make([]any, 1+g.next(3))
	for i := range out {
		out[i] = g.sub(depth)
	}
	return out
}

func (g *gen) schema(depth int) map[string]any {
	s := map[string]any{}
	for range 1 + g.next(4) {
		switch g.next(18) {
		case 0:
			props := map[string]any{}
			for range 1 + g.next(3) {
				props[genNames[g.next(len(genNames))]] = g.sub(depth)
			}
			s["properties"] = props
		case 1:
			s["patternProperties"] = map[string]any{genPatterns[g.next(len(genPatterns))]: g.sub(depth)}
		case 2:
			s["additionalProperties"] = g.sub(depth)
		case 3:
			s["items"] = g.sub(depth)
		case 4:
			s["prefixItems"] = g.subs(depth)
		case 5:
			s["contains"] = g.sub(depth)
		case 6:
			s["allOf"] = g.subs(depth)
		case 7:
			s["anyOf"] = g.subs(depth)
		case 8:
			s["oneOf"] = g.subs(depth)
		case 9:
			s["not"] = g.sub(depth)
		case 10:
			s["if"], s["then"], s["else"] = g.sub(depth), g.sub(depth), g.sub(depth)
		case 11:
			s["dependentSchemas"] = map[string]any{genNames[g.next(len(genNames))]: g.sub(depth)}
		case 12:
			s["$ref"] = genRefs[g.next(len(genRefs))]
		case 13:
			s["unevaluatedProperties"] = g.sub(depth)
		case 14:
			s["unevaluatedItems"] = g.sub(depth)
		case 15:
			s["propertyNames"] = map[string]any{"maxLength": 3}
		case 16:
			s["enum"] = []any{1, "a", map[string]any{"a": 1}, []any{1, 2}}
			s["uniqueItems"] = true
		case 17:
			s["type"] = genTypes[g.next(len(genTypes))]
			s["minimum"] = 0
		}
	}
	return s
}

// genValue is b as a value: an object, often nested deep along one name.
func genValue(b []byte) map[string]any {
	g := &gen{b: b}
	v := map[string]any{}
	for range g.next(4) {
		v[genNames[g.next(len(genNames))]] = g.value(5)
	}
	deep := any(map[string]any{})
	name := genNames[g.next(len(genNames))]
	for range 4 + g.next(24) {
		if g.next(3) == 0 {
			deep = []any{deep, g.value(1)}
		} else {
			deep = map[string]any{name: deep, "b": 1}
		}
	}
	v[genNames[g.next(len(genNames))]] = deep
	return v
}

func (g *gen) value(depth int) any {
	kind := g.next(6)
	if depth <= 0 {
		kind %= 3
	}
	switch kind {
	case 0:
		return genNames[g.next(len(genNames))]
	case 1:
		return g.next(5) - 1
	case 2:
		return nil
	case 3, 4:
		m := map[string]any{}
		for range g.next(4) {
			m[genNames[g.next(len(genNames))]] = g.value(depth - 1)
		}
		return m
	}
	a := make([]any, g.next(4))
	for i := range a {
		a[i] = g.value(depth - 1)
	}
	return a
}

func BenchmarkCheckSteps(b *testing.B) {
	k, err := compileInput(b, `{"type":"object","properties":{"a":{"type":"array","items":{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer","minimum":0},"c":{"type":"boolean"}},"required":["a"]}}}}`)
	if err != nil {
		b.Fatal(err)
	}
	v, _ := jsonschema.UnmarshalJSON(strings.NewReader(`{"a":[` + strings.TrimSuffix(strings.Repeat(`{"a":"x","b":1,"c":true,"d":null},`, 10000), ",") + `]}`))
	b.Run("count", func(b *testing.B) {
		for b.Loop() {
			_, _ = k.input.plan.checkSteps(v, MaxCheckSteps)
		}
	})
	b.Run("validate", func(b *testing.B) {
		for b.Loop() {
			_ = k.input.s.Validate(v)
		}
	})
}

// BenchmarkCheckCost is what compiling a large schema's cost takes.
func BenchmarkCheckCost(b *testing.B) {
	var props []string
	for i := range 700 {
		props = append(props, fmt.Sprintf(`"p%d":{"$ref":"#/$defs/e"}`, i))
	}
	schema := `{"type":"object","$defs":{"e":{"type":"object","properties":{"a":{"type":"string"},"next":{"$ref":"#/$defs/e"},"all":{"type":"array","items":{"$ref":"#/$defs/e"}}}}},"properties":{` + strings.Join(props, ",") + `}}`
	for b.Loop() {
		if _, err := compileInput(b, schema); err != nil {
			b.Fatal(err)
		}
	}
}
