package chat

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/param"

	"github.com/hermesbus/hermes/internal/httpapi"
)

// Ollama's chat API as a second front door: POST /api/chat runs the same loop for Ollama's
// clients (its request shape; its answer whole, or streamed as one JSON object a line, as Ollama
// streams by default). Ollama's messages carry no call ids: Hermes names the calls of an
// assistant message by their place (ollama_<message>_<index>) and matches a tool message to the
// calls before it by tool_name, else in order; the answer's calls carry their ids (an "id"
// beside "function"), which a client may send back.

// ollamaWire is POST /api/chat.
type ollamaWire struct{}

func (ollamaWire) writeError(w http.ResponseWriter, e *chatError) {
	writeRetryAfter(w, e)
	httpapi.WriteJSON(w, e.Status, map[string]any{"error": e.Message})
}

func (ollamaWire) unknownModel(model, served string) *chatError {
	return &chatError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model",
		Message: fmt.Sprintf("model %q not found, try %q (GET /api/tags)", protocolShort(model), served)}
}

func (ollamaWire) decode(body []byte) (*chatRequest, error) {
	var raw struct {
		Model    *string           `json:"model"`
		Messages []json.RawMessage `json:"messages"`
		Tools    []json.RawMessage `json:"tools"`
		Stream   *bool             `json:"stream"`
		Options  *struct {
			Temperature *float64        `json:"temperature"`
			TopP        *float64        `json:"top_p"`
			NumPredict  *int64          `json:"num_predict"`
			Seed        *int64          `json:"seed"`
			Stop        json.RawMessage `json:"stop"`
		} `json:"options"`
		Format json.RawMessage `json:"format"`
	}
	if err := decodeBody(body, &raw, ""); err != nil {
		return nil, err
	}
	if err := checkShape(raw.Model, len(raw.Messages), len(raw.Tools), "GET /api/tags"); err != nil {
		return nil, err
	}
	switch {
	case len(raw.Format) > 0 && string(raw.Format) != "null" && string(raw.Format) != `""`:
		return nil, badParam("format", "structured output is not taken by Hermes' loop")
	}
	req := &chatRequest{Model: *raw.Model, Stream: raw.Stream == nil || *raw.Stream} // Ollama streams unless told not to
	if err := req.decodeConversation(raw.Messages, raw.Tools, decodeOllamaMessage); err != nil {
		return nil, err
	}
	if o := raw.Options; o != nil {
		p := &req.Params
		if o.Temperature != nil {
			p.Temperature = param.NewOpt(*o.Temperature)
		}
		if o.TopP != nil {
			p.TopP = param.NewOpt(*o.TopP)
		}
		if o.NumPredict != nil && *o.NumPredict > 0 {
			p.MaxCompletionTokens = param.NewOpt(*o.NumPredict)
		}
		if o.Seed != nil {
			p.Seed = param.NewOpt(*o.Seed)
		}
		if len(o.Stop) > 0 && string(o.Stop) != "null" {
			var stop []string
			if json.Unmarshal(o.Stop, &stop) != nil || len(stop) > 4 {
				return nil, badParam("options.stop", "must be up to 4 strings")
			}
			p.Stop = openai.ChatCompletionNewParamsStopUnion{OfStringArray: stop}
		}
	}
	return req, nil
}

// decodeOllamaMessage reads the message at index i of an Ollama conversation, whose earlier
// messages are before: its calls named by their place, a tool message matched to the calls of
// the assistant message before it.
func decodeOllamaMessage(at string, i int, data json.RawMessage, before []chatMessage) (chatMessage, error) {
	var raw struct {
		Role       *string         `json:"role"`
		Content    json.RawMessage `json:"content"`
		Images     []string        `json:"images"`
		ToolName   string          `json:"tool_name"`
		ToolCallID string          `json:"tool_call_id"`
		ToolCalls  []struct {
			ID       string `json:"id"`
			Function struct {
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return chatMessage{}, badParam(at, "must be a message object")
	}
	if len(raw.Images) > 0 {
		return chatMessage{}, badParam(at+".images", "only text is taken")
	}
	// Re-encoded in OpenAI's shape, the message is read as the OpenAI front door reads one.
	m := map[string]any{"role": raw.Role, "content": raw.Content}
	if raw.Role != nil && *raw.Role == "tool" {
		id := raw.ToolCallID
		if id == "" {
			id = answeredCall(before, raw.ToolName)
		}
		m["tool_call_id"] = id
	}
	if len(raw.ToolCalls) > 0 {
		var calls []map[string]any
		for j, c := range raw.ToolCalls {
			id := c.ID
			if id == "" {
				id = fmt.Sprintf("ollama_%d_%d", i, j) // apart from the ids the loop gives
			}
			args := string(c.Function.Arguments)
			var s string
			if json.Unmarshal(c.Function.Arguments, &s) == nil {
				args = s // a client that sent the arguments as a JSON string
			}
			if args == "" || args == "null" {
				args = "{}"
			}
			calls = append(calls, map[string]any{"id": id, "type": "function", "function": map[string]any{"name": c.Function.Name, "arguments": args}})
		}
		m["tool_calls"] = calls
	}
	b, _ := json.Marshal(m)
	return decodeChatMessage(at, b)
}

// answeredCall is the id of the call a tool message without one answers: of the calls of the
// last assistant message not yet answered, the first named tool (any, when no name is given).
func answeredCall(before []chatMessage, tool string) string {
	answered := map[string]bool{}
	for i := len(before) - 1; i >= 0; i-- {
		m := before[i]
		switch m.Role {
		case "tool":
			answered[m.ToolCallID] = true
		case "assistant":
			for _, c := range m.ToolCalls {
				if !answered[c.ID] && (tool == "" || c.Function.Name == tool) {
					return c.ID
				}
			}
			return ""
		default:
			return ""
		}
	}
	return ""
}

// ollamaAnswer is an OpenAI completion (as complete makes it) in Ollama's shape: the message,
// done, done_reason and the token counts.
func ollamaAnswer(body map[string]any, model string) map[string]any {
	out := map[string]any{"model": model, "created_at": time.Now().UTC().Format(time.RFC3339Nano), "done": true}
	choices, _ := body["choices"].([]any)
	msg := map[string]any{"role": "assistant", "content": ""}
	reason := "stop"
	if len(choices) > 0 {
		choice, _ := choices[0].(map[string]any)
		m, _ := choice["message"].(map[string]any)
		if text, _ := m["content"].(string); text != "" {
			msg["content"] = text
		}
		if calls := toolCallsOf(m["tool_calls"]); len(calls) > 0 {
			var out []map[string]any
			for _, c := range calls {
				var args any = map[string]any{}
				_ = json.Unmarshal([]byte(c.Function.Arguments), &args)
				out = append(out, map[string]any{"id": c.ID, "function": map[string]any{"name": c.Function.Name, "arguments": args}})
			}
			msg["tool_calls"] = out
		}
	}
	out["message"], out["done_reason"] = msg, reason
	if u, ok := body["usage"].(map[string]any); ok {
		out["prompt_eval_count"], out["eval_count"] = u["prompt_tokens"], u["completion_tokens"]
	}
	if h, ok := body["hermes"]; ok {
		out["hermes"] = h
	}
	return out
}

// ollamaFailure is an error answer (an OpenAI error object) in Ollama's shape.
func ollamaFailure(body map[string]any) map[string]any {
	msg := "the run failed"
	if e, ok := body["error"].(map[string]any); ok {
		if m, ok := e["message"].(string); ok {
			msg = m
		}
	}
	return map[string]any{"error": msg}
}

func (ollamaWire) answer(w http.ResponseWriter, status int, body map[string]any) {
	if status != http.StatusOK {
		httpapi.WriteJSON(w, status, ollamaFailure(body))
		return
	}
	model, _ := body["model"].(string)
	httpapi.WriteJSON(w, status, ollamaAnswer(body, model))
}

func (ollamaWire) stream(w http.ResponseWriter, run, model string) answerStream {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	return &ollamaStream{w: w, rc: http.NewResponseController(w), model: model}
}

// ollamaStream streams as Ollama does: one JSON object a line, the last with done true.
// Progress goes as lines with an empty message and a "hermes" field.
type ollamaStream struct {
	mu     sync.Mutex
	w      http.ResponseWriter
	rc     *http.ResponseController
	broken bool
	model  string
}

func (s *ollamaStream) line(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken {
		return
	}
	_ = s.rc.SetWriteDeadline(time.Now().Add(chatWriteTimeout))
	if _, err := s.w.Write(append(b, '\n')); err != nil {
		s.broken = true
		return
	}
	if err := s.rc.Flush(); err != nil {
		s.broken = true
	}
}

func (s *ollamaStream) progress(ev map[string]any) {
	s.line(map[string]any{"model": s.model, "created_at": time.Now().UTC().Format(time.RFC3339Nano),
		"message": map[string]any{"role": "assistant", "content": ""}, "done": false, "hermes": ev})
}

func (s *ollamaStream) finish(status int, body map[string]any, _ bool) {
	if status != http.StatusOK {
		s.line(ollamaFailure(body))
		return
	}
	a := ollamaAnswer(body, s.model)
	msg := a["message"].(map[string]any)
	if text, _ := msg["content"].(string); text != "" {
		s.line(map[string]any{"model": s.model, "created_at": a["created_at"], "message": map[string]any{"role": "assistant", "content": text}, "done": false})
		msg["content"] = ""
	}
	s.line(a)
}
