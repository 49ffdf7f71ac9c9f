package contract_test

import (
	"encoding/json"
	"errors"
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
