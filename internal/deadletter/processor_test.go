package deadletter

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/internal/park"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/ledger"
	"github.com/hermesbus/hermes/pkg/protocol"
)

type fixture struct {
	b       *bus.Bus
	p       *Processor
	metrics *metrics.Metrics
	pub     *bus.Publisher
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	b := bustest.NewServer(t).Provision(t, bus.Config{})
	m := metrics.New(nil)
	p, err := New(Config{Bus: b, Instance: "dlq-test", Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{b: b, p: p, metrics: m, pub: bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: "r"})}
}

// store publishes m to subject on the record and returns its stream sequence.
func (f *fixture) store(t *testing.T, subject string, m *protocol.Message) uint64 {
	t.Helper()
	ack, err := f.pub.Publish(t.Context(), subject, m)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

func (f *fixture) storeRaw(t *testing.T, subject string, data []byte, hdr nats.Header) uint64 {
	t.Helper()
	ack, err := f.b.JS.PublishMsg(t.Context(), &nats.Msg{Subject: subject, Data: data, Header: hdr})
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// advise hands the processor an advisory of kind for the message at seq, given up by consumer.
func (f *fixture) advise(t *testing.T, kind, consumer string, seq, deliveries uint64) error {
	t.Helper()
	typ := typeMaxDeliver
	if kind == "terminated" {
		typ = typeTerminated
	}
	data, _ := json.Marshal(advisory{Type: typ, Stream: protocol.StreamName, Consumer: consumer, StreamSeq: seq, Deliveries: deliveries, Reason: "bad"})
	return f.p.handle(t.Context(), &bus.Delivery{Subject: "$JS.EVENT.ADVISORY.CONSUMER.X", Data: data, Header: nats.Header{}})
}

// letters returns the dead letters kept, by consumer.
func (f *fixture) letters(t *testing.T) []Letter {
	t.Helper()
	l, err := List(t.Context(), f.b, 100)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func dispatch(t *testing.T, rid, call string, corr *protocol.Correlation) *protocol.Message {
	t.Helper()
	m, err := protocol.NewMessage(protocol.TypeToolCall, &protocol.Dispatch{Call: protocol.ToolCall{ToolCallID: call, Name: "echo", Arguments: json.RawMessage(`{}`)},
		Route: "echo_route", Action: protocol.Action{Kind: protocol.ActionHTTP, TimeoutMS: 100, Retry: protocol.RetryPolicy{MaxAttempts: 1, BackoffFactor: 1, InitialIntervalMS: 1, MaxIntervalMS: 1},
			HTTP: &protocol.HTTPAction{URL: "http://x/", Method: "POST"}}})
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID, m.Correlation = protocol.MsgIDToolCall(rid, call), rid, "s_"+rid, corr
	return m
}

func requestMsg(t *testing.T, rid string, serial bool) *protocol.Message {
	t.Helper()
	m, err := protocol.NewMessage(protocol.TypeRequest, &protocol.Request{RequestID: rid, SessionID: "s_" + rid, Serial: serial,
		ToolCalls: []protocol.ToolCall{{ToolCallID: "a", Name: "echo"}, {ToolCallID: "b", Name: "echo"}}})
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDRequest(rid), rid, "s_"+rid
	return m
}

func TestProcessorAnswersWhatWaits(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	toolConsumer := bus.ToolConsumer(protocol.ActionHTTP, "echo")
	for _, c := range []struct {
		name      string
		lastError string // the ledger's last failure of the call
		wantCode  string
	}{
		{"a call that kept failing keeps its last failure", protocol.CodeToolHTTP5xx, protocol.CodeToolHTTP5xx},
		{"a call that never failed is DEAD_LETTERED", "", protocol.CodeDeadLettered},
	} {
		t.Run(c.name, func(t *testing.T) {
			rid := fmt.Sprintf("call_%d", len(c.lastError))
			corr := &protocol.Correlation{CallIDs: []string{"a", "b"}}
			if c.lastError != "" {
				l := ledger.New(f.b.Claims, "w", 0)
				h, _, err := l.Acquire(ctx, ledger.Key(rid, "a"))
				if err != nil {
					t.Fatal(err)
				}
				h.Release(ctx, c.lastError)
			}
			seq := f.store(t, protocol.SubjectToolCall(protocol.ActionHTTP, "echo", "s_"+rid), dispatch(t, rid, "a", corr))
			if err := f.advise(t, "max_deliveries", toolConsumer, seq, 20); err != nil {
				t.Fatal(err)
			}
			rec, res, err := f.b.Result(ctx, rid, "a", "s_"+rid, "")
			if err != nil {
				t.Fatal(err)
			}
			if res.ErrorCode != c.wantCode || res.ErrorOrigin != protocol.OriginHermes || res.Route != "echo_route" || !strings.Contains(res.RecoveryHint, "dlq") {
				t.Errorf("result %+v", res)
			}
			if m := rec.Msg; m.Sender.Role != protocol.RoleDeadLetter || m.Correlation == nil || len(m.Correlation.CallIDs) != 2 {
				t.Errorf("the result does not follow its dispatch: %+v", m)
			}
		})
	}
	letters := f.letters(t)
	if len(letters) != 2 || letters[0].Consumer != toolConsumer || letters[0].Deliveries != 20 || letters[0].Type != protocol.TypeToolCall ||
		!strings.Contains(letters[0].Reason, "20 deliveries") {
		t.Fatalf("letters %+v", letters)
	}
	if n := testutil.ToFloat64(f.metrics.DeadLetters.WithLabelValues(toolConsumer, "max_deliveries")); n != 2 {
		t.Errorf("dead letters counted %v", n)
	}
}

func TestProcessorFailsADeadRequestAndWakesTheNextSerialOne(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	// A serial request waits, parked, for the dead one's response.
	lot := park.New(f.b, f.pub, nil)
	next := requestMsg(t, "next_1", true)
	raw, _ := protocol.Marshal(next)
	if _, err := lot.Park(ctx, park.Wait{Key: protocol.WakeOnResponse("dead_1")}, "next_1", protocol.SubjectRequest(next.SessionID), raw); err != nil {
		t.Fatal(err)
	}
	seq := f.store(t, protocol.SubjectRequest("s_dead_1"), requestMsg(t, "dead_1", true))
	if err := f.advise(t, "terminated", bus.RequestConsumer(0), seq, 1); err != nil {
		t.Fatal(err)
	}
	_, resp, err := f.b.Response(ctx, "dead_1", "")
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != protocol.StatusFailed || resp.Error == nil || resp.Error.Code != protocol.CodeDeadLettered || len(resp.Results) != 2 ||
		resp.Results[1].ErrorCode != protocol.CodeDeadLettered {
		t.Fatalf("response %+v", resp)
	}
	if n, _ := lot.Parked(ctx, protocol.WakeOnResponse("dead_1")); n != 0 {
		t.Errorf("the next serial request still waits (%d parked)", n)
	}
	if n := testutil.ToFloat64(f.metrics.Responses.WithLabelValues(protocol.StatusFailed)); n != 1 {
		t.Errorf("responses counted %v", n)
	}
	// The same advisory again (a redelivery): one letter, one response, counted once.
	if err := f.advise(t, "terminated", bus.RequestConsumer(0), seq, 1); err != nil {
		t.Fatal(err)
	}
	if l := f.letters(t); len(l) != 1 {
		t.Errorf("%d letters after a repeated advisory", len(l))
	}
	if n := testutil.ToFloat64(f.metrics.Responses.WithLabelValues(protocol.StatusFailed)); n != 1 {
		t.Errorf("responses counted %v after a repeated advisory", n)
	}
}

func TestProcessorKeepsWhatItCannotRead(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	hdr := nats.Header{}
	hdr.Set(bus.HeaderTraceID, "trace-9")
	poison := f.storeRaw(t, protocol.SubjectRequest("s_poison"), []byte{0xc1, 0x00}, hdr)
	if err := f.advise(t, "terminated", bus.RequestConsumer(3), poison, 1); err != nil {
		t.Fatal(err)
	}
	// A message gone from the record (aged out): the letter keeps what the advisory says.
	if err := f.advise(t, "max_deliveries", bus.RequestConsumer(3), 99_999, 20); err != nil {
		t.Fatal(err)
	}
	// An advisory of another stream, or not an advisory: ignored.
	other, _ := json.Marshal(advisory{Type: typeMaxDeliver, Stream: "KV_x", Consumer: "c", StreamSeq: 1})
	if err := f.p.handle(ctx, &bus.Delivery{Data: other, Header: nats.Header{}}); err != nil {
		t.Fatal(err)
	}
	letters := f.letters(t)
	if len(letters) != 2 {
		t.Fatalf("letters %+v", letters)
	}
	if letters[0].Type != "" || letters[0].Size != 2 || letters[0].StreamSeq != poison || letters[1].Size != 0 || letters[1].Subject != "" {
		t.Errorf("letters %+v", letters)
	}
	if _, err := Retry(ctx, f.b, letters[0].Seq); err == nil || !strings.Contains(err.Error(), "no Hermes worker can decode") {
		t.Errorf("re-drive of undecodable bytes: %v", err)
	}
	if _, err := Retry(ctx, f.b, letters[1].Seq); err == nil || !strings.Contains(err.Error(), "gone from the record") {
		t.Errorf("re-drive of a letter without its original: %v", err)
	}
}

// A result the routers gave up aggregating is aggregated by the processor: its request is
// answered once every call has a result, however many of them were given up — never left
// without a response.
func TestProcessorAggregatesGivenUpResults(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	corr := &protocol.Correlation{CallIDs: []string{"a", "b"}}
	record := func(call string) uint64 {
		t.Helper()
		res := protocol.ToolResult{ToolCallID: call, Name: "echo", Status: protocol.ResultOK, Content: json.RawMessage(`{}`)}
		m, _ := protocol.NewMessage(protocol.TypeToolResult, &res)
		m.MsgID, m.RequestID, m.SessionID, m.Correlation = protocol.MsgIDToolResult("agg_1", call), "agg_1", "s_agg", corr
		rec, _, err := f.b.RecordResult(ctx, f.pub, m, &res)
		if err != nil {
			t.Fatal(err)
		}
		return rec.Seq
	}
	// a given up while b has no result: nothing to answer yet.
	if err := f.advise(t, "max_deliveries", bus.ConsumerRouterResults, record("a"), 20); err != nil {
		t.Fatal(err)
	}
	if ok, _ := f.b.Answered(ctx, "agg_1", "s_agg"); ok {
		t.Fatal("answered before every call had a result")
	}
	// b given up too: the processor answers.
	if err := f.advise(t, "terminated", bus.ConsumerRouterResults, record("b"), 1); err != nil {
		t.Fatal(err)
	}
	_, resp, err := f.b.Response(ctx, "agg_1", "s_agg")
	if err != nil || resp.Status != protocol.StatusSuccess || len(resp.Results) != 2 {
		t.Fatalf("response %+v %v", resp, err)
	}
	// Given up again: the one response stays.
	if err := f.advise(t, "max_deliveries", bus.ConsumerRouterResults, record("a"), 20); err != nil {
		t.Fatal(err)
	}
	if _, again, err := f.b.Response(ctx, "agg_1", "s_agg"); err != nil || again.Status != resp.Status {
		t.Fatalf("response %+v %v", again, err)
	}
}

// A call given up on whose last try ended with a tool's own code CANCELLED is answered
// DEAD_LETTERED: a Hermes CANCELLED result would say the request was cancelled.
func TestProcessorDoesNotPassAGivenUpCallOffAsCancelled(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	rid := "r_tool_cancelled"
	h, _, err := ledger.New(f.b.Claims, "w", 0).Acquire(ctx, ledger.Key(rid, "a"))
	if err != nil {
		t.Fatal(err)
	}
	h.Release(ctx, protocol.CodeCancelled)
	seq := f.store(t, protocol.SubjectToolCall(protocol.ActionHTTP, "echo", "s_"+rid), dispatch(t, rid, "a", &protocol.Correlation{CallIDs: []string{"a"}}))
	if err := f.advise(t, "max_deliveries", bus.ToolConsumer(protocol.ActionHTTP, "echo"), seq, 20); err != nil {
		t.Fatal(err)
	}
	_, res, err := f.b.Result(ctx, rid, "a", "s_"+rid, "")
	if err != nil || res.Cancelled() || res.ErrorCode != protocol.CodeDeadLettered || !strings.Contains(res.RecoveryHint, "kept failing with CANCELLED") {
		t.Fatalf("%+v %v", res, err)
	}
}
