package agent_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/hermesbus/hermes/internal/agent"
	"github.com/hermesbus/hermes/internal/llm"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// A backend that echoes its API key — in the arguments of the tool it calls, then in its
// answer — passes it neither to the client (the answer, the conversation returned), nor to
// the record (the decisions), nor to the bus (the calls' arguments).
func TestTheBackendsKeyReachesNeitherClientNorRecord(t *testing.T) {
	const key = "sk-live-4f7c0a9e2b61d853"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []struct {
				Role string `json:"role"`
			} `json:"messages"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		w.Header().Set("Content-Type", "application/json")
		msg := fmt.Sprintf(`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
			"function":{"name":"lookup","arguments":"{\"q\":\"%s\",\"r\":\"\\u0073k-live-4f7c0a9e2b61d853\"}"}}]}`, got)
		if last := req.Messages[len(req.Messages)-1].Role; last == "tool" {
			msg = fmt.Sprintf(`{"role":"assistant","content":"Done. Your key, in case you need it: %s"}`, got)
		}
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":%s}],
			"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`, msg)
	}))
	t.Cleanup(srv.Close)
	c, err := llm.New(llm.Config{LookupEnv: func(string) (string, bool) { return key, true },
		Backend: llm.Backend{BaseURL: srv.URL + "/v1", Model: "m", KeyEnv: "LLM_KEY", MaxRetries: new(int)}})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		args []string
	)
	run := &runner{answer: func(c protocol.ToolCall) protocol.ToolResult {
		mu.Lock()
		args = append(args, string(c.Arguments))
		mu.Unlock()
		return protocol.ToolResult{Status: protocol.ResultOK, Content: json.RawMessage(`{"found":true}`)}
	}}
	rec := &decisions{}
	l := &agent.Loop{LLM: c, Runner: run, Record: rec}
	out, err := l.Run(t.Context(), agent.Run{Session: "sess_k", RequestID: "chat_k", Messages: user("look it up"), Intent: "look it up",
		Tools: []agent.Tool{{Name: "lookup"}}})
	if err != nil {
		t.Fatal(err)
	}
	if out.Turns != 2 || len(args) != 1 || !strings.Contains(out.Answer.Content, "[redacted]") {
		t.Fatalf("turns %d, calls %q, answer %q", out.Turns, args, out.Answer.Content)
	}
	seen := map[string]any{"the answer": out.Answer, "the conversation": out.Messages, "the client's calls": out.ClientCalls,
		"the decisions": rec.ds, "the calls' arguments": args}
	for what, v := range seen {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if s := string(b); strings.Contains(s, key) || strings.Contains(s, key[:10]) || strings.Contains(s, `\\u0073k-live`) {
			t.Errorf("%s holds the key: %s", what, s)
		}
	}
}
