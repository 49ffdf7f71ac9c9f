package chat

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/scriptedllm"
	"github.com/hermesbus/hermes/internal/summarize"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// A history a model takes: a result with no call before it is left out, a call with no
// result is answered with what is known, and results answer only the calls just before them.
func TestWellFormed(t *testing.T) {
	call := func(ids ...string) protocol.LLMMessage {
		m := protocol.LLMMessage{Role: "assistant"}
		for _, id := range ids {
			m.ToolCalls = append(m.ToolCalls, protocol.LLMCall{ID: id, Name: "echo", Arguments: "{}"})
		}
		return m
	}
	result := func(id string) protocol.LLMMessage {
		return protocol.LLMMessage{Role: "tool", ToolCallID: id, Content: "ok " + id}
	}
	user := protocol.LLMMessage{Role: "user", Content: "hi"}
	got := wellFormed([]protocol.LLMMessage{
		result("stray"), user, call("a", "b"), result("b"), result("a"), result("a"), // a repeated: left out
		call("c"), user, // c unanswered before the person speaks
		call("d"), // d unanswered at the end
	})
	var shape []string
	for _, m := range got {
		s := m.Role
		if m.Role == "tool" {
			s += ":" + m.ToolCallID
			if strings.Contains(m.Content, "no result of this call was recorded") {
				s += "(none)"
			}
		}
		shape = append(shape, s)
	}
	want := "user assistant tool:b tool:a assistant tool:c(none) user assistant tool:d(none)"
	if strings.Join(shape, " ") != want {
		t.Errorf("got  %s\nwant %s", strings.Join(shape, " "), want)
	}
}

// teePublisher records the decisions on a real record, keeping them (and their sequences) to
// look at.
type teePublisher struct {
	real *bus.Publisher
	seen fakePublisher
	mu   sync.Mutex
	seqs []uint64
}

func (p *teePublisher) Publish(ctx context.Context, subject string, m *protocol.Message) (*jetstream.PubAck, error) {
	ack, err := p.real.Publish(ctx, subject, m)
	if err != nil {
		return nil, err
	}
	if _, err := p.seen.Publish(ctx, subject, m); err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.seqs = append(p.seqs, ack.Sequence)
	p.mu.Unlock()
	return ack, nil
}

// recordHarness is the doors with the record on an embedded JetStream server.
func recordHarness(t *testing.T, script *scriptedllm.Script) (*harness, *teePublisher) {
	t.Helper()
	b := bustest.NewServer(t).Provision(t, bus.Config{})
	pub := &teePublisher{real: bus.NewPublisher(b.JS, protocol.Sender{Role: "gateway", Instance: "chat-test"})}
	return newHarness(t, script, func(_ *Config, e *Env) { e.Record, e.Publisher = b.JS, pub }), pub
}

// POST /v1/chat takes only the new message: the conversation before it is the session's record.
// The answer is the response package: the text, what the calls Hermes ran came to, pending
// items, the intent, the turns and the usage.
func TestHermesChat(t *testing.T) {
	one, two := 1, 2
	h, pub := recordHarness(t, conversation(
		scriptedllm.Turn{ToolCalls: []scriptedllm.ToolCall{call("call_w", "weather_search", map[string]any{"city": "上海"})}},
		scriptedllm.Turn{Step: &one, Content: "上海明天中雨"},
		scriptedllm.Turn{Step: &two, Content: "北京也是"}))
	r := h.post("/v1/chat", `{"session_id":"sess_hc","message":"上海明天的天气怎么样"}`)
	if r.code != http.StatusOK {
		t.Fatalf("%d %s", r.code, r.body)
	}
	out := r.json(t)
	run := r.header.Get("X-Hermes-Run-ID")
	calls, _ := out["tool_calls"].([]any)
	pending, _ := out["pending"].([]any)
	intent, _ := out["intent"].(map[string]any)
	if out["session_id"] != "sess_hc" || out["run_id"] != run || out["text"] != "上海明天中雨" || out["turns"] != 2.0 || pending == nil || len(pending) != 0 ||
		intent == nil || intent["domain"] != nil || out["usage"].(map[string]any)["total_tokens"].(float64) == 0 || len(calls) != 1 {
		t.Fatalf("%s", r.body)
	}
	if c := calls[0].(map[string]any); c["name"] != "weather_search" || c["status"] != "ok" || c["duration_ms"] != 3.0 || c["tool_call_id"] != "call_w" ||
		c["request_id"] != run+"-1" {
		t.Errorf("call %v", c)
	}
	// The next message alone: the model reads the conversation the record holds, then it.
	if r = h.post("/v1/chat", `{"session_id":"sess_hc","message":"北京呢","max_turns":2}`); r.code != http.StatusOK || r.json(t)["text"] != "北京也是" {
		t.Fatalf("%d %s", r.code, r.body)
	}
	if got := h.modelRead(); got != "user:,assistant:,tool:call_w,assistant:,user:" {
		t.Errorf("the model read %s", got)
	}
	ds := pub.seen.published()
	if last := ds[len(ds)-1]; len(last.Messages) != 1 || last.Messages[0].Content != "北京呢" || !last.FromRecord {
		t.Errorf("the second run recorded %+v", last)
	}
	if len(h.kv.Keys()) != 0 {
		t.Errorf("kept %v: the record is the conversation", h.kv.Keys())
	}

	// With a summary of the first exchange, the model reads it before the person's message it
	// covers, then what came since.
	s := &protocol.LLMSummary{Through: pub.seqs[1], Tail: pub.seqs[0], Messages: 4, New: 4, Text: "The person asked about Shanghai's weather."}
	m, err := protocol.NewMessage(protocol.TypeLLMSummary, s)
	if err != nil {
		t.Fatal(err)
	}
	m.Follow(pub.seen.msgs[1], protocol.MsgIDLLMSummary("sess_hc", s.Through))
	if _, err := pub.real.Publish(t.Context(), protocol.SubjectEvent(protocol.EventSummary, "sess_hc"), m); err != nil {
		t.Fatal(err)
	}
	// The script has no third answer: the model's refusal, in Hermes' error shape.
	r = h.post("/v1/chat", `{"session_id":"sess_hc","message":"谢谢"}`)
	if e, _ := r.json(t)["error"].(map[string]any); r.code != http.StatusBadRequest || e["code"] != "llm_refused" || !strings.Contains(e["message"].(string), "sess_hc") {
		t.Errorf("%d %s", r.code, r.body)
	}
	reqs := h.model.Requests()
	read := reqs[len(reqs)-1].Messages
	if !strings.HasPrefix(read[0].Text(), summarize.NotePrefix) || !strings.Contains(read[0].Text(), "Shanghai's weather") ||
		!strings.HasSuffix(read[0].Text(), "上海明天的天气怎么样") || read[len(read)-1].Text() != "谢谢" {
		t.Errorf("the model read %+v", read)
	}

	// The end user a request names is on the record with its caller, when the caller may
	// name one.
	ctx := admission.WithCaller(t.Context(), &auth.Caller{ID: "key:app", Name: "app", Role: auth.RoleAdmin})
	if r := h.do(ctx, http.MethodPost, "/v1/chat", `{"session_id":"sess_hu","message":"hi","user":"alice"}`); r.code != http.StatusOK {
		t.Fatalf("%d %s", r.code, r.body)
	}
	pub.seen.mu.Lock()
	m = pub.seen.msgs[len(pub.seen.msgs)-1]
	pub.seen.mu.Unlock()
	if m.SessionID != "sess_hu" || m.Caller == nil || m.Caller.ID != "key:app" || m.Caller.User != "alice" {
		t.Errorf("recorded as %+v", m.Caller)
	}
	for _, a := range h.adm.asked() {
		if a.Session == "sess_hu" && a.Actor.Owner() != "key:app#alice" {
			t.Errorf("admitted %+v", a)
		}
	}

	// With an Idempotency-Key, the retry gets the first run's package again.
	first := h.post("/v1/chat", `{"session_id":"sess_hk","message":"上海明天的天气怎么样"}`, headerIdemKey, "k")
	again := h.post("/v1/chat", `{"session_id":"sess_hk","message":"上海明天的天气怎么样"}`, headerIdemKey, "k")
	if first.code != http.StatusOK || again.header.Get("X-Hermes-Replayed") != "true" || string(again.body) != string(first.body) {
		t.Errorf("replayed %d %s\nfirst %s", again.code, again.body, first.body)
	}
}

// /v1/chat refuses in Hermes' error shape, naming the field; a record that cannot be read is
// the bus away.
func TestHermesChatRefusals(t *testing.T) {
	h := newHarness(t, echoThenAnswer(), nil)
	for _, tc := range []struct{ body, field string }{
		{`{"message":"x"}`, "session_id"},
		{`{"session_id":"","message":"x"}`, "session_id"},
		{`{"session_id":"s"}`, "message"},
		{`{"session_id":"s","message":"  "}`, "message"},
		{`{"session_id":"s","message":"` + strings.Repeat("x", MaxChatMessageBytes+1) + `"}`, "message"},
		{`{"session_id":"s","message":"x","max_turns":0}`, "max_turns"},
		{`{"session_id":"s","message":"x","model":"gpt"}`, "model"},
		{`{"session_id":"bad.id","message":"x"}`, "session_id"},
		{`{"session_id":"sandbox-x","message":"x"}`, "session_id"},
		{`{"session_id":"s","message":"x","user":"a b"}`, "user"},
		{`{"session_id":"s","message":"x","user":7}`, "user"},
		{`{"session_id":"s","message":"x"} {}`, ""},
	} {
		r := h.post("/v1/chat", tc.body)
		e, _ := r.json(t)["error"].(map[string]any)
		field, _ := e["field"].(string)
		if r.code != http.StatusBadRequest || e["code"] != protocol.CodeInvalidRequest || field != tc.field || e["message"] == "" {
			t.Errorf("%.80s: %d %s", tc.body, r.code, r.body)
		}
	}
	h.srv.env.Record = &brokenRecord{}
	r := h.post("/v1/chat", `{"session_id":"sess_f","message":"x"}`)
	if e, _ := r.json(t)["error"].(map[string]any); r.code != http.StatusServiceUnavailable || e["code"] != protocol.CodeBusUnavailable {
		t.Errorf("%d %s", r.code, r.body)
	}
}

// brokenRecord is a record that cannot be read.
type brokenRecord struct{ jetstream.JetStream }

func (*brokenRecord) Stream(context.Context, string) (jetstream.Stream, error) {
	return nil, errors.New("no responders")
}
