package integration

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/protocol"
)

func TestSeedRequestSucceeds(t *testing.T) {
	t.Parallel()
	s := start(t, options{routesFile: "../../examples/routes.yaml", workers: 1})
	body, err := os.ReadFile(seedPath("request-policy-number.json"))
	if err != nil {
		t.Fatal(err)
	}
	resp := s.route(body)
	if resp.Status != protocol.StatusSuccess || resp.RequestID != "req_abc123" {
		t.Fatalf("response %+v", resp)
	}
	r := result(t, resp, "call_def456")
	if r.Status != protocol.ResultOK || r.Route != "get_policy_number_by_name" || r.Attempts != 1 {
		t.Fatalf("result %+v", r)
	}
	var content struct {
		PolicyNumber string `json:"policy_number"`
	}
	if err := json.Unmarshal(r.Content, &content); err != nil || content.PolicyNumber == "" {
		t.Fatalf("content has no policy number: %s", r.Content)
	}
}

// TestSeedInsuranceRoutes runs the insurance seed's four route tests through Hermes, with the
// seed's routes file loaded unchanged (its policy-service host dialled at the demo tools).
func TestSeedInsuranceRoutes(t *testing.T) {
	t.Setenv("POLICY_TOKEN", "seed-token-value")
	s := start(t, options{routesFile: seedPath("routes-insurance.yaml"), workers: 1,
		allowEnv: []string{"POLICY_TOKEN@http://policy-service:8000"}, demoHosts: []string{"policy-service:8000"}})
	cases := []struct {
		tool, intent, route string
	}{
		{"get_policy_number", "我的保单号是多少", "get_policy_number_by_name"},
		{"get_policy_number", "张三的保单状态是什么", ""},
		{"get_policy_status", "查询王五的保单状态", "get_policy_status_by_name"},
		{"get_policy_status", "保单状态查询", ""},
	}
	for i, c := range cases {
		resp := s.route(request("seed_route_"+string(rune('a'+i)), c.intent, call("call_1", c.tool, map[string]any{})))
		r := result(t, resp, "call_1")
		if c.route == "" {
			if r.ErrorCode != protocol.CodeNoRoute || r.ErrorOrigin != protocol.OriginHermes || resp.Status != protocol.StatusFailed {
				t.Errorf("%s %q: want NO_ROUTE, got %+v", c.tool, c.intent, r)
			}
			continue
		}
		if r.Status != protocol.ResultOK || r.Route != c.route {
			t.Errorf("%s %q: want ok via %s, got %+v (content %s)", c.tool, c.intent, c.route, r, r.Content)
		}
	}
	// The regex's capture group (match_1 = 王五) reached the tool.
	resp := s.route(request("seed_capture", "查询王五的保单状态", call("c", "get_policy_status", map[string]any{})))
	if r := result(t, resp, "c"); !strings.Contains(string(r.Content), "王五") {
		t.Fatalf("the captured name did not reach the tool: %s", r.Content)
	}
}

func TestNamedCaptureReachesTool(t *testing.T) {
	variant(t, "internal/router's TestRouteStage (a rule's captures become the dispatch's params) and pkg/worker's TestCallArgumentsTakeTheRoutesCaptures (an argument of the same name wins); TestSeedInsuranceRoutes end to end")
	t.Parallel()
	s := start(t, options{workers: 1})
	resp := s.route(request("capture_1", "查看李四的保单", call("c", "get_policy_status", map[string]any{})))
	if r := result(t, resp, "c"); r.Status != protocol.ResultOK || !strings.Contains(string(r.Content), "李四") {
		t.Fatalf("named group did not reach the tool: %+v %s", r, r.Content)
	}
	// An explicit argument of the same name wins over the capture.
	resp = s.route(request("capture_2", "查看李四的保单", call("c", "get_policy_status", map[string]any{"name": "赵六"})))
	if r := result(t, resp, "c"); !strings.Contains(string(r.Content), "赵六") || strings.Contains(string(r.Content), "李四") {
		t.Fatalf("argument did not win over the capture: %s", r.Content)
	}
}

func TestParallelCallsMatchedByID(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	barrier := map[string]any{"id": "three", "count": 3, "timeout_ms": 10000}
	resp := s.route(request("barrier_1", "",
		call("call_0", "echo", map[string]any{"n": 0, "barrier": barrier}),
		call("call_1", "echo", map[string]any{"n": 1, "barrier": barrier}),
		call("call_2", "echo", map[string]any{"n": 2, "barrier": barrier})))
	if resp.Status != protocol.StatusSuccess || len(resp.Results) != 3 {
		t.Fatalf("response %+v", resp)
	}
	for i, id := range []string{"call_0", "call_1", "call_2"} {
		r := result(t, resp, id)
		var got struct{ N int }
		if err := json.Unmarshal(r.Content, &got); err != nil || got.N != i {
			t.Errorf("%s got content %s, want n=%d", id, r.Content, i)
		}
		if resp.Results[i].ToolCallID != id {
			t.Errorf("results[%d] is %s, want request order", i, resp.Results[i].ToolCallID)
		}
	}
}

func TestUnknownToolIsPartialSuccess(t *testing.T) {
	variant(t, "internal/router's TestRouteStage and TestOutletAndAggregation (NO_ROUTE, never tried, the response partial_success); TestUpServesMetricsOnItsHTTPPort end to end")
	t.Parallel()
	s := start(t, options{workers: 1})
	resp := s.route(request("unknown_1", "", call("a", "echo", map[string]any{"x": 1}), call("b", "no_such_tool", map[string]any{})))
	if resp.Status != protocol.StatusPartialSuccess {
		t.Fatalf("status %s, want partial_success", resp.Status)
	}
	r := result(t, resp, "b")
	if r.Status != protocol.ResultError || r.ErrorCode != protocol.CodeNoRoute || r.Attempts != 0 || r.RecoveryHint == "" {
		t.Fatalf("result %+v", r)
	}
}

func TestRetriesAndFailures(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	resp := s.route(request("retry_1", "",
		call("flaky", "echo", map[string]any{"fail_times": 2}),
		call("slow", "slow_echo", map[string]any{"delay_ms": 2000}),
		call("down", "echo", map[string]any{"status": 503}),
		call("refused", "echo", map[string]any{"status": 404}),
		call("grpc", "grpc_tool", map[string]any{}),
		call("order", "order_query", map[string]any{"order_id": "ORD-2026/../x"}),
	))
	want := map[string]struct {
		status, code string
		attempts     int
	}{
		"flaky":   {protocol.ResultOK, "", 3},
		"slow":    {protocol.ResultError, protocol.CodeToolTimeout, 2},
		"down":    {protocol.ResultError, protocol.CodeToolHTTP5xx, 3},
		"refused": {protocol.ResultError, protocol.CodeToolHTTP4xx, 1},
		"grpc":    {protocol.ResultError, protocol.CodeRouteIncomplete, 1}, // its rule names no target: refused, never retried
	}
	for id, w := range want {
		r := result(t, resp, id)
		if r.Status != w.status || r.ErrorCode != w.code || r.Attempts != w.attempts {
			t.Errorf("%s: got status=%s code=%s attempts=%d, want %s %s %d", id, r.Status, r.ErrorCode, r.Attempts, w.status, w.code, w.attempts)
		}
		if r.Status == protocol.ResultError && r.RecoveryHint == "" {
			t.Errorf("%s: error without recovery_hint", id)
		}
	}
	if r := result(t, resp, "slow"); r.ErrorOrigin != protocol.OriginHermes {
		t.Errorf("timeout origin %q, want hermes", r.ErrorOrigin)
	}
	// A path parameter that could climb out of /v1/orders/ is refused before any request.
	if r := result(t, resp, "order"); r.ErrorCode != protocol.CodeBadArguments || r.Attempts > 1 || !strings.Contains(r.RecoveryHint, "path parameter") {
		t.Errorf("path parameter with '/': %+v %s", r, r.Content)
	}
	if resp.Status != protocol.StatusPartialSuccess {
		t.Errorf("status %s, want partial_success", resp.Status)
	}
}
