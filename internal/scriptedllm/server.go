package scriptedllm

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/hermesbus/hermes/internal/summarize"
)

// maxBodyBytes bounds a request body; keptRequests how many requests Requests remembers (the
// latest), so a long-running server does not grow with every request.
const (
	maxBodyBytes = 8 << 20
	keptRequests = 256
)

// Server answers OpenAI chat completions from a Script. It is an http.Handler, safe for
// concurrent use.
type Server struct {
	script *Script
	// key, when set, is the Bearer key every request must carry.
	key string
	now func() time.Time

	mu          sync.Mutex
	failed      map[[2]int]int // by conversation and turn: how many times it failed
	requests    []Request
	embedFailed int
	embedded    int // texts embedded
}

// Request is what a client sent, as the server read it: for tests to see what the loop told
// the model.
type Request struct {
	Model    string    `json:"model"`
	Messages []Message `json:"messages"`
	Tools    []Tool    `json:"tools,omitempty"`
	// ToolChoice is the request's tool_choice as sent ("none", "auto", an object), if any.
	ToolChoice json.RawMessage `json:"tool_choice,omitempty"`
	Stream     bool            `json:"stream,omitempty"`
	// StreamOptions.IncludeUsage asks for a last chunk with usage.
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options,omitempty"`
	// ResponseFormat is the structured output asked for, if any.
	ResponseFormat *struct {
		Type       string `json:"type"`
		JSONSchema struct {
			Name string `json:"name"`
		} `json:"json_schema"`
	} `json:"response_format,omitempty"`
}

// Message is one chat message; Content is kept as sent (a string, or parts).
type Message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content,omitempty"`
	ToolCalls  []WireToolCall  `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	Name       string          `json:"name,omitempty"`
}

// Text is the message's text: its string content, or its text parts joined.
func (m Message) Text() string {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(m.Content, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			if p.Type == "text" {
				b.WriteString(p.Text)
			}
		}
		return b.String()
	}
	return ""
}

// WireToolCall is a tool call as the wire carries it.
type WireToolCall struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// Tool is a tool the client offered.
type Tool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
	} `json:"function"`
}

// New returns a server answering from s; key, when not empty, is required as a Bearer key.
func New(s *Script, key string) (*Server, error) {
	if s == nil {
		return nil, errors.New("scriptedllm: no script")
	}
	if err := s.Check(); err != nil {
		return nil, err
	}
	return &Server{script: s, key: key, now: time.Now, failed: map[[2]int]int{}}, nil
}

// Requests returns what the server was sent, the latest keptRequests, oldest first.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// ServeHTTP serves /v1/chat/completions, /v1/embeddings and /v1/models.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.key != "" {
		got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		if subtle.ConstantTimeCompare([]byte(got), []byte(s.key)) != 1 {
			apiError(w, http.StatusUnauthorized, "invalid_api_key", "authentication_error", "", "Incorrect API key provided.")
			return
		}
	}
	switch strings.TrimSuffix(r.URL.Path, "/") {
	case "/v1/models":
		s.models(w)
	case "/v1/chat/completions":
		if r.Method != http.MethodPost {
			apiError(w, http.StatusMethodNotAllowed, "method_not_allowed", "invalid_request_error", "", "use POST")
			return
		}
		s.complete(w, r)
	case "/v1/embeddings":
		if r.Method != http.MethodPost {
			apiError(w, http.StatusMethodNotAllowed, "method_not_allowed", "invalid_request_error", "", "use POST")
			return
		}
		s.embeddings(w, r)
	default:
		apiError(w, http.StatusNotFound, "not_found", "invalid_request_error", "", "no such endpoint: "+r.URL.Path)
	}
}

func (s *Server) models(w http.ResponseWriter) {
	models := s.script.Models
	if len(models) == 0 {
		models = []string{"scripted"}
	}
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	out := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list"}
	for _, m := range models {
		out.Data = append(out.Data, model{ID: m, Object: "model", Created: 1_700_000_000, OwnedBy: "hermes-scripted"})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) complete(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes+1))
	if err != nil || len(body) > maxBodyBytes {
		apiError(w, http.StatusRequestEntityTooLarge, "body_too_large", "invalid_request_error", "", "the body is missing or larger than 8 MiB")
		return
	}
	var req Request
	if err := json.Unmarshal(body, &req); err != nil {
		apiError(w, http.StatusBadRequest, "invalid_json", "invalid_request_error", "", "the body is not a chat completion request: "+err.Error())
		return
	}
	if req.Model == "" {
		apiError(w, http.StatusBadRequest, "missing_required_parameter", "invalid_request_error", "model", "you must provide a model parameter")
		return
	}
	if len(req.Messages) == 0 {
		apiError(w, http.StatusBadRequest, "missing_required_parameter", "invalid_request_error", "messages", "messages must hold at least one message")
		return
	}
	if len(s.script.Models) > 0 && !slices.Contains(s.script.Models, req.Model) {
		apiError(w, http.StatusNotFound, "model_not_found", "invalid_request_error", "model", fmt.Sprintf("The model `%s` does not exist", req.Model))
		return
	}
	s.mu.Lock()
	if len(s.requests) == keptRequests {
		s.requests = slices.Delete(s.requests, 0, 1)
	}
	s.requests = append(s.requests, req)
	s.mu.Unlock()

	firstUser, lastUser, step := "", "", 0
	var seen seen
	for _, m := range req.Messages {
		switch m.Role {
		case "user":
			if firstUser == "" {
				firstUser = m.Text()
			}
			lastUser = m.Text()
		case "assistant":
			step++
		case "tool":
			seen.lastTool = m.Text()
		case "system", "developer":
			seen.system += m.Text() + "\n"
		}
	}
	seen.lastUser = lastUser
	if f := req.ResponseFormat; f != nil && f.Type == "json_schema" && f.JSONSchema.Name == IntentSchema {
		// An intent asked for as structured output: the script's intents answer it.
		content := s.script.intentOf(lastUser)
		a := answer{id: "chatcmpl-scripted-intent", model: req.Model, created: s.now().Unix(), content: content,
			usage: usageOf(req, content, nil)}
		a.whole(w)
		return
	}
	// A conversation Hermes summarized is a follow-up: its steps count from the last exchange
	// the summary covers, so a step turn would act again (book the meeting twice). It is
	// answered by the conversation's then, or otherwise.
	summarized := strings.HasPrefix(firstUser, summarize.NotePrefix)
	ci, ti, t, err := s.script.pick(firstUser, step, seen, summarized)
	if err != nil {
		msg := "the script has no conversation for this first user message"
		if !errors.Is(err, errNoTurn) {
			msg = err.Error()
		}
		apiError(w, http.StatusBadRequest, "no_scripted_answer", "invalid_request_error", "messages", msg)
		return
	}
	if t.Status != 0 {
		s.mu.Lock()
		n := s.failed[[2]int{ci, ti}]
		fail := t.Times == 0 || n < t.Times
		if fail {
			s.failed[[2]int{ci, ti}] = n + 1
		}
		s.mu.Unlock()
		if fail {
			if !sleep(r, time.Duration(t.DelayMS)*time.Millisecond) {
				return
			}
			msg := t.Message
			if msg == "" {
				msg = http.StatusText(t.Status)
			}
			typ := "server_error"
			if t.Status == http.StatusTooManyRequests {
				typ = "rate_limit_exceeded"
			}
			if t.RetryAfterMS > 0 {
				w.Header().Set("Retry-After-Ms", strconv.Itoa(t.RetryAfterMS))
			}
			apiError(w, t.Status, typ, typ, "", msg)
			return
		}
		// Failed its times: the next turn of the same step answers.
		ci, _, t, err = s.script.pickAfter(ci, ti, step, seen)
		if err != nil {
			apiError(w, http.StatusBadRequest, "no_scripted_answer", "invalid_request_error", "messages", err.Error())
			return
		}
	}
	if t.Raw != "" {
		if !sleep(r, time.Duration(t.DelayMS)*time.Millisecond) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, t.Raw)
		return
	}
	calls := make([]WireToolCall, len(t.ToolCalls))
	for i, c := range t.ToolCalls {
		args, err := c.argumentsText()
		if err != nil {
			apiError(w, http.StatusInternalServerError, "bad_script", "server_error", "", err.Error())
			return
		}
		id := c.ID
		if id == "" && !c.NoID {
			id = fmt.Sprintf("call_%d_%d", step, i)
		}
		calls[i].ID, calls[i].Type, calls[i].Function.Name, calls[i].Function.Arguments = id, "function", c.Name, args
	}
	content := t.Content
	if t.Summarize {
		content = condense(lastUser)
	}
	a := answer{id: fmt.Sprintf("chatcmpl-scripted-%d-%d", ci, step), model: req.Model, created: s.now().Unix(),
		content: content, calls: calls, usage: usageOf(req, content, calls), delay: time.Duration(t.DelayMS) * time.Millisecond}
	if req.Stream {
		a.stream(w, r, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
		return
	}
	if !sleep(r, a.delay) {
		return
	}
	a.whole(w)
}

// pickAfter finds the turn answering step after turn ti of conversation ci failed its times.
func (s *Script) pickAfter(ci, ti, step int, seen seen) (int, int, *Turn, error) {
	c := &s.Conversations[ci]
	for j := ti + 1; j < len(c.Turns); j++ {
		t := &c.Turns[j]
		if t.AnyStep {
			continue
		}
		if t.Step != nil && *t.Step != step {
			break
		}
		if !t.holds(seen) {
			continue
		}
		return ci, j, t, nil
	}
	return ci, -1, nil, fmt.Errorf("conversation %q: turn %d stopped failing, and no turn after it answers step %d (give the next one the same step)", c.Name, ti, step)
}

// sleep waits d, or until the client goes away (false).
func sleep(r *http.Request, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	}
}

// usage counts tokens as about four bytes each, the prompt being every message and tool sent.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func usageOf(req Request, content string, calls []WireToolCall) usage {
	prompt := 0
	for _, m := range req.Messages {
		prompt += len(m.Content) + len(m.Role) + 4
		for _, c := range m.ToolCalls {
			prompt += len(c.Function.Name) + len(c.Function.Arguments)
		}
	}
	for _, t := range req.Tools {
		prompt += len(t.Function.Name) + len(t.Function.Description) + len(t.Function.Parameters)
	}
	completion := len(content)
	for _, c := range calls {
		completion += len(c.Function.Name) + len(c.Function.Arguments)
	}
	u := usage{PromptTokens: (prompt + 3) / 4, CompletionTokens: (completion + 3) / 4}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

// answer is one scripted assistant message.
type answer struct {
	id, model string
	created   int64
	content   string
	calls     []WireToolCall
	usage     usage
	delay     time.Duration
}

func (a *answer) finishReason() string {
	if len(a.calls) > 0 {
		return "tool_calls"
	}
	return "stop"
}

// whole writes the answer as one chat.completion.
func (a *answer) whole(w http.ResponseWriter) {
	msg := map[string]any{"role": "assistant", "content": nil}
	if a.content != "" || len(a.calls) == 0 {
		msg["content"] = a.content
	}
	if len(a.calls) > 0 {
		msg["tool_calls"] = a.calls
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": a.id, "object": "chat.completion", "created": a.created, "model": a.model,
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": a.finishReason(), "logprobs": nil}},
		"usage":   a.usage,
	})
}

// stream writes the answer as chat.completion.chunk events: the role, the content in pieces,
// each tool call's id and name then its arguments in fragments, the finish reason, usage when
// asked, then [DONE].
func (a *answer) stream(w http.ResponseWriter, r *http.Request, withUsage bool) {
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	var deltas []map[string]any
	deltas = append(deltas, map[string]any{"role": "assistant", "content": ""})
	for _, piece := range pieces(a.content, 8) {
		deltas = append(deltas, map[string]any{"content": piece})
	}
	for i, c := range a.calls {
		deltas = append(deltas, map[string]any{"tool_calls": []any{map[string]any{
			"index": i, "id": c.ID, "type": "function", "function": map[string]any{"name": c.Function.Name, "arguments": ""}}}})
		for _, piece := range pieces(c.Function.Arguments, 12) {
			deltas = append(deltas, map[string]any{"tool_calls": []any{map[string]any{
				"index": i, "function": map[string]any{"arguments": piece}}}})
		}
	}
	pause := a.delay / time.Duration(len(deltas)+1)
	chunk := func(choices []any, u *usage) bool {
		if !sleep(r, pause) {
			return false
		}
		c := map[string]any{"id": a.id, "object": "chat.completion.chunk", "created": a.created, "model": a.model, "choices": choices}
		if u != nil {
			c["usage"] = u
		}
		b, _ := json.Marshal(c)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	for _, d := range deltas {
		if !chunk([]any{map[string]any{"index": 0, "delta": d, "finish_reason": nil}}, nil) {
			return
		}
	}
	if !chunk([]any{map[string]any{"index": 0, "delta": map[string]any{}, "finish_reason": a.finishReason()}}, nil) {
		return
	}
	if withUsage && !chunk([]any{}, &a.usage) {
		return
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}

// pieces cuts s into pieces of about n bytes, never inside a character.
func pieces(s string, n int) []string {
	var out []string
	for len(s) > 0 {
		i := min(n, len(s))
		for i < len(s) && !utf8.RuneStart(s[i]) {
			i++
		}
		out = append(out, s[:i])
		s = s[i:]
	}
	return out
}

// condense is a summarizer's request answered deterministically (Turn.Summarize).
func condense(prompt string) string {
	var parts []string
	for line := range strings.SplitSeq(prompt, "\n") {
		switch {
		case strings.HasPrefix(line, "Summary so far: "):
			parts = append(parts, strings.TrimPrefix(line, "Summary so far: "))
		case strings.HasPrefix(line, "user: "), strings.HasPrefix(line, "assistant: "):
			if r := []rune(line); len(r) > 40 {
				line = string(r[:40]) + "…"
			}
			parts = append(parts, line)
		}
	}
	if len(parts) == 0 {
		return "(nothing to summarize)"
	}
	// A summary stays short however long the conversation (a model's is told to): the
	// latest 400 characters.
	out := []rune(strings.Join(parts, " | "))
	if len(out) > 400 {
		out = append([]rune("…"), out[len(out)-400:]...)
	}
	return string(out)
}

// apiError writes an OpenAI-style error.
func apiError(w http.ResponseWriter, status int, code, typ, param, msg string) {
	e := map[string]any{"message": msg, "type": typ, "code": code, "param": nil}
	if param != "" {
		e["param"] = param
	}
	writeJSON(w, status, map[string]any{"error": e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Serve serves h on ln until ctx is done, then stops: requests running get up to 5 s.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	logger.Info("scripted LLM listening", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("scriptedllm: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("scriptedllm: %w", err)
	}
	return nil
}
