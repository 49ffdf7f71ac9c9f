package chat

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/internal/scriptedllm"
)

// Ollama's /api/chat, whole (stream false): the answer in Ollama's shape, its token counts and
// what Hermes ran.
func TestOllamaAnswer(t *testing.T) {
	h := newHarness(t, echoThenAnswer(), nil)
	r := h.post("/api/chat", `{"model":"hermes","stream":false,"messages":[{"role":"user","content":"say hi"}],"options":{"temperature":0.1,"top_p":0.5,"num_predict":9,"seed":3,"stop":["END"]}}`,
		headerSession, "sess_o")
	if r.code != http.StatusOK {
		t.Fatalf("%d %s", r.code, r.body)
	}
	out := r.json(t)
	msg := out["message"].(map[string]any)
	if out["done"] != true || out["done_reason"] != "stop" || out["model"] != "scripted" || msg["content"] != "echoed hi" || msg["role"] != "assistant" ||
		out["prompt_eval_count"].(float64) == 0 || out["hermes"].(map[string]any)["session_id"] != "sess_o" {
		t.Errorf("%s", r.body)
	}
	if len(h.sub.submitted()) != 1 || len(h.pub.published()) != 2 {
		t.Errorf("%d requests, %d decisions", len(h.sub.submitted()), len(h.pub.published()))
	}
	req, err := ollamaWire{}.decode([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"options":{"temperature":0.1,"top_p":0.5,"num_predict":9,"seed":3,"stop":["END"]},"format":""}`))
	if p := req.Params; err != nil || p.Temperature.Value != 0.1 || p.TopP.Value != 0.5 || p.MaxCompletionTokens.Value != 9 || p.Seed.Value != 3 ||
		len(p.Stop.OfStringArray) != 1 || !req.Stream {
		t.Errorf("%v %+v", err, req)
	}
}

// An Ollama client's own tools: its calls come back as Ollama's (arguments an object, each
// with an id); the client sends the message back as it keeps it, and its result without an id,
// matched to the call by tool_name; the run goes on with Hermes' result kept meanwhile.
func TestOllamaClientToolRoundTrip(t *testing.T) {
	h := newHarness(t, mixedTurn("notes.md"), nil)
	user := `{"role":"user","content":"open my notes"}`
	r := h.post("/api/chat", `{"model":"hermes","stream":false,"tools":`+openEditor+`,"messages":[`+user+`]}`, headerSession, "sess_oc")
	msg := r.json(t)["message"].(map[string]any)
	calls, _ := msg["tool_calls"].([]any)
	if r.code != http.StatusOK || len(calls) != 1 {
		t.Fatalf("%d %s", r.code, r.body)
	}
	c := calls[0].(map[string]any)
	fn := c["function"].(map[string]any)
	if c["id"] != "call_c" || fn["name"] != "open_editor" || fn["arguments"].(map[string]any)["path"] != "notes.md" {
		t.Fatalf("%v", c)
	}
	back, _ := json.Marshal(map[string]any{"role": "assistant", "content": "", "tool_calls": []any{map[string]any{"id": c["id"], "function": fn}}})
	r = h.post("/api/chat", `{"model":"hermes","stream":false,"tools":`+openEditor+`,"messages":[`+user+`,`+string(back)+
		`,{"role":"tool","tool_name":"open_editor","content":"opened"}]}`, headerSession, "sess_oc")
	if r.code != http.StatusOK || r.json(t)["message"].(map[string]any)["content"] != "both done" {
		t.Fatalf("%d %s", r.code, r.body)
	}
	if got := h.modelRead(); got != "user:,assistant:,tool:call_h,tool:call_c" || len(h.sub.submitted()) != 1 {
		t.Errorf("the model read %s; %d requests", got, len(h.sub.submitted()))
	}
	if got := h.pub.recorded(); got != "user:,assistant:,tool:call_h,tool:call_c" {
		t.Errorf("recorded %s", got)
	}
}

// Ollama's messages carry no call ids: the calls of an assistant message are named by their
// place, its arguments taken as an object or a JSON string, and a tool message without an id
// answers the first open call of its tool_name (any, without one).
func TestOllamaNamesTheCalls(t *testing.T) {
	req, err := ollamaWire{}.decode([]byte(`{"model":"m","messages":[{"role":"user","content":"x"},
		{"role":"assistant","tool_calls":[{"function":{"name":"a","arguments":{"k":1}}},{"function":{"name":"b","arguments":"{\"k\":2}"}},{"function":{"name":"a"}}]},
		{"role":"tool","tool_name":"b","content":"rb"},{"role":"tool","content":"ra"},{"role":"tool","tool_name":"a","content":"ra2"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range req.Messages[1].ToolCalls {
		got = append(got, c.ID+"="+c.Function.Name+c.Function.Arguments)
	}
	for _, m := range req.Messages[2:] {
		got = append(got, m.ToolCallID)
	}
	if want := `ollama_1_0=a{"k":1} ollama_1_1=b{"k":2} ollama_1_2=a{} ollama_1_1 ollama_1_0 ollama_1_2`; strings.Join(got, " ") != want {
		t.Errorf("got  %s\nwant %s", strings.Join(got, " "), want)
	}
	// A tool message that answers no open call is refused, as OpenAI's is.
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"x"},{"role":"tool","tool_name":"a","content":"r"}]}`,
		`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"a"}}]},{"role":"user","content":"x"},{"role":"tool","content":"r"}]}`,
	} {
		if _, err := (ollamaWire{}).decode([]byte(body)); err == nil || !strings.Contains(err.Error(), "messages[") {
			t.Errorf("%s: %v", body, err)
		}
	}
}

// Refused in Ollama's shape: {"error": …} naming the field; an unknown model 404 naming where
// the models are listed; a run that fails, its error's message.
func TestOllamaRefusals(t *testing.T) {
	h := newHarness(t, conversation(scriptedllm.Turn{Status: 400, Message: "too long for me"}), nil)
	for _, tc := range []struct {
		body string
		code int
		want string
	}{
		{`{"messages":[{"role":"user","content":"x"}]}`, 400, "model: is required"},
		{`{"model":"llama3","messages":[{"role":"user","content":"x"}]}`, 404, `model "llama3" not found, try "scripted" (GET /api/tags)`},
		{`{"model":"hermes","messages":[]}`, 400, "messages: is required"},
		{`{"model":"hermes","messages":[1]}`, 400, "messages[0]: must be a message object"},
		{`{"model":"hermes","messages":[{"role":"user","content":"x","images":["aGk="]}]}`, 400, "messages[0].images"},
		{`{"model":"hermes","messages":[{"role":"user","content":"x"}],"format":"json"}`, 400, "format"},
		{`{"model":"hermes","messages":[{"role":"user","content":"x"}],"options":{"stop":"x"}}`, 400, "options.stop"},
		{`{"model":"hermes","messages":[{"role":"user","content":"x"}],"tools":[{"type":"x"}]}`, 400, "tools[0].type"},
		{`{"model":"hermes","messages":[{"role":"user","content":"x"}],"stream":"no"}`, 400, "stream"},
		{`{"model":"hermes","stream":false,"messages":[{"role":"user","content":"x"}]}`, 400, "too long for me"},
	} {
		r := h.post("/api/chat", tc.body)
		out := r.json(t)
		if msg, _ := out["error"].(string); r.code != tc.code || len(out) != 1 || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: %d %s", tc.body, r.code, r.body)
		}
	}
}
