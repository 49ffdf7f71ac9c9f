package record

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

func TestFormatFlow(t *testing.T) {
	t.Parallel()
	f := &Formatter{Location: time.UTC}
	noRoute, _ := json.Marshal(`no route matches tool "fax_send" with this intent`)
	cases := []struct {
		name string
		e    *Entry
		want string
	}{
		{"request", entry(t, 1, 0, protocol.TypeRequest, sampleRequest(), "gateway-1"),
			`12:00:01.123 [request]  req_abc (session s1) 2 calls: get_policy_status call_1, weather_search call_2  intent="查询王五的保单"`},
		{"route", entry(t, 2, 2, protocol.TypeToolCall, sampleDispatch(), "router-1"),
			`12:00:01.125 [route]    req_abc router-1 -> get_policy_status call_1 rule=policy_status args={"policy_id":"P1"} params={"name":"王五"}`},
		{"start", entry(t, 3, 3, protocol.TypeToolStarted, &protocol.ToolStarted{ToolCallID: "call_1", Name: "get_policy_status", Attempt: 2}, "worker-1"),
			`12:00:01.126 [start]    req_abc get_policy_status call_1 on worker-1 (try 2)`},
		{"done ok", entry(t, 4, 15, protocol.TypeToolResult, &protocol.ToolResult{ToolCallID: "call_1", Name: "get_policy_status",
			Status: protocol.ResultOK, Content: json.RawMessage("{\n  \"status\": \"active\"\n}"), ExecutionTimeMS: 12, Attempts: 1, Route: "policy_status"}, "worker-1"),
			`12:00:01.138 [done]     req_abc get_policy_status call_1 12 ms ok content={"status":"active"}`},
		{"done ok after retries", entry(t, 5, 15, protocol.TypeToolResult, &protocol.ToolResult{ToolCallID: "call_1", Name: "echo",
			Status: protocol.ResultOK, Content: json.RawMessage(`1`), ExecutionTimeMS: 3, Attempts: 3}, "worker-1"),
			`12:00:01.138 [done]     req_abc echo call_1 3 ms ok after 3 tries content=1`},
		{"done error", entry(t, 6, 16, protocol.TypeToolResult, &protocol.ToolResult{ToolCallID: "call_2", Name: "weather_search",
			Status: protocol.ResultError, Content: json.RawMessage(`"no answer within 4000 ms"`), ExecutionTimeMS: 4000, Attempts: 3,
			ErrorCode: protocol.CodeToolTimeout, ErrorOrigin: protocol.OriginHermes}, "worker-1"),
			`12:00:01.139 [done]     req_abc weather_search call_2 4000 ms error TOOL_TIMEOUT (hermes) after 3 tries: "no answer within 4000 ms"`},
		{"no route", entry(t, 7, 1, protocol.TypeToolResult, &protocol.ToolResult{ToolCallID: "c", Name: "fax_send",
			Status: protocol.ResultError, Content: noRoute, ErrorCode: protocol.CodeNoRoute, ErrorOrigin: protocol.OriginHermes}, "router-1"),
			`12:00:01.124 [done]     req_abc fax_send c error NO_ROUTE (hermes): "no route matches tool \"fax_send\" with this intent"`},
		{"response timed from its request", entry(t, 8, 17, protocol.TypeResponse, &protocol.Response{RequestID: "req_abc", SessionID: "s1",
			Status: protocol.StatusPartialSuccess, Results: []protocol.ToolResult{
				{ToolCallID: "call_1", Status: protocol.ResultOK}, {ToolCallID: "call_2", Status: protocol.ResultError}}}, "router-1"),
			`12:00:01.140 [response] req_abc partial_success (2 results, 1 ok) 17 ms`},
		{"response of a request not seen", entry(t, 9, 20, protocol.TypeResponse, &protocol.Response{RequestID: "req_abc", SessionID: "s1",
			Status: protocol.StatusSuccess, Results: []protocol.ToolResult{{ToolCallID: "call_1", Status: protocol.ResultOK}}}, "router-1"),
			`12:00:01.143 [response] req_abc success (1 result)`},
		{"failed response", entry(t, 10, 21, protocol.TypeResponse, &protocol.Response{RequestID: "req_abc", SessionID: "s1",
			Status: protocol.StatusFailed, Error: &protocol.ResponseError{Code: "DEAD_LETTERED", Message: "tool_calls[0].tool_call_id is invalid"}}, "deadletter-1"),
			`12:00:01.144 [response] req_abc failed (0 results): DEAD_LETTERED tool_calls[0].tool_call_id is invalid`},
	}
	cases = append(cases, struct {
		name string
		e    *Entry
		want string
	}{"a tool's own code", entry(t, 12, 16, protocol.TypeToolResult, &protocol.ToolResult{ToolCallID: "call_2", Name: "order_query",
		Status: protocol.ResultError, Content: json.RawMessage(`{"message":"no such order"}`), ExecutionTimeMS: 3, Attempts: 1,
		ErrorCode: protocol.CodeToolHTTP4xx, ErrorOrigin: protocol.OriginTool, ToolErrorCode: "ORDER_NOT_FOUND"}, "worker-1"),
		`12:00:01.139 [done]     req_abc order_query call_2 3 ms error TOOL_HTTP_4XX (tool: ORDER_NOT_FOUND) after 1 try: {"message":"no such order"}`})
	byShop := entry(t, 11, 0, protocol.TypeRequest, sampleRequest(), "gateway-1")
	byShop.Msg.Caller = &protocol.Caller{ID: "key:abc", Name: "shop\x1b[2J", Role: "user", User: "alice@example.com"}
	cases = append(cases, struct {
		name string
		e    *Entry
		want string
	}{"request with its caller", byShop,
		`12:00:01.123 [request]  req_abc (session s1) 2 calls: get_policy_status call_1, weather_search call_2 by shop\u001b[2J (key:abc, user) for alice@example.com  intent="查询王五的保单"`})
	for _, c := range cases {
		if got := f.Format(c.e); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
}

func TestFormatUnreadable(t *testing.T) {
	t.Parallel()
	f := &Formatter{Location: time.UTC}
	got := f.Format(Decode(42, "hermes.request.s1", t0, []byte("not msgpack")))
	if !strings.HasPrefix(got, "12:00:01.123 [?]        seq 42 hermes.request.s1: protocol: malformed message") {
		t.Fatalf("got %q", got)
	}
	// An envelope that reads but whose payload does not still names its type and request.
	m, _ := protocol.NewMessage(protocol.TypeToolResult, &protocol.ToolResult{ToolCallID: "bad id", Status: "ok"})
	m.MsgID, m.RequestID, m.SessionID = "x", "req_abc", "s1"
	data, _ := protocol.Marshal(m)
	got = f.Format(Decode(43, "hermes.result.s1", t0, data))
	if !strings.Contains(got, "[?]") || !strings.Contains(got, "seq 43 hermes.result.s1 tool_result.v1 req_abc: result.tool_call_id must hold only") {
		t.Fatalf("got %q", got)
	}
}

func TestFormatKeepsOneLineAndCutsLongValues(t *testing.T) {
	t.Parallel()
	f := &Formatter{Location: time.UTC}
	req := sampleRequest()
	req.Intent = "line one\nline two \x1b[31mred\x1b[0m \u202eevil" + strings.Repeat("长", 500)
	req.ToolCalls[0].Arguments = json.RawMessage(`{"blob":"` + strings.Repeat("x", 5000) + `"}`)
	for _, e := range []*Entry{
		entry(t, 1, 0, protocol.TypeRequest, req, "gateway\n-1"),
		entry(t, 2, 0, protocol.TypeToolCall, &protocol.Dispatch{Call: req.ToolCalls[0], Route: "r\x07", Action: sampleDispatch().Action}, "router\x1b-1"),
	} {
		got := f.Format(e)
		if strings.ContainsAny(got, "\n\r\x1b\x07\u202e") {
			t.Errorf("line holds control characters: %q", got)
		}
		if n := len([]rune(got)); n > 400 {
			t.Errorf("line is %d characters long: %q", n, got)
		}
		if !strings.Contains(got, "…") {
			t.Errorf("long value not marked as cut: %q", got)
		}
	}
}

func TestFormatOptions(t *testing.T) {
	t.Parallel()
	f := &Formatter{Location: time.UTC, Date: true, Color: true}
	got := f.Format(entry(t, 1, 0, protocol.TypeToolResult, &protocol.ToolResult{ToolCallID: "c", Name: "echo",
		Status: protocol.ResultError, ErrorCode: protocol.CodeToolHTTP5xx, ErrorOrigin: protocol.OriginTool, Attempts: 1}, "w"))
	want := "2026-03-16 12:00:01.123 [done]     req_abc echo c 0 ms \x1b[31merror TOOL_HTTP_5XX (tool)\x1b[0m after 1 try"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

func TestFormatForgetsRequestsBeyondItsBound(t *testing.T) {
	t.Parallel()
	f := &Formatter{Location: time.UTC}
	for i := range maxStarted + 10 {
		r := sampleRequest()
		r.RequestID = fmt.Sprintf("req_%d", i)
		f.Format(&Entry{Time: t0, Msg: &protocol.Message{SessionID: "s1"}, Payload: r})
	}
	if len(f.started) > maxStarted {
		t.Fatalf("remembers %d requests", len(f.started))
	}
}

func TestJSON(t *testing.T) {
	t.Parallel()
	e := entry(t, 7, 2, protocol.TypeToolCall, sampleDispatch(), "router-1")
	line, err := JSON(e)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(line), "\n") {
		t.Fatalf("not one line: %s", line)
	}
	var got struct {
		Seq       uint64          `json:"seq"`
		Subject   string          `json:"subject"`
		Time      time.Time       `json:"time"`
		Type      string          `json:"type"`
		RequestID string          `json:"request_id"`
		SessionID string          `json:"session_id"`
		Sender    protocol.Sender `json:"sender"`
		Deadline  *time.Time      `json:"deadline"`
		Payload   struct {
			Route string `json:"route"`
			Call  struct {
				Arguments json.RawMessage `json:"arguments"`
			} `json:"call"`
		} `json:"payload"`
		Error *string `json:"error"`
	}
	if err := json.Unmarshal(line, &got); err != nil {
		t.Fatalf("%v: %s", err, line)
	}
	if got.Seq != 7 || got.Subject != "hermes.x.s1" || !got.Time.Equal(t0.Add(2*time.Millisecond)) || got.Type != "tool_call.v1" ||
		got.RequestID != "req_abc" || got.SessionID != "s1" || got.Sender.Instance != "router-1" || got.Deadline != nil ||
		got.Payload.Route != "policy_status" || string(got.Payload.Call.Arguments) != `{"policy_id":"P1"}` || got.Error != nil {
		t.Fatalf("got %+v from %s", got, line)
	}

	// A dispatched action's header values never show, whatever they hold; the entry itself is
	// not changed.
	d := sampleDispatch()
	d.Action.HTTP.Headers = map[string]string{"Authorization": "Bearer sk-live-0123456789abcdef", "X-Auth-Token": "${env.POLICY_TOKEN}"}
	e = entry(t, 9, 2, protocol.TypeToolCall, d, "forger")
	line, err = JSON(e)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(line), "sk-live") || strings.Contains(string(line), "POLICY_TOKEN") ||
		!strings.Contains(string(line), `"Authorization":"`+HiddenHeaderValue+`"`) {
		t.Errorf("header values shown: %s", line)
	}
	if e.Payload.(*protocol.Dispatch).Action.HTTP.Headers["Authorization"] == HiddenHeaderValue {
		t.Error("hiding changed the entry")
	}

	line, err = JSON(Decode(8, "hermes.request.s1", t0, []byte{0xc1}))
	if err != nil {
		t.Fatal(err)
	}
	var bad map[string]any
	if err := json.Unmarshal(line, &bad); err != nil {
		t.Fatal(err)
	}
	if bad["seq"] != float64(8) || bad["error"] == nil || bad["payload"] != nil || bad["type"] != nil {
		t.Fatalf("unreadable message as %s", line)
	}
}

func TestParseSince(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 16, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"90m":                       now.Add(-90 * time.Minute),
		"2h":                        now.Add(-2 * time.Hour),
		"2026-03-16T09:00:00Z":      time.Date(2026, 3, 16, 9, 0, 0, 0, time.UTC),
		"2026-03-16T09:00:00+08:00": time.Date(2026, 3, 16, 1, 0, 0, 0, time.UTC),
	} {
		got, err := ParseSince(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("ParseSince(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "yesterday", "-1h", "2026-03-16"} {
		if _, err := ParseSince(in, now); err == nil || !strings.Contains(err.Error(), "--since") {
			t.Errorf("ParseSince(%q) = %v, want an error naming --since", in, err)
		}
	}
}

// A model's decision reads as seed 001 §5.2's decision log: the input, the choice, each warning.
func TestFormatDecisionInTheSeedsShape(t *testing.T) {
	t.Parallel()
	f := &Formatter{Location: time.UTC}
	d := &protocol.LLMDecision{Run: "chat-1", Turn: 1, Backend: "local", Model: "qwen2.5-14b", Tries: 1, LatencyMS: 412,
		Input:    "帮我定明天下午的会议室",
		Chosen:   []protocol.LLMCall{{ID: "call_1", Name: "meeting_book", Arguments: `{"title": "周会"}`}},
		Warnings: []protocol.LLMWarning{{Kind: protocol.WarnMissingArgument, Tool: "meeting_book", CallID: "call_1", Field: "room_id", Message: "room_id: is required"}},
		Usage:    protocol.LLMUsage{Prompt: 812, Completion: 40, Total: 852}}
	got := f.Format(entry(t, 1, 0, protocol.TypeLLMDecision, d, "gateway-1"))
	want := strings.Join([]string{
		`12:00:01.123 [路由]     req_abc 原始输入: 帮我定明天下午的会议室`,
		`12:00:01.123 [路由]     req_abc LLM选择: meeting_book call_1 {"title":"周会"}  (qwen2.5-14b at local, 412 ms, 1 try, tokens 812+40)`,
		`12:00:01.123 [警告]     req_abc 参数key缺失: room_id (meeting_book call_1)`,
	}, "\n")
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	answer := &protocol.LLMDecision{Run: "chat-1", Turn: 4, Backend: "local", Model: "m", Tries: 2, Answer: "会议已安排妥当\n明天上午9点"}
	if got := f.Format(entry(t, 2, 0, protocol.TypeLLMDecision, answer, "gateway-1")); got != `12:00:01.123 [最终]     req_abc 回复用户: 会议已安排妥当\u000a明天上午9点  (m at local, 0 ms, 2 tries, tokens 0+0)` {
		t.Errorf("answer: %s", got)
	}
	failed := &protocol.LLMDecision{Run: "chat-1", Turn: 2, Backend: "local", Model: "m", Tries: 3, Error: "the model m at local answered HTTP 503: busy"}
	if got := f.Format(entry(t, 3, 0, protocol.TypeLLMDecision, failed, "gateway-1")); !strings.Contains(got, "[错误]     req_abc LLM: the model m at local answered HTTP 503: busy  (m at local, 0 ms, 3 tries") {
		t.Errorf("error: %s", got)
	}
}

// What a tool's policy decided shows on the route line of a call it let run, on the result
// of one it kept from running, and as a line of its own for a wait or an approval: the
// decision, the rule, the policy's source and version, why, when to try again, the approval.
func TestFormatPolicyDecisions(t *testing.T) {
	t.Parallel()
	f := &Formatter{Location: time.UTC}
	d := sampleDispatch()
	d.Params = nil
	d.Policy = &protocol.PolicyDecision{Decision: protocol.PolicyAllowed, Source: "policy", Version: 2}
	retry := t0.Add(59 * time.Second)
	cases := []struct {
		name string
		e    *Entry
		want string
	}{
		{"allowed on the route", entry(t, 1, 2, protocol.TypeToolCall, d, "router-1"),
			`12:00:01.125 [route]    req_abc router-1 -> get_policy_status call_1 rule=policy_status args={"policy_id":"P1"} policy: allowed (policy v2)`},
		{"denied on the result", entry(t, 2, 1, protocol.TypeToolResult, &protocol.ToolResult{ToolCallID: "call_1", Name: "meeting_book",
			Status: protocol.ResultError, Content: json.RawMessage(`"allowed_roles: meeting_book may be called by [admin] only (policy v2 of meeting_book)"`),
			ErrorCode: protocol.CodePolicyDenied, ErrorOrigin: protocol.OriginHermes,
			Policy: &protocol.PolicyDecision{Decision: protocol.PolicyDenied, Rule: "allowed_roles", Source: "policy", Version: 2, Reason: "not shown twice"}}, "router-1"),
			`12:00:01.124 [done]     req_abc meeting_book call_1 error POLICY_DENIED (hermes): "allowed_roles: meeting_book may be called by [admin] only (policy v2 of meeting_book)" policy: denied: allowed_roles (policy v2)`},
		{"limited with its retry time", entry(t, 3, 1, protocol.TypeToolResult, &protocol.ToolResult{ToolCallID: "call_2", Name: "meeting_book",
			Status: protocol.ResultError, ErrorCode: protocol.CodeRateLimited, ErrorOrigin: protocol.OriginHermes,
			Policy: &protocol.PolicyDecision{Decision: protocol.PolicyLimited, Rule: "rate_limit", Source: "contract", Version: 3, RetryAt: retry}}, "router-1"),
			`12:00:01.124 [done]     req_abc meeting_book call_2 error RATE_LIMITED (hermes) policy: limited: rate_limit (contract v3) retry at 12:01:00.123`},
		{"a wait", entry(t, 4, 4, protocol.TypePolicy, &protocol.PolicyEvent{ToolCallID: "call_3", Tool: "meeting_book", At: t0,
			Decision: protocol.PolicyDecision{Decision: protocol.PolicyWaited, Rule: "rate_limit", Source: "policy", Version: 2, Reason: "over 10/min for each caller", RetryAt: retry}}, "router-1"),
			`12:00:01.127 [policy]   req_abc meeting_book call_3 waited: rate_limit (policy v2) "over 10/min for each caller" retry at 12:01:00.123`},
		{"an approval", entry(t, 5, 5, protocol.TypePolicy, &protocol.PolicyEvent{ToolCallID: "call_1", Tool: "meeting_book", At: t0,
			Decision: protocol.PolicyDecision{Decision: protocol.PolicyApproved, Rule: "confirm_required", Source: "policy", Version: 2, ApprovalID: "appr_1", By: "key:admin"}}, "gateway-1"),
			`12:00:01.128 [policy]   req_abc meeting_book call_1 approved: confirm_required (policy v2) approval=appr_1 by key:admin`},
	}
	for _, c := range cases {
		if got := f.Format(c.e); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
	// A refusal stands out in colour; an approval does not.
	f.Color = true
	if got := f.Format(cases[3].e); !strings.Contains(got, yellow+"waited: rate_limit") {
		t.Errorf("a wait in colour: %q", got)
	}
	if got := f.Format(cases[4].e); strings.Contains(got, yellow) {
		t.Errorf("an approval in colour: %q", got)
	}
}
