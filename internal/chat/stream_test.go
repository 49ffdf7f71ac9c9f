package chat

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/internal/scriptedllm"
)

// chunk is one chat.completion.chunk of a stream.
type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Delta        map[string]any `json:"delta"`
		FinishReason *string        `json:"finish_reason"`
	} `json:"choices"`
	Usage  map[string]any `json:"usage"`
	Hermes map[string]any `json:"hermes"`
	Error  map[string]any `json:"error"`
}

// chunks are a stream's chunks, checking it ends with [DONE] and nothing after.
func chunks(t *testing.T, r reply) []chunk {
	t.Helper()
	if r.code != http.StatusOK || r.header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("%d %v", r.code, r.header)
	}
	events := r.events(t)
	if len(events) == 0 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("the stream does not end with [DONE]: %q", events)
	}
	var out []chunk
	for _, e := range events[:len(events)-1] {
		var c chunk
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatalf("%v: %s", err, e)
		}
		out = append(out, c)
	}
	return out
}

// Streamed, the run goes out as OpenAI streams: the role first, progress as chunks with an
// empty delta and a "hermes" field (each decision, each turn's results; never a tool_calls
// delta for a call Hermes runs), the answer's text, the finish reason with what Hermes ran, and
// with include_usage a last chunk of the usage alone; then [DONE].
func TestOpenAIStream(t *testing.T) {
	h := newHarness(t, echoThenAnswer(), nil)
	r := h.post("/v1/chat/completions", `{"model":"scripted","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"say hi"}]}`,
		headerSession, "sess_s")
	cs := chunks(t, r)
	run := r.header.Get("X-Hermes-Run-ID")
	var shape []string
	for _, c := range cs {
		if c.ID != run || c.Object != "chat.completion.chunk" || c.Model != "scripted" {
			t.Errorf("chunk %+v", c)
		}
		switch {
		case len(c.Choices) == 0:
			if c.Usage["total_tokens"].(float64) == 0 {
				t.Errorf("usage %v", c.Usage)
			}
			shape = append(shape, "usage")
		case c.Choices[0].Delta["tool_calls"] != nil:
			t.Errorf("a tool_calls delta for Hermes' call: %+v", c)
		case c.Choices[0].FinishReason != nil:
			if c.Usage != nil || c.Hermes["run_id"] != run || len(c.Hermes["calls"].([]any)) != 1 {
				t.Errorf("finish %+v", c)
			}
			shape = append(shape, "finish:"+*c.Choices[0].FinishReason)
		case c.Hermes != nil:
			ev := c.Hermes
			shape = append(shape, ev["event"].(string))
			if ev["event"] == "decided" && ev["turn"] == 1.0 && (ev["request_id"] != run+"-1" || ev["model"] != "scripted" || ev["calls"].([]any)[0] != "echo") {
				t.Errorf("decided %v", ev)
			}
			if ev["event"] == "results" && ev["results"].([]any)[0].(map[string]any)["name"] != "echo" {
				t.Errorf("results %v", ev)
			}
		case c.Choices[0].Delta["role"] == "assistant":
			shape = append(shape, "role")
		default:
			shape = append(shape, "text:"+c.Choices[0].Delta["content"].(string))
		}
	}
	if got := strings.Join(shape, " "); got != "role decided results decided text:echoed hi finish:stop usage" {
		t.Errorf("streamed %s", got)
	}
}

// Without include_usage the usage rides on the finish chunk; the client's calls go out as
// tool_calls deltas, finishing with tool_calls.
func TestOpenAIStreamsTheClientsCalls(t *testing.T) {
	h := newHarness(t, conversation(scriptedllm.Turn{Content: "let me open it",
		ToolCalls: []scriptedllm.ToolCall{call("call_c", "open_editor", map[string]any{"path": "a.md"})}}), nil)
	cs := chunks(t, h.post("/v1/chat/completions", `{"model":"scripted","stream":true,"messages":[{"role":"user","content":"open a.md"}],
		"tools":[{"type":"function","function":{"name":"open_editor"}}]}`))
	last := cs[len(cs)-1]
	if *last.Choices[0].FinishReason != "tool_calls" || last.Usage["total_tokens"].(float64) == 0 {
		t.Errorf("finish %+v", last)
	}
	var text string
	var calls []any
	for _, c := range cs {
		if s, ok := c.Choices[0].Delta["content"].(string); ok {
			text += s
		}
		if tc, ok := c.Choices[0].Delta["tool_calls"].([]any); ok {
			calls = append(calls, tc...)
		}
	}
	b, _ := json.Marshal(calls)
	if text != "let me open it" || string(b) != `[{"function":{"arguments":"{\"path\":\"a.md\"}","name":"open_editor"},"id":"call_c","index":0,"type":"function"}]` {
		t.Errorf("text %q, calls %s", text, b)
	}
}

// A run that fails after the stream began ends it with one error event, as OpenAI sends one.
func TestOpenAIStreamError(t *testing.T) {
	h := newHarness(t, conversation(scriptedllm.Turn{Status: 503, Message: "overloaded"}), nil)
	cs := chunks(t, h.post("/v1/chat/completions", `{"model":"scripted","stream":true,"messages":[{"role":"user","content":"x"}]}`))
	last := cs[len(cs)-1]
	if last.Error["code"] != "llm_unavailable" || last.Error["type"] != "upstream_error" || len(last.Choices) != 0 {
		t.Errorf("%+v", cs)
	}
}

// Ollama streams unless told not to: one JSON object a line, progress with an empty message and
// a "hermes" field, the text, then the last line (done, its reason, the token counts).
func TestOllamaStream(t *testing.T) {
	h := newHarness(t, echoThenAnswer(), nil)
	r := h.post("/api/chat", `{"model":"scripted","messages":[{"role":"user","content":"say hi"}]}`)
	if r.code != http.StatusOK || r.header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("%d %v", r.code, r.header)
	}
	var shape []string
	lines := r.lines(t)
	for i, l := range lines {
		msg := l["message"].(map[string]any)
		if l["model"] != "scripted" || l["created_at"] == "" || msg["role"] != "assistant" || msg["tool_calls"] != nil || (l["done"] == true) != (i == len(lines)-1) {
			t.Errorf("line %d: %v", i, l)
		}
		switch {
		case l["done"] == true:
			if l["done_reason"] != "stop" || l["prompt_eval_count"].(float64) == 0 || l["eval_count"] == nil || msg["content"] != "" || l["hermes"] == nil {
				t.Errorf("the last line %v", l)
			}
			shape = append(shape, "done")
		case l["hermes"] != nil:
			shape = append(shape, l["hermes"].(map[string]any)["event"].(string))
		default:
			shape = append(shape, "text:"+msg["content"].(string))
		}
	}
	if got := strings.Join(shape, " "); got != "decided results decided text:echoed hi done" {
		t.Errorf("streamed %s", got)
	}
	// A run that fails ends the stream with Ollama's error line.
	h = newHarness(t, conversation(scriptedllm.Turn{Status: 503, Message: "overloaded"}), nil)
	lines = h.post("/api/chat", `{"model":"scripted","messages":[{"role":"user","content":"x"}]}`).lines(t)
	if e, _ := lines[len(lines)-1]["error"].(string); !strings.Contains(e, "overloaded") {
		t.Errorf("%v", lines)
	}
}

// brokenWriter is a client that stopped reading: every write fails.
type brokenWriter struct {
	header http.Header
	writes int
}

func (w *brokenWriter) Header() http.Header { return w.header }
func (w *brokenWriter) WriteHeader(int)     {}
func (w *brokenWriter) count() int          { return w.writes }
func (w *brokenWriter) Write([]byte) (int, error) {
	w.writes++
	return 0, errors.New("the client is gone")
}

// plainWriter takes writes but cannot flush them.
type plainWriter struct {
	brokenWriter
	body strings.Builder
}

func (w *plainWriter) Write(b []byte) (int, error) { w.writes++; return w.body.Write(b) }

// A stream whose write or flush fails writes nothing more: the run goes on without its client.
func TestStreamsStopWritingToAGoneClient(t *testing.T) {
	for name, w := range map[string]interface {
		http.ResponseWriter
		count() int
	}{"write fails": &brokenWriter{header: http.Header{}}, "no flush": &plainWriter{brokenWriter: brokenWriter{header: http.Header{}}}} {
		s := newChatStream(w, "run", "m")
		s.progress(map[string]any{"event": "decided"})
		s.finish(http.StatusOK, map[string]any{"choices": []any{map[string]any{"message": map[string]any{"content": "x"}}}}, true)
		o := (ollamaWire{}).stream(w, "run", "m")
		o.progress(map[string]any{"event": "decided"})
		o.finish(http.StatusOK, map[string]any{}, false)
		if n := w.count(); n != 2 {
			t.Errorf("%s: %d writes, want one per stream", name, n)
		}
	}
}
