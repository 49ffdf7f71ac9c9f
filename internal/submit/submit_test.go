package submit

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/ledger"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// fixture is a Submitter on an embedded server, and a stand-in router that answers every
// request it reads (unless hold is set) with an ok result per call.
type fixture struct {
	srv      *bustest.Server
	nc       *nats.Conn
	b        *bus.Bus
	s        *Submitter
	hold     atomic.Bool // the stand-in router answers nothing while set
	answered atomic.Int64
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{srv: bustest.NewServer(t)}
	f.nc = f.srv.Connect(t)
	f.b = f.srv.Provision(t, bus.Config{})
	s, err := New(Config{Conn: f.nc, Bus: f.b, Sender: protocol.Sender{Role: protocol.RoleGateway, Instance: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	f.s = s
	stop, err := s.Listen() // in place when it returns
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stop() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go f.router(ctx, t)
	return f
}

// router answers requests as they come, through the partition consumers.
func (f *fixture) router(ctx context.Context, t *testing.T) {
	pub := bus.NewPublisher(f.b.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: "stand-in"})
	handle := bus.HandlerFunc(func(ctx context.Context, d *bus.Delivery) error {
		if f.hold.Load() {
			return nil
		}
		req, err := d.Msg.DecodeRequest(protocol.Limits{})
		if err != nil {
			return bus.Permanent(err)
		}
		results := make([]protocol.ToolResult, len(req.ToolCalls))
		for i := range req.ToolCalls {
			results[i] = protocol.ToolResult{ToolCallID: req.ToolCalls[i].ToolCallID, Name: req.ToolCalls[i].Name, Status: protocol.ResultOK, Content: json.RawMessage(`{}`)}
		}
		resp := &protocol.Response{RequestID: req.RequestID, SessionID: req.Session(), Status: protocol.ResponseStatus(results), Results: results}
		m, _ := protocol.NewMessage(protocol.TypeResponse, resp)
		m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDResponse(req.RequestID), req.RequestID, req.Session()
		f.answered.Add(1) // before the response goes out: whoever gets it sees the count
		if _, err := f.b.Respond(ctx, pub, m); err != nil {
			f.answered.Add(-1)
			return err
		}
		return nil
	})
	for p := range f.b.Partitions() {
		cons, err := f.b.Consumer(ctx, bus.RequestConsumer(p))
		if err != nil {
			if ctx.Err() == nil && f.nc.IsConnected() {
				t.Error(err)
			}
			return
		}
		go func() {
			_ = (&bus.Subscriber{Consumer: cons, Handler: bus.Messages(handle, nil, "test"), Concurrency: 1}).Run(ctx)
		}()
	}
}

func req(id string, calls ...string) *protocol.Request {
	r := &protocol.Request{RequestID: id, Intent: "test"}
	for _, c := range calls {
		r.ToolCalls = append(r.ToolCalls, protocol.ToolCall{ToolCallID: c, Name: "echo", Arguments: json.RawMessage(`{}`)})
	}
	return r
}

func TestSubmit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	trace := protocol.TraceContext{TraceID: "trace-1"}

	out, err := f.s.Submit(ctx, Submission{Request: req("r1", "a", "b"), Trace: trace, Wait: 10 * time.Second})
	if err != nil || out.Pending || out.Replayed || out.Response == nil || len(out.Response.Results) != 2 || out.TraceID != "trace-1" {
		t.Fatalf("first submit: %+v %v", out, err)
	}
	// The same request again: the first response, nothing run again, the first trace id.
	out, err = f.s.Submit(ctx, Submission{Request: req("r1", "a", "b"), Trace: protocol.TraceContext{TraceID: "trace-2"}, Wait: 10 * time.Second})
	if err != nil || !out.Replayed || out.Response == nil || out.TraceID != "trace-2" {
		t.Fatalf("repeat: %+v %v", out, err)
	}
	if n := f.answered.Load(); n != 1 {
		t.Errorf("the router answered %d times", n)
	}
	// Another request under the same id: a conflict, never published.
	if _, err := f.s.Submit(ctx, Submission{Request: req("r1", "other"), Wait: time.Second}); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "r1") {
		t.Fatalf("conflict: %v", err)
	}
	// Too large for the bus: refused before anything.
	if _, err := f.s.Submit(ctx, Submission{Request: req("r_big", "a"), Size: f.b.MaxMessageBytes(), Wait: time.Second}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("too large: %v", err)
	}
	if _, err := f.b.Plan(ctx, "r_big"); !errors.Is(err, bus.ErrNotFound) {
		t.Errorf("a refused request was accepted: %v", err)
	}
	// Accepted: its plan recorded at intake, the first publication saying so.
	if p, err := f.b.Plan(ctx, "r1"); err != nil || !p.AtIntake || strings.Join(p.CallIDs, ",") != "a,b" || p.Fingerprint == "" {
		t.Errorf("plan at intake: %+v %v", p, err)
	}
	if raw, err := f.b.Stream.GetLastMsgForSubject(ctx, f.b.StoredSubjectRequest("r1")); err != nil || raw.Header.Get(bus.HeaderPlanned) == "" {
		t.Errorf("the first publication does not say it was planned: %v", err)
	}
	// No answer within the wait: pending, the request keeps running; Status follows it.
	f.hold.Store(true)
	out, err = f.s.Submit(ctx, Submission{Request: req("r2", "a"), Trace: trace, Wait: 300 * time.Millisecond})
	if err != nil || !out.Pending || out.Response != nil {
		t.Fatalf("pending: %+v %v", out, err)
	}
	if _, pending, err := f.s.Status(ctx, "r2"); err != nil || !pending {
		t.Fatalf("status while pending: %v %v", pending, err)
	}
	// Submitted again while it runs: it joins the first submission, under its trace id.
	out, err = f.s.Submit(ctx, Submission{Request: req("r2", "a"), Trace: protocol.TraceContext{TraceID: "trace-3"}, Wait: 300 * time.Millisecond})
	if err != nil || !out.Pending || out.TraceID != "trace-1" {
		t.Fatalf("joined: %+v %v", out, err)
	}
	if _, _, err := f.s.Status(ctx, "r_unknown"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("status of an unknown request: %v", err)
	}
	// The caller leaving: its context's error; the request keeps running.
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(200*time.Millisecond, cancel)
	if _, err := f.s.Submit(cctx, Submission{Request: req("r3", "a"), Wait: time.Minute}); !errors.Is(err, context.Canceled) {
		t.Fatalf("caller left: %v", err)
	}
	if _, pending, err := f.s.Status(ctx, "r3"); err != nil || !pending {
		t.Fatalf("r3 was not accepted: %v %v", pending, err)
	}
}

func TestSubmitWhileDisconnected(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.nc.Close()
	if _, err := f.s.Submit(t.Context(), Submission{Request: req("r1", "a"), Wait: time.Second}); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("submit: %v", err)
	}
	if _, _, err := f.s.Status(t.Context(), "r1"); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("status: %v", err)
	}
	if _, _, err := f.s.Cancel(t.Context(), "r1", Cancellation{By: "test"}); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("cancel: %v", err)
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	f.hold.Store(true) // nothing is answered but by the cancellation

	// Unknown: not found. A bad reason: refused.
	if _, _, err := f.s.Cancel(ctx, "nobody", Cancellation{By: "test"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown: %v", err)
	}
	if _, _, err := f.s.Cancel(ctx, "nobody", Cancellation{By: "test", Reason: strings.Repeat("x", protocol.MaxCancelTextBytes+1)}); !errors.Is(err, protocol.ErrInvalid) {
		t.Fatalf("long reason: %v", err)
	}

	// Accepted (planned at intake), not taken by any router: the cancellation marks its calls
	// in the ledger and answers it.
	if out, err := f.s.Submit(ctx, Submission{Request: req("q1", "a", "b"), Wait: 100 * time.Millisecond}); err != nil || !out.Pending {
		t.Fatalf("submit: %+v %v", out, err)
	}
	resp, replayed, err := f.s.Cancel(ctx, "q1", Cancellation{By: "http 127.0.0.1:1", Reason: "changed my mind"})
	if err != nil || replayed {
		t.Fatalf("cancel: %v %v", replayed, err)
	}
	if resp.Status != protocol.StatusFailed || resp.Error == nil || resp.Error.Code != protocol.CodeCancelled ||
		resp.Error.Message != "cancelled by http 127.0.0.1:1: changed my mind" || len(resp.Results) != 2 {
		t.Fatalf("response %+v %+v", resp, resp.Error)
	}
	for _, r := range resp.Results {
		if r.ErrorCode != protocol.CodeCancelled || r.Name != "echo" || !strings.Contains(string(r.Content), "http 127.0.0.1:1") {
			t.Errorf("result %+v", r)
		}
		if ok, err := ledger.IsCancelled(ctx, f.b.Claims, ledger.Key("q1", r.ToolCallID)); !ok || err != nil {
			t.Errorf("claim of %s not cancelled: %v", r.ToolCallID, err)
		}
	}
	if p, err := f.b.Plan(ctx, "q1"); err != nil || !p.AtIntake || len(p.CallIDs) != 2 {
		t.Errorf("plan %+v %v", p, err)
	}
	// Again: the same response, replayed.
	again, replayed, err := f.s.Cancel(ctx, "q1", Cancellation{By: "someone else"})
	if err != nil || !replayed || again.Error.Message != resp.Error.Message {
		t.Fatalf("again: %+v %v %v", again, replayed, err)
	}

	// Planned, one call finished: that result stands, the other is cancelled.
	f.submitPlanned(t, "p1", "done", "open")
	resp, _, err = f.s.Cancel(ctx, "p1", Cancellation{By: "test"})
	if err != nil || resp.Status != protocol.StatusPartialSuccess || resp.Results[0].Status != protocol.ResultOK || resp.Results[1].ErrorCode != protocol.CodeCancelled {
		t.Fatalf("partly finished: %+v %v", resp, err)
	}

	// Every call finished, but no response recorded yet: nothing is cancelled; the request is
	// answered as it finished, and the caller told so.
	f.submitPlanned(t, "p2", "one", "two")
	pub := bus.NewPublisher(f.b.JS, protocol.Sender{Role: protocol.RoleToolWorker, Instance: "w"})
	res := protocol.ToolResult{ToolCallID: "two", Name: "echo", Status: protocol.ResultOK, Content: json.RawMessage(`{}`), Attempts: 1}
	m, _ := protocol.NewMessage(protocol.TypeToolResult, &res)
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDToolResult("p2", "two"), "p2", "p2"
	if _, _, err := f.b.RecordResult(ctx, pub, m, &res); err != nil {
		t.Fatal(err)
	}
	resp, _, err = f.s.Cancel(ctx, "p2", Cancellation{By: "test"})
	if !errors.Is(err, ErrFinished) || resp == nil || resp.Status != protocol.StatusSuccess || resp.Error != nil {
		t.Fatalf("all finished: %+v %v", resp, err)
	}
	if _, err := f.b.Stream.GetLastMsgForSubject(ctx, protocol.SubjectEvent(protocol.EventCancel, "p2")); err == nil {
		t.Error("a cancellation that cancelled nothing is on the record")
	}

	// Finished: nothing to cancel.
	f.hold.Store(false)
	if _, err := f.s.Submit(ctx, Submission{Request: req("f1", "a"), Wait: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	resp, _, err = f.s.Cancel(ctx, "f1", Cancellation{By: "test"})
	if !errors.Is(err, ErrFinished) || resp == nil || resp.Status != protocol.StatusSuccess {
		t.Fatalf("finished: %+v %v", resp, err)
	}
}

// submitPlanned records a plan for request id with calls, as a router would, and an ok result
// for the first call.
func (f *fixture) submitPlanned(t *testing.T, id string, calls ...string) {
	t.Helper()
	ctx := t.Context()
	if _, err := f.s.Submit(ctx, Submission{Request: req(id, calls...), Wait: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.b.CreatePlan(ctx, id, &bus.Plan{SessionID: id, CallIDs: calls, Names: []string{"echo", "echo"}, Fingerprint: "x"}); err != nil {
		t.Fatal(err)
	}
	pub := bus.NewPublisher(f.b.JS, protocol.Sender{Role: protocol.RoleToolWorker, Instance: "w"})
	res := protocol.ToolResult{ToolCallID: calls[0], Name: "echo", Status: protocol.ResultOK, Content: json.RawMessage(`{"ok":true}`), Attempts: 1}
	m, _ := protocol.NewMessage(protocol.TypeToolResult, &res)
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDToolResult(id, calls[0]), id, id
	if _, _, err := f.b.RecordResult(ctx, pub, m, &res); err != nil {
		t.Fatal(err)
	}
}
