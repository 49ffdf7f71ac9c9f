package integration

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/internal/router"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// TestFastLaneRefusesAReusedIDWhileTheFirstRuns: a second request under a request_id whose first
// request still runs on the fast lane (another session, other arguments) is refused, 409, and
// never gets the first caller's result; the record keeps the first request's.
func TestFastLaneRefusesAReusedIDWhileTheFirstRuns(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	x := withSession(request("rv_conf", "", call("c", "read_record", map[string]any{"who": "alice", "delay_ms": 700})), "rv_alice")
	y := withSession(request("rv_conf", "", call("c", "read_record", map[string]any{"who": "mallory"})), "rv_mallory")
	ax := s.postAsync(x, "")
	waitFor(t, "alice's call to start", func() bool { return len(s.recorder.tries("rv_conf/c")) == 1 })
	status, _, body := s.post(y, "?timeout=5s")
	t.Logf("mallory (same request_id, other session, other arguments): HTTP %d %s", status, body)
	a := <-ax
	t.Logf("alice: HTTP %d %s", a.status, a.body)
	if status != http.StatusConflict {
		t.Errorf("another request under a used request_id: HTTP %d, want 409", status)
	}
	if strings.Contains(string(body), "alice") {
		t.Errorf("mallory got alice's result")
	}
	t.Logf("tool tries: %d", len(s.recorder.tries("rv_conf/c")))
	s.recordedOf("rv_conf")
	s.waitWritten()
	for _, m := range s.record() {
		if m.RequestID == "rv_conf" && m.Type == protocol.TypeToolResult && m.SessionID == "rv_mallory" {
			res, _ := m.DecodeToolResult()
			t.Logf("recorded in mallory's session: %s", res.Content)
			if strings.Contains(string(res.Content), "alice") {
				t.Errorf("alice's result is on the record of mallory's session")
			}
		}
	}
	for typ, subj := range s.recordOf("rv_conf") {
		t.Logf("record: %s %v", typ, subj)
	}
}

// TestFastLaneDoesNotRunAnAnsweredRequestAgain: a request answered on the durable path, sent
// again (a client retry), is answered from the record, its calls not run again.
func TestFastLaneDoesNotRunAnAnsweredRequestAgain(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	req := request("rv_rerun", "", call("c", "read_record", map[string]any{"q": 1}))
	s.gateway.FastLane().SetEnabled(false)
	s.route(req)
	s.recordedOf("rv_rerun")
	s.gateway.FastLane().SetEnabled(true)
	again := s.route(req)
	t.Logf("again: %s", again.Status)
	if n := len(s.recorder.tries("rv_rerun/c")); n != 1 {
		t.Errorf("the tool saw %d tries (same Idempotency-Key), want 1: the replayed request ran again", n)
	}
}

// TestFastLaneWorkerKnowsACallByMoreThanItsIDs: a worker answers again from memory only the same
// call — its ids, session and arguments: once the first request's plan is gone (its TTL;
// deleted here), a new request under the id, in another session, is run, not given the old
// answer.
func TestFastLaneWorkerKnowsACallByMoreThanItsIDs(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	s.route(withSession(request("rv_old", "", call("c", "read_record", map[string]any{"who": "alice"})), "rv_s1"))
	s.recordedOf("rv_old")
	_, b := s.connect()
	if err := b.Calls.Delete(context.Background(), protocol.KeyPlan("rv_old")); err != nil {
		t.Fatal(err)
	}
	resp := s.route(withSession(request("rv_old", "", call("c", "read_record", map[string]any{"who": "bob"})), "rv_s2"))
	got := string(result(t, resp, "c").Content)
	t.Logf("bob's result: %s (tool tries %d)", got, len(s.recorder.tries("rv_old/c")))
	if strings.Contains(got, "alice") {
		t.Errorf("bob's request was answered with alice's remembered result")
	}
}

// TestASessionOnBothLanesIsListedOnce: GET /v1/sessions lists a session with requests on both
// lanes (hermes.request.<p>.<s> and hermes.request.fast.<s>) once, with all its requests.
func TestASessionOnBothLanesIsListedOnce(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	s.route(withSession(request("rv_l1", "", call("c", "read_echo", map[string]any{})), "rv_sess"))
	s.route(withSession(request("rv_l2", "", call("c", "echo", map[string]any{})), "rv_sess"))
	s.recordedOf("rv_l1")
	s.recordedOf("rv_l2")
	got := s.sessions("")
	n := 0
	for _, x := range got.Sessions {
		if x.SessionID == "rv_sess" {
			n++
			t.Logf("row: %+v", x)
		}
	}
	if n != 1 {
		t.Errorf("rv_sess listed %d times, want 1", n)
	}
}

// TestAWorkerCannotAnswerTheGatewaysPublish: a worker answers the fast lane on its own reply
// subjects only: it cannot answer a message it receives with another's reply subject — the
// gateway's JetStream publish of a cancel event (its PubAck inbox), which every worker
// receives.
func TestAWorkerCannotAnswerTheGatewaysPublish(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	s.violating = true
	wc, _ := s.connectAs(bus.RoleWorker)
	if _, err := wc.Subscribe(protocol.FilterEvents(protocol.EventCancel), func(m *nats.Msg) {
		_ = m.Respond([]byte(`{"error":{"code":503,"err_code":10077,"description":"forged by a worker"}}`))
	}); err != nil {
		t.Fatal(err)
	}
	_ = wc.Flush()
	gc, _ := s.connectAs(bus.RoleGateway)
	inbox := gc.NewInbox()
	sub, err := gc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := gc.PublishRequest(protocol.SubjectEvent(protocol.EventCancel, "rv_s"), inbox, []byte("x")); err != nil {
		t.Fatal(err)
	}
	var replies []string
	for {
		m, err := sub.NextMsg(time.Second)
		if err != nil {
			break
		}
		replies = append(replies, string(m.Data))
	}
	t.Logf("replies to the gateway's publish: %q", replies)
	for _, r := range replies {
		if strings.Contains(r, "forged") {
			t.Errorf("a worker answered the gateway's JetStream publish")
		}
	}
}

// TestFastLaneSealsTheResultsItDecides: with sealed results, a result a stage decided on the fast
// lane (NO_ROUTE here; a policy's refusal, APPROVAL_REQUIRED alike) is recorded sealed, as the
// durable path records it, so readers that trust only sealed results find it.
func TestFastLaneSealsTheResultsItDecides(t *testing.T) {
	t.Parallel()
	_, key, _ := ed25519.GenerateKey(nil)
	s := start(t, options{workers: 1, seal: &router.SealKey{ID: "r1", Key: key}})
	s.waitFastLane()
	resp := s.route(request("rv_seal", "", call("a", "read_echo", map[string]any{}), call("b", "no_such_tool", map[string]any{})))
	t.Logf("b: %s", result(t, resp, "b").ErrorCode)
	s.recordedOf("rv_seal")
	if a, _ := s.fastCounts(); a != 1 {
		t.Fatalf("not answered on the fast lane")
	}
	_, b := s.connectAs(bus.RoleGateway)
	for _, id := range []string{"a", "b"} {
		_, res, err := b.Result(context.Background(), "rv_seal", id, "rv_seal", "")
		t.Logf("trusted result of %s: %v %v", id, res != nil, err)
		if err != nil {
			t.Errorf("call %s: the recorded result is not taken: %v", id, err)
		}
	}
}

// TestOnlyGatewaysAndRoutersUseTheFastLane: the fast lane's subjects are the services': an
// external client may not ask a router there, nor a worker send another worker a call, nor
// either listen for the calls or the workers' answers; the server refuses each, and no tool runs.
func TestOnlyGatewaysAndRoutersUseTheFastLane(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, users: []bus.User{{Name: "crm", Role: bus.RoleClient}}})
	s.waitFastLane()
	s.violating = true
	m, _ := protocol.NewMessage(protocol.TypeRequest, &protocol.Request{RequestID: "fl_forged", ToolCalls: []protocol.ToolCall{
		{ToolCallID: "c", Name: "read_record", Arguments: json.RawMessage(`{}`)}}})
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDRequest("fl_forged"), "fl_forged", "fl_forged"
	data, _ := protocol.Marshal(m)
	client := s.srv.ConnectAsUser(t, "crm")
	worker, _ := s.connectAs(bus.RoleWorker)
	for _, c := range []struct {
		who     string
		nc      *nats.Conn
		publish string
	}{
		{"a client", client, protocol.SubjectFastRequest("fl_forged")},
		{"a worker", worker, protocol.SubjectFastRequest("fl_forged")},
		{"a worker", worker, protocol.SubjectFastCall("http", "read_record")},
	} {
		before := len(s.srv.Violations())
		if _, err := c.nc.Request(c.publish, data, 300*time.Millisecond); err == nil {
			t.Errorf("%s asked %s and was answered", c.who, c.publish)
		}
		if !s.srv.RefusedSince(before, c.publish) {
			t.Errorf("%s published on %s unrefused", c.who, c.publish)
		}
	}
	for _, c := range []struct {
		who    string
		nc     *nats.Conn
		listen string
	}{
		{"a client", client, protocol.FilterFastCalls},
		{"a client", client, protocol.FastReplies + ".>"},
		{"a worker", worker, protocol.FastReplies + ".>"},
		{"a worker", worker, protocol.FilterFastRequests},
	} {
		before := len(s.srv.Violations())
		if _, err := c.nc.SubscribeSync(c.listen); err != nil {
			t.Fatal(err)
		}
		_ = c.nc.Flush()
		if !s.srv.RefusedSince(before, c.listen) {
			t.Errorf("%s listens on %s unrefused", c.who, c.listen)
		}
	}
	if n := len(s.recorder.tries("fl_forged/c")); n != 0 {
		t.Errorf("the tool ran %d forged calls", n)
	}
}
