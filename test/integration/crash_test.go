package integration

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/deadletter"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// postAsync posts req in the background; the answer arrives on the channel.
func (s *system) postAsync(req any, query string) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		status, hdr, body := s.post(req, query)
		ch <- answer{status: status, header: hdr, body: body}
	}()
	return ch
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (s *system) countRecorded(requestID string, typ protocol.Type) int {
	n := 0
	for _, m := range s.record() {
		if m.RequestID == requestID && m.Type == typ {
			n++
		}
	}
	return n
}

// TestWorkerKilledMidCall: a tool worker process is SIGKILLed while a call runs; the call is
// redelivered to another worker with the same Idempotency-Key and the request completes with
// exactly one result and one response.
func TestWorkerKilledMidCall(t *testing.T) {
	t.Parallel()
	s := start(t, options{bus: bus.Config{AckWait: 2 * time.Second}})
	victim := s.spawn("toolworker", "victim-worker", append(s.workerArgs(), "--tools", "record")...)
	got := s.postAsync(request("crash_w1", "", call("c", "record", map[string]any{"first_delay_ms": 60000})), "")
	waitFor(t, "the victim to start the call", func() bool { return len(s.recorder.tries("crash_w1/c")) == 1 })
	victim.kill()
	s.addWorker("survivor-worker")
	a := <-got
	if a.status != http.StatusOK {
		t.Fatalf("HTTP %d: %s", a.status, a.body)
	}
	resp := decodeResponse(t, a.body)
	r := result(t, resp, "c")
	if resp.Status != protocol.StatusSuccess || r.Attempts != 2 {
		t.Fatalf("response %+v", resp)
	}
	tries := s.recorder.tries("crash_w1/c")
	if len(tries) != 2 {
		t.Fatalf("the tool saw %d tries, want 2 (the killed one and the redelivery)", len(tries))
	}
	for i, h := range tries {
		if h.Get("X-Hermes-Attempt") != []string{"1", "2"}[i] {
			t.Errorf("try %d carried attempt %q", i+1, h.Get("X-Hermes-Attempt"))
		}
	}
	if n := s.countRecorded("crash_w1", protocol.TypeToolResult); n != 1 {
		t.Errorf("%d results recorded, want 1", n)
	}
	if n := s.countRecorded("crash_w1", protocol.TypeResponse); n != 1 {
		t.Errorf("%d responses recorded, want 1", n)
	}
}

// TestSlowToolRunsOnce: a tool that takes 3× the ack deadline is not run twice, even with two
// workers ready to take a redelivery.
func TestSlowToolRunsOnce(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 2, bus: bus.Config{AckWait: time.Second}})
	resp := s.route(request("slow_1", "", call("c", "record", map[string]any{"delay_ms": 3000})))
	if r := result(t, resp, "c"); r.Status != protocol.ResultOK || r.Attempts != 1 {
		t.Fatalf("result %+v", r)
	}
	if n := len(s.recorder.tries("slow_1/c")); n != 1 {
		t.Fatalf("the slow tool ran %d times, want once", n)
	}
	if n := s.countRecorded("slow_1", protocol.TypeToolStarted); n != 1 {
		t.Fatalf("%d starts recorded, want 1", n)
	}
}

// TestWorkerDiesOnLastDelivery: both deliveries allowed die with their worker; the call is
// dead-lettered and the request still gets its response.
func TestWorkerDiesOnLastDelivery(t *testing.T) {
	t.Parallel()
	s := start(t, options{bus: bus.Config{AckWait: time.Second, MaxDeliver: 2}})
	got := s.postAsync(request("crash_last", "", call("c", "record", map[string]any{"delay_ms": 60000, "slow_tries": 2})), "")
	for i, name := range []string{"victim-1", "victim-2"} {
		v := s.spawn("toolworker", name, append(s.workerArgs(), "--tools", "record")...)
		waitFor(t, name+" to start the call", func() bool { return len(s.recorder.tries("crash_last/c")) == i+1 })
		v.kill()
	}
	// The server notices the exhausted message when a healthy worker next pulls: it does not
	// run it, and the request gets its dead-letter answer.
	s.addWorker("healthy-worker")
	a := <-got
	if a.status != http.StatusOK {
		t.Fatalf("HTTP %d: %s", a.status, a.body)
	}
	r := result(t, decodeResponse(t, a.body), "c")
	if r.Status != protocol.ResultError || r.ErrorCode != protocol.CodeDeadLettered || r.Attempts != 2 {
		t.Fatalf("result %+v", r)
	}
	dl := s.waitDeadLetter(protocol.SubjectToolCall(protocol.ActionHTTP, "record", "crash_last"))
	if dl.Header.Get(deadletter.HeaderDeliveries) != "2" {
		t.Fatalf("dead letter %v", dl.Header)
	}

	// hermes dlq ls shows it; hermes dlq retry re-drives it to a healthy worker.
	var out, errOut bytes.Buffer
	env := app.Env{Stdout: &out, Stderr: &errOut}
	if err := app.RunDLQ(context.Background(), []string{"ls", "--nats", s.srv.URL}, env); err != nil {
		t.Fatalf("dlq ls: %v: %s", err, errOut.String())
	}
	seq := strconv.FormatUint(dl.Sequence, 10)
	if !strings.Contains(out.String(), protocol.SubjectToolCall(protocol.ActionHTTP, "record", "crash_last")) || !strings.Contains(out.String(), "gave up after 2 deliveries") ||
		!strings.Contains(out.String(), seq) {
		t.Fatalf("dlq ls printed:\n%s", out.String())
	}
	out.Reset()
	if err := app.RunDLQ(context.Background(), []string{"retry", "--nats", s.srv.URL, seq}, env); err != nil {
		t.Fatalf("dlq retry: %v: %s", err, errOut.String())
	}
	_, b := s.connect()
	waitFor(t, "the re-driven call's result", func() bool {
		_, res, err := b.Result(context.Background(), "crash_last", "c", "crash_last", "")
		return err == nil && res.Status == protocol.ResultOK && res.Attempts == 3
	})
	if n := len(s.recorder.tries("crash_last/c")); n != 3 {
		t.Fatalf("the tool saw %d tries, want 3", n)
	}
	// The response already sent stays the one response.
	if n := s.countRecorded("crash_last", protocol.TypeResponse); n != 1 {
		t.Fatalf("%d responses recorded, want 1", n)
	}
	// The call has its tool's result now: it is not re-driven again.
	if err := app.RunDLQ(context.Background(), []string{"retry", "--nats", s.srv.URL, seq}, env); err == nil || !strings.Contains(err.Error(), "has its tool's result") {
		t.Fatalf("a second re-drive: %v", err)
	}
}

// TestRouterKilledMidRequest: the only router, a separate process, is SIGKILLed while requests
// are in flight; a router started afterwards finishes every one of them. Clients retry with the
// same request_id after timeouts; none is lost, none answered twice.
func TestRouterKilledMidRequest(t *testing.T) {
	long(t, "a router killed under load")
	s := start(t, options{routers: -1, workers: 1, bus: bus.Config{AckWait: 2 * time.Second}})
	victim := s.spawn("router", "victim-router", "--routes", "testdata/routes.yaml")
	// A burst, so that the victim is in the middle of many requests when it dies.
	const n = 200
	reqs := make([]map[string]any, n)
	for i := range reqs {
		id := fmt.Sprintf("rk_%03d", i)
		reqs[i] = request(id, "", call("a", "echo", map[string]any{"delay_ms": 100, "i": i}),
			call("b", "echo", map[string]any{"i": i}), call("c", "echo", map[string]any{"j": i}))
	}
	// Until the kill the victim is the only router: every dispatch seen is its own.
	nc, _ := s.connect()
	var seen atomic.Int64
	sub, err := nc.Subscribe(protocol.FilterToolCalls(protocol.ActionHTTP, "*"), func(*nats.Msg) { seen.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan []clientRun, 1)
	go func() { done <- s.runClients(reqs, time.Second, 0, 60*time.Second) }()
	dispatchedBy := func() map[string]int {
		by := map[string]int{}
		for _, m := range s.record() {
			if m.Type == protocol.TypeToolCall {
				by[m.Sender.Instance]++
			}
		}
		return by
	}
	waitFor(t, "the victim router to dispatch calls", func() bool { return seen.Load() >= 30 })
	victim.kill()
	_ = sub.Unsubscribe()
	s.addRouter("survivor-router")
	counts := s.classify(<-done)
	report(t, "router killed mid-request", n, counts)
	by := dispatchedBy()
	t.Logf("calls dispatched: %v; requests split between the two routers: %d", by, s.splitRequests())
	if by["survivor-router"] == 0 {
		t.Errorf("the survivor did no dispatching; the kill came too late to test a takeover")
	}
	if counts[outcomeOK]+counts[outcomeResolved] != n {
		t.Fatalf("not every request was answered exactly once: %v", counts)
	}
}

// splitRequests counts requests whose calls were dispatched by more than one router: the
// ones a router died in the middle of.
func (s *system) splitRequests() int {
	by := map[string]map[string]bool{}
	for _, m := range s.record() {
		if m.Type == protocol.TypeToolCall {
			if by[m.RequestID] == nil {
				by[m.RequestID] = map[string]bool{}
			}
			by[m.RequestID][m.Sender.Instance] = true
		}
	}
	n := 0
	for _, routers := range by {
		if len(routers) > 1 {
			n++
		}
	}
	return n
}

// TestLateAndDuplicateDeliveries: after a request completed, a dead worker's late result, a
// duplicate delivery of the call and of the request (as if redelivered after a late ack, under
// new message ids so the stream cannot drop them) change nothing: the call does not run again
// and the request keeps its one response.
func TestLateAndDuplicateDeliveries(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	first := s.route(request("late_dup", "", call("c", "record", map[string]any{"v": "real"})))
	var callMsg, reqMsg *protocol.Message
	for _, m := range s.record() {
		if m.RequestID == "late_dup" && m.Type == protocol.TypeToolCall {
			callMsg = m
		}
		if m.RequestID == "late_dup" && m.Type == protocol.TypeRequest {
			reqMsg = m
		}
	}
	pub := bus.NewPublisher(s.js, protocol.Sender{Role: protocol.RoleToolWorker, Instance: "dead-worker"})
	late, _ := protocol.NewMessage(protocol.TypeToolResult, &protocol.ToolResult{ToolCallID: "c", Name: "record",
		Status: protocol.ResultOK, Content: []byte(`{"v":"late"}`), Attempts: 1})
	late.Follow(callMsg, "late-result-from-a-dead-worker")
	ctx := context.Background()
	if _, err := pub.Publish(ctx, protocol.SubjectRedrivenResult(callMsg.SessionID), late); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*protocol.Message{callMsg, reqMsg} {
		m.MsgID += ":again"
		subject := protocol.SubjectRequest(m.SessionID)
		if m.Type == protocol.TypeToolCall {
			subject = protocol.SubjectToolCall(protocol.ActionHTTP, "record", m.SessionID)
		}
		if _, err := pub.Publish(ctx, subject, m); err != nil {
			t.Fatal(err)
		}
	}
	// Wait until all three were handled (acked) by their consumers: a minute, not waitFor's
	// 20 s, since this test runs in parallel with the rest of the package on a loaded machine.
	_, b := s.connect()
	waitForWithin(t, "the duplicates to be handled", time.Minute, func() bool {
		for _, name := range []string{bus.RequestConsumer(s.partitionOf("late_dup")), bus.ConsumerRouterResults, bus.ToolConsumer(protocol.ActionHTTP, "record")} {
			c, err := b.Consumer(ctx, name)
			if err != nil {
				return false
			}
			info, err := c.Info(ctx)
			if err != nil || info.NumPending > 0 || info.NumAckPending > 0 {
				return false
			}
		}
		return true
	})
	if n := len(s.recorder.tries("late_dup/c")); n != 1 {
		t.Fatalf("the call ran %d times, want once", n)
	}
	status, _, body := s.post(request("late_dup", "", call("c", "record", map[string]any{"v": "real"})), "")
	if status != http.StatusOK {
		t.Fatalf("HTTP %d", status)
	}
	again := decodeResponse(t, body)
	if r := result(t, again, "c"); string(r.Content) != `{"v":"real"}` || string(result(t, first, "c").Content) != `{"v":"real"}` {
		t.Fatalf("the late result replaced the first: %s", r.Content)
	}
	if n := s.countRecorded("late_dup", protocol.TypeResponse); n != 1 {
		t.Fatalf("%d responses recorded, want 1", n)
	}
	rec, _, err := b.Result(ctx, "late_dup", "c", "late_dup", "")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Msg.Sender.Instance == "dead-worker" {
		t.Fatal("the late result replaced the recorded one")
	}
}

// TestWorkerKilledUnderLoad: two tool worker processes share the load; one is SIGKILLed in the
// middle of it. Every request is answered exactly once; the calls it was running are run again
// by the survivor.
func TestWorkerKilledUnderLoad(t *testing.T) {
	long(t, "workers killed under load")
	s := start(t, options{bus: bus.Config{AckWait: 2 * time.Second}})
	victim := s.spawn("toolworker", "victim-worker", s.workerArgs()...)
	s.spawn("toolworker", "survivor-worker", s.workerArgs()...)
	const n = 60
	reqs := make([]map[string]any, n)
	for i := range reqs {
		reqs[i] = request(fmt.Sprintf("wk_%02d", i), "", call("a", "record", map[string]any{"delay_ms": 300, "i": i}),
			call("b", "echo", map[string]any{"i": i}))
	}
	done := make(chan []clientRun, 1)
	go func() { done <- s.runClients(reqs, time.Second, 10*time.Millisecond, 60*time.Second) }()
	waitFor(t, "the victim to be running calls", func() bool {
		for _, m := range s.record() {
			if m.Type == protocol.TypeToolStarted && m.Sender.Instance == "victim-worker" {
				return true
			}
		}
		return false
	})
	victim.kill()
	counts := s.classify(<-done)
	report(t, "tool worker killed under load", n, counts)
	if counts[outcomeOK]+counts[outcomeResolved] != n {
		t.Fatalf("%v", counts)
	}
	rerun := 0
	for _, req := range reqs {
		id := req["request_id"].(string)
		if tries := len(s.recorder.tries(id + "/a")); tries > 1 {
			rerun++
		}
		if c := s.countRecorded(id, protocol.TypeToolResult); c != 2 {
			t.Errorf("%s: %d results recorded, want 2", id, c)
		}
	}
	t.Logf("calls run again after the kill: %d", rerun)
}

// TestQueuedCallsRunOnce: more slow calls than a worker has slots, each taking longer than the
// ack deadline. Calls waiting for a slot are not pulled (so their deadline does not run out
// unseen), and none runs twice.
func TestQueuedCallsRunOnce(t *testing.T) {
	long(t, "slow calls queued past the ack deadline")
	s := start(t, options{bus: bus.Config{AckWait: time.Second}})
	s.addWorkerWith(app.WorkerConfig{Instance: "small-worker", Concurrency: 2})
	resp := s.route(request("queued", "",
		call("a", "record", map[string]any{"delay_ms": 2500}),
		call("b", "record", map[string]any{"delay_ms": 2500}),
		call("c", "record", map[string]any{"delay_ms": 2500})))
	if resp.Status != protocol.StatusSuccess {
		t.Fatalf("response %+v", resp)
	}
	for _, id := range []string{"a", "b", "c"} {
		if n := len(s.recorder.tries("queued/" + id)); n != 1 {
			t.Errorf("call %s ran %d times, want once", id, n)
		}
		if r := result(t, resp, id); r.Attempts != 1 {
			t.Errorf("call %s reports %d attempts, want 1", id, r.Attempts)
		}
	}
}

// TestResponseLargerThanABusMessage: results that fit one by one but not together; the
// response still arrives, with the largest content replaced by a RESULT_TOO_LARGE error.
func TestResponseLargerThanABusMessage(t *testing.T) {
	t.Parallel()
	s := start(t, options{})
	s.addWorkerWith(app.WorkerConfig{Instance: "big-worker", MaxResultBytes: 12 << 20})
	resp := s.route(request("big_resp", "",
		call("a", "record", map[string]any{"pad_bytes": 5 << 20}),
		call("b", "record", map[string]any{"pad_bytes": 4 << 20}),
		call("c", "echo", map[string]any{"small": true})))
	a, b, c := result(t, resp, "a"), result(t, resp, "b"), result(t, resp, "c")
	if a.Status != protocol.ResultError || a.ErrorCode != protocol.CodeResultTooLarge {
		t.Errorf("largest result: %s %s", a.Status, a.ErrorCode)
	}
	if b.Status != protocol.ResultOK || len(b.Content) < 4<<20 || c.Status != protocol.ResultOK {
		t.Errorf("other results: %s (%d bytes) and %s", b.Status, len(b.Content), c.Status)
	}
	if resp.Status != protocol.StatusPartialSuccess {
		t.Errorf("status %s", resp.Status)
	}
	// One result alone larger than a bus message (but within the worker's own limit) becomes
	// RESULT_TOO_LARGE when the worker records it, and the call is not run again.
	resp = s.route(request("big_result", "", call("a", "record", map[string]any{"pad_bytes": 9 << 20})))
	if r := result(t, resp, "a"); r.ErrorCode != protocol.CodeResultTooLarge {
		t.Errorf("oversized result: %+v", r)
	}
	if n := len(s.recorder.tries("big_result/a")); n != 1 {
		t.Errorf("the oversized call ran %d times, want once", n)
	}
}

// TestReusedRequestIDAfterTheDuplicateWindow: a different request published under a finished
// request's id, past the stream's duplicate window (simulated with a new message id), runs
// nothing: the router recognises the other content and ignores it.
func TestReusedRequestIDAfterTheDuplicateWindow(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	s.route(request("reused", "", call("c", "record", map[string]any{"v": 1})))
	other, _ := protocol.NewMessage(protocol.TypeRequest, &protocol.Request{RequestID: "reused",
		ToolCalls: []protocol.ToolCall{{ToolCallID: "d", Name: "record", Arguments: []byte(`{"v":2}`)}}})
	other.MsgID, other.RequestID, other.SessionID = "request:reused:later", "reused", "reused"
	pub := bus.NewPublisher(s.js, protocol.Sender{Role: protocol.RoleClient, Instance: "test"})
	if _, err := pub.Publish(context.Background(), protocol.SubjectRequest("reused"), other); err != nil {
		t.Fatal(err)
	}
	s.drain()
	if n := len(s.recorder.tries("reused/d")); n != 0 {
		t.Fatalf("the other request's call ran %d times", n)
	}
	if n := s.countRecorded("reused", protocol.TypeToolCall); n != 1 {
		t.Fatalf("%d calls dispatched under the id, want 1", n)
	}
}
