package contract_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// A contract a program builds (as the Go SDK will), schemas as JSON.
func built(t testing.TB) *contract.Compiled {
	t.Helper()
	var c contract.Contract
	if err := json.Unmarshal([]byte(`{
		"name": "pay",
		"input_schema": {"type": "object", "properties": {"amount": {"type": "number", "exclusiveMinimum": 0}}, "required": ["amount"]},
		"output_schema": {
			"success": {"type": "object", "properties": {"receipt": {"type": "string"}}, "required": ["receipt"]},
			"failure": {"error_code": {"type": "string", "enum": ["DECLINED"]}, "recovery_hint": {"type": "string"}}
		},
		"execution_policy": {"timeout_ms": 2000, "max_retries": 0, "resource_level": "H"},
		"effects": "side_effects"
	}`), &c); err != nil {
		t.Fatal(err)
	}
	k, err := contract.Compile(&c, 2, 9)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestABuiltContractChecksValuesAndFailures(t *testing.T) {
	k := built(t)
	if err := k.CheckInput([]byte(`{"amount":0}`)); err == nil || err.Error() != "amount: is 0; must be more than 0" {
		t.Errorf("amount 0: %v", err)
	}
	if v := k.CheckValue([]byte(`{"receipt":"r-1"}`)); v.Violation != "" {
		t.Error(v)
	}
	if v := k.CheckValue([]byte(`"ok"`)); v.Violation != "success: is a string, want object" {
		t.Errorf("a bare string: %+v", v)
	}
	if v := k.CheckFailure("DECLINED", "use another card"); !v.Failure || v.Code != "DECLINED" || v.Hint != "use another card" {
		t.Errorf("declined: %+v", v)
	}
	if v := k.CheckFailure("TIMEOUT_AT_BANK", ""); !strings.Contains(v.Violation, `failure.error_code: is "TIMEOUT_AT_BANK"; must be one of "DECLINED"`) {
		t.Errorf("an undeclared code: %+v", v)
	}
	if k.EffectsOrDefault() != contract.EffectsSideEffects || k.Ref().ResourceLevel != "H" {
		t.Errorf("%+v", k.Ref())
	}
	a := k.Apply(protocol.Action{TimeoutMS: 30000, Retry: protocol.RetryPolicy{MaxAttempts: 3}})
	if a.TimeoutMS != 2000 || a.Retry.MaxAttempts != 1 {
		t.Errorf("applied: %+v", a)
	}
}

func TestCompileRefusesWhatNoContractMaySay(t *testing.T) {
	for _, tc := range []struct{ json, want string }{
		{`{"name":"a b"}`, "name: "},
		{`{"name":"t","effects":"maybe"}`, "effects: must be one of"},
		{`{"name":"t","reach":{"kind":"http","timeout_ms":0}}`, "reach: "},
		{`{"name":"t","output_schema":{"failure":{"type":"object","properties":{"error_code":{"enum":["TOOL_TIMEOUT"]}}}}}`, "TOOL_TIMEOUT is one of Hermes' own codes"},
		{`{"name":"t","input_schema":{"type":"object","properties":{"a":{"$ref":"https://127.0.0.1:9/x.json"}}}}`, "leads outside the contract"},
		{`{"name":"t","input_schema":{"type":"object","minProperties":"x"}}`, "input_schema.minProperties: not valid JSON Schema"},
	} {
		var c contract.Contract
		if err := json.Unmarshal([]byte(tc.json), &c); err != nil {
			t.Fatal(err)
		}
		_, err := contract.Compile(&c, 1, 1)
		var ce *contract.Error
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want …%s…", tc.json, err, tc.want)
		}
	}
}

// Whatever a tool or a caller sends, checking it never panics and always says something.
func FuzzCheck(f *testing.F) {
	k := built(f)
	f.Add([]byte(`{"success":{"receipt":"r"}}`), true)
	f.Add([]byte(`{"failure":{"error_code":"DECLINED"}}`), false)
	f.Add([]byte(`{"amount":-1e309}`), false)
	f.Add([]byte("\xff\x00{"), true)
	f.Fuzz(func(t *testing.T, data []byte, errorStatus bool) {
		_ = k.CheckInput(data)
		v := k.CheckOutput(data, errorStatus)
		if v.Failure && v.Violation != "" {
			t.Fatalf("both a failure and a violation: %+v", v)
		}
		_ = k.CheckValue(data)
		_ = k.CheckFailure(string(data), string(data))
	})
}

func compileJSON(t *testing.T, doc string) (*contract.Compiled, error) {
	t.Helper()
	var c contract.Contract
	if err := json.Unmarshal([]byte(doc), &c); err != nil {
		t.Fatal(err)
	}
	return contract.Compile(&c, 1, 1)
}

// What a check may cost is bounded when the contract is compiled: a schema whose references
// fan out exponentially and a pattern too large are refused; a recursive schema is not.
func TestChecksHaveBoundedCost(t *testing.T) {
	var defs []string
	for i := range 24 {
		defs = append(defs, fmt.Sprintf(`"d%d":{"anyOf":[{"$ref":"#/$defs/d%d"},{"$ref":"#/$defs/d%d"}]}`, i, i+1, i+1))
	}
	defs = append(defs, `"d24":{"type":"string"}`)
	_, err := compileJSON(t, `{"name":"t","input_schema":{"type":"object","$defs":{`+strings.Join(defs, ",")+`},"properties":{"a":{"$ref":"#/$defs/d0"}}}}`)
	if err == nil || !strings.Contains(err.Error(), "subschemas to check one value") {
		t.Errorf("exponential references: %v", err)
	}
	// A recursion that checks each level's child twice.
	if _, err := compileJSON(t, `{"name":"t","input_schema":{"type":"object","$defs":{"n":{"type":"object","properties":{"c":{"allOf":[{"$ref":"#/$defs/n"},{"$ref":"#/$defs/n"}]}}}},"properties":{"root":{"$ref":"#/$defs/n"}}}}`); err == nil || !strings.Contains(err.Error(), "recursion") {
		t.Errorf("a recursion through two branches: %v", err)
	}
	// Ordinary schemas are taken: entities referring to each other, one definition shared by
	// many properties, a nullable recursion.
	var props []string
	for i := range 700 {
		props = append(props, fmt.Sprintf(`"p%d":{"$ref":"#/$defs/e"}`, i))
	}
	for _, ok := range []string{
		`{"name":"t","input_schema":{"type":"object","$defs":{"e":{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}}}},"properties":{` + strings.Join(props, ",") + `}}}`,
		`{"name":"t","input_schema":{"type":"object","$defs":{"user":{"type":"object","properties":{"team":{"$ref":"#/$defs/team"}}},"team":{"type":"object","properties":{"lead":{"$ref":"#/$defs/user"},"members":{"type":"array","items":{"$ref":"#/$defs/user"}}}}},"properties":{"u":{"$ref":"#/$defs/user"}}}}`,
		`{"name":"t","input_schema":{"type":"object","$defs":{"n":{"anyOf":[{"type":"null"},{"type":"object","properties":{"next":{"$ref":"#/$defs/n"}}}]}},"properties":{"list":{"$ref":"#/$defs/n"}}}}`,
	} {
		if _, err := compileJSON(t, ok); err != nil {
			t.Errorf("an ordinary schema refused: %v", err)
		}
	}
	tree := `{"name":"t","input_schema":{"type":"object","$defs":{"node":{"type":"object","properties":{"children":{"type":"array","items":{"$ref":"#/$defs/node"}}}}},"properties":{"root":{"$ref":"#/$defs/node"}}}}`
	k, err := compileJSON(t, tree)
	if err != nil {
		t.Fatalf("a recursive schema: %v", err)
	}
	if err := k.CheckInput([]byte(`{"root":{"children":[{"children":[]},{"children":[{"children":"x"}]}]}}`)); err == nil {
		t.Error("a recursive schema checks nothing")
	}
	if _, err := compileJSON(t, `{"name":"t","input_schema":{"type":"object","properties":{"a":{"type":"string","pattern":"[a-z]{1000}[0-9]{1000}[A-Z]{1000}x{1000}"}}}}`); err == nil || !strings.Contains(err.Error(), "too complex") {
		t.Errorf("a pattern of 4000 repeats: %v", err)
	}
	if _, err := compileJSON(t, `{"name":"t","input_schema":{"type":"object","properties":{"a":{"type":"string","pattern":"^[a-zA-Z0-9 ]{1,500}$"}}}}`); err != nil {
		t.Errorf("a common pattern refused: %v", err)
	}
	k, err = compileJSON(t, `{"name":"t","input_schema":{"type":"object","properties":{"a":{"type":"string","pattern":"^[a-z]+$"}}}}`)
	if err != nil {
		t.Fatal(err)
	}
	long := `{"a":"` + strings.Repeat("a", contract.MaxPatternInput+1) + `"}`
	if err := k.CheckInput([]byte(long)); err == nil || !strings.Contains(err.Error(), "a: is 65537 bytes long") {
		t.Errorf("a string longer than patterns are matched against: %v", err)
	}
	// Refused whatever the pattern would have said: never let through by not matching.
	k, err = compileJSON(t, `{"name":"t","input_schema":{"type":"object","properties":{"cmd":{"type":"string","not":{"pattern":"[;|&]"}}}}}`)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.CheckInput([]byte(`{"cmd":"ls; rm -rf /` + strings.Repeat(" ", contract.MaxPatternInput) + `"}`)); err == nil {
		t.Error("a long string got past a pattern it breaks")
	}
}

// An argument named as a field but for case is refused: a Go tool decoding JSON would take it
// for the field, unchecked.
func TestArgumentsNamedAsAFieldButForCaseAreRefused(t *testing.T) {
	k, err := compileJSON(t, `{"name":"t","input_schema":{"type":"object","properties":{"order_id":{"type":"string","pattern":"^ORD[0-9]{12}$"}}}}`)
	if err != nil {
		t.Fatal(err)
	}
	err = k.CheckInput([]byte(`{"order_id":"ORD000000000001","ORDER_ID":"../../etc/passwd"}`))
	if err == nil || err.Error() != "ORDER_ID: differs from the field order_id only in case" {
		t.Errorf("%v", err)
	}
}

// A failure code a contract declares by const is checked as an enum's are; and what an answer
// says is shown briefly (field names cut).
func TestFailureConstsAndLongNames(t *testing.T) {
	if _, err := compileJSON(t, `{"name":"t","output_schema":{"failure":{"type":"object","properties":{"error_code":{"const":"DEAD_LETTERED"}}}}}`); err == nil || !strings.Contains(err.Error(), "const: DEAD_LETTERED is one of Hermes' own codes") {
		t.Errorf("const: %v", err)
	}
	k, err := compileJSON(t, `{"name":"t","output_schema":{"success":{"type":"object","additionalProperties":false}}}`)
	if err != nil {
		t.Fatal(err)
	}
	v := k.CheckOutput([]byte(`{"success":{"`+strings.Repeat("k", 500)+`":1}}`), false)
	if len(v.Violation) > 200 || !strings.Contains(v.Violation, "…") {
		t.Errorf("a long name shown as %q", v.Violation)
	}
}

// An argument's schema stands alone, as InputJSONSchema shows it (the short form expanded);
// one that refers elsewhere in the schema, or that is not there, is nil.
func TestArgumentSchema(t *testing.T) {
	k, err := compileJSON(t, `{"name":"t","input_schema":{"order_id":{"type":"string","pattern":"^ORD[0-9]{12}$","required":true},"n":{"type":"integer"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(k.ArgumentSchema("order_id")); got != `{"pattern":"^ORD[0-9]{12}$","type":"string"}` {
		t.Errorf("order_id: %s", got)
	}
	if got := k.ArgumentSchema("missing"); got != nil {
		t.Errorf("missing: %s", got)
	}
	k, err = compileJSON(t, `{"name":"t","input_schema":{"type":"object","$defs":{"id":{"type":"string"}},"properties":{"id":{"$ref":"#/$defs/id"}}}}`)
	if err != nil {
		t.Fatal(err)
	}
	if got := k.ArgumentSchema("id"); got != nil {
		t.Errorf("a $ref: %s", got)
	}
	k, err = compileJSON(t, `{"name":"t"}`)
	if err != nil {
		t.Fatal(err)
	}
	if got := k.ArgumentSchema("id"); got != nil {
		t.Errorf("no input schema: %s", got)
	}
}
