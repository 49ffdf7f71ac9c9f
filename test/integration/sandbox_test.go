package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/gateway"
	"github.com/hermesbus/hermes/internal/sandbox"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// refusal decodes a sandbox's refusal (422 SANDBOX_REFUSED) and its report.
func refusal(t *testing.T, code int, body string) *sandbox.Report {
	t.Helper()
	var out struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
		Sandbox *sandbox.Report `json:"sandbox"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil || code != http.StatusUnprocessableEntity ||
		out.Error.Code != protocol.CodeSandboxRefused || out.Sandbox == nil || !out.Sandbox.Failed() {
		t.Fatalf("want a sandbox's refusal; got %d %s", code, body)
	}
	return out.Sandbox
}

func brokenContract(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "examples", "sandbox", name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Seed 003 §3.2's two stories: a tool answering "ORDER_NOT_FOUND " (a trailing space) and a
// payment tool answering non-JSON at amount 0 are refused at registration with a report naming
// each case and violation; nothing is registered. The sandbox's calls went through the bus
// like real calls, under a sandbox session, with their own request ids.
func TestTheSandboxRefusesBrokenTools(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"admin": auth.RoleAdmin})

	code, _, body := s.registerContract(keys["admin"], brokenContract(t, "order_query_broken"))
	rep := refusal(t, code, body)
	t.Logf("order_query_broken:\n%s", rep.Text())
	var trailing *sandbox.CaseResult
	for i, c := range rep.Cases {
		if c.Outcome == sandbox.CaseViolation && strings.Contains(c.Detail, "ORDER_NOT_FOUND ") && trailing == nil {
			trailing = &rep.Cases[i]
		}
	}
	if trailing == nil || trailing.Kind != "valid" || !strings.Contains(string(trailing.Arguments), "ORD000000000000") ||
		!strings.Contains(trailing.Detail, `is "ORDER_NOT_FOUND "; must be one of "ORDER_NOT_FOUND"`) || rep.Health != "ok" || rep.SessionID != "sandbox-order_query_broken" {
		t.Errorf("the trailing space is not named: %+v", rep)
	}
	if code, _ := s.call("GET", "/api/v1/tools/order_query_broken", keys["admin"], ""); code != http.StatusNotFound {
		t.Errorf("a refused tool was registered: %d", code)
	}

	// The payment tool has side effects: without a sandbox reach it would be skipped; its
	// contract names one, so it is tried there — and amount 0 breaks it.
	code, _, body = s.registerContract(keys["admin"], brokenContract(t, "payment_charge_broken"))
	rep = refusal(t, code, body)
	t.Logf("payment_charge_broken:\n%s", rep.Text())
	var zero *sandbox.CaseResult
	for i, c := range rep.Cases {
		if c.Outcome == sandbox.CaseViolation && strings.Contains(string(c.Arguments), `"amount":0,`) {
			zero = &rep.Cases[i]
		}
	}
	if zero == nil || zero.Kind != "boundary" || !strings.Contains(zero.Detail, "divide by zero") || rep.Violations != 1 {
		t.Errorf("amount 0 is not named: %+v", rep)
	}

	// Every sandbox call went through a worker, to the sandbox reach, marked and recorded
	// under the sandbox session.
	dispatched := 0
	for _, m := range s.record() {
		if m.SessionID != "sandbox-payment_charge_broken" || m.Type != protocol.TypeToolCall {
			continue
		}
		d, err := m.DecodeDispatch()
		if err != nil || d.Route != "sandbox:payment_charge_broken" && d.Call.ToolCallID != "health" {
			t.Errorf("a sandbox dispatch: %+v %v", d, err)
			continue
		}
		if d.Call.ToolCallID != "health" && (d.Contract == nil || !d.Contract.Sandbox || !strings.HasSuffix(d.Action.HTTP.URL, "/v1/sandbox/payments")) {
			t.Errorf("a sandbox dispatch not under the candidate, or not to the sandbox reach: %+v", d)
		}
		dispatched++
	}
	if dispatched != len(rep.Cases)+1 {
		t.Errorf("%d sandbox calls dispatched; want %d cases and /health", dispatched, len(rep.Cases))
	}

	// --force registers anyway, keeping the report with the version.
	code, v, body := s.call2("POST", "/api/v1/tools?force=true", keys["admin"], brokenContract(t, "payment_charge_broken"))
	if code != http.StatusCreated || v.Version != 1 || !strings.Contains(string(v.Sandbox), `"verdict":"refused"`) || !strings.Contains(string(v.Sandbox), `"forced":true`) {
		t.Fatalf("forced: %d %s", code, body)
	}
	code, body = s.call("GET", "/api/v1/tools/payment_charge_broken", keys["admin"], "")
	if code != http.StatusOK || !strings.Contains(body, `"forced":true`) {
		t.Errorf("the report kept: %d %s", code, body)
	}
	// hermes tools check tries it again: still broken.
	code, body = s.call("POST", "/api/v1/tools/payment_charge_broken/check", keys["admin"], "")
	var again sandbox.Report
	if err := json.Unmarshal([]byte(body), &again); code != http.StatusOK || err != nil || !again.Failed() || again.Violations != 1 {
		t.Errorf("check: %d %s", code, body)
	}
}

// call2 posts a contract (YAML) to path and decodes the tool view.
func (s *system) call2(method, path, key, doc string) (int, gateway.ToolView, string) {
	s.t.Helper()
	code, body := s.call(method, path, key, doc, "Content-Type", "application/yaml")
	var v gateway.ToolView
	_ = json.Unmarshal([]byte(body), &v)
	return code, v, body
}

// A good tool passes; a tool with side effects and no sandbox reach is not tried (the report
// says it was skipped) unless the registrar allows it; an unreachable tool is refused with
// that reason; a sandbox over its budget reports the cases that did not finish.
func TestTheSandboxPassesSkipsAndBounds(t *testing.T) {
	variant(t, "internal/sandbox's TestTryOutcomes (skipped without leave, tried with it, refused as unreachable, cancelled and reported unfinished over its budget); TestTheSandboxRefusesBrokenTools end to end")
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"admin": auth.RoleAdmin})
	seed, err := os.ReadFile(seedPath("contract-order-query.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	code, v, body := s.registerContract(keys["admin"], string(seed))
	if code != http.StatusCreated || !strings.Contains(string(v.Sandbox), `"verdict":"passed"`) {
		t.Fatalf("the seed's order_query: %d %s", code, body)
	}

	sideEffects := "name: charge_it\neffects: side_effects\ninput_schema: {amount: {type: number, required: true}}\nreach: {http: {url: \"http://127.0.0.1:8081/v1/echo\", method: POST}}\n"
	code, v, body = s.registerContract(keys["admin"], sideEffects)
	if code != http.StatusCreated || !strings.Contains(string(v.Sandbox), `"verdict":"skipped"`) {
		t.Fatalf("side effects without a sandbox reach: %d %s", code, body)
	}
	for _, m := range s.record() {
		if m.SessionID == "sandbox-charge_it" {
			t.Fatal("a tool with side effects was tried without leave")
		}
	}
	code, v, body = s.call2("POST", "/api/v1/tools?allow_side_effects=true", keys["admin"], strings.Replace(sideEffects, "required: true", "required: true, minimum: 1", 1))
	if code != http.StatusCreated || !strings.Contains(string(v.Sandbox), `"verdict":"passed"`) {
		t.Fatalf("side effects allowed: %d %s", code, body)
	}

	// Nothing listens on port 9 here: refused as unreachable.
	code, _, body = s.registerContract(keys["admin"], "name: gone\ninput_schema: {q: {type: string}}\nreach: {http: {url: \"http://127.0.0.1:9/x\", method: POST, timeout_ms: 500}}\n")
	rep := refusal(t, code, body)
	if rep.Reason != "the tool is unreachable: dial tcp 127.0.0.1:9: connect: connection refused" || !strings.Contains(rep.Health, protocol.CodeToolUnreachable) {
		t.Errorf("unreachable: %+v", rep)
	}

	// Echo waits as long as delay_ms says; a budget of 2 s leaves the long cases unfinished.
	slow := "name: echo\ninput_schema:\n  type: object\n  properties:\n    delay_ms: {type: integer, minimum: 0, maximum: 20000}\nexecution_policy: {timeout_ms: 30000}\n"
	code, _, body = s.call2("POST", "/api/v1/tools?budget=2s", keys["admin"], slow)
	rep = refusal(t, code, body)
	if rep.Unfinished == 0 || !strings.Contains(rep.Reason, "did not finish within the sandbox's budget of 2s") {
		t.Errorf("over budget: %+v", rep)
	}
	for _, c := range rep.Cases {
		if c.Outcome == sandbox.CaseUnfinished && !strings.Contains(string(c.Arguments), `"delay_ms":2000`) {
			t.Errorf("a quick case did not finish: %+v", c)
		}
	}
	if code, body := s.call("POST", "/api/v1/tools?budget=forever", keys["admin"], slow, "Content-Type", "application/yaml"); code != http.StatusBadRequest || !strings.Contains(body, "budget") {
		t.Errorf("a bad budget: %d %s", code, body)
	}
}

// The attacks on the sandbox the review found, each refused: a NATS client publishing a request
// marked as the sandbox's (whose calls skip the input check) into a sandbox session, during
// and after a real sandbox; a caller squatting the sandbox's request ids to block
// registrations.
func TestTheSandboxCannotBeForgedOrBlocked(t *testing.T) {
	variant(t, "pkg/protocol's TestSandboxSessionsAreReserved and TestACallerCannotAskForTheSandbox (no caller's request in a sandbox session, under its ids, or marked the sandbox's) and internal/router's TestASandboxRequestRunsOnlyWhileItsCandidateIsKept (a forged sandbox request is never dispatched)")
	t.Parallel()
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"admin": auth.RoleAdmin, "alice": auth.RoleUser})
	doc := "name: echo_min\ninput_schema: {amount: {type: integer, required: true, minimum: 1}}\nreach: {http: {url: \"http://127.0.0.1:8081/v1/echo\", method: POST}}\n"

	// Squatting: the sandbox's ids are reserved to it.
	for _, id := range []string{"sandbox-echo_min-1", "sandbox-echo_min-2"} {
		if code, body := s.call("POST", "/v1/route", keys["alice"], `{"request_id":"`+id+`","tool_calls":[{"tool_call_id":"c","name":"echo","arguments":{}}]}`); code != http.StatusBadRequest || !strings.Contains(body, "sandbox") {
			t.Fatalf("a caller took the sandbox's id %s: %d %s", id, code, body)
		}
	}
	if code, body := s.call("POST", "/v1/route", keys["alice"], `{"request_id":"r1","session_id":"sandbox-echo_min","tool_calls":[{"tool_call_id":"c","name":"echo","arguments":{}}]}`); code != http.StatusBadRequest {
		t.Fatalf("a caller wrote into a sandbox session: %d %s", code, body)
	}
	code, v, body := s.registerContract(keys["admin"], doc)
	if code != http.StatusCreated || !strings.Contains(string(v.Sandbox), `"verdict":"passed"`) {
		t.Fatalf("register: %d %s", code, body)
	}

	// Forging: a NATS client's sandbox request, naming the candidate the sandbox kept (its
	// revision is in the record), with arguments the contract refuses.
	var rev uint64
	for _, m := range s.record() {
		if m.SessionID == "sandbox-echo_min" && m.Type == protocol.TypeRequest {
			if req, err := m.DecodeRequest(protocol.Limits{}); err == nil && req.Sandbox != nil {
				rev = req.Sandbox.Revision
			}
		}
	}
	if rev == 0 {
		t.Fatal("no sandbox request in the record")
	}
	js := clientJS(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	forged := &protocol.Request{RequestID: "sandbox-echo_min-forged", SessionID: "sandbox-echo_min",
		Sandbox:   &protocol.Sandbox{Tool: "echo_min", Revision: rev, Probe: "c"},
		ToolCalls: []protocol.ToolCall{{ToolCallID: "c", Name: "echo_min", Arguments: []byte(`{"amount":-5}`)}}}
	publishClientRequest(ctx, t, js, "sandbox-echo_min", forged, nil)
	publishClientRequest(ctx, t, js, "after_forgery", &protocol.Request{RequestID: "after_forgery", SessionID: "after_forgery",
		ToolCalls: []protocol.ToolCall{{ToolCallID: "c", Name: "echo", Arguments: []byte(`{}`)}}}, nil)
	_, admin := s.connect()
	waitFor(t, "the client's next request answered", func() bool { _, _, err := admin.Response(ctx, "after_forgery", "after_forgery"); return err == nil })
	if _, err := admin.Plan(ctx, "sandbox-echo_min-forged"); err == nil {
		t.Fatal("a client's sandbox request was accepted")
	}
	for _, m := range s.record() {
		if m.Type == protocol.TypeToolCall && strings.Contains(string(m.Payload), "-5") {
			t.Fatalf("the forged call was dispatched: %+v", m)
		}
	}
}
