package registry_test

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

func seed(t testing.TB) *contract.Compiled {
	t.Helper()
	data, err := os.ReadFile("testdata/contract-order-query.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := registry.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	k, err := contract.Compile(c, 3, 17)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The seed's contract (seed 003 §3.2, ../shared/seed-examples) loads as written: short-form
// input, success and failure schemas, its execution policy.
func TestTheSeedContractLoadsUnchanged(t *testing.T) {
	t.Parallel()
	k := seed(t)
	if k.Name != "order_query" || !strings.HasPrefix(k.Description, "查询订单详情") || !k.Shaped() {
		t.Fatalf("%+v", k.Contract)
	}
	p := k.ExecutionPolicy
	if p == nil || p.TimeoutMS != 800 || p.MaxRetries == nil || *p.MaxRetries != 1 || p.ResourceLevel != "M" {
		t.Fatalf("policy %+v", p)
	}
	if k.EffectsOrDefault() != contract.EffectsIdempotent || k.Reach != nil {
		t.Fatalf("effects %q reach %+v", k.Effects, k.Reach)
	}
	ref := k.Ref()
	if ref.Name != "order_query" || ref.Version != 3 || ref.Revision != 17 || ref.ResourceLevel != "M" || ref.Effects != "idempotent" {
		t.Fatalf("ref %+v", ref)
	}
	// Kept as written, in the order written.
	if !strings.HasPrefix(string(k.InputSchema), `{"order_id":{"type":"string","required":true,"pattern":"^ORD[0-9]{12}$"`) {
		t.Fatalf("input schema %s", k.InputSchema)
	}
}

func TestArgumentsAreChecked(t *testing.T) {
	t.Parallel()
	k := seed(t)
	for _, tc := range []struct{ args, want string }{
		{`{"order_id":"ORD202603160042"}`, ""},
		{`{"order_id":"ORD123"}`, "order_id: does not match ^ORD[0-9]{12}$"},
		{`{"order_id":"ORD-20260316-0042"}`, "order_id: does not match ^ORD[0-9]{12}$"},
		{`{}`, "order_id: is required"},
		{``, "order_id: is required"},
		{`{"order_id":7}`, "order_id: is a number, want string"},
		{`{"order_id":"ORD202603160042","orderId":"x"}`, "orderId: is not a field the contract names"},
		{`[1]`, "(the arguments): is an array, want object"},
	} {
		err := k.CheckInput([]byte(tc.args))
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.args, err)
			}
			continue
		}
		var ae *contract.ArgumentsError
		if !errors.As(err, &ae) || ae.Error() != tc.want {
			t.Errorf("%s: got %v, want %s", tc.args, err, tc.want)
			continue
		}
		if !strings.Contains(ae.Hint, "call order_query again") {
			t.Errorf("%s: hint %q", tc.args, ae.Hint)
		}
	}
	// The field's description helps the caller fix it.
	err := k.CheckInput([]byte(`{"order_id":"x"}`))
	if ae := (*contract.ArgumentsError)(nil); !errors.As(err, &ae) || !strings.Contains(ae.Hint, "15位订单号，以ORD开头") {
		t.Errorf("hint: %v", err)
	}
}

func TestShortAndFullSchemas(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, doc  string
		good, bad  string
		badProblem string
	}{
		{"short form rules", `
name: book
input_schema:
  room: {type: string, required: true, enum: [A, B], description: the room}
  people: {type: integer, minimum: 1, maximum: 12}
  title: {type: string, min_length: 2, max_length: 5}
`, `{"room":"A","people":3,"title":"abc"}`, `{"room":"C","people":13,"title":"a"}`,
			`people: is 13; at most 12; room: is "C"; must be one of "A", "B"; title: is 1 characters long; at least 2`},
		{"a field named type", `
name: t
input_schema:
  type: {type: string, required: true}
`, `{"type":"x"}`, `{}`, "type: is required"},
		{"full JSON Schema with local refs", `
name: full
input_schema:
  type: object
  $defs:
    id: {type: string, pattern: "^[a-z]+$"}
  properties:
    id: {$ref: "#/$defs/id"}
  required: [id]
`, `{"id":"abc","other":1}`, `{"id":"ABC"}`, "id: does not match ^[a-z]+$"},
		{"Chinese ranges as the seeds write them", `
name: zh
input_schema:
  name: {type: string, pattern: "^[\\u4e00-\\u9fa5]{2,4}$"}
`, `{"name":"王五"}`, `{"name":"wang"}`, `name: does not match ^[\u4e00-\u9fa5]{2,4}$`},
		{"JSON", `{"name":"j","input_schema":{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"n":{"type":"integer"}}}}`,
			`{"n":1}`, `{"n":1.5}`, "n: is a number, want integer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := registry.Parse([]byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			k, err := contract.Compile(c, 1, 1)
			if err != nil {
				t.Fatal(err)
			}
			if err := k.CheckInput([]byte(tc.good)); err != nil {
				t.Errorf("good %s: %v", tc.good, err)
			}
			if err := k.CheckInput([]byte(tc.bad)); err == nil || err.Error() != tc.badProblem {
				t.Errorf("bad %s: %v, want %s", tc.bad, err, tc.badProblem)
			}
		})
	}
}

// Answers are the seed's shape, checked exactly: the seed's refused tool answered
// "ORDER_NOT_FOUND " with a trailing space.
func TestAnswersAreCheckedExactly(t *testing.T) {
	t.Parallel()
	k := seed(t)
	for _, tc := range []struct {
		answer      string
		errorStatus bool
		violation   string
		code, hint  string
	}{
		{`{"success":{"order_id":"ORD202603160042","status":"paid","items":[{"sku":"a"}]}}`, false, "", "", ""},
		{`{"failure":{"error_code":"ORDER_NOT_FOUND","recovery_hint":"check the id"}}`, false, "", "ORDER_NOT_FOUND", "check the id"},
		{`{"failure":{"error_code":"SERVICE_UNAVAILABLE"}}`, true, "", "SERVICE_UNAVAILABLE", ""},
		{`{"failure":{"error_code":"ORDER_NOT_FOUND ","recovery_hint":"x"}}`, false, `failure.error_code: is "ORDER_NOT_FOUND "; must be one of "ORDER_NOT_FOUND", "INVALID_ORDER_ID", "SERVICE_UNAVAILABLE"`, "", ""},
		{`{"success":{"status":"lost"}}`, false, `success.status: is "lost"; must be one of`, "", ""},
		{`{"success":{"status":"paid"}}`, true, "a success answer came with an error status", "", ""},
		{`"Internal Server Error"`, true, "", "", ""}, // not the tool's answer: the executor's verdict stands
		{`"Internal Server Error"`, false, `the answer must be {"success": …} or {"failure"`, "", ""},
		{`{"order_id":"ORD202603160042"}`, false, `got an object with order_id`, "", ""},
		{`{"success":{},"failure":{}}`, false, `got an object with failure, success`, "", ""},
		{`{"failure":{"recovery_hint":"x"}}`, false, "failure.error_code: is required", "", ""},
		{`not json`, false, "the answer is not JSON", "", ""},
	} {
		v := k.CheckOutput([]byte(tc.answer), tc.errorStatus)
		if !strings.Contains(v.Violation, tc.violation) || (tc.violation == "") != (v.Violation == "") {
			t.Errorf("%s: violation %q, want %q", tc.answer, v.Violation, tc.violation)
		}
		if v.Code != tc.code || v.Hint != tc.hint || v.Failure != (tc.code != "") {
			t.Errorf("%s: %+v", tc.answer, v)
		}
	}
	// A failure schema of its own still never lets a tool pass for Hermes.
	c, err := registry.Parse([]byte("name: t\noutput_schema:\n  failure: {type: object}\n"))
	if err != nil {
		t.Fatal(err)
	}
	k2, _ := contract.Compile(c, 1, 1)
	if v := k2.CheckOutput([]byte(`{"failure":{"error_code":"NO_ROUTE"}}`), false); !strings.Contains(v.Violation, "Hermes' own codes") {
		t.Errorf("NO_ROUTE from a tool: %+v", v)
	}
	if v := k2.CheckOutput([]byte(`{"failure":{"error_code":"not a code"}}`), false); !strings.Contains(v.Violation, "is not an error code") {
		t.Errorf("a code of spaces: %+v", v)
	}
}

func TestPlainOutputSchemas(t *testing.T) {
	t.Parallel()
	c, err := registry.Parse([]byte("name: t\noutput_schema:\n  type: object\n  required: [temp]\n  properties:\n    temp: {type: number}\n"))
	if err != nil {
		t.Fatal(err)
	}
	k, _ := contract.Compile(c, 1, 1)
	if k.Shaped() {
		t.Fatal("a plain schema read as shaped")
	}
	if v := k.CheckOutput([]byte(`{"temp":21.5}`), false); v.Violation != "" {
		t.Error(v)
	}
	if v := k.CheckOutput([]byte(`{"temp":"warm"}`), false); v.Violation != "temp: is a string, want number" {
		t.Error(v)
	}
	// Under an error status a plain contract leaves the verdict to the executor.
	if v := k.CheckOutput([]byte(`{"error":"down"}`), true); v.Violation != "" || v.Failure {
		t.Error(v)
	}
}

func TestExecutionPolicyTheStricterWins(t *testing.T) {
	t.Parallel()
	k := seed(t) // timeout_ms 800, max_retries 1
	route := protocol.Action{TimeoutMS: 5000, Retry: protocol.RetryPolicy{MaxAttempts: 4}}
	if a := k.Apply(route); a.TimeoutMS != 800 || a.Retry.MaxAttempts != 2 {
		t.Errorf("route 5000 ms × 4: %+v", a)
	}
	route = protocol.Action{TimeoutMS: 300, Retry: protocol.RetryPolicy{MaxAttempts: 1}}
	if a := k.Apply(route); a.TimeoutMS != 300 || a.Retry.MaxAttempts != 1 {
		t.Errorf("route 300 ms × 1: %+v", a)
	}
}

func TestAContractMayNameItsReach(t *testing.T) {
	t.Parallel()
	c, err := registry.Parse([]byte(`
name: weather
reach:
  http:
    url: http://127.0.0.1:9/weather/{city}
    method: GET
    timeout_ms: 2000
    headers: {X-Key: "${env.WEATHER_KEY}"}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Reach == nil || c.Reach.Kind != protocol.ActionHTTP || c.Reach.HTTP.Method != "GET" || c.Reach.TimeoutMS != 2000 {
		t.Fatalf("%+v", c.Reach)
	}
}

// A contract that does not parse or compile is refused with the line and the field; nothing of
// it is kept.
func TestBadContractsNameLineAndField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ doc, want string }{
		{"name: t\ndescripton: x\n", "line 2: descripton: unknown field"},
		{"name: t\ninput_schema:\n  id: {type: string, pattern: \"([a-z\"}\n", "line 3: input_schema.id.pattern: not valid JSON Schema: '([a-z' is not valid regex"},
		{"name: t\ninput_schema:\n  id: {type: text}\n", "line 3: input_schema.id.type: must be one of string, integer"},
		{"name: t\ninput_schema:\n  id: {type: string, minlength: 3}\n", "line 3: input_schema.id.minlength: unknown rule"},
		{"name: t\ninput_schema:\n  type: object\n  properties:\n    id:\n      type: string\n      minLength: -1\n", "line 7: input_schema.properties.id.minLength: not valid JSON Schema"},
		{"name: t\ninput_schema:\n  type: object\n  properties:\n    x: {$ref: \"file:///etc/passwd\"}\n", "leads outside the contract"},
		{"name: t\ninput_schema:\n  type: object\n  properties:\n    x: {$ref: \"http://127.0.0.1:9/s.json\"}\n", "leads outside the contract"},
		{"name: t\noutput_schema:\n  failure:\n    type: object\n    properties:\n      error_code: {type: string, enum: [NOT_FOUND, NO_ROUTE]}\n", "output_schema.failure.properties.error_code.enum[1]: NO_ROUTE is one of Hermes' own codes"},
		{"name: t\nexecution_policy: {timeout_ms: 800, max_retries: 99}\n", "execution_policy.max_retries: must be from 0 to 10"},
		{"name: t\nexecution_policy: {resource_level: X}\n", "execution_policy.resource_level: must be one of L, M, H"},
		{"name: t\nexecution_policy: {timeout_ms: fast}\n", "line 2: execution_policy.timeout_ms: must be an integer"},
		{"name: t\neffects: risky\n", "effects: must be one of none, idempotent, side_effects"},
		{"name: a.b\n", "name: "},
		{"description: x\n", "name: is required"},
		{"name: t\ninput_schema:\n  id: {type: string\n", "invalid YAML: did not find expected"},
		{"name: t\nreach:\n  http: {url: \"http://h:1/x?api_key=abc123abc123\"}\n", "line 3: reach.http.url"},
		{"name: t\ninput_schema: {a: {type: string}, a: {type: string}}\n", "duplicate key"},
		{"- a\n- b\n", "line 1: a contract is a mapping"},
		{"kind: blueprint\nname: t\n", "kind: is \"blueprint\""},
	} {
		_, err := registry.Parse([]byte(tc.doc))
		var ce *contract.Error
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q:\n got %v\nwant …%s…", tc.doc, err, tc.want)
		}
	}
}

func TestNoDocumentGrowsPastItsBounds(t *testing.T) {
	t.Parallel()
	// An alias bomb: each level doubles what the aliases stand for.
	var b strings.Builder
	b.WriteString("name: t\ninput_schema:\n  type: object\n  x0: &a0 [1, 2]\n")
	for i := 1; i < 30; i++ {
		b.WriteString("  x" + strconv.Itoa(i) + ": &a" + strconv.Itoa(i) + " [*a" + strconv.Itoa(i-1) + ", *a" + strconv.Itoa(i-1) + "]\n")
	}
	if _, err := registry.Parse([]byte(b.String())); err == nil || !strings.Contains(err.Error(), "values in one contract") {
		t.Errorf("alias bomb: %v", err)
	}
	// Few values, each an alias of a long one: the bytes are bounded too.
	amp := "name: t\ninput_schema:\n  type: object\n  description: &d " + strings.Repeat("x", 60_000) + "\n  examples: [" + strings.TrimSuffix(strings.Repeat("*d, ", 100), ", ") + "]\n"
	if _, err := registry.Parse([]byte(amp)); err == nil || !strings.Contains(err.Error(), "expands to more than") {
		t.Errorf("aliases of a long value: %v", err)
	}
	deep := "name: t\ninput_schema: " + strings.Repeat("[", 100) + strings.Repeat("]", 100) + "\n"
	if _, err := registry.Parse([]byte(deep)); err == nil || !strings.Contains(err.Error(), "nested more than") {
		t.Errorf("deep: %v", err)
	}
	if _, err := registry.Parse(make([]byte, contract.MaxSourceBytes+1)); err == nil {
		t.Error("an oversized document was read")
	}
}

func TestManyContractsInOneFile(t *testing.T) {
	t.Parallel()
	all, err := registry.ParseAll([]byte("name: a\n---\nname: b\neffects: none\n---\n"))
	if err != nil || len(all) != 2 || all[1].Effects != contract.EffectsNone {
		t.Fatalf("%v %+v", err, all)
	}
	if _, err := registry.Parse([]byte("name: a\n---\nname: b\n")); err == nil {
		t.Error("two contracts taken as one")
	}
}

func FuzzParse(f *testing.F) {
	seedDoc, _ := os.ReadFile("testdata/contract-order-query.yaml")
	f.Add(seedDoc)
	f.Add([]byte(`{"name":"j","input_schema":{"type":"object"}}`))
	f.Add([]byte("name: t\ninput_schema:\n  a: {type: string, pattern: \"\\\\u4e00\"}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := registry.Parse(data)
		if err != nil {
			var ce *contract.Error
			if !errors.As(err, &ce) {
				t.Fatalf("an error that is not a contract.Error: %T %v", err, err)
			}
			return
		}
		k, err := contract.Compile(c, 1, 1)
		if err != nil {
			t.Fatalf("parsed but does not compile: %v", err)
		}
		_ = k.CheckInput([]byte(`{"a":1}`))
		_ = k.CheckOutput([]byte(`{"success":{}}`), false)
	})
}
