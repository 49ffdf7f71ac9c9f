package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
)

// fastCounts sums what the system's routers answered and declined on the fast lane.
func (s *system) fastCounts() (answered, declined int64) {
	for _, r := range s.routers {
		if l := r.Lane(); l != nil {
			a, d := l.Counts()
			answered, declined = answered+a, declined+d
		}
	}
	return answered, declined
}

// recordOf returns the subjects of the record's messages of requestID, by type.
func (s *system) recordOf(requestID string) map[protocol.Type][]string {
	out := map[protocol.Type][]string{}
	for _, raw := range s.stored() {
		m, err := protocol.Unmarshal(raw.Data)
		if err != nil || m.RequestID != requestID {
			continue
		}
		out[m.Type] = append(out[m.Type], raw.Subject)
	}
	return out
}

// recordedOf waits until the record holds requestID's response.
func (s *system) recordedOf(requestID string) map[protocol.Type][]string {
	s.t.Helper()
	var got map[protocol.Type][]string
	waitFor(s.t, requestID+"'s response on the record", func() bool {
		got = s.recordOf(requestID)
		return len(got[protocol.TypeResponse]) > 0
	})
	return got
}

// waitWritten waits until every router's fast lane has written what it answered.
func (s *system) waitWritten() {
	s.t.Helper()
	waitFor(s.t, "the fast lane's record written", func() bool {
		for _, r := range s.routers {
			if l := r.Lane(); l != nil && l.Writer().Waiting() > 0 {
				return false
			}
		}
		return true
	})
}

// waitFastLane waits until a worker serves the fast lane (NATS micro discovery finds one).
func (s *system) waitFastLane() {
	s.t.Helper()
	nc, _ := s.connect()
	waitFor(s.t, "a worker to serve the fast lane", func() bool {
		_, err := nc.Request("$SRV.PING."+worker.FastService, nil, 200*time.Millisecond)
		return err == nil
	})
}

// TestFastLaneAnswersReadsAndRecordsThem: a request whose calls only read is answered on the
// fast lane — each call run once by a worker over request/reply, nothing dispatched on the
// bus — and its whole record follows: the request, each call, its start, each result and the
// response, once each. A call that changes something, or a serial request, takes the durable path.
func TestFastLaneAnswersReadsAndRecordsThem(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	resp := s.route(request("fl_read", "", call("a", "read_echo", map[string]any{"q": 1}), call("b", "read_record", map[string]any{"q": 2})))
	if resp.Status != protocol.StatusSuccess || result(t, resp, "a").Attempts != 1 || string(result(t, resp, "a").Content) != `{"q":1}` {
		t.Fatalf("response %+v", resp)
	}
	if answered, declined := s.fastCounts(); answered != 1 || declined != 0 {
		t.Fatalf("the fast lane answered %d and declined %d requests, want 1 and 0", answered, declined)
	}
	if n := len(s.recorder.tries("fl_read/b")); n != 1 {
		t.Errorf("the tool saw %d tries, want 1", n)
	}
	rec := s.recordedOf("fl_read")
	want := map[protocol.Type][]string{
		protocol.TypeRequest:     {"hermes.request.fast.fl_read"},
		protocol.TypeToolCall:    {"hermes.event.fast_call.fl_read", "hermes.event.fast_call.fl_read"},
		protocol.TypeToolStarted: {"hermes.event.tool_started.fl_read", "hermes.event.tool_started.fl_read"},
		protocol.TypeToolResult:  {"hermes.result.fl_read:a.fl_read", "hermes.result.fl_read:b.fl_read"},
		protocol.TypeResponse:    {"hermes.response.fl_read.fl_read"},
	}
	for typ, subjects := range want {
		got := strings.Join(rec[typ], " ")
		if len(rec[typ]) != len(subjects) || !strings.Contains(" "+strings.Join(subjects, " ")+" ", " "+rec[typ][0]+" ") {
			t.Errorf("%s recorded on %q, want %q", typ, got, subjects)
		}
	}
	if len(rec) != len(want) {
		t.Errorf("recorded %v, want only %v", rec, want)
	}

	// The durable path: a call that changes something, a serial request.
	s.route(request("fl_write", "", call("a", "read_echo", map[string]any{}), call("b", "record", map[string]any{})))
	serial := request("fl_serial", "", call("a", "read_echo", map[string]any{}))
	serial["serial"] = true
	s.route(serial)
	for _, id := range []string{"fl_write", "fl_serial"} {
		rec := s.recordedOf(id)
		if len(rec[protocol.TypeToolCall]) == 0 || !strings.HasPrefix(rec[protocol.TypeToolCall][0], "hermes.tool_http.") {
			t.Errorf("%s: calls recorded on %v, want the durable path's subjects", id, rec[protocol.TypeToolCall])
		}
		if !strings.HasPrefix(rec[protocol.TypeRequest][0], "hermes.request.") || strings.HasPrefix(rec[protocol.TypeRequest][0], "hermes.request.fast.") {
			t.Errorf("%s: request recorded on %v", id, rec[protocol.TypeRequest])
		}
	}
	if answered, _ := s.fastCounts(); answered != 1 {
		t.Errorf("the fast lane answered %d requests, want still 1", answered)
	}

	// The same request again gets the first response, not another run; another request under
	// the id is refused.
	again := s.route(request("fl_read", "", call("a", "read_echo", map[string]any{"q": 1}), call("b", "read_record", map[string]any{"q": 2})))
	if again.Status != protocol.StatusSuccess {
		t.Fatalf("again: %+v", again)
	}
	status, _, body := s.post(request("fl_read", "", call("a", "read_echo", map[string]any{"q": 9})), "")
	if status != http.StatusConflict {
		t.Errorf("another request under a used id: HTTP %d: %s", status, body)
	}
	if n := len(s.recorder.tries("fl_read/b")); n != 1 {
		t.Errorf("the tool saw %d tries after the request was sent again, want 1", n)
	}
	if rec := s.recordOf("fl_read"); len(rec[protocol.TypeResponse]) != 1 || len(rec[protocol.TypeToolResult]) != 2 {
		t.Errorf("after the request was sent again the record holds %v", rec)
	}
}

// TestFastLaneWorkerKilledMidCall: the only worker of a read-only tool, a separate process, is
// SIGKILLed while it runs a fast-lane call; the router gives up on it and the request takes the
// durable path, where another worker runs the call: one answer, one result, one response.
func TestFastLaneWorkerKilledMidCall(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 0})
	victim := s.spawn("toolworker", "fl-victim", append(s.workerArgs(), "--tools", "read_record")...)
	s.waitFastLane()
	got := s.postAsync(request("fl_kill", "", call("c", "read_record", map[string]any{"first_delay_ms": 60000})), "")
	waitFor(t, "the victim to start the call", func() bool { return len(s.recorder.tries("fl_kill/c")) == 1 })
	victim.kill()
	s.addWorker("fl-survivor")
	a := <-got
	if a.status != http.StatusOK {
		t.Fatalf("HTTP %d: %s", a.status, a.body)
	}
	if resp := decodeResponse(t, a.body); resp.Status != protocol.StatusSuccess {
		t.Fatalf("response %+v", resp)
	}
	if n := len(s.recorder.tries("fl_kill/c")); n != 2 {
		t.Errorf("the tool saw %d tries, want 2 (the killed one and the durable path's)", n)
	}
	rec := s.recordedOf("fl_kill")
	if len(rec[protocol.TypeToolResult]) != 1 || len(rec[protocol.TypeResponse]) != 1 {
		t.Errorf("recorded %v, want one result and one response", rec)
	}
	if _, declined := s.fastCounts(); declined != 1 {
		t.Errorf("the fast lane declined %d requests, want 1", declined)
	}
}

// TestFastLaneSlowWorker: a read-only call that takes longer than the router waits on the fast
// lane goes down the durable path; the worker running it still, which the durable path's call
// reaches, records the answer it gives instead of running it again.
func TestFastLaneSlowWorker(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	resp := s.route(request("fl_slow", "", call("c", "read_record", map[string]any{"first_delay_ms": 1800})))
	if resp.Status != protocol.StatusSuccess {
		t.Fatalf("response %+v", resp)
	}
	if n := len(s.recorder.tries("fl_slow/c")); n != 1 {
		t.Errorf("the tool saw %d tries, want 1", n)
	}
	rec := s.recordedOf("fl_slow")
	if len(rec[protocol.TypeToolResult]) != 1 || len(rec[protocol.TypeResponse]) != 1 {
		t.Errorf("recorded %v, want one result and one response", rec)
	}
	if answered, declined := s.fastCounts(); answered != 0 || declined != 1 {
		t.Errorf("the fast lane answered %d and declined %d, want 0 and 1", answered, declined)
	}
}

// TestFastLaneFullBuffer: with room for one answered request's record, requests beyond it take
// the durable path — none is answered without its record — and each call still runs once.
func TestFastLaneFullBuffer(t *testing.T) {
	t.Parallel()
	s := start(t, options{routers: -1, workers: 1})
	s.addRouterWith(app.RouterConfig{Instance: "fl-router", Fast: app.FastLaneConfig{Buffer: 1}})
	const n = 8
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.route(request(fmt.Sprintf("fl_full_%d", i), "", call("c", "read_record", map[string]any{"delay_ms": 300})))
		}()
	}
	wg.Wait()
	answered, declined := s.fastCounts()
	if answered < 1 || declined < 1 || answered+declined != n {
		t.Errorf("the fast lane answered %d and declined %d of %d requests; want both, and every request once", answered, declined, n)
	}
	for i := range n {
		id := fmt.Sprintf("fl_full_%d", i)
		if tries := len(s.recorder.tries(id + "/c")); tries != 1 {
			t.Errorf("%s: the tool saw %d tries, want 1", id, tries)
		}
		if rec := s.recordedOf(id); len(rec[protocol.TypeToolResult]) != 1 || len(rec[protocol.TypeResponse]) != 1 || len(rec[protocol.TypeRequest]) != 1 {
			t.Errorf("%s: recorded %v", id, rec)
		}
	}
}

// TestFastLaneWorkerAnswersTwice: a worker that answers a fast-lane call twice has its first
// answer taken, once: the caller gets it, and the record holds it alone.
func TestFastLaneWorkerAnswersTwice(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 0})
	nc, _ := s.connect()
	sub, err := nc.Subscribe(protocol.SubjectFastCall("http", "read_echo"), func(msg *nats.Msg) {
		m, err := protocol.Unmarshal(msg.Data)
		if err != nil {
			return
		}
		disp, err := m.DecodeDispatch()
		if err != nil {
			return
		}
		for i, content := range []string{`"first"`, `"second"`} {
			res := protocol.ToolResult{ToolCallID: disp.Call.ToolCallID, Name: disp.Call.Name, Route: disp.Route, Status: protocol.ResultOK,
				Content: json.RawMessage(content), Attempts: 1}
			out, _ := protocol.NewMessage(protocol.TypeToolResult, &res)
			out.Follow(m, protocol.MsgIDToolResult(m.RequestID, res.ToolCallID))
			out.Sender = protocol.Sender{Role: protocol.RoleToolWorker, Instance: fmt.Sprintf("twice-%d", i)}
			data, _ := protocol.Marshal(out)
			_ = msg.RespondMsg(&nats.Msg{Data: data, Header: nats.Header{bus.HeaderFast: []string{protocol.FastAnswered}}})
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	resp := s.route(request("fl_twice", "", call("c", "read_echo", map[string]any{})))
	if r := result(t, resp, "c"); string(r.Content) != `"first"` {
		t.Fatalf("result %+v, want the first answer", r)
	}
	rec := s.recordedOf("fl_twice")
	if len(rec[protocol.TypeToolResult]) != 1 || len(rec[protocol.TypeResponse]) != 1 {
		t.Errorf("recorded %v, want one result and one response", rec)
	}
	for _, m := range s.record() {
		if m.RequestID == "fl_twice" && m.Type == protocol.TypeToolResult && m.Sender.Instance != "twice-0" {
			t.Errorf("recorded the result %s sent, want the first answer's", m.Sender.Instance)
		}
	}
}

// TestFastLaneKeepsPolicies: the fast lane decides under the tools' policies as the durable path
// does: a rate limit refuses the call over it (answered and recorded as the durable path would),
// a role the policy does not allow is refused, and a call that needs an approval is never run on
// it — it is answered APPROVAL_REQUIRED, and once approved runs on the durable path.
func TestFastLaneKeepsPolicies(t *testing.T) {
	t.Parallel()
	s := start(t, options{callers: true, workers: 1})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser})
	s.applyPolicy("read_echo", `{"rate_limit":"1/h","scope":"tool","on_limit":"refuse"}`)
	if r := s.routeOne(keys["ann"], "fl-rate-1", "fl-rate", "read_echo", `{}`); r.Status != protocol.ResultOK {
		t.Fatalf("first call: %+v", r)
	}
	if r := s.routeOne(keys["ann"], "fl-rate-2", "fl-rate", "read_echo", `{}`); r.ErrorCode != protocol.CodeRateLimited || r.Policy == nil {
		t.Fatalf("second call: %+v, want RATE_LIMITED by the policy", r)
	}
	if answered, declined := s.fastCounts(); answered != 2 || declined != 0 {
		t.Errorf("the fast lane answered %d and declined %d, want 2 and 0", answered, declined)
	}
	if rec := s.recordedOf("fl-rate-2"); len(rec[protocol.TypeToolResult]) != 1 || rec[protocol.TypeRequest][0] != "hermes.request.fast.fl-rate" {
		t.Errorf("the refused call's record: %v", rec)
	}

	s.applyPolicy("read_echo", `{"allowed_roles":["admin"]}`)
	if r := s.routeOne(keys["ann"], "fl-role", "fl-rate", "read_echo", `{}`); r.Status == protocol.ResultOK {
		t.Fatalf("a role the policy does not allow: %+v", r)
	}

	s.applyPolicy("read_record", `{"confirm_required":true,"expires_in":"5m"}`)
	res := s.routeOne(keys["ann"], "fl-approve", "fl-approve", "read_record", `{"n":1}`)
	if res.ErrorCode != protocol.CodeApprovalRequired || res.Policy == nil || res.Policy.ApprovalID == "" {
		t.Fatalf("a call needing approval: %+v", res)
	}
	if n := len(s.recorder.tries("fl-approve/c1")); n != 0 {
		t.Errorf("the tool saw %d tries before the approval, want 0", n)
	}
	id := res.Policy.ApprovalID
	if code, body := s.call(http.MethodPost, "/v1/approvals/"+id+"/approve", keys["ann"], `{}`); code != http.StatusOK {
		t.Fatalf("approve: %d %s", code, body)
	}
	rec := s.recordedOf(id)
	if len(rec[protocol.TypeToolCall]) != 1 || !strings.HasPrefix(rec[protocol.TypeToolCall][0], "hermes.tool_http.read_record.") {
		t.Errorf("the approved call's record: %v, want it dispatched on the durable path", rec)
	}
}
