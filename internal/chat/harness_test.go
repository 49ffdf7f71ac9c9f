package chat

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/llm"
	"github.com/hermesbus/hermes/internal/scriptedllm"
	"github.com/hermesbus/hermes/internal/scriptedllm/scriptedllmtest"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// The doors' unit tests drive the handlers with httptest against fakes of what they work with:
// a Submitter that answers each turn's request at once (every call ok, its arguments echoed,
// unless told otherwise), an Admitter that admits all (unless told otherwise), a Publisher that
// keeps the decisions, the contracts of a few tools, the sessions in a bustest.MemKV, and the
// model a scripted OpenAI-compatible server.

var (
	_ Submitter = (*fakeSubmitter)(nil)
	_ Admitter  = (*fakeAdmitter)(nil)
	_ Publisher = (*fakePublisher)(nil)
	_ Contracts = (*fakeContracts)(nil)
	_ KV        = (*bustest.MemKV)(nil)
)

// fakeSubmitter answers each turn's request with answer, or echoes every call's arguments.
type fakeSubmitter struct {
	answer func(ctx context.Context, sub submit.Submission) (*submit.Outcome, error)

	mu      sync.Mutex
	subs    []submit.Submission
	cancels []cancelled
}

type cancelled struct {
	requestID string
	c         submit.Cancellation
}

func (f *fakeSubmitter) Submit(ctx context.Context, sub submit.Submission) (*submit.Outcome, error) {
	f.mu.Lock()
	f.subs = append(f.subs, sub)
	answer := f.answer
	f.mu.Unlock()
	if answer != nil {
		return answer(ctx, sub)
	}
	return echoed(sub), nil
}

func (f *fakeSubmitter) Cancel(_ context.Context, requestID string, c submit.Cancellation) (*protocol.Response, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cancels = append(f.cancels, cancelled{requestID, c})
	return nil, true, nil
}

func (f *fakeSubmitter) submitted() []submit.Submission {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]submit.Submission(nil), f.subs...)
}

func (f *fakeSubmitter) cancelled() []cancelled {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]cancelled(nil), f.cancels...)
}

// echoed is the response of a request whose every call succeeded, answering its arguments.
func echoed(sub submit.Submission) *submit.Outcome {
	req := sub.Request
	resp := &protocol.Response{RequestID: req.RequestID, SessionID: req.SessionID, Status: protocol.StatusSuccess}
	for _, c := range req.ToolCalls {
		resp.Results = append(resp.Results, protocol.ToolResult{ToolCallID: c.ToolCallID, Name: c.Name, Status: protocol.ResultOK,
			Content: c.Arguments, ExecutionTimeMS: 3, Attempts: 1})
	}
	return &submit.Outcome{Response: resp, TraceID: sub.Trace.TraceID}
}

// fakeAdmitter admits every ask refuse lets through (all, without refuse), and keeps the asks.
type fakeAdmitter struct {
	refuse func(ask admission.Ask) error

	mu   sync.Mutex
	asks []admission.Ask
}

func (f *fakeAdmitter) Admit(_ context.Context, ask admission.Ask) (*admission.Ticket, error) {
	f.mu.Lock()
	f.asks = append(f.asks, ask)
	refuse := f.refuse
	f.mu.Unlock()
	if refuse != nil {
		if err := refuse(ask); err != nil {
			return nil, err
		}
	}
	return &admission.Ticket{Owner: ask.Actor.Owner(), Caller: ask.Actor.Record()}, nil
}

func (f *fakeAdmitter) asked() []admission.Ask {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]admission.Ask(nil), f.asks...)
}

// fakePublisher keeps the decisions published, failing with err when set.
type fakePublisher struct {
	mu        sync.Mutex
	err       error
	subjects  []string
	msgs      []*protocol.Message
	decisions []*protocol.LLMDecision
}

func (f *fakePublisher) Publish(_ context.Context, subject string, m *protocol.Message) (*jetstream.PubAck, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	d, err := m.DecodeLLMDecision()
	if err != nil {
		return nil, err
	}
	f.subjects, f.msgs, f.decisions = append(f.subjects, subject), append(f.msgs, m), append(f.decisions, d)
	return &jetstream.PubAck{Stream: protocol.StreamName, Sequence: uint64(len(f.msgs))}, nil
}

func (f *fakePublisher) published() []*protocol.LLMDecision {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*protocol.LLMDecision(nil), f.decisions...)
}

// recorded is every message the decisions hold, in order, as role:tool_call_id.
func (f *fakePublisher) recorded() string {
	var out []string
	for _, d := range f.published() {
		for _, m := range d.Messages {
			out = append(out, m.Role+":"+m.ToolCallID)
		}
	}
	return strings.Join(out, ",")
}

// fakeContracts are the registered tools (err, when set, fails their reading).
type fakeContracts struct {
	mu    sync.Mutex
	tools []*contract.Compiled
	err   error
}

func (f *fakeContracts) Tools(context.Context) ([]*contract.Compiled, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tools, f.err
}

// noRecord is a record the OpenAI and Ollama doors never read.
type noRecord struct{ jetstream.JetStream }

// compiled is the contract src (JSON) compiled.
func compiled(tb testing.TB, src string) *contract.Compiled {
	tb.Helper()
	var c contract.Contract
	if err := json.Unmarshal([]byte(src), &c); err != nil {
		tb.Fatal(err)
	}
	k, err := contract.Compile(&c, 1, 1)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

// The registered tools of the tests: echo and weather_search take objects; scalar does not,
// and is never offered to the model.
const (
	echoContract    = `{"name":"echo","description":"echoes its text back","input_schema":{"type":"object","properties":{"text":{"type":"string","description":"what to echo"}},"required":["text"]}}`
	weatherContract = `{"name":"weather_search","description":"the weather forecast of a city","input_schema":{"type":"object","properties":{"city":{"type":"string","description":"the city"}}}}`
	scalarContract  = `{"name":"scalar","description":"takes a number","input_schema":{"type":"number"}}`
)

// harness is the chat doors with fakes, the model scripted.
type harness struct {
	t         *testing.T
	srv       *Server
	model     *scriptedllm.Server
	sub       *fakeSubmitter
	adm       *fakeAdmitter
	pub       *fakePublisher
	kv        *bustest.MemKV
	contracts *fakeContracts
	mux       *http.ServeMux
}

// newHarness serves the doors with the model answering from script; tweak, when set, changes
// the configuration before the doors are made.
func newHarness(t *testing.T, script *scriptedllm.Script, tweak func(*Config, *Env)) *harness {
	t.Helper()
	model, base := scriptedllmtest.Start(t, script, "")
	c, err := llm.New(llm.Config{Backend: llm.Backend{Name: "scripted", BaseURL: base, Model: "scripted", MaxRetries: new(0)},
		Embeddings: embeddingsOf(script)})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, model: model, sub: &fakeSubmitter{}, adm: &fakeAdmitter{}, pub: &fakePublisher{}, kv: bustest.NewMemKV(),
		contracts: &fakeContracts{tools: []*contract.Compiled{compiled(t, echoContract), compiled(t, weatherContract), compiled(t, scalarContract)}}}
	cfg := Config{LLM: c, Model: "scripted"}
	env := Env{Submit: h.sub, Admit: h.adm, Publisher: h.pub, Contracts: h.contracts, Sessions: h.kv, Record: noRecord{}}
	if tweak != nil {
		tweak(&cfg, &env)
	}
	if h.srv, err = New(cfg, env); err != nil {
		t.Fatal(err)
	}
	h.mux = http.NewServeMux()
	for _, r := range h.srv.Routes() {
		h.mux.HandleFunc(r.Pattern, r.Handler)
	}
	return h
}

func embeddingsOf(s *scriptedllm.Script) *llm.Backend {
	if s.Embeddings == nil {
		return nil
	}
	return &llm.Backend{Name: "scripted", Model: "scripted-embed", MaxRetries: new(0)}
}

// reply is an answer as the client got it.
type reply struct {
	code   int
	header http.Header
	body   []byte
}

// json is the answer's body as a JSON object.
func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("the answer is not a JSON object (%v): %d %s", err, r.code, r.body)
	}
	return m
}

// openAIError is the answer's OpenAI error object.
func (r reply) openAIError(t *testing.T) map[string]any {
	t.Helper()
	e, _ := r.json(t)["error"].(map[string]any)
	if e == nil {
		t.Fatalf("no error object: %d %s", r.code, r.body)
	}
	return e
}

// events are a server-sent stream's data fields, [DONE] included.
func (r reply) events(t *testing.T) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(r.body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, data)
		} else if sc.Text() != "" {
			t.Fatalf("a stream line that is not an event's data: %q", sc.Text())
		}
	}
	return out
}

// lines are a JSON-lines answer's objects.
func (r reply) lines(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(r.body)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("a line that is not a JSON object (%v): %q", err, l)
		}
		out = append(out, m)
	}
	return out
}

// do serves one request (headers given as name, value, …) in ctx.
func (h *harness) do(ctx context.Context, method, path, body string, headers ...string) reply {
	h.t.Helper()
	req := httptest.NewRequestWithContext(ctx, method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	h.mux.ServeHTTP(rec, req)
	return reply{code: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
}

func (h *harness) post(path, body string, headers ...string) reply {
	h.t.Helper()
	return h.do(h.t.Context(), http.MethodPost, path, body, headers...)
}

// modelRead is what the model was sent last, as role:tool_call_id.
func (h *harness) modelRead() string {
	reqs := h.model.Requests()
	if len(reqs) == 0 {
		return ""
	}
	var out []string
	for _, m := range reqs[len(reqs)-1].Messages {
		out = append(out, m.Role+":"+m.ToolCallID)
	}
	return strings.Join(out, ",")
}

// call is a scripted tool call.
func call(id, name string, args map[string]any) scriptedllm.ToolCall {
	return scriptedllm.ToolCall{ID: id, Name: name, Arguments: args}
}

// conversation is a script of one conversation whose turns answer in order.
func conversation(turns ...scriptedllm.Turn) *scriptedllm.Script {
	return &scriptedllm.Script{Conversations: []scriptedllm.Conversation{{Name: "test", Turns: turns}}}
}

// echoThenAnswer: the model calls echo, then answers with what it read.
func echoThenAnswer() *scriptedllm.Script {
	return conversation(
		scriptedllm.Turn{ToolCalls: []scriptedllm.ToolCall{call("call_e", "echo", map[string]any{"text": "hi"})}},
		scriptedllm.Turn{Content: "echoed hi"})
}

// refusal is an admission's refusal.
func refusal(status int, code string, retry ...int) *admission.Refusal {
	r := &admission.Refusal{Status: status, Code: code, Message: "refused: " + code}
	if len(retry) > 0 {
		r.RetryAfter = time.Duration(retry[0]) * time.Second
	}
	return r
}
