package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/examples"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/scriptedllm"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// The seed's policies (examples/tool-policies.yaml, as hermes up applies them) through the
// chat loop with the scripted meeting model: meeting_book waits for the person's confirmation
// — the turn ends with Hermes' message naming the call and its arguments, /v1/chat lists it in
// pending with its approval — and "确认" runs it, once, and the model goes on to its answer;
// anything else cancels it. A user role may not book; notify_send to more than 20 people is
// refused naming the count; the 11th notice in a minute is limited.
func TestChatSeedPoliciesEndToEnd(t *testing.T) {
	t.Parallel()
	seed, err := examples.Files.ReadFile("tool-policies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cs := startChatWith(t, "chat-policies", scriptedllm.Meeting(), nil, seed)
	chat := func(session, message string) map[string]any {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"session_id": session, "message": message})
		code, out := cs.postJSON(t, "/v1/chat", string(body))
		if code != http.StatusOK {
			t.Fatalf("%s: %d %v", message, code, out)
		}
		return out
	}
	first := chat("sess_confirm", meetingAsk)
	text, _ := first["text"].(string)
	pending, _ := first["pending"].([]any)
	t.Logf("turn 1: %s", text)
	if len(pending) != 1 || !strings.Contains(text, "meeting_book") || !strings.Contains(text, "确认") || !strings.Contains(text, `"attendees":["zhangwei","lina"]`) {
		t.Fatalf("the first answer does not ask to confirm meeting_book: %s %v", text, pending)
	}
	p, _ := pending[0].(map[string]any)
	id, _ := p["approval_id"].(string)
	if p["tool"] != "meeting_book" || id == "" {
		t.Fatalf("pending %v", p)
	}
	second := chat("sess_confirm", "确认")
	text, _ = second["text"].(string)
	t.Logf("turn 2: %s", text)
	if !strings.Contains(text, "会议已安排妥当") || len(second["pending"].([]any)) != 0 {
		t.Fatalf("after 确认: %v", second)
	}
	code, body := cs.call(t, http.MethodGet, "/v1/approvals/"+id, cs.sys.Key.Key, "")
	if code != http.StatusOK || !strings.Contains(body, `"state":"used"`) {
		t.Fatalf("the approval after the run: %d %s", code, body)
	}
	transcript, entries := cs.transcript(t, "sess_confirm")
	t.Logf("the record of sess_confirm:\n%s", transcript)
	booked := 0
	for _, e := range entries {
		if r, ok := e.Payload.(*protocol.ToolResult); ok && r.Name == "meeting_book" && r.Status == protocol.ResultOK {
			booked++
		}
	}
	if booked != 1 {
		t.Fatalf("meeting_book ran %d times", booked)
	}

	// Anything else cancels it.
	first = chat("sess_cancel", meetingAsk)
	p, _ = first["pending"].([]any)[0].(map[string]any)
	id, _ = p["approval_id"].(string)
	chat("sess_cancel", "算了，不开了")
	if code, body := cs.call(t, http.MethodGet, "/v1/approvals/"+id, cs.sys.Key.Key, ""); !strings.Contains(body, `"state":"denied"`) {
		t.Fatalf("not confirmed: %d %s", code, body)
	}

	// A user may not book; over 20 recipients is refused; the 11th notice in a minute is limited.
	kv, err := cs.js.KeyValue(context.Background(), auth.KeysBucket)
	if err != nil {
		t.Fatal(err)
	}
	keys := auth.NewKeys(kv)
	userKey, _, err := keys.Create(context.Background(), auth.NewKey{Name: "u", Role: auth.RoleUser})
	if err != nil {
		t.Fatal(err)
	}
	opsKey, _, err := keys.Create(context.Background(), auth.NewKey{Name: "ops", Role: auth.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	route := func(key, id, tool, args string) protocol.ToolResult {
		t.Helper()
		code, body := cs.call(t, http.MethodPost, "/v1/route", key, `{"request_id":"`+id+`","tool_calls":[{"tool_call_id":"c1","name":"`+tool+`","arguments":`+args+`}]}`)
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", id, code, body)
		}
		return result(t, decodeResponse(t, []byte(body)), "c1")
	}
	if r := route(userKey, "pol-user", "meeting_book", `{"title":"x","attendees":["zhangwei"],"start_time":"2025-01-15T09:00:00","duration_minutes":30}`); r.ErrorCode != protocol.CodePolicyDenied || r.Policy == nil || r.Policy.Rule != "allowed_roles" {
		t.Fatalf("a user booking: %+v %s", r, r.Content)
	}
	many := make([]string, 21)
	for i := range many {
		many[i] = fmt.Sprintf("u%d", i)
	}
	ids, _ := json.Marshal(many)
	if r := route(cs.sys.Key.Key, "pol-21", "notify_send", `{"user_ids":`+string(ids)+`,"message":"hi"}`); r.ErrorCode != protocol.CodePolicyDenied || !strings.Contains(string(r.Content), "21 recipients") {
		t.Fatalf("21 recipients: %+v %s", r, r.Content)
	}
	limited := 0
	for i := range 11 {
		r := route(opsKey, fmt.Sprintf("pol-n%d", i), "notify_send", `{"user_ids":["zhangwei"],"message":"hi"}`)
		if r.ErrorCode == protocol.CodeRateLimited {
			limited++
			if r.Policy == nil || r.Policy.RetryAt.IsZero() {
				t.Fatalf("limited without a retry time: %+v", r)
			}
		}
	}
	if limited != 1 {
		t.Fatalf("%d of 11 notices limited; 10 fit in the minute", limited)
	}
}

// call sends method path as the caller of key, and returns the status and body.
func (cs *chatSystem) call(t *testing.T, method, path, key, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, cs.sys.GatewayURL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}
