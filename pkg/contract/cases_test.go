package contract_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/contract"
)

// The cases the sandbox tries: valid ones the contract accepts, boundary values at the edges
// of each field, invalid ones it refuses — and each is what it says it is.
func TestCasesComeFromTheInputSchema(t *testing.T) {
	k, err := compileJSON(t, `{"name": "order_query",
		"input_schema": {"order_id": {"type": "string", "required": true, "pattern": "^ORD[0-9]{12}$"}},
		"output_schema": {"success": {"type": "object"}, "failure": {"type": "object", "properties": {"error_code": {"type": "string", "enum": ["ORDER_NOT_FOUND"]}}}}}`)
	if err != nil {
		t.Fatal(err)
	}
	cases := k.Cases()
	byName := map[string]contract.Case{}
	for _, c := range cases {
		byName[c.Name] = c
		valid := k.CheckInput(c.Arguments) == nil
		if valid != (c.Kind != contract.CaseInvalid) {
			t.Errorf("case %q (%s) %s: CheckInput says valid=%v", c.Name, c.Kind, c.Arguments, valid)
		}
	}
	if c, ok := byName["typical arguments, required fields only"]; !ok || string(c.Arguments) != `{"order_id":"ORD000000000000"}` {
		t.Errorf("typical case: %+v (all: %s)", c, names(cases))
	}
	for _, want := range []string{"order_id missing", `order_id = "INVALID-!" (off its pattern)`, "order_id of the wrong type (12345)"} {
		if _, ok := byName[want]; !ok {
			t.Errorf("no case %q; cases: %s", want, names(cases))
		}
	}

	// The seed's payment story: amount 0 is tried at the edge.
	k, err = compileJSON(t, `{"name": "pay", "effects": "side_effects",
		"input_schema": {"type": "object", "required": ["amount", "currency"], "additionalProperties": false, "properties": {
			"amount": {"type": "number", "minimum": 0, "maximum": 50000},
			"currency": {"type": "string", "enum": ["CNY", "USD"]},
			"note": {"type": "string", "maxLength": 8}}}}`)
	if err != nil {
		t.Fatal(err)
	}
	cases = k.Cases()
	var got []string
	for _, c := range cases {
		got = append(got, string(c.Kind)+" "+c.Name+" "+string(c.Arguments))
		if valid := k.CheckInput(c.Arguments) == nil; valid != (c.Kind != contract.CaseInvalid) {
			t.Errorf("case %q: CheckInput says valid=%v", c.Name, valid)
		}
	}
	all := strings.Join(got, "\n")
	for _, want := range []string{
		`boundary amount at its minimum 0 {"amount":0,"currency":"CNY","note":"sample"}`,
		`boundary amount at its maximum 50000`,
		`boundary currency = "USD" (of its enum)`,
		`boundary note at its max length 8 {"amount":1,"currency":"CNY","note":"samplesa"}`,
		`invalid amount below its minimum (-1)`,
		`invalid currency = "CNY " (not in its enum)`,
		`invalid note longer than its max length 8`,
		`invalid an unknown field`,
		`invalid no arguments {}`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no case %q; cases:\n%s", want, all)
		}
	}
	if len(cases) > contract.MaxCases {
		t.Errorf("%d cases; at most %d", len(cases), contract.MaxCases)
	}
}

func names(cases []contract.Case) string {
	b, _ := json.Marshal(cases)
	return string(b)
}

// Patterns give strings they match, or nothing when they cannot be followed.
func TestCasesFollowPatterns(t *testing.T) {
	for pattern, want := range map[string]string{
		`^ORD[0-9]{12}$`:             `"ORD000000000000"`,
		`^(sms|email)-[a-z]+\d{2,}$`: `"sms-a00"`,
		`^[A-Z]{2}_x?y*$`:            `"AA_"`,
	} {
		k, err := compileJSON(t, `{"name": "t", "input_schema": {"type": "object", "required": ["v"], "properties": {"v": {"type": "string", "pattern": `+jsonQuote(pattern)+`}}}}`)
		if err != nil {
			t.Fatal(err)
		}
		c := k.Cases()
		if len(c) == 0 || c[0].Kind != contract.CaseValid || !strings.Contains(string(c[0].Arguments), want) {
			t.Errorf("pattern %s: first case %+v; want v = %s", pattern, c, want)
		}
	}
}

func jsonQuote(s string) string { b, _ := json.Marshal(s); return string(b) }

// Whatever an input schema says, making cases from it ends, stays small and never mislabels a
// case.
func FuzzCases(f *testing.F) {
	f.Add(`{"order_id":{"type":"string","required":true,"pattern":"^ORD[0-9]{12}$"}}`)
	f.Add(`{"type":"object","required":["a"],"properties":{"a":{"type":"array","minItems":3,"maxItems":5,"items":{"$ref":"#"}}}}`)
	f.Add(`{"type":"object","properties":{"n":{"type":"number","exclusiveMinimum":0.5,"maximum":1e300}}}`)
	f.Add(`{"type":"object","properties":{"s":{"type":"string","pattern":"(a|b){50}[^a-z]+\\d{3,}","minLength":3000}}}`)
	f.Fuzz(func(t *testing.T, schema string) {
		var c contract.Contract
		c.Name = "t"
		c.InputSchema = json.RawMessage(schema)
		if !json.Valid(c.InputSchema) {
			return
		}
		k, err := contract.Compile(&c, 1, 1)
		if err != nil {
			return
		}
		cases := k.Cases()
		if len(cases) > contract.MaxCases {
			t.Fatalf("%d cases", len(cases))
		}
		for _, cs := range cases {
			if valid := k.CheckInput(cs.Arguments) == nil; valid != (cs.Kind != contract.CaseInvalid) {
				t.Fatalf("case %q (%s) %s: valid=%v", cs.Name, cs.Kind, cs.Arguments, valid)
			}
		}
	})
}

// What the review found the generator missing: a pattern with a minimum length, a pattern
// written for Chinese text (\uXXXX), an integer minimum that is not whole, a huge integer bound.
func TestCasesReachHardSchemas(t *testing.T) {
	for _, tc := range []struct{ schema, want string }{
		{`{"type":"object","required":["p"],"properties":{"p":{"type":"string","pattern":"^1[0-9]+$","minLength":11,"maxLength":11}}}`, `{"p":"10101010101"}`},
		{`{"type":"object","required":["name"],"properties":{"name":{"type":"string","pattern":"^[\\u4e00-\\u9fa5]{2,4}$"}}}`, `{"name":"中中"}`},
		{`{"type":"object","required":["n"],"properties":{"n":{"type":"integer","minimum":1.5,"maximum":9}}}`, `{"n":2}`},
		{`{"type":"object","required":["n"],"properties":{"n":{"type":"integer","minimum":100000000000000000000000}}}`, `{"n":100000000000000000000000}`},
	} {
		k, err := compileJSON(t, `{"name":"t","input_schema":`+tc.schema+`}`)
		if err != nil {
			t.Fatal(err)
		}
		cases := k.Cases()
		if len(cases) == 0 || cases[0].Kind != contract.CaseValid || string(cases[0].Arguments) != tc.want {
			t.Errorf("%s: %s; want first %s", tc.schema, names(cases), tc.want)
		}
	}
}
