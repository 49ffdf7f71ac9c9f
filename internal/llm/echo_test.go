package llm_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/internal/llm"
)

// echoing is an OpenAI-compatible backend (loopback) that puts the key it was sent, and the
// text named by the X-Echo header of its test, into every part of its answer: the content,
// a tool call's id, name and arguments (there written with \u escapes), the refusal, a field
// no client reads, and an embedding's model.
func echoing(t *testing.T, extra string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		escaped := ""
		for _, c := range got {
			escaped += fmt.Sprintf(`\\u%04x`, c)
		}
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/embeddings") {
			fmt.Fprintf(w, `{"object":"list","model":"embed %s %s","data":[{"object":"embedding","index":0,"embedding":[0.5]}],"usage":{"prompt_tokens":1,"total_tokens":1}}`, got, extra)
			return
		}
		fmt.Fprintf(w, `{"id":"c-%[1]s","object":"chat.completion","created":1,"model":"m %[1]s","system_fingerprint":"%[1]s %[3]s",
			"choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":"your key is %[1]s, and %[3]s","refusal":"%[1]s",
			"tool_calls":[{"id":"call_%[1]s","type":"function","function":{"name":"lookup_%[1]s","arguments":"{\"key\":\"%[2]s\",\"also\":\"%[3]s\"}"}}]}}],
			"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`, got, escaped, extra)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

// A backend that echoes its key (or the embedding model's) in a normal answer passes neither
// on: whatever the client reads of the answer — its text, its tool calls, the message as
// given back to the model, the answer's raw JSON — holds [redacted] instead.
func TestAKeyEchoedInAnAnswerIsRedacted(t *testing.T) {
	const chatKey, embedKey = "sk-chat-0123456789abcdef", "sk-embed-fedcba9876543210"
	keys := map[string]string{"CHAT_KEY": chatKey, "EMBED_KEY": embedKey}
	base := echoing(t, embedKey)
	c, err := llm.New(llm.Config{LookupEnv: func(n string) (string, bool) { v, ok := keys[n]; return v, ok },
		Backend:    llm.Backend{BaseURL: base, Model: "m", KeyEnv: "CHAT_KEY", MaxRetries: retries(0)},
		Embeddings: &llm.Backend{BaseURL: echoing(t, chatKey), Model: "embed", KeyEnv: "EMBED_KEY"}})
	if err != nil {
		t.Fatal(err)
	}
	resp, _, err := c.Complete(t.Context(), ask("hi"), llm.Answer)
	if err != nil {
		t.Fatal(err)
	}
	msg := resp.Choices[0].Message
	param, _ := json.Marshal(msg.ToParam())
	whole, _ := json.Marshal(resp)
	seen := map[string]string{"content": msg.Content, "refusal": msg.Refusal, "raw": resp.RawJSON(), "message raw": msg.RawJSON(),
		"as a param": string(param), "marshalled": string(whole), "id": resp.ID, "model": resp.Model}
	for _, tc := range msg.ToolCalls {
		seen["call id"], seen["call name"], seen["call arguments"] = tc.ID, tc.Function.Name, tc.Function.Arguments
	}
	for what, s := range seen {
		for _, k := range []string{chatKey, embedKey} {
			if strings.Contains(s, k) || strings.Contains(s, k[:12]) {
				t.Errorf("the %s holds a key: %s", what, s)
			}
		}
	}
	if !strings.Contains(msg.Content, "[redacted]") || !strings.Contains(msg.ToolCalls[0].Function.Arguments, "[redacted]") {
		t.Errorf("content %q, arguments %q", msg.Content, msg.ToolCalls[0].Function.Arguments)
	}
	var args map[string]string
	if err := json.Unmarshal([]byte(msg.ToolCalls[0].Function.Arguments), &args); err != nil || args["key"] != "[redacted]" {
		t.Errorf("arguments %q: %v", msg.ToolCalls[0].Function.Arguments, err)
	}
	if _, err := c.Embed(t.Context(), []string{"x"}); err != nil {
		t.Fatal(err)
	}
}
