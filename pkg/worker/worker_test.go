package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/ledger"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
)

// observer counts what a worker tells it.
type observer struct {
	mu                          sync.Mutex
	started, finished, retrying int
	recorded                    []protocol.ToolResult
}

func (o *observer) Started(string, int, time.Duration) { o.mu.Lock(); o.started++; o.mu.Unlock() }
func (o *observer) Finished(string, time.Duration)     { o.mu.Lock(); o.finished++; o.mu.Unlock() }
func (o *observer) Retrying(string, string)            { o.mu.Lock(); o.retrying++; o.mu.Unlock() }
func (o *observer) Recorded(r *protocol.ToolResult) {
	o.mu.Lock()
	o.recorded = append(o.recorded, *r)
	o.mu.Unlock()
}

// rig is a worker of one executor on an embedded server, and a way to dispatch calls to it.
type rig struct {
	t   *testing.T
	b   *bus.Bus
	pub *bus.Publisher
	obs *observer
}

func newRig(t *testing.T, cfg bus.Config, execs ...worker.Executor) *rig {
	t.Helper()
	b := bustest.NewServer(t).Provision(t, cfg)
	r := &rig{t: t, b: b, pub: bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: "test-router"}), obs: &observer{}}
	w, err := worker.New(worker.Config{Bus: b, Instance: "w1", Executors: execs, Tools: []string{"t"}, Observer: r.obs})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	return r
}

// dispatch publishes a call of tool t, kind kind, of request rid.
func (r *rig) dispatch(kind, rid, args string, retry protocol.RetryPolicy) {
	r.t.Helper()
	if retry.MaxAttempts == 0 {
		retry = protocol.RetryPolicy{MaxAttempts: 1, BackoffFactor: 1, InitialIntervalMS: 1, MaxIntervalMS: 1}
	}
	action := protocol.Action{Kind: kind, TimeoutMS: 5000, Retry: retry}
	if kind == protocol.ActionHTTP {
		action.HTTP = &protocol.HTTPAction{URL: "http://127.0.0.1:1/", Method: "POST"} // never called: the executors are fakes
	}
	if kind == protocol.ActionMCP {
		action.MCP = &protocol.MCPAction{Server: "s", Tool: "t"}
	}
	m, err := protocol.NewMessage(protocol.TypeToolCall, &protocol.Dispatch{Call: protocol.ToolCall{ToolCallID: "c", Name: "t", Arguments: json.RawMessage(args)},
		Route: "rule", Action: action})
	if err != nil {
		r.t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDToolCall(rid, "c"), rid, "s"
	m.Correlation = &protocol.Correlation{CallIDs: []string{"c"}}
	if _, err := r.b.EnsureToolConsumer(r.t.Context(), kind, "t"); err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.pub.Publish(r.t.Context(), protocol.SubjectToolCall(kind, "t", "s"), m); err != nil {
		r.t.Fatal(err)
	}
}

// result waits for rid's recorded result.
func (r *rig) result(rid string) (*protocol.Message, *protocol.ToolResult) {
	r.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		rec, res, err := r.b.Result(r.t.Context(), rid, "c", "s", "")
		if err == nil {
			return rec.Msg, res
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.t.Fatalf("no result for %s", rid)
	return nil, nil
}

func goFunc(f worker.Func) *worker.Funcs {
	funcs, _ := worker.NewFuncs(map[string]worker.Func{"t": f})
	return funcs
}

func TestWorkerRunsRetriesAndRecords(t *testing.T) {
	t.Parallel()
	var tries atomic.Int64
	r := newRig(t, bus.Config{}, goFunc(func(_ context.Context, args json.RawMessage) (any, error) {
		if tries.Add(1) == 1 {
			return nil, &worker.ToolError{Code: "BUSY", Retryable: true, Err: errors.New("busy")}
		}
		return json.RawMessage(args), nil
	}))
	r.dispatch(protocol.ActionGo, "r_ok", `{"n":9007199254740993}`, protocol.RetryPolicy{MaxAttempts: 3, BackoffFactor: 1, InitialIntervalMS: 10, MaxIntervalMS: 10})
	m, res := r.result("r_ok")
	if res.Status != protocol.ResultOK || string(res.Content) != `{"n":9007199254740993}` || res.Attempts != 2 || res.Route != "rule" || res.Name != "t" {
		t.Fatalf("result %+v", res)
	}
	if m.Sender.Role != protocol.RoleToolWorker || m.Correlation == nil || m.Correlation.CallIDs[0] != "c" || m.MsgID != protocol.MsgIDToolResult("r_ok", "c") {
		t.Errorf("envelope %+v", m)
	}
	// The result is on the bus a moment before the observer hears it was recorded.
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.obs.mu.Lock()
		ok := r.obs.started == 2 && r.obs.finished == 2 && r.obs.retrying == 1 && len(r.obs.recorded) == 1
		if ok || time.Now().After(deadline) {
			if !ok {
				t.Errorf("observer %+v", r.obs)
			}
			r.obs.mu.Unlock()
			break
		}
		r.obs.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
}

func TestWorkerFinalFailuresAndDeadlines(t *testing.T) {
	t.Parallel()
	r := newRig(t, bus.Config{}, goFunc(func(ctx context.Context, args json.RawMessage) (any, error) {
		if strings.Contains(string(args), "big") {
			return strings.Repeat("x", 2<<20), nil // over the default result limit
		}
		return nil, errors.New("no such order")
	}))
	r.dispatch(protocol.ActionGo, "r_fail", `{}`, protocol.RetryPolicy{MaxAttempts: 3, BackoffFactor: 1, InitialIntervalMS: 1, MaxIntervalMS: 1})
	if _, res := r.result("r_fail"); res.ErrorCode != protocol.CodeToolFailed || res.ErrorOrigin != protocol.OriginTool || res.Attempts != 1 {
		t.Errorf("permanent failure: %+v", res)
	}
	r.dispatch(protocol.ActionGo, "r_big", `{"big":true}`, protocol.RetryPolicy{})
	if _, res := r.result("r_big"); res.ErrorCode != protocol.CodeResultTooLarge {
		t.Errorf("too large: %+v", res)
	}
	// A call whose request's deadline passed is not run.
	m, _ := protocol.NewMessage(protocol.TypeToolCall, &protocol.Dispatch{Call: protocol.ToolCall{ToolCallID: "c", Name: "t"},
		Route: "rule", Action: protocol.Action{Kind: protocol.ActionGo, TimeoutMS: 100, Retry: protocol.RetryPolicy{MaxAttempts: 1, BackoffFactor: 1, InitialIntervalMS: 1, MaxIntervalMS: 1}}})
	m.MsgID, m.RequestID, m.SessionID, m.Deadline = protocol.MsgIDToolCall("r_late", "c"), "r_late", "s", time.Now().Add(-time.Minute)
	if _, err := r.pub.Publish(t.Context(), protocol.SubjectToolCall(protocol.ActionGo, "t", "s"), m); err != nil {
		t.Fatal(err)
	}
	if _, res := r.result("r_late"); res.ErrorCode != protocol.CodeDeadlineExceeded {
		t.Errorf("late: %+v", res)
	}
}

// A cancelled call is not started; a running one is stopped when its request is cancelled and
// answered CANCELLED naming who cancelled.
func TestWorkerHonoursCancellation(t *testing.T) {
	t.Parallel()
	started := make(chan struct{}, 4)
	var ran atomic.Int64
	r := newRig(t, bus.Config{}, goFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
		ran.Add(1)
		started <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	}))
	ctx := t.Context()
	// Cancelled before it was dispatched: never started.
	if err := ledger.Cancel(ctx, r.b.Claims, ledger.Key("r_before", "c")); err != nil {
		t.Fatal(err)
	}
	r.dispatch(protocol.ActionGo, "r_before", `{}`, protocol.RetryPolicy{})
	if _, res := r.result("r_before"); res.ErrorCode != protocol.CodeCancelled || res.Attempts != 0 {
		t.Fatalf("cancelled before: %+v", res)
	}
	if ran.Load() != 0 {
		t.Fatal("a cancelled call ran")
	}
	// Running: a cancel message alone stops nothing (it could be forged); once the ledger
	// says so, it stops.
	r.dispatch(protocol.ActionGo, "r_running", `{}`, protocol.RetryPolicy{})
	<-started
	announce := func() {
		ev, _ := protocol.NewMessage(protocol.TypeCancel, &protocol.Cancel{By: "http 192.0.2.7:1", At: time.Now()})
		ev.MsgID, ev.RequestID, ev.SessionID = protocol.MsgIDCancel("r_running")+time.Now().String(), "r_running", "s"
		if _, err := r.pub.Publish(ctx, protocol.SubjectEvent(protocol.EventCancel, "s"), ev); err != nil {
			t.Fatal(err)
		}
	}
	announce()
	time.Sleep(300 * time.Millisecond)
	if _, _, err := r.b.Result(ctx, "r_running", "c", "s", ""); !errors.Is(err, bus.ErrNotFound) {
		t.Fatalf("a forged cancellation stopped the call: %v", err)
	}
	if err := ledger.Cancel(ctx, r.b.Claims, ledger.Key("r_running", "c")); err != nil {
		t.Fatal(err)
	}
	announce()
	_, res := r.result("r_running")
	if res.ErrorCode != protocol.CodeCancelled || res.Attempts != 1 || !strings.Contains(string(res.Content), "192.0.2.7") {
		t.Fatalf("cancelled while running: %+v", res)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	b := &bus.Bus{}
	http := worker.ExecutorFunc(protocol.ActionHTTP, nil)
	for _, c := range []struct {
		cfg  worker.Config
		want string
	}{
		{worker.Config{Instance: "w", Executors: []worker.Executor{http}}, "Bus is required"},
		{worker.Config{Bus: b, Executors: []worker.Executor{http}}, "Instance is required"},
		{worker.Config{Bus: b, Instance: "w"}, "at least one executor"},
		{worker.Config{Bus: b, Instance: "w", Executors: []worker.Executor{http, http}}, "two executors of kind"},
		{worker.Config{Bus: b, Instance: "w", Executors: []worker.Executor{worker.ExecutorFunc("smtp", nil)}}, `kind "smtp"`},
		{worker.Config{Bus: b, Instance: "w", Executors: []worker.Executor{nil}}, "nil executor"},
		{worker.Config{Bus: b, Instance: "w", Executors: []worker.Executor{http}, Tools: []string{"a.b"}}, "tools"},
	} {
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want %q", c.cfg, err, c.want)
		}
	}
}

// toolsExec names the tools it serves: none.
type toolsExec struct{ ran *atomic.Int64 }

func (toolsExec) Kind() string    { return protocol.ActionMCP }
func (toolsExec) Tools() []string { return nil }
func (e toolsExec) Execute(context.Context, *worker.Call) (worker.Outcome, error) {
	e.ran.Add(1)
	return worker.OK(json.RawMessage(`{}`), 0), nil
}

// An executor that names no tools serves none — not every tool of its kind.
func TestAnExecutorNamingNoToolsServesNone(t *testing.T) {
	t.Parallel()
	var ran atomic.Int64
	r := newRig(t, bus.Config{}, toolsExec{&ran})
	r.dispatch(protocol.ActionMCP, "r_other", `{}`, protocol.RetryPolicy{})
	time.Sleep(time.Second)
	if _, _, err := r.b.Result(t.Context(), "r_other", "c", "s", ""); !errors.Is(err, bus.ErrNotFound) || ran.Load() != 0 {
		t.Fatalf("ran %d: %v", ran.Load(), err)
	}
}

// A Go tool that ignores its context is timed out all the same.
func TestAGoToolIgnoringItsContextIsTimedOut(t *testing.T) {
	t.Parallel()
	r := newRig(t, bus.Config{}, goFunc(func(context.Context, json.RawMessage) (any, error) {
		time.Sleep(3 * time.Second)
		return "late", nil
	}))
	m, _ := protocol.NewMessage(protocol.TypeToolCall, &protocol.Dispatch{Call: protocol.ToolCall{ToolCallID: "c", Name: "t"},
		Route: "rule", Action: protocol.Action{Kind: protocol.ActionGo, TimeoutMS: 100, Retry: protocol.RetryPolicy{MaxAttempts: 1, BackoffFactor: 1, InitialIntervalMS: 1, MaxIntervalMS: 1}}})
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDToolCall("r_slow", "c"), "r_slow", "s"
	if _, err := r.b.EnsureToolConsumer(t.Context(), protocol.ActionGo, "t"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.pub.Publish(t.Context(), protocol.SubjectToolCall(protocol.ActionGo, "t", "s"), m); err != nil {
		t.Fatal(err)
	}
	if _, res := r.result("r_slow"); res.ErrorCode != protocol.CodeToolTimeout {
		t.Fatalf("result %+v", res)
	}
}

// A brief JetStream outage — a cluster electing a leader, a server restarting — does not stop
// a worker; it serves calls again once JetStream is back.
func TestAWorkerOutlivesABriefJetStreamOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a JetStream outage")
	}
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{})
	exec := worker.ExecutorFunc(protocol.ActionHTTP, func(context.Context, *worker.Call) (worker.Outcome, error) {
		return worker.OK(json.RawMessage(`{}`), 0), nil
	})
	w, err := worker.New(worker.Config{Bus: b, Instance: "w", Executors: []worker.Executor{exec}, Tools: []string{"t"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	time.Sleep(300 * time.Millisecond)
	jsCfg := srv.JetStreamConfig()
	jsCfg.StoreDir = filepath.Dir(jsCfg.StoreDir) // enabling adds the "jetstream" it ends in
	if err := srv.DisableJetStream(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(6 * time.Second)
	if err := srv.EnableJetStream(jsCfg); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("the worker stopped during the outage: %v", err)
	case <-time.After(time.Second):
	}
	r := &rig{t: t, b: b, pub: bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: "test-router"})}
	r.dispatch(protocol.ActionHTTP, "after_outage", `{}`, protocol.RetryPolicy{})
	if _, res := r.result("after_outage"); res.Status != protocol.ResultOK {
		t.Fatalf("a call after the outage: %+v", res)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A call whose claim is held by a worker that died a moment before its lease runs out is
// taken over in the same delivery: the wait does not spend one of the call's deliveries
// (with MaxDeliver 2 and a crash on the first, the second is its last).
func TestAClaimAboutToLapseIsWaitedForInPlace(t *testing.T) {
	t.Parallel()
	r := newRig(t, bus.Config{AckWait: time.Second}, goFunc(func(_ context.Context, args json.RawMessage) (any, error) {
		return json.RawMessage(args), nil
	}))
	if _, _, err := ledger.New(r.b.Claims, "dead-worker", time.Second).Acquire(t.Context(), ledger.Key("r_lapse", "c")); err != nil {
		t.Fatal(err)
	}
	r.dispatch(protocol.ActionGo, "r_lapse", `{}`, protocol.RetryPolicy{})
	if _, res := r.result("r_lapse"); res.Status != protocol.ResultOK || res.Attempts != 2 {
		t.Fatalf("result %+v", res)
	}
	info, err := r.b.Stream.Consumer(t.Context(), bus.ToolConsumer(protocol.ActionGo, "t"))
	if err != nil {
		t.Fatal(err)
	}
	ci, err := info.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if ci.NumRedelivered != 0 || ci.Delivered.Consumer != 1 {
		t.Fatalf("delivered %d times (%d redelivered), want once", ci.Delivered.Consumer, ci.NumRedelivered)
	}
}

// changingSet is an executor of kind mcp whose tools change while it runs (worker.ToolSet).
type changingSet struct {
	mu      sync.Mutex
	has     map[string]bool
	changed chan struct{}
}

func (c *changingSet) Kind() string { return protocol.ActionMCP }
func (c *changingSet) Execute(context.Context, *worker.Call) (worker.Outcome, error) {
	return worker.OK(json.RawMessage(`"served"`), 0), nil
}
func (c *changingSet) Has(tool string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.has[tool]
}
func (c *changingSet) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}
func (c *changingSet) add(tool string) {
	c.mu.Lock()
	c.has[tool] = true
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// A tool whose consumer appears before its executor has it is served once the executor says it
// has it: not before (another worker may hold it), and not never.
func TestAToolSetsToolIsServedOnceItHasIt(t *testing.T) {
	t.Parallel()
	b := bustest.NewServer(t).Provision(t, bus.Config{})
	set := &changingSet{has: map[string]bool{}, changed: make(chan struct{})}
	w, err := worker.New(worker.Config{Bus: b, Instance: "w-set", Executors: []worker.Executor{set}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	r := &rig{t: t, b: b, pub: bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: "test-router"})}
	r.dispatch(protocol.ActionMCP, "r_set", `{}`, protocol.RetryPolicy{})
	time.Sleep(500 * time.Millisecond)
	if _, _, err := b.Result(t.Context(), "r_set", "c", "s", ""); !errors.Is(err, bus.ErrNotFound) {
		t.Fatalf("served before the executor had the tool: %v", err)
	}
	set.add("t")
	if _, res := r.result("r_set"); res.Status != protocol.ResultOK || string(res.Content) != `"served"` {
		t.Fatalf("result %+v", res)
	}
}
