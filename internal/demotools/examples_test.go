package demotools

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/pkg/contract"
)

const (
	examplesDir   = "../../examples"
	localBaseURL  = "http://127.0.0.1:8081"
	deployBaseURL = "http://demo-tools:8081"
	localTarget   = "target: 127.0.0.1:8090"
	deployTarget  = "target: demo-tools:8090"
)

// exampleRequest is a HermesRequest as the example files hold it.
type exampleRequest struct {
	RequestID string `json:"request_id"`
	SessionID string `json:"session_id,omitempty"`
	Intent    string `json:"intent"`
	ToolCalls []struct {
		ToolCallID string          `json:"tool_call_id"`
		Name       string          `json:"name"`
		Arguments  json.RawMessage `json:"arguments"`
	} `json:"tool_calls"`
}

var tokenPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

func readExamples(t *testing.T) map[string]exampleRequest {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(examplesDir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples/*.json: %v", err)
	}
	out := make(map[string]exampleRequest)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var req exampleRequest
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		name := filepath.Base(f)
		if !tokenPattern.MatchString(req.RequestID) || (req.SessionID != "" && !tokenPattern.MatchString(req.SessionID)) {
			t.Errorf("%s: bad request_id %q or session_id %q", name, req.RequestID, req.SessionID)
		}
		if req.Intent == "" || len(req.ToolCalls) == 0 {
			t.Errorf("%s: needs an intent and tool calls", name)
		}
		seen := map[string]bool{}
		for _, c := range req.ToolCalls {
			if !tokenPattern.MatchString(c.ToolCallID) || seen[c.ToolCallID] {
				t.Errorf("%s: bad or repeated tool_call_id %q", name, c.ToolCallID)
			}
			seen[c.ToolCallID] = true
			if len(c.Arguments) == 0 || c.Arguments[0] != '{' {
				t.Errorf("%s: %s arguments are not an object", name, c.ToolCallID)
			}
		}
		out[name] = req
	}
	return out
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestExamplesCoverEveryTool(t *testing.T) {
	examples := readExamples(t)
	routes := readFile(t, filepath.Join(examplesDir, "routes.yaml"))
	for name, req := range examples {
		for _, c := range req.ToolCalls {
			if !strings.Contains(routes, "tool_name: "+c.Name+"\n") {
				t.Errorf("%s calls %s, which examples/routes.yaml does not route", name, c.Name)
			}
		}
	}
	for _, e := range newTestServer().endpoints() {
		if strings.HasSuffix(e.Tool, "_broken") {
			continue // reached by their contracts alone, to be refused by the sandbox
		}
		file := "request-" + e.Tool + ".json"
		if e.Tool == "get_policy_number" {
			file = "request.json"
		}
		if _, ok := examples[file]; !ok {
			t.Errorf("no examples/%s for %s", file, e.Tool)
		}
	}
	if _, ok := examples["request-"+ProfileTool+".json"]; !ok {
		t.Errorf("no examples/request-%s.json for the gRPC tool", ProfileTool)
	}
	if p := examples["request-parallel.json"]; len(p.ToolCalls) != 3 {
		t.Errorf("request-parallel.json has %d calls, want 3", len(p.ToolCalls))
	}
	seed := examples["request.json"]
	if seed.RequestID != "req_abc123" || seed.Intent != "我的保单号是多少" || len(seed.ToolCalls) != 1 ||
		seed.ToolCalls[0].ToolCallID != "call_def456" || seed.ToolCalls[0].Name != "get_policy_number" {
		t.Errorf("request.json is not the seed's request: %+v", seed)
	}
}

func TestDeployRoutesMatchExamples(t *testing.T) {
	local := readFile(t, filepath.Join(examplesDir, "routes.yaml"))
	deploy := readFile(t, "../../deploy/routes.yaml")
	if !strings.Contains(local, localBaseURL+"/") {
		t.Fatalf("examples/routes.yaml does not use %s", localBaseURL)
	}
	if !strings.Contains(local, localTarget+"\n") {
		t.Fatalf("examples/routes.yaml has no gRPC rule with %s", localTarget)
	}
	if want := strings.ReplaceAll(strings.ReplaceAll(local, localBaseURL, deployBaseURL), localTarget, deployTarget); deploy != want {
		t.Error("deploy/routes.yaml differs from examples/routes.yaml with the base URL and gRPC target swapped; regenerate it with\n" +
			"  sed 's#" + localBaseURL + "#" + deployBaseURL + "#g; s#" + localTarget + "#" + deployTarget + "#g' examples/routes.yaml > deploy/routes.yaml")
	}
}

// exampleRule is what the tests read of a rule in routes.yaml: enough to pick a route the way
// the router does and call it the way the tool worker does.
type exampleRule struct {
	name, tool, url, method string
	grpc                    string // the service, for a grpc rule
	contains                []string
	regex                   *regexp.Regexp
	maxAttempts             int
}

// readRules reads routes.yaml line by line; the file keeps one key per line.
func readRules(t *testing.T, text string) []exampleRule {
	t.Helper()
	uEscape := regexp.MustCompile(`\\u([0-9a-fA-F]{4})`)
	var rules []exampleRule
	for i, line := range strings.Split(text, "\n") {
		key, value, ok := strings.Cut(strings.TrimSpace(line), ": ")
		if !ok || strings.HasPrefix(key, "#") {
			continue
		}
		if key == "- name" {
			rules = append(rules, exampleRule{name: value, maxAttempts: 1})
			continue
		}
		if len(rules) == 0 {
			continue
		}
		r := &rules[len(rules)-1]
		switch key {
		case "tool_name":
			r.tool = value
		case "url":
			r.url = value
		case "service":
			r.grpc = value
		case "method":
			r.method = value
		case "max_attempts":
			r.maxAttempts, _ = strconv.Atoi(value)
		case "intent_contains":
			if err := json.Unmarshal([]byte(value), &r.contains); err != nil {
				t.Fatalf("routes.yaml:%d: intent_contains: %v", i+1, err)
			}
		case "intent_regex":
			if uq, err := strconv.Unquote(value); err == nil {
				value = uq
			}
			// Python's re.match anchors at the start; Go spells \uXXXX as \x{XXXX}.
			r.regex = regexp.MustCompile(`^(?:` + uEscape.ReplaceAllString(value, `\x{$1}`) + `)`)
		}
	}
	return rules
}

// pickRule picks the first rule whose conditions all hold and returns it with the arguments its
// regex captured.
func pickRule(rules []exampleRule, tool, intent string) (exampleRule, map[string]string, bool) {
	for _, r := range rules {
		if r.tool != tool {
			continue
		}
		if len(r.contains) > 0 && !slices.ContainsFunc(r.contains, func(k string) bool { return strings.Contains(intent, k) }) {
			continue
		}
		captured := map[string]string{}
		if r.regex != nil {
			m := r.regex.FindStringSubmatch(intent)
			if m == nil {
				continue
			}
			for i, name := range r.regex.SubexpNames()[1:] {
				if name == "" {
					name = "match_" + strconv.Itoa(i+1)
				}
				captured[name] = m[i+1]
			}
		}
		return r, captured, true
	}
	return exampleRule{}, nil, false
}

// workerRequest builds the HTTP request the tool worker sends for a call routed by rule.
func workerRequest(t *testing.T, rule exampleRule, arguments json.RawMessage, captured map[string]string, requestID, callID string) *http.Request {
	t.Helper()
	var argMap map[string]any
	dec := json.NewDecoder(bytes.NewReader(arguments))
	dec.UseNumber()
	if err := dec.Decode(&argMap); err != nil {
		t.Fatal(err)
	}
	for k, v := range captured {
		if _, explicit := argMap[k]; !explicit {
			argMap[k] = v
		}
	}
	text := func(v any) string {
		if s, ok := v.(string); ok {
			return s
		}
		b, _ := json.Marshal(v)
		return string(b)
	}
	target := regexp.MustCompile(`\{(\w+)\}`).ReplaceAllStringFunc(rule.url, func(p string) string {
		return url.PathEscape(text(argMap[p[1:len(p)-1]]))
	})
	target = strings.TrimPrefix(target, localBaseURL)
	var body *bytes.Reader
	if bodyMethod(rule.method) {
		b, _ := json.Marshal(argMap)
		body = bytes.NewReader(b)
	} else {
		q := url.Values{}
		for k, v := range argMap {
			if list, ok := v.([]any); ok {
				for _, e := range list {
					q.Add(k, text(e))
				}
				continue
			}
			q.Set(k, text(v))
		}
		if len(q) > 0 {
			target += "?" + q.Encode()
		}
		body = bytes.NewReader(nil)
	}
	req := httptest.NewRequest(rule.method, target, body)
	req.Header.Set("Idempotency-Key", requestID+"/"+callID)
	req.Header.Set("X-Request-ID", requestID)
	return req
}

// TestExamplesRunAgainstTheTools routes every example call with examples/routes.yaml, calls
// the demo tools the way the tool worker does (retrying a 5xx up to the route's max_attempts)
// and expects every call to succeed.
func TestExamplesRunAgainstTheTools(t *testing.T) {
	rules := readRules(t, readFile(t, filepath.Join(examplesDir, "routes.yaml")))
	s := newTestServer()
	for name, req := range readExamples(t) {
		for _, c := range req.ToolCalls {
			t.Run(fmt.Sprintf("%s/%s", name, c.ToolCallID), func(t *testing.T) {
				rule, captured, ok := pickRule(rules, c.Name, req.Intent)
				if !ok {
					t.Fatalf("no rule routes %s for intent %q", c.Name, req.Intent)
				}
				if rule.url == "" { // the gRPC service, or a go rule: the SDK's meeting tools
					call := callMeetingTool
					if rule.grpc != "" {
						if rule.grpc != ProfileService {
							t.Fatalf("rule %s calls %s, which the demo tools do not serve", rule.name, rule.grpc)
						}
						call = func(_ string, args json.RawMessage) (json.RawMessage, error) { return callProfile(args) }
					}
					out, err := call(c.Name, c.Arguments)
					if err != nil {
						t.Fatalf("rule %s: %v", rule.name, err)
					}
					k := demoContract(t, c.Name)
					if err := k.CheckInput(c.Arguments); err != nil {
						t.Errorf("the example's arguments break the contract of %s: %v", c.Name, err)
					}
					if v := k.CheckValue(out); v.Violation != "" {
						t.Errorf("the answer breaks the contract of %s: %+v\n%s", c.Name, v, out)
					}
					return
				}
				var r reply
				for attempt := 1; attempt <= rule.maxAttempts; attempt++ {
					hr := workerRequest(t, rule, c.Arguments, captured, req.RequestID, c.ToolCallID)
					r = doRequest(t, s, hr)
					if r.status < 500 {
						break
					}
				}
				if r.status != http.StatusOK {
					t.Fatalf("rule %s: %d %s", rule.name, r.status, r.body)
				}
				// Both sides keep the tool's contract: the example's arguments, the answer.
				k := demoContract(t, c.Name)
				if err := k.CheckInput(c.Arguments); err != nil {
					t.Errorf("the example's arguments break the contract of %s: %v", c.Name, err)
				}
				if v := k.CheckOutput(r.body, false); v.Violation != "" || v.Failure {
					t.Errorf("the answer breaks the contract of %s: %+v\n%s", c.Name, v, r.body)
				}
			})
		}
	}
	// The seed's insurance rules win for the seed's intents, and capture the name.
	if r, _, _ := pickRule(rules, "get_policy_number", "我的保单号是多少"); r.name != "get_policy_number_by_name" {
		t.Errorf("我的保单号是多少 routed by %q", r.name)
	}
	if r, c, _ := pickRule(rules, "get_policy_status", "查询王五的保单状态"); r.name != "get_policy_status_by_name" || c["match_1"] != "王五" {
		t.Errorf("查询王五的保单状态 routed by %q capturing %v", r.name, c)
	}
	if r, _, _ := pickRule(rules, "get_policy_status", "保单状态查询"); r.name != "get_policy_status" {
		t.Errorf("保单状态查询 routed by %q, want the fallback", r.name)
	}
}

func doRequest(t *testing.T, h http.Handler, req *http.Request) reply {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	r := reply{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
	checkEnvelope(t, r)
	return r
}

// callMeetingTool calls one of the Go meeting tools with JSON arguments, as Serve would.
func callMeetingTool(name string, args json.RawMessage) (json.RawMessage, error) {
	var out any
	var err error
	switch name {
	case "calendar_free_slots":
		var in FreeSlotsIn
		if err = json.Unmarshal(args, &in); err == nil {
			out, err = freeSlots(context.Background(), in)
		}
	case "meeting_book":
		var in MeetingIn
		if err = json.Unmarshal(args, &in); err == nil {
			out, err = bookMeeting(context.Background(), in)
		}
	case "notify_send":
		var in NotifyIn
		if err = json.Unmarshal(args, &in); err == nil {
			out, err = sendNotice(context.Background(), in)
		}
	default:
		return nil, fmt.Errorf("no Go tool %s", name)
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

// demoContract reads examples/contracts/<tool>.yaml, compiled; a Go tool's comes from its types.
func demoContract(t *testing.T, tool string) *contract.Compiled {
	t.Helper()
	for _, d := range MeetingTools() {
		if d.Name() == tool {
			c := d.Contract()
			k, err := contract.Compile(&c, 1, 1)
			if err != nil {
				t.Fatal(err)
			}
			return k
		}
	}
	c, err := registry.Parse([]byte(readFile(t, filepath.Join(examplesDir, "contracts", tool+".yaml"))))
	if err != nil {
		t.Fatalf("the contract of %s: %v", tool, err)
	}
	k, err := contract.Compile(c, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Every demo tool has a contract, named as the tool (the deliberately broken ones under
// examples/sandbox), and the seed's is there unchanged.
func TestEveryDemoToolHasAContract(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(examplesDir, "contracts", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	broken, err := filepath.Glob(filepath.Join(examplesDir, "sandbox", "*.yaml"))
	if err != nil || len(broken) != 2 {
		t.Fatalf("the broken tools' contracts: %v %v", broken, err)
	}
	files = append(files, broken...)
	have := map[string]bool{}
	for _, f := range files {
		c, err := registry.Parse([]byte(readFile(t, f)))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if filepath.Base(f) != c.Name+".yaml" {
			t.Errorf("%s holds the contract of %s", f, c.Name)
		}
		have[c.Name] = true
	}
	for _, name := range MeetingToolNames {
		if have[name] {
			t.Errorf("Go tool %s has a contract file; its contract comes from its types", name)
		}
	}
	if !have[ProfileTool] {
		t.Errorf("the gRPC tool %s has no contract in examples/contracts", ProfileTool)
	}
	delete(have, ProfileTool)
	for _, e := range newTestServer().endpoints() {
		if !have[e.Tool] {
			t.Errorf("demo tool %s has no contract in examples/contracts", e.Tool)
		}
		delete(have, e.Tool)
	}
	if len(have) > 0 {
		t.Errorf("contracts of tools the demo tools do not serve: %v", have)
	}
	// internal/registry/testdata holds the seed's file as the seeds restore it.
	seed := readFile(t, filepath.Join("..", "registry", "testdata", "contract-order-query.yaml"))
	if mine := readFile(t, filepath.Join(examplesDir, "contracts", "order_query.yaml")); seed != mine {
		t.Error("examples/contracts/order_query.yaml is not the seed's contract as written")
	}
}

// exampleBlueprint is a blueprint as examples/blueprints holds it (seed 003 §3.3).
type exampleBlueprint struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Steps       []struct {
		Tool         string            `json:"tool"`
		InputMapping map[string]string `json:"input_mapping"`
		Condition    string            `json:"condition,omitempty"`
		OutputKey    string            `json:"output_key"`
		DefaultValue json.RawMessage   `json:"default_value,omitempty"`
	} `json:"steps"`
	Fallback struct {
		Message    string `json:"message"`
		TransferTo string `json:"transfer_to,omitempty"`
	} `json:"fallback"`
}

func readBlueprint(t *testing.T, name string) exampleBlueprint {
	t.Helper()
	var bp exampleBlueprint
	dec := json.NewDecoder(strings.NewReader(readFile(t, filepath.Join(examplesDir, "blueprints", name+".json"))))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&bp); err != nil {
		t.Fatalf("blueprints/%s.json: %v", name, err)
	}
	if bp.Name != name || bp.Description == "" || len(bp.Steps) == 0 || bp.Fallback.Message == "" {
		t.Errorf("blueprints/%s.json: %+v", name, bp)
	}
	return bp
}

// Every example blueprint calls only routed tools that have a contract, and check_and_urge is
// the seed's file as written.
func TestExampleBlueprintsCallRoutedTools(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(examplesDir, "blueprints", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples/blueprints/*.json: %v", err)
	}
	routes := readFile(t, filepath.Join(examplesDir, "routes.yaml"))
	for _, f := range files {
		bp := readBlueprint(t, strings.TrimSuffix(filepath.Base(f), ".json"))
		for i, st := range bp.Steps {
			if !strings.Contains(routes, "tool_name: "+st.Tool+"\n") {
				t.Errorf("%s step %d calls %s, which examples/routes.yaml does not route", bp.Name, i, st.Tool)
			}
			demoContract(t, st.Tool)
			if st.OutputKey == "" {
				t.Errorf("%s step %d has no output_key", bp.Name, i)
			}
		}
	}
	seed, err := os.ReadFile("../../../shared/seed-examples/blueprint-check-and-urge.json")
	if err != nil {
		t.Logf("the seed examples are not beside this checkout: %v", err)
		return
	}
	if string(seed) != readFile(t, filepath.Join(examplesDir, "blueprints", "check_and_urge.json")) {
		t.Error("examples/blueprints/check_and_urge.json is not the seed's blueprint as written")
	}
}

// The two inputs examples/blueprints/README.md gives for travel_advice take one branch each, as
// the blueprint's steps go against the demo tools: the weather, then the calendar_query whose
// condition holds, called with its mapped arguments and answering within its contract.
func TestTravelAdviceTakesTheREADMEsBranches(t *testing.T) {
	bp := readBlueprint(t, "travel_advice")
	readme := readFile(t, filepath.Join(examplesDir, "blueprints", "README.md"))
	rows := regexp.MustCompile("(?m)^\\| `(\\{\"city\".*?\\})` .*`(indoor|outdoor)` activities").FindAllStringSubmatch(readme, -1)
	if len(rows) != 2 || rows[0][2] == rows[1][2] {
		t.Fatalf("the README gives %d inputs, want one for each branch: %v", len(rows), rows)
	}
	s := newTestServer()
	rules := readRules(t, readFile(t, filepath.Join(examplesDir, "routes.yaml")))
	call := func(tool string, arguments map[string]any) map[string]any {
		t.Helper()
		b, _ := json.Marshal(arguments)
		rule, _, ok := pickRule(rules, tool, "")
		if !ok {
			t.Fatalf("no rule routes %s", tool)
		}
		r := doRequest(t, s, workerRequest(t, rule, b, nil, "req_bp", "call_"+tool))
		if r.status != http.StatusOK {
			t.Fatalf("%s %s: %d %s", tool, b, r.status, r.body)
		}
		if v := demoContract(t, tool).CheckOutput(r.body, false); v.Violation != "" {
			t.Errorf("the answer breaks the contract of %s: %+v", tool, v)
		}
		return r.obj(t)
	}
	for _, row := range rows {
		var input map[string]any
		if err := json.Unmarshal([]byte(row[1]), &input); err != nil {
			t.Fatalf("README input %s: %v", row[1], err)
		}
		run := map[string]map[string]any{"user_input": input}
		var ran []string
		for _, st := range bp.Steps {
			if st.Condition != "" && !holds(t, st.Condition, run) {
				continue
			}
			arguments := map[string]any{}
			for k, v := range st.InputMapping {
				arguments[k] = v
				if strings.HasPrefix(v, "$.") {
					arguments[k] = lookupPath(t, v, run)
				}
			}
			run[st.OutputKey] = call(st.Tool, arguments)
			ran = append(ran, st.OutputKey)
			if run[st.OutputKey]["date"] != input["date"] {
				t.Errorf("%s: %s is for %v", row[1], st.OutputKey, run[st.OutputKey]["date"])
			}
		}
		if want := []string{"weather", row[2]}; !slices.Equal(ran, want) {
			t.Errorf("%s ran %v, want %v (precipitation %v %%)", row[1], ran, want, run["weather"]["precipitation_chance_pct"])
		}
	}
}

// lookupPath resolves a path $.key.field of a blueprint run.
func lookupPath(t *testing.T, path string, run map[string]map[string]any) any {
	t.Helper()
	key, field, ok := strings.Cut(strings.TrimPrefix(path, "$."), ".")
	v, found := run[key][field]
	if !ok || !found {
		t.Fatalf("%s finds nothing in %v", path, run)
	}
	return v
}

// holds evaluates a condition of the form "$.key.field OP number".
func holds(t *testing.T, cond string, run map[string]map[string]any) bool {
	t.Helper()
	parts := strings.Fields(cond)
	if len(parts) != 3 {
		t.Fatalf("condition %q is not \"$.path OP number\"", cond)
	}
	x, err1 := lookupPath(t, parts[0], run).(json.Number).Float64()
	y, err2 := strconv.ParseFloat(parts[2], 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("condition %q: %v %v", cond, err1, err2)
	}
	switch parts[1] {
	case ">=":
		return x >= y
	case "<":
		return x < y
	}
	t.Fatalf("condition %q: operator %s", cond, parts[1])
	return false
}
