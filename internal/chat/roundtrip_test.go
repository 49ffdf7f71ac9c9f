package chat

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/internal/scriptedllm"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// mixedTurn: the model calls Hermes' echo and the client's open_editor in one turn, then
// answers once it has both results.
func mixedTurn(path string) *scriptedllm.Script {
	return conversation(
		scriptedllm.Turn{ToolCalls: []scriptedllm.ToolCall{call("call_h", "echo", map[string]any{"text": "hermes runs me"}),
			call("call_c", "open_editor", map[string]any{"path": path})}},
		scriptedllm.Turn{Content: "both done"})
}

const openEditor = `[{"type":"function","function":{"name":"open_editor","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}}]`

// The client-tool round trip: Hermes runs its own call and returns the client's as an ordinary
// tool call; the client's next POST, with the call's result, continues the run — the model reads
// its whole message and Hermes' result, kept meanwhile — and nothing runs or is recorded twice.
func TestClientToolRoundTrip(t *testing.T) {
	h := newHarness(t, mixedTurn("notes.md"), nil)
	user := `{"role":"user","content":"open my notes"}`
	r := h.post("/v1/chat/completions", `{"model":"scripted","tools":`+openEditor+`,"messages":[`+user+`]}`, headerSession, "sess_ct")
	choice := r.json(t)["choices"].([]any)[0].(map[string]any)
	msg := choice["message"].(map[string]any)
	calls, _ := msg["tool_calls"].([]any)
	if r.code != http.StatusOK || choice["finish_reason"] != "tool_calls" || msg["content"] != nil || len(calls) != 1 ||
		calls[0].(map[string]any)["id"] != "call_c" {
		t.Fatalf("%d %s", r.code, r.body)
	}
	if subs := h.sub.submitted(); len(subs) != 1 || len(subs[0].Request.ToolCalls) != 1 || subs[0].Request.ToolCalls[0].Name != "echo" {
		t.Fatalf("submitted %+v", subs)
	}
	pending := 0
	for _, k := range h.kv.Keys() {
		if strings.HasPrefix(k, "chatpend.") {
			pending++
		}
	}
	if pending != 1 {
		t.Fatalf("kept %v", h.kv.Keys())
	}

	back, _ := json.Marshal(msg)
	r = h.post("/v1/chat/completions", `{"model":"scripted","tools":`+openEditor+`,"messages":[`+user+`,`+string(back)+
		`,{"role":"tool","tool_call_id":"call_c","content":"{\"opened\":true}"}]}`, headerSession, "sess_ct")
	if r.code != http.StatusOK || r.json(t)["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"] != "both done" {
		t.Fatalf("%d %s", r.code, r.body)
	}
	// The model read the run whole: its message with both calls, Hermes' result, the client's.
	if got := h.modelRead(); got != "user:,assistant:,tool:call_h,tool:call_c" {
		t.Errorf("the model read %s", got)
	}
	reqs := h.model.Requests()
	last := reqs[len(reqs)-1].Messages
	if len(last[1].ToolCalls) != 2 || !strings.Contains(last[2].Text(), "hermes runs me") || !strings.Contains(last[3].Text(), "opened") {
		t.Errorf("the model read %+v", last)
	}
	// Nothing ran twice, nothing is recorded twice.
	if n := len(h.sub.submitted()); n != 1 {
		t.Errorf("%d requests submitted", n)
	}
	if got := h.pub.recorded(); got != "user:,assistant:,tool:call_h,tool:call_c" {
		t.Errorf("recorded %s", got)
	}
	var st chatState
	if err := json.Unmarshal(h.kv.Value(chatKey("sess_ct")), &st); err != nil || len(st.Seen) != 4 {
		t.Errorf("state %+v %v", st, err)
	}
}

// A run whose pending turn is too large to keep goes on from what the client has: the model
// reads its own call and the client's result, without Hermes' result of the run.
func TestClientToolRoundTripTooLargeToKeep(t *testing.T) {
	h := newHarness(t, mixedTurn(strings.Repeat("x", maxPendingBytes)), nil)
	user := `{"role":"user","content":"open my notes"}`
	r := h.post("/v1/chat/completions", `{"model":"scripted","tools":`+openEditor+`,"messages":[`+user+`]}`, headerSession, "sess_big")
	msg := r.json(t)["choices"].([]any)[0].(map[string]any)["message"]
	for _, k := range h.kv.Keys() {
		if strings.HasPrefix(k, "chatpend.") {
			t.Errorf("kept %s", k)
		}
	}
	back, _ := json.Marshal(msg)
	r = h.post("/v1/chat/completions", `{"model":"scripted","tools":`+openEditor+`,"messages":[`+user+`,`+string(back)+
		`,{"role":"tool","tool_call_id":"call_c","content":"opened"}]}`, headerSession, "sess_big")
	if r.code != http.StatusOK {
		t.Fatalf("%d %s", r.code, r.body)
	}
	if got := h.modelRead(); got != "user:,assistant:,tool:call_c" {
		t.Errorf("the model read %s", got)
	}
}

// A history resent is matched to what the session's state holds: what matches is not recorded
// again; one that differs is recorded again as sent, the first decision warning of it. A state
// that cannot be read is a new conversation.
func TestHistoryMatchesTheSessionsState(t *testing.T) {
	h := newHarness(t, &scriptedllm.Script{Conversations: []scriptedllm.Conversation{{Name: "any", Turns: []scriptedllm.Turn{{Content: "first"}},
		Then: &scriptedllm.Turn{Content: "again"}}}}, nil)
	post := func(msgs string) {
		t.Helper()
		if r := h.post("/v1/chat/completions", `{"model":"scripted","messages":[`+msgs+`]}`, headerSession, "sess_h"); r.code != http.StatusOK {
			t.Fatalf("%d %s", r.code, r.body)
		}
	}
	post(`{"role":"user","content":"a"}`)
	post(`{"role":"user","content":"a"},{"role":"assistant","content":"first"},{"role":"user","content":"b"}`)
	ds := h.pub.published()
	if got := h.pub.recorded(); got != "user:,user:" || len(ds[1].Warnings) != 0 {
		t.Errorf("recorded %s, warnings %+v", got, ds[1].Warnings)
	}
	post(`{"role":"user","content":"edited"}`)
	ds = h.pub.published()
	if w := ds[len(ds)-1].Warnings; len(w) != 1 || w[0].Kind != protocol.WarnHistory {
		t.Errorf("warnings %+v", w)
	}
	if _, err := h.kv.Put(t.Context(), chatKey("sess_h"), []byte("not json")); err != nil {
		t.Fatal(err)
	}
	post(`{"role":"user","content":"a"}`)
	if ds = h.pub.published(); len(ds[len(ds)-1].Warnings) != 0 || ds[len(ds)-1].Messages[0].Content != "a" {
		t.Errorf("after an unreadable state: %+v", ds[len(ds)-1])
	}
	var st chatState
	if err := json.Unmarshal(h.kv.Value(chatKey("sess_h")), &st); err != nil || len(st.Seen) != 2 {
		t.Errorf("the state was not kept again: %s", h.kv.Value(chatKey("sess_h")))
	}
}
