package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/record"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/ledger"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// deleteRequest sends DELETE /v1/requests/{id} (query appended) and returns status, headers and body.
func (s *system) deleteRequest(id, query string) (int, http.Header, []byte) {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodDelete, s.base+"/v1/requests/"+id+query, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, body
}

// transcript formats the record of session as hermes replay prints it, for the test's log.
func (s *system) transcript(session string) string {
	s.t.Helper()
	var b strings.Builder
	f := &record.Formatter{Location: time.UTC}
	for _, raw := range s.stored() {
		if !strings.HasSuffix(raw.Subject, "."+session) {
			continue
		}
		b.WriteString(f.Format(record.Decode(raw.Sequence, raw.Subject, raw.Time, raw.Data)))
		b.WriteByte('\n')
	}
	return b.String()
}

// TestCancelRequest: a request of three calls — one finished, one running, one waiting for a
// worker slot — is cancelled over HTTP. The running call's tool sees its request aborted, the
// waiting one never starts, the response is recorded once with CANCELLED for the two that did
// not finish and says who cancelled, and the record has the cancellation. Cancelling again
// answers the same; cancelling a finished request is a 409; an unknown one a 404.
func TestCancelRequest(t *testing.T) {
	t.Parallel()
	s := start(t, options{bus: bus.Config{AckWait: 2 * time.Second}})
	s.addWorkerWith(app.WorkerConfig{Instance: "worker-1", Concurrency: 1}) // one slot per tool
	req := map[string]any{"request_id": "cx_1", "session_id": "cx_sess", "intent": "cancel me",
		"tool_calls": []map[string]any{
			call("fast", "echo", map[string]any{"n": 1}),
			call("slow_1", "record", map[string]any{"delay_ms": 60_000}),
			call("slow_2", "record", map[string]any{"delay_ms": 60_000}),
		}}
	posted := s.postAsync(req, "?timeout=2m")
	waitFor(t, "one slow call to run", func() bool {
		return len(s.recorder.tries("cx_1/slow_1"))+len(s.recorder.tries("cx_1/slow_2")) == 1
	})
	running, queued := "slow_1", "slow_2"
	if len(s.recorder.tries("cx_1/slow_2")) == 1 {
		running, queued = queued, running
	}
	waitFor(t, "the fast call's result", func() bool { return s.countRecorded("cx_1", protocol.TypeToolResult) == 1 })

	status, hdr, body := s.deleteRequest("cx_1", "?reason=user+pressed+stop")
	t.Logf("DELETE /v1/requests/cx_1?reason=user+pressed+stop -> HTTP %d\n%s", status, indent(body))
	if status != http.StatusOK || hdr.Get("X-Hermes-Replayed") != "" {
		t.Fatalf("cancel: HTTP %d %v: %s", status, hdr, body)
	}
	resp := decodeResponse(t, body)
	if resp.Status != protocol.StatusPartialSuccess || resp.Error == nil || resp.Error.Code != protocol.CodeCancelled ||
		!strings.Contains(resp.Error.Message, "cancelled by http 127.0.0.1:") || !strings.Contains(resp.Error.Message, "user pressed stop") {
		t.Fatalf("response %+v error %+v", resp, resp.Error)
	}
	if r := result(t, resp, "fast"); r.Status != protocol.ResultOK {
		t.Errorf("the finished call: %+v", r)
	}
	for _, id := range []string{running, queued} {
		r := result(t, resp, id)
		if r.Status != protocol.ResultError || r.ErrorCode != protocol.CodeCancelled || r.ErrorOrigin != protocol.OriginHermes || r.Name != "record" {
			t.Errorf("%s: %+v", id, r)
		}
	}
	// The client still waiting on POST gets the same response.
	a := <-posted
	if a.status != http.StatusOK || !bytes.Equal(bytes.TrimSpace(a.body), bytes.TrimSpace(body)) {
		t.Errorf("the waiting POST got HTTP %d: %s", a.status, a.body)
	}
	// The running call's tool saw its request aborted; the queued one never started, also
	// once the worker's slot was free and it settled the queued call's message for good.
	waitFor(t, "the running call's HTTP request to be aborted", func() bool { return s.recorder.abortedTries("cx_1/"+running) == 1 })
	s.waitToolSettled(protocol.ActionHTTP, "record")
	if n := len(s.recorder.tries("cx_1/" + queued)); n != 0 {
		t.Errorf("the queued call started %d times after the cancellation", n)
	}
	if n := len(s.recorder.tries("cx_1/" + running)); n != 1 {
		t.Errorf("the running call was tried %d times", n)
	}
	// The record: who cancelled, one response, a CANCELLED result per unfinished call.
	waitFor(t, "the cancelled results on the record", func() bool { return s.countRecorded("cx_1", protocol.TypeToolResult) == 3 })
	for typ, want := range map[protocol.Type]int{protocol.TypeCancel: 1, protocol.TypeResponse: 1, protocol.TypeToolResult: 3} {
		if n := s.countRecorded("cx_1", typ); n != want {
			t.Errorf("%s recorded %d times, want %d", typ, n, want)
		}
	}
	for _, m := range s.record() {
		if m.Type == protocol.TypeCancel {
			c, err := m.DecodeCancel()
			if err != nil || !strings.HasPrefix(c.By, "http 127.0.0.1:") || c.Reason != "user pressed stop" || m.Sender.Role != protocol.RoleGateway {
				t.Errorf("cancel message %+v: %+v %v", m, c, err)
			}
		}
	}
	t.Logf("hermes replay --session cx_sess:\n%s", s.transcript("cx_sess"))

	// Cancelling again answers the same response, marked replayed.
	status, hdr, again := s.deleteRequest("cx_1", "")
	if status != http.StatusOK || hdr.Get("X-Hermes-Replayed") != "true" || !bytes.Equal(again, body) {
		t.Errorf("second cancel: HTTP %d %v: %s", status, hdr.Get("X-Hermes-Replayed"), again)
	}
	// GET shows the cancelled response.
	if got, err := http.Get(s.base + "/v1/requests/cx_1"); err != nil || got.StatusCode != http.StatusOK {
		t.Errorf("GET after cancel: %v %v", got, err)
	} else {
		got.Body.Close()
	}
	// A finished request cannot be cancelled.
	s.route(request("cx_done", "", call("c", "echo", map[string]any{})))
	status, _, conflict := s.deleteRequest("cx_done", "")
	t.Logf("DELETE /v1/requests/cx_done -> HTTP %d %s", status, bytes.TrimSpace(conflict))
	if status != http.StatusConflict || !strings.Contains(string(conflict), protocol.CodeAlreadyFinished) {
		t.Errorf("cancel of a finished request: HTTP %d: %s", status, conflict)
	}
	if status, _, nf := s.deleteRequest("cx_nobody", ""); status != http.StatusNotFound {
		t.Errorf("cancel of an unknown request: HTTP %d: %s", status, nf)
	}
	if status, _, bad := s.deleteRequest("cx.*", ""); status != http.StatusBadRequest {
		t.Errorf("cancel of a bad id: HTTP %d: %s", status, bad)
	}
	if status, _, bad := s.deleteRequest("cx_1", "?reason="+strings.Repeat("x", 300)); status != http.StatusBadRequest || !strings.Contains(string(bad), `"field":"reason"`) {
		t.Errorf("cancel with a reason too long: HTTP %d: %s", status, bad)
	}
}

// TestCancelBeforeAnyRouter: a request still queued (no router runs) is cancelled; when a
// router comes, none of its calls runs: the router reads nothing on a request's first delivery
// and dispatches them, and workers find them cancelled in the call ledger.
func TestCancelBeforeAnyRouter(t *testing.T) {
	variant(t, "internal/submit's TestCancel (a request no router took: its calls marked cancelled in the ledger, answered) and pkg/worker's TestWorkerHonoursCancellation (a cancelled call is not started); TestCancelRequest end to end")
	t.Parallel()
	s := start(t, options{routers: -1, workers: 1})
	queued := request("cq_1", "", call("a", "record", map[string]any{}))
	queued["session_id"] = "cq_sess"
	if status, _, body := s.post(queued, "?timeout=1s"); status != http.StatusGatewayTimeout {
		t.Fatalf("POST: HTTP %d: %s", status, body)
	}
	status, _, body := s.deleteRequest("cq_1", "")
	if status != http.StatusOK {
		t.Fatalf("cancel: HTTP %d: %s", status, body)
	}
	if r := result(t, decodeResponse(t, body), "a"); r.ErrorCode != protocol.CodeCancelled {
		t.Fatalf("result %+v", r)
	}
	s.addRouter("late-router")
	// The request reaches the router before a later request of the same session (one
	// partition, in order); its call reaches a worker, which does not start it.
	after := request("cq_after", "", call("c", "echo", map[string]any{}))
	after["session_id"] = "cq_sess"
	s.route(after)
	waitFor(t, "the cancelled call dispatched", func() bool { return s.countRecorded("cq_1", protocol.TypeToolCall) == 1 })
	s.waitToolSettled(protocol.ActionHTTP, "record")
	if n := s.countRecorded("cq_1", protocol.TypeToolStarted); n != 0 {
		t.Errorf("%d tries of a cancelled request's call started", n)
	}
	if n := s.countRecorded("cq_1", protocol.TypeToolResult); n != 1 {
		t.Errorf("%d results recorded for the cancelled call, want its CANCELLED one", n)
	}
	if n := len(s.recorder.tries("cq_1/a")); n != 0 {
		t.Errorf("the cancelled call ran %d times", n)
	}
	if n := s.countRecorded("cq_1", protocol.TypeResponse); n != 1 {
		t.Errorf("%d responses recorded", n)
	}
}

// TestCancelASerialRequest: cancelling a running serial request lets the session's next one
// go; a parked serial request cancelled while it waits never runs, and the one after it is not
// held up by it.
func TestCancelASerialRequest(t *testing.T) {
	variant(t, "internal/router's TestSerialStageRedeliveriesAndPredecessorsThatNeverRan (a predecessor answered without running is stepped over) and internal/answer's TestRespondOnceAndWakeTheNext; TestCancelRequest and TestSerialRequestsRunOneAtATime end to end")
	t.Parallel()
	s := start(t, options{workers: 1})
	serial := serialRecord("cs_sess")
	first := s.postAsync(serial("cs_1", map[string]any{"delay_ms": 60_000}), "?timeout=2m")
	waitFor(t, "the first serial request to run", func() bool { return len(s.recorder.tries("cs_1/c")) == 1 })
	second := s.postAsync(serial("cs_2", map[string]any{}), "?timeout=2m")
	third := s.postAsync(serial("cs_3", map[string]any{}), "?timeout=2m")
	waitFor(t, "the later two to be parked", func() bool { return s.countRecorded("cs_3", protocol.TypeRequest) >= 1 })
	time.Sleep(300 * time.Millisecond)
	if status, _, body := s.deleteRequest("cs_2", ""); status != http.StatusOK {
		t.Fatalf("cancel the parked one: HTTP %d: %s", status, body)
	}
	if status, _, body := s.deleteRequest("cs_1", ""); status != http.StatusOK {
		t.Fatalf("cancel the running one: HTTP %d: %s", status, body)
	}
	for name, ch := range map[string]<-chan answer{"cs_1": first, "cs_2": second} {
		a := <-ch
		if r := result(t, decodeResponse(t, a.body), "c"); r.ErrorCode != protocol.CodeCancelled {
			t.Errorf("%s: %+v", name, r)
		}
	}
	a := <-third
	if r := result(t, decodeResponse(t, a.body), "c"); r.Status != protocol.ResultOK {
		t.Fatalf("the third serial request after the cancelled two: HTTP %d %+v", a.status, r)
	}
	if n := len(s.recorder.tries("cs_2/c")); n != 0 {
		t.Errorf("the cancelled parked request ran %d times", n)
	}
}

// TestCancelFromTheCommandLine: hermes cancel, through a gateway and straight on the bus.
func TestCancelFromTheCommandLine(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	for i, via := range [][]string{{"--url", ""}, {"--nats", ""}} {
		id := []string{"cli_http", "cli_nats"}[i]
		got := s.postAsync(request(id, "", call("c", "record", map[string]any{"delay_ms": 60_000})), "?timeout=2m")
		waitFor(t, id+" to run", func() bool { return len(s.recorder.tries(id+"/c")) == 1 })
		via[1] = s.base
		if via[0] == "--nats" {
			via[1] = s.srv.URL
		}
		var out, errOut bytes.Buffer
		code := app.Exec(app.RunCancel, []string{via[0], via[1], "--reason", "from the cli", id}, app.Env{Stdout: &out, Stderr: &errOut})
		if code != 0 {
			t.Fatalf("hermes cancel %s: exit %d: %s %s", via[0], code, errOut.String(), out.String())
		}
		var resp protocol.Response
		if err := json.Unmarshal(out.Bytes(), &resp); err != nil || resp.Error == nil || resp.Error.Code != protocol.CodeCancelled {
			t.Fatalf("hermes cancel %s printed %s (%v)", via[0], out.String(), err)
		}
		if via[0] == "--nats" && !strings.Contains(resp.Error.Message, "cancelled by cli ") {
			t.Errorf("on the bus, the record names %q", resp.Error.Message)
		}
		<-got
		// Again: it had finished (cancelled): exit 0, the same response.
		out.Reset()
		if code := app.Exec(app.RunCancel, []string{via[0], via[1], id}, app.Env{Stdout: &out, Stderr: &errOut}); code != 0 {
			t.Errorf("second hermes cancel %s: exit %d", via[0], code)
		}
	}
	s.route(request("cli_done", "", call("c", "echo", map[string]any{})))
	var out, errOut bytes.Buffer
	if code := app.Exec(app.RunCancel, []string{"--url", s.base, "cli_done"}, app.Env{Stdout: &out, Stderr: &errOut}); code != 1 {
		t.Errorf("hermes cancel of a finished request: exit %d, want 1", code)
	}
	if code := app.Exec(app.RunCancel, []string{"--url", s.base, "cli_nobody"}, app.Env{Stdout: &out, Stderr: &errOut}); code != 2 {
		t.Errorf("hermes cancel of an unknown request: exit %d, want 2", code)
	}
	if code := app.Exec(app.RunCancel, []string{"a.b"}, app.Env{Stdout: &out, Stderr: &errOut}); code != 2 || !strings.Contains(errOut.String(), "request_id") {
		t.Errorf("hermes cancel of a bad id: exit %d: %s", code, errOut.String())
	}
}

func indent(b []byte) string {
	var out bytes.Buffer
	if json.Indent(&out, b, "  ", "  ") != nil {
		return string(b)
	}
	return "  " + out.String()
}

// TestCancellingTheMiddleSerialRequestKeepsOneAtATime: of three serial requests — the first
// running, two waiting — the middle one is cancelled. The third waits for the first, not for
// the cancelled one: the session's serial requests still never run at the same time.
func TestCancellingTheMiddleSerialRequestKeepsOneAtATime(t *testing.T) {
	variant(t, "internal/router's TestSerialStageRedeliveriesAndPredecessorsThatNeverRan and TestSerialRecheckStepsOverAPredecessorCancelledMeanwhile (the successor of a cancelled one waits for the one still running); TestCancelRequest and TestSerialRequestsRunOneAtATime end to end")
	t.Parallel()
	s := start(t, options{workers: 1})
	serial := serialRecord("mid_sess")
	first := s.postAsync(serial("mid_1", map[string]any{"delay_ms": 2500}), "?timeout=1m")
	waitFor(t, "the first to run", func() bool { return len(s.recorder.tries("mid_1/c")) == 1 })
	second := s.postAsync(serial("mid_2", map[string]any{}), "?timeout=1m")
	waitFor(t, "the second to wait", func() bool { return s.countRecorded("mid_2", protocol.TypeRequest) >= 1 })
	third := s.postAsync(serial("mid_3", map[string]any{}), "?timeout=1m")
	waitFor(t, "the third to wait", func() bool { return s.countRecorded("mid_3", protocol.TypeRequest) >= 1 })
	time.Sleep(300 * time.Millisecond) // both parked
	if status, _, body := s.deleteRequest("mid_2", ""); status != http.StatusOK {
		t.Fatalf("cancel the middle one: HTTP %d: %s", status, body)
	}
	<-second
	time.Sleep(500 * time.Millisecond)
	if n := len(s.recorder.tries("mid_3/c")); n != 0 {
		t.Fatalf("the third serial request ran while the first still ran (%d tries)", n)
	}
	for _, ch := range []<-chan answer{first, third} {
		if a := <-ch; a.status != http.StatusOK || decodeResponse(t, a.body).Status != protocol.StatusSuccess {
			t.Fatalf("HTTP %d: %s", a.status, a.body)
		}
	}
	var firstAnswered, thirdStarted time.Time
	for _, raw := range s.stored() {
		m, err := protocol.Unmarshal(raw.Data)
		if err != nil {
			continue
		}
		switch {
		case m.RequestID == "mid_1" && m.Type == protocol.TypeResponse:
			firstAnswered = raw.Time
		case m.RequestID == "mid_3" && m.Type == protocol.TypeToolStarted:
			thirdStarted = raw.Time
		}
	}
	if thirdStarted.Before(firstAnswered) {
		t.Errorf("the third started at %v, before the first was answered at %v", thirdStarted, firstAnswered)
	}
	if n := len(s.recorder.tries("mid_2/c")); n != 0 {
		t.Errorf("the cancelled one ran %d times", n)
	}
}

// TestCancellingTwoWaitingSerialRequests: of four serial requests — the first running, three
// waiting — the second and then the third are cancelled. The fourth still waits for the first:
// the third, by the time it was cancelled, waited for the first (its own predecessor answered
// without running), and a request answered without running is stepped over, not counted.
func TestCancellingTwoWaitingSerialRequests(t *testing.T) {
	variant(t, "internal/router's TestSerialStageRedeliveriesAndPredecessorsThatNeverRan and TestSerialStageStepsOverMoreThanOneDeliveryFollows (predecessors answered without running are stepped over, however many); TestCancelRequest and TestSerialRequestsRunOneAtATime end to end")
	t.Parallel()
	s := start(t, options{workers: 2})
	serial := serialRecord("two_sess")
	first := s.postAsync(serial("two_1", map[string]any{"delay_ms": 3000}), "?timeout=1m")
	waitFor(t, "the first to run", func() bool { return len(s.recorder.tries("two_1/c")) == 1 })
	var waiting []<-chan answer
	for _, id := range []string{"two_2", "two_3", "two_4"} {
		waiting = append(waiting, s.postAsync(serial(id, map[string]any{}), "?timeout=1m"))
		waitFor(t, id+" to wait", func() bool { return s.countRecorded(id, protocol.TypeRequest) >= 1 })
	}
	time.Sleep(300 * time.Millisecond) // all parked
	for _, id := range []string{"two_2", "two_3"} {
		if status, _, body := s.deleteRequest(id, ""); status != http.StatusOK {
			t.Fatalf("cancel %s: HTTP %d: %s", id, status, body)
		}
		time.Sleep(300 * time.Millisecond) // its successor woken and parked again
	}
	if n := len(s.recorder.tries("two_4/c")); n != 0 {
		t.Fatalf("the fourth serial request ran while the first still ran (%d tries)", n)
	}
	if a := <-first; a.status != http.StatusOK {
		t.Fatalf("the first: HTTP %d: %s", a.status, a.body)
	}
	for i, ch := range waiting {
		a := <-ch
		want := protocol.StatusSuccess
		if i < 2 {
			want = protocol.StatusFailed
		}
		if got := decodeResponse(t, a.body).Status; got != want {
			t.Errorf("two_%d: %s, want %s: %s", i+2, got, want, a.body)
		}
	}
	if n := len(s.recorder.tries("two_4/c")); n != 1 {
		t.Errorf("the fourth ran %d times, want once", n)
	}
}

// TestACancellationThatStoppedHalfWayIsFinished: the canceller of a queued request stops
// after recording its CANCELLED results and before the response (a crash); a router answers
// it from them. (Before: every call Done, nothing to aggregate, no answer.)
func TestACancellationThatStoppedHalfWayIsFinished(t *testing.T) {
	variant(t, "internal/router's TestARequestWithEveryResultIsAnsweredFromThem (a request whose every result is recorded is answered from them)")
	t.Parallel()
	s := start(t, options{routers: -1, workers: 1})
	queued := request("half_1", "", call("a", "record", map[string]any{}))
	queued["session_id"] = "half_sess"
	if status, _, body := s.post(queued, "?timeout=1s"); status != http.StatusGatewayTimeout {
		t.Fatalf("POST: HTTP %d: %s", status, body)
	}
	ctx := context.Background()
	_, b := s.connect()
	if _, _, err := b.CreatePlan(ctx, "half_1", &bus.Plan{SessionID: "half_sess", CallIDs: []string{"a"}, Names: []string{"record"},
		RequestMsg: protocol.MsgIDRequest("half_1"), Cancelled: true}); err != nil {
		t.Fatal(err)
	}
	if err := ledger.Cancel(ctx, b.Claims, ledger.Key("half_1", "a")); err != nil {
		t.Fatal(err)
	}
	res := protocol.CancelledResult(&protocol.ToolCall{ToolCallID: "a", Name: "record"}, "", 0, "someone")
	m, _ := protocol.NewMessage(protocol.TypeToolResult, &res)
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDToolResult("half_1", "a"), "half_1", "half_sess"
	m.Correlation = &protocol.Correlation{CallIDs: []string{"a"}}
	if _, _, err := b.RecordResult(ctx, bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleGateway, Instance: "crashed"}), m, &res); err != nil {
		t.Fatal(err)
	}
	s.addRouter("late-router")
	waitFor(t, "half_1 answered", func() bool { ok, _ := b.Answered(ctx, "half_1", "half_sess"); return ok })
	if n := len(s.recorder.tries("half_1/a")); n != 0 {
		t.Errorf("the cancelled call ran %d times", n)
	}
}

// TestACancellationThatStoppedBeforeWakingIsFinished: the canceller of a parked serial request
// stops after recording the response and before waking the session's next serial request;
// the client retries the cancellation, as told, and the next one runs.
func TestACancellationThatStoppedBeforeWakingIsFinished(t *testing.T) {
	variant(t, "internal/submit's TestCancellingAnAnsweredRequestWakesItsSuccessor (cancelling again wakes the next serial request)")
	t.Parallel()
	s := start(t, options{workers: 1})
	serial := serialRecord("wake_sess")
	first := s.postAsync(serial("wake_1", map[string]any{"delay_ms": 1500}), "?timeout=1m")
	waitFor(t, "the first to run", func() bool { return len(s.recorder.tries("wake_1/c")) == 1 })
	_ = s.postAsync(serial("wake_2", map[string]any{}), "?timeout=1s")
	waitFor(t, "wake_2 accepted", func() bool { return s.countRecorded("wake_2", protocol.TypeRequest) >= 1 })
	time.Sleep(200 * time.Millisecond)
	third := s.postAsync(serial("wake_3", map[string]any{}), "?timeout=30s")
	waitFor(t, "wake_3 accepted", func() bool { return s.countRecorded("wake_3", protocol.TypeRequest) >= 1 })
	time.Sleep(300 * time.Millisecond)
	ctx := context.Background()
	_, b := s.connect()
	pub := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleGateway, Instance: "crashed"})
	// Submitter.Cancel of wake_2 up to recording the response; then the crash.
	if _, _, err := b.CreatePlan(ctx, "wake_2", &bus.Plan{SessionID: "wake_sess", CallIDs: []string{"c"}, Names: []string{"record"},
		RequestMsg: protocol.MsgIDRequest("wake_2"), Serial: true, Cancelled: true}); err != nil {
		t.Fatal(err)
	}
	_ = ledger.Cancel(ctx, b.Claims, ledger.Key("wake_2", "c"))
	res := protocol.CancelledResult(&protocol.ToolCall{ToolCallID: "c", Name: "record"}, "", 0, "someone")
	rm, _ := protocol.NewMessage(protocol.TypeToolResult, &res)
	rm.MsgID, rm.RequestID, rm.SessionID = protocol.MsgIDToolResult("wake_2", "c"), "wake_2", "wake_sess"
	if _, _, err := b.RecordResult(ctx, pub, rm, &res); err != nil {
		t.Fatal(err)
	}
	resp := &protocol.Response{RequestID: "wake_2", SessionID: "wake_sess", Status: protocol.ResponseStatus([]protocol.ToolResult{res}),
		Results: []protocol.ToolResult{res}, Error: &protocol.ResponseError{Code: protocol.CodeCancelled, Message: "cancelled by someone"}}
	out, _ := protocol.NewMessage(protocol.TypeResponse, resp)
	out.MsgID, out.RequestID, out.SessionID = protocol.MsgIDResponse("wake_2"), "wake_2", "wake_sess"
	if _, err := b.Respond(ctx, pub, out); err != nil {
		t.Fatal(err)
	}
	if status, _, body := s.deleteRequest("wake_2", ""); status != http.StatusOK {
		t.Fatalf("retried cancel: HTTP %d %s", status, body)
	}
	<-first
	if a := <-third; a.status != http.StatusOK {
		t.Fatalf("wake_3 never ran: HTTP %d %s", a.status, a.body)
	}
}

// waitToolSettled waits until workers have settled every call of tool's consumer (of kind):
// none waits to be delivered, none awaits its acknowledgement, so none is delivered again.
func (s *system) waitToolSettled(kind, tool string) {
	s.t.Helper()
	waitFor(s.t, "the workers to have settled every call of "+tool, func() bool {
		cons, err := s.js.Consumer(s.ctx, protocol.StreamName, bus.ToolConsumer(kind, tool))
		if err != nil {
			return false
		}
		info, err := cons.Info(s.ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
}

// serialRecord returns a builder of serial requests of session, each one call "c" of the
// record tool with args.
func serialRecord(session string) func(id string, args map[string]any) map[string]any {
	return func(id string, args map[string]any) map[string]any {
		r := request(id, "", call("c", "record", args))
		r["session_id"], r["serial"] = session, true
		return r
	}
}
