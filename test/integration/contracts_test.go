package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/gateway"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// routeAs posts a request with key and returns its HermesResponse (200 required).
func (s *system) routeAs(key string, req map[string]any) *protocol.Response {
	s.t.Helper()
	body, _ := json.Marshal(req)
	code, out := s.call("POST", "/v1/route", key, string(body))
	if code != http.StatusOK {
		s.t.Fatalf("POST /v1/route: %d %s", code, out)
	}
	return decodeResponse(s.t, []byte(out))
}

// registerContract posts a contract (YAML) with key and returns the status and the answer.
func (s *system) registerContract(key, doc string) (int, gateway.ToolView, string) {
	s.t.Helper()
	code, body := s.call("POST", "/api/v1/tools", key, doc, "Content-Type", "application/yaml")
	var v gateway.ToolView
	_ = json.Unmarshal([]byte(body), &v)
	return code, v, body
}

// The seed's contract registered through the API as written, then exercised through the bus:
// a good call, a bad argument stopped before dispatch, a contract-breaking answer stopped
// before anyone sees it; versions, history, removal, and who may change tools.
func TestTheSeedContractThroughTheAPI(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"admin": auth.RoleAdmin, "alice": auth.RoleUser})
	seed, err := os.ReadFile(seedPath("contract-order-query.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// Changing tools needs tools:admin; reading them does not.
	if code, _, body := s.registerContract(keys["alice"], string(seed)); code != http.StatusForbidden || !strings.Contains(body, "tools:admin") {
		t.Fatalf("a user registers: %d %s", code, body)
	}
	code, v1, body := s.registerContract(keys["admin"], string(seed))
	if code != http.StatusCreated || v1.Version != 1 || v1.Source != string(seed) {
		t.Fatalf("register the seed's contract: %d %s", code, body)
	}
	if code, again, _ := s.registerContract(keys["admin"], string(seed)); code != http.StatusOK || again.Version != 1 || *again.Changed {
		t.Fatalf("the same again: %d %+v", code, again)
	}
	if code, body := s.call("GET", "/api/v1/tools", keys["alice"], ""); code != http.StatusOK || !strings.Contains(body, `"name":"order_query"`) {
		t.Fatalf("list: %d %s", code, body)
	}
	var seen time.Time
	waitFor(t, "the router uses the contract", func() bool {
		r := s.routeAs(keys["alice"], request(fmt.Sprintf("ct_probe_%d", time.Now().UnixNano()), "", call("c", "order_query", map[string]any{"order_id": "x"})))
		seen = time.Now()
		return result(t, r, "c").ErrorCode == protocol.CodeBadArguments
	})
	t.Logf("first call refused by the contract %s after registration", seen.Sub(v1.RegisteredAt).Round(time.Millisecond))

	// A good call, a bad argument, an order that does not exist (a failure the contract declares).
	r := s.routeAs(keys["alice"], request("ct_1", "",
		call("good", "order_query", map[string]any{"order_id": "ORD202603120042"}),
		call("bad", "order_query", map[string]any{"order_id": "ORD-20260312-0042"}),
		call("missing", "order_query", map[string]any{"order_id": "ORD209901010001"})))
	good, bad, missing := result(t, r, "good"), result(t, r, "bad"), result(t, r, "missing")
	if good.Status != protocol.ResultOK || good.ContractVersion != 1 || !strings.HasPrefix(string(good.Content), `{"success":{`) {
		t.Errorf("good: %+v %s", good, good.Content)
	}
	if bad.ErrorCode != protocol.CodeBadArguments || bad.ErrorOrigin != protocol.OriginHermes || bad.Attempts != 0 ||
		string(bad.Content) != `"order_id: does not match ^ORD[0-9]{12}$"` || !strings.Contains(bad.RecoveryHint, "15位订单号") {
		t.Errorf("bad argument: %+v %s", bad, bad.Content)
	}
	if missing.ErrorCode != "ORDER_NOT_FOUND" || missing.ErrorOrigin != protocol.OriginTool || missing.RecoveryHint == "" || missing.Attempts != 1 {
		t.Errorf("declared failure: %+v", missing)
	}
	for _, m := range s.record() {
		if m.RequestID == "ct_1" && m.Type == protocol.TypeToolCall && strings.Contains(string(m.Payload), "ORD-2026") {
			t.Error("the call with a bad argument was dispatched")
		}
	}

	// Version 2 allows no delivered orders: the tool's answer breaks it. Stopped, kept in the
	// record's result, never in the response.
	v2doc := strings.Replace(string(seed), "enum: [created, paid, shipped, delivered, cancelled]", "enum: [created]", 1)
	if code, v2, body := s.registerContract(keys["admin"], v2doc); code != http.StatusCreated || v2.Version != 2 {
		t.Fatalf("version 2: %d %s", code, body)
	}
	waitFor(t, "version 2 in use", func() bool {
		r := s.routeAs(keys["alice"], request(fmt.Sprintf("ct_v2_%d", time.Now().UnixNano()), "", call("c", "order_query", map[string]any{"order_id": "ORD202603120042"})))
		return result(t, r, "c").ContractVersion == 2
	})
	r = s.routeAs(keys["alice"], request("ct_2", "", call("c", "order_query", map[string]any{"order_id": "ORD202603120042"})))
	broken := result(t, r, "c")
	if broken.ErrorCode != protocol.CodeContractViolation || broken.ErrorOrigin != protocol.OriginTool || broken.Rejected != nil ||
		!strings.Contains(string(broken.Content), `success.status: is \"`) {
		t.Errorf("a contract-breaking answer: %+v %s", broken, broken.Content)
	}
	kept := false
	for _, m := range s.record() {
		if m.RequestID == "ct_2" && m.Type == protocol.TypeToolResult {
			res, err := m.DecodeToolResult()
			kept = err == nil && strings.HasPrefix(string(res.Rejected), `{"success":`)
		}
	}
	if !kept {
		t.Error("the rejected answer is not in the record's result")
	}

	// The history keeps both versions; version 1 reads as registered.
	code, body = s.call("GET", "/api/v1/tools/order_query?version=1", keys["alice"], "")
	var got gateway.ToolView
	if err := json.Unmarshal([]byte(body), &got); code != http.StatusOK || err != nil || got.Version != 1 || len(got.History) != 2 || got.Source != string(seed) {
		t.Fatalf("get version 1: %d %s", code, body)
	}
	// Removed: calls go on as before contracts (the routes file's rule, unchecked).
	if code, body := s.call("DELETE", "/api/v1/tools/order_query", keys["admin"], ""); code != http.StatusOK {
		t.Fatalf("remove: %d %s", code, body)
	}
	if code, _ := s.call("DELETE", "/api/v1/tools/order_query", keys["admin"], ""); code != http.StatusNotFound {
		t.Fatalf("removed twice: %d", code)
	}
	waitFor(t, "the removal seen", func() bool {
		r := s.routeAs(keys["alice"], request(fmt.Sprintf("ct_rm_%d", time.Now().UnixNano()), "", call("c", "order_query", map[string]any{"order_id": "ORD202603120042"})))
		return result(t, r, "c").ContractVersion == 0 && result(t, r, "c").Status == protocol.ResultOK
	})
}

// A contract that does not parse or compile is refused with its line and field, and nothing
// of it is registered; only YAML and JSON are taken.
func TestBadContractsAreRefusedWithTheirLine(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"admin": auth.RoleAdmin})
	for _, tc := range []struct {
		doc, field string
		line       int
	}{
		{"name: t1\ninput_schema:\n  id: {type: string, pattern: \"([a-z\"}\n", "input_schema.id.pattern", 3},
		{"name: t2\noutput_schema:\n  failure:\n    type: object\n    properties:\n      error_code: {type: string, enum: [NOT_FOUND, NO_ROUTE]}\n", "output_schema.failure.properties.error_code.enum[1]", 6},
		{"name: t3\nexecution_policy: {timeout_ms: 800, resource_level: XL}\n", "execution_policy.resource_level", 2},
		{"name: t4\nreach:\n  http: {url: \"http://127.0.0.1:9/x\", headers: {Authorization: \"Bearer sk-abcdefghijklmnopqrstuvwx\"}}\n", "reach.http.headers.Authorization", 3},
	} {
		code, _, body := s.registerContract(keys["admin"], tc.doc)
		var e struct {
			Error struct {
				Code, Field string
				Line        int
			}
		}
		_ = json.Unmarshal([]byte(body), &e)
		if code != http.StatusBadRequest || e.Error.Code != protocol.CodeInvalidContract || e.Error.Field != tc.field || e.Error.Line != tc.line {
			t.Errorf("%q: %d %s", tc.doc, code, body)
		}
	}
	if code, body := s.call("POST", "/api/v1/tools", keys["admin"], "name: t", "Content-Type", "text/csv"); code != http.StatusUnsupportedMediaType {
		t.Errorf("text/csv: %d %s", code, body)
	}
	if code, body := s.call("GET", "/api/v1/tools", keys["admin"], ""); code != http.StatusOK || strings.Contains(body, `"name":"t`) {
		t.Errorf("something of a refused contract was registered: %s", body)
	}
}

// A call in flight when its contract changes finishes under the version it started with; the
// next one runs under the new version.
func TestACallFinishesUnderItsContractVersion(t *testing.T) {
	variant(t, "pkg/worker's TestAnswersAreJudgedByTheirCallsContractVersion (an answer is judged under the version its call was routed under); TestTheSeedContractThroughTheAPI end to end")
	t.Parallel()
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"admin": auth.RoleAdmin})
	v1 := "name: echo\noutput_schema:\n  type: object\n  required: [n]\n"
	v2 := "name: echo\noutput_schema:\n  type: object\n  required: [m]\n"
	// Both versions ask for what echo does not answer to the sandbox's {}: forced.
	if code, _, body := s.call2("POST", "/api/v1/tools?force=true", keys["admin"], v1); code != http.StatusCreated {
		t.Fatalf("%d %s", code, body)
	}
	waitFor(t, "version 1 in use", func() bool {
		r := s.routeAs(keys["admin"], request(fmt.Sprintf("inflight_probe_%d", time.Now().UnixNano()), "", call("c", "echo", map[string]any{"n": 1})))
		return result(t, r, "c").ContractVersion == 1
	})
	done := make(chan *protocol.Response, 1)
	go func() {
		body, _ := json.Marshal(request("inflight_1", "", call("slow", "echo", map[string]any{"n": 1, "delay_ms": 1500})))
		_, out := s.call("POST", "/v1/route", keys["admin"], string(body))
		var r protocol.Response
		_ = json.Unmarshal([]byte(out), &r)
		done <- &r
	}()
	waitFor(t, "the call started", func() bool {
		for _, m := range s.record() {
			if m.RequestID == "inflight_1" && m.Type == protocol.TypeToolStarted {
				return true
			}
		}
		return false
	})
	if code, _, body := s.call2("POST", "/api/v1/tools?force=true", keys["admin"], v2); code != http.StatusCreated {
		t.Fatalf("%d %s", code, body)
	}
	r := <-done
	if res := result(t, r, "slow"); res.Status != protocol.ResultOK || res.ContractVersion != 1 {
		t.Errorf("the call in flight: %+v %s", res, res.Content)
	}
	waitFor(t, "version 2 in use", func() bool {
		r := s.routeAs(keys["admin"], request(fmt.Sprintf("inflight_after_%d", time.Now().UnixNano()), "", call("c", "echo", map[string]any{"n": 1})))
		res := result(t, r, "c")
		return res.ContractVersion == 2 && res.ErrorCode == protocol.CodeContractViolation
	})
}

// A contract that names its reach is routed there, whatever the routes file says (it has no
// rule for this tool); its execution policy, the stricter, bounds the call.
func TestAContractNamesItsReach(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"admin": auth.RoleAdmin})
	doc := `name: reached_echo
description: echo, reached as its contract says
input_schema:
  n: {type: integer, required: true}
  delay_ms: {type: integer, minimum: 0}
reach:
  http: {url: "http://127.0.0.1:8081/v1/echo", method: POST, timeout_ms: 5000, retry: {max_attempts: 3}}
execution_policy: {timeout_ms: 300, max_retries: 0, max_in_flight: 3}
`
	if code, _, body := s.registerContract(keys["admin"], doc); code != http.StatusCreated {
		t.Fatalf("%d %s", code, body)
	}
	var r *protocol.Response
	waitFor(t, "the contract in use", func() bool {
		r = s.routeAs(keys["admin"], request(fmt.Sprintf("reach_%d", time.Now().UnixNano()), "",
			call("ok", "reached_echo", map[string]any{"n": 7}), call("slow", "reached_echo", map[string]any{"n": 8, "delay_ms": 2000})))
		return result(t, r, "ok").Status == protocol.ResultOK
	})
	if ok := result(t, r, "ok"); ok.Route != "contract:reached_echo" || ok.ContractVersion != 1 || !strings.Contains(string(ok.Content), `"n":7`) {
		t.Errorf("reached: %+v %s", ok, ok.Content)
	}
	// 300 ms and one try, not the reach's 5 s and three.
	if slow := result(t, r, "slow"); slow.ErrorCode != protocol.CodeToolTimeout || slow.Attempts != 1 || !strings.Contains(slow.RecoveryHint, "timeout_ms=300") {
		t.Errorf("the stricter policy: %+v", slow)
	}
	// Its calls in flight across every worker: the consumer's MaxAckPending.
	_, admin := s.connect()
	cons, err := admin.Stream.Consumer(context.Background(), bus.ToolConsumer(protocol.ActionHTTP, "reached_echo"))
	if err != nil || cons.CachedInfo().Config.MaxAckPending != 3 {
		t.Errorf("the tool's consumer: %v %+v", err, cons)
	}
	for _, m := range s.record() {
		if m.Type != protocol.TypeToolCall || !strings.HasPrefix(m.RequestID, "reach_") {
			continue
		}
		d, err := m.DecodeDispatch()
		if err != nil || d.Contract == nil || d.Contract.Version != 1 || d.Action.TimeoutMS != 300 || d.Action.Retry.MaxAttempts != 1 {
			t.Errorf("the dispatch: %+v %v", d, err)
		}
	}
}

// hermes apply: the diff against what is registered, --dry-run changing nothing, --prune
// removing what no file names.
func TestApplyDiffsDryRunsAndPrunes(t *testing.T) {
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"admin": auth.RoleAdmin})
	t.Setenv("HERMES_API_KEY", keys["admin"])
	dir := t.TempDir()
	write := func(name, doc string) {
		if err := os.WriteFile(dir+"/"+name, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	apply := func(args ...string) string {
		t.Helper()
		var out, errs strings.Builder
		// The tools have no route: the sandbox would refuse them as unreachable.
		if err := app.RunApply(context.Background(), append([]string{"--url", s.base, "-f", dir, "--force"}, args...), app.Env{Stdout: &out, Stderr: &errs}); err != nil {
			t.Fatalf("apply %v: %v\n%s%s", args, err, out.String(), errs.String())
		}
		return out.String()
	}
	version := func(name string) int {
		code, body := s.call("GET", "/api/v1/tools/"+name, keys["admin"], "")
		if code == http.StatusNotFound {
			return 0
		}
		var v gateway.ToolView
		_ = json.Unmarshal([]byte(body), &v)
		if v.Removed {
			return -v.Version
		}
		return v.Version
	}
	write("a.yaml", "name: tool_a\ninput_schema:\n  n: {type: integer}\n---\nname: tool_b\neffects: none\n")
	if out := apply(); !strings.Contains(out, "+ tool_a (new") || !strings.Contains(out, "+ tool_b (new") || version("tool_a") != 1 || version("tool_b") != 1 {
		t.Fatalf("first apply:\n%s", out)
	}
	write("a.yaml", "name: tool_a\ninput_schema:\n  n: {type: string}\n---\nname: tool_b\neffects: none\n")
	out := apply("--dry-run")
	del, add := strings.Index(out, `-       "type": "integer"`), strings.Index(out, `+       "type": "string"`)
	if !strings.Contains(out, "~ tool_a (version 1 → 2") || del < 0 || add < del ||
		!strings.Contains(out, "= tool_b (version 1, unchanged)") || !strings.Contains(out, "dry run: nothing changed") || version("tool_a") != 1 {
		t.Fatalf("dry run:\n%s", out)
	}
	if out := apply(); !strings.Contains(out, "tool_a: version 2 registered") || version("tool_a") != 2 {
		t.Fatalf("apply the change:\n%s", out)
	}
	write("a.yaml", "name: tool_a\ninput_schema:\n  n: {type: string}\n")
	if out := apply(); !strings.Contains(out, "tool_b (version 1; no file names it, kept") || version("tool_b") != 1 {
		t.Fatalf("without --prune:\n%s", out)
	}
	if out := apply("--prune"); !strings.Contains(out, "- tool_b (version 1; no file names it)") || version("tool_b") != -2 {
		t.Fatalf("--prune:\n%s (tool_b %d)", out, version("tool_b"))
	}
	// A document that is not a contract, or a tool named twice, is refused before anything
	// changes.
	write("b.yaml", "name: tool_a\neffects: none\n")
	var out2, errs strings.Builder
	if err := app.RunApply(context.Background(), []string{"--url", s.base, "-f", dir}, app.Env{Stdout: &out2, Stderr: &errs}); err == nil || !strings.Contains(err.Error(), "tool tool_a is named again") {
		t.Fatalf("a tool named twice: %v", err)
	}
}

// A gateway that asks no caller for a key lets nobody change tools: a contract may say where
// workers call.
func TestAGatewayWithoutKeysChangesNoTool(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	doc := "name: evil\nreach: {http: {url: \"http://127.0.0.1:9/x\"}}\n"
	if code, body := s.call("POST", "/api/v1/tools", "", doc, "Content-Type", "application/yaml"); code != http.StatusForbidden || !strings.Contains(body, "tools:admin") {
		t.Errorf("register: %d %s", code, body)
	}
	if code, body := s.call("DELETE", "/api/v1/tools/echo", "", ""); code != http.StatusForbidden {
		t.Errorf("remove: %d %s", code, body)
	}
	if code, body := s.call("GET", "/api/v1/tools", "", ""); code != http.StatusOK || strings.Contains(body, "evil") {
		t.Errorf("list: %d %s", code, body)
	}
}
