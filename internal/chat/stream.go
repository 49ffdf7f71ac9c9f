package chat

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// chatStream answers a chat completion as server-sent events, as OpenAI streams one: chunks of
// chat.completion.chunk, then "data: [DONE]". While the loop runs, progress goes out as chunks
// whose delta is empty and whose "hermes" field says what happened (a decision, a turn's
// results): OpenAI clients ignore the field, and nothing in it is a tool call a client would run.
// An error after the stream began is one event {"error":{…}}, as OpenAI sends it.
type chatStream struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	rc      *http.ResponseController
	broken  bool // a write failed: the client is gone or stopped reading
	id      string
	model   string
	created int64
}

// chatWriteTimeout bounds each write of a stream: a client that stops reading does not hold
// the run (it goes on, and ends, without it).
const chatWriteTimeout = 30 * time.Second

func newChatStream(w http.ResponseWriter, id, model string) *chatStream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s := &chatStream{w: w, rc: http.NewResponseController(w), id: id, model: model, created: time.Now().Unix()}
	s.chunk(map[string]any{"role": "assistant", "content": ""}, nil, nil, nil)
	return s
}

func (s *chatStream) send(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	s.write(append(append([]byte("data: "), b...), '\n', '\n'))
}

func (s *chatStream) write(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken {
		return
	}
	_ = s.rc.SetWriteDeadline(time.Now().Add(chatWriteTimeout))
	if _, err := s.w.Write(b); err != nil {
		s.broken = true
		return
	}
	if err := s.rc.Flush(); err != nil {
		s.broken = true
	}
}

// chunk sends one chat.completion.chunk.
func (s *chatStream) chunk(delta map[string]any, finish any, usage any, hermes map[string]any) {
	c := map[string]any{"id": s.id, "object": "chat.completion.chunk", "created": s.created, "model": s.model,
		"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": nil}}}
	if usage != nil {
		c["usage"] = usage
	}
	if hermes != nil {
		c["hermes"] = hermes
	}
	s.send(c)
}

// progress tells of the loop's progress (a chunk with an empty delta).
func (s *chatStream) progress(ev map[string]any) { s.chunk(map[string]any{}, nil, nil, ev) }

// finish streams body, the run's answer (a completion, or an error object), and ends the
// stream. The answer's text goes as one content delta, the client's tool calls as tool_calls
// deltas, then the finish reason with the usage; with includeUsage, a last chunk without
// choices carries the usage, as OpenAI sends it.
func (s *chatStream) finish(status int, body map[string]any, includeUsage bool) {
	if status != http.StatusOK {
		s.send(body)
		s.done()
		return
	}
	choices, _ := body["choices"].([]any)
	if len(choices) == 0 {
		s.done()
		return
	}
	choice, _ := choices[0].(map[string]any)
	msg, _ := choice["message"].(map[string]any)
	if text, _ := msg["content"].(string); text != "" {
		s.chunk(map[string]any{"content": text}, nil, nil, nil)
	}
	if calls := toolCallsOf(msg["tool_calls"]); len(calls) > 0 {
		var deltas []any
		for i, c := range calls {
			deltas = append(deltas, map[string]any{"index": i, "id": c.ID, "type": "function",
				"function": map[string]any{"name": c.Function.Name, "arguments": c.Function.Arguments}})
		}
		s.chunk(map[string]any{"tool_calls": deltas}, nil, nil, nil)
	}
	usage := body["usage"]
	hermes, _ := body["hermes"].(map[string]any)
	if includeUsage {
		s.chunk(map[string]any{}, choice["finish_reason"], nil, hermes)
		s.send(map[string]any{"id": s.id, "object": "chat.completion.chunk", "created": s.created, "model": s.model,
			"choices": []any{}, "usage": usage})
	} else {
		s.chunk(map[string]any{}, choice["finish_reason"], usage, hermes)
	}
	s.done()
}

func (s *chatStream) done() { s.write([]byte("data: [DONE]\n\n")) }

// toolCallsOf reads the tool calls of an answer, whether made here or read back from a kept
// answer (JSON).
func toolCallsOf(v any) []chatToolCall {
	switch calls := v.(type) {
	case []chatToolCall:
		return calls
	case nil:
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	var out []chatToolCall
	_ = json.Unmarshal(b, &out)
	return out
}
