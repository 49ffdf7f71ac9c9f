package blueprint

import (
	"encoding/json"
	"os"
	"testing"
)

func FuzzParse(f *testing.F) {
	if seed, err := os.ReadFile("testdata/check_and_urge.json"); err == nil {
		f.Add(seed)
	}
	f.Add([]byte("name: t\nsteps:\n  - tool: a\n    input_mapping: {x: $.user_input.x, l: [1, '$.user_input.y']}\n    output_key: k\n    timeout: 5s\n    retry: {max_attempts: 2}\n  - parallel:\n    - {tool: b, condition: '$.k.n >= 50', output_key: m, default_value: {a: 1}}\n    fallback: {message: m}\nfallback: {step: {tool: c, input_mapping: {v: $.m}}, transfer_to: human}\n"))
	f.Add([]byte(`{"name":"n","steps":[{"tool":"a","condition":"!($.user_input.a == null) && $.user_input.b","input_mapping":{"n":1e400}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := Parse(data)
		if err != nil {
			return
		}
		if err := b.Compile(func(string) bool { return true }); err != nil {
			return
		}
		out, err := json.Marshal(b)
		if err != nil {
			t.Fatalf("a compiled blueprint does not marshal: %v", err)
		}
		back, err := Parse(out)
		if err != nil {
			t.Fatalf("%s does not parse back: %v", out, err)
		}
		if err := back.Compile(func(string) bool { return true }); err != nil {
			t.Fatalf("%s does not compile back: %v", out, err)
		}
		again, err := json.Marshal(back)
		if err != nil || string(again) != string(out) {
			t.Fatalf("round trip:\n%s\n%s", out, again)
		}
		ctx := map[string]any{UserInput: map[string]any{"a": 1.0, "b": "x", "c": []any{true, nil}}}
		for _, n := range b.Nodes() {
			steps := append([]*Step{n.Step}, n.Group...)
			for _, s := range steps {
				_, _ = s.Inputs(ctx)
				_, _ = s.Allowed(ctx)
			}
		}
	})
}

func FuzzCondition(f *testing.F) {
	for _, s := range []string{
		"($.order_data.success.status == 'created' || $.order_data.success.status == 'paid')",
		"$.user_input.n >= 50", "!$.user_input.b", `$.a == "$.b" && null != $.c['d'][0]`, "len($.a) > 1",
		"$env", "__p0 == 1", "1 < 'a'", "$.a[?@.x == 1] == 1", "-1 <= $.user_input.n", "((($.user_input.x)))",
	} {
		f.Add(s)
	}
	ctx := map[string]any{UserInput: map[string]any{"n": 50.0, "b": true, "s": "x", "l": []any{1.0}}, "order_data": nil}
	f.Fuzz(func(t *testing.T, cond string) {
		c, err := compileCondition(cond)
		if err != nil {
			return
		}
		_, _, _ = c.eval(ctx)
	})
}
