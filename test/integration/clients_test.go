package integration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// An external NATS client publishes requests under its own NATS user, and that user is who the
// record says made them, whatever caller the message claims; it owns the sessions it opens, may
// not publish into another caller's, and may publish nothing but requests.
func TestExternalClientsPublishRequestsAsThemselves(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"alice": auth.RoleUser, "ops": auth.RoleOperator})
	if code, body := s.call("POST", "/v1/route", keys["alice"], `{"request_id":"alice_1","session_id":"alices","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{}}]}`); code != 200 {
		t.Fatalf("alice: HTTP %d %s", code, body)
	}
	js := clientJS(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	publish := func(subjectSession, requestID, session string) {
		t.Helper()
		req := &protocol.Request{RequestID: requestID, SessionID: session, ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: "echo", Arguments: []byte(`{"from":"crm"}`)}}}
		// The caller the message claims is not believed.
		publishClientRequest(ctx, t, js, subjectSession, req, &protocol.Caller{ID: "key:someone-else", Name: "admin", Role: "admin"})
	}
	publish("ext_s1", "ext_1", "ext_s1")
	_, admin := s.connect()
	var resp *protocol.Response
	waitFor(t, "the client's request answered", func() bool {
		_, r, err := admin.Response(ctx, "ext_1", "ext_s1")
		resp = r
		return err == nil
	})
	if resp.Status != protocol.StatusSuccess || !strings.Contains(string(resp.Results[0].Content), "crm") {
		t.Fatalf("response %+v", resp)
	}
	stored, err := admin.Stream.GetLastMsgForSubject(ctx, protocol.StoredSubjectRequest("ext_s1"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := protocol.Unmarshal(stored.Data)
	if err != nil {
		t.Fatal(err)
	}
	if m.Caller == nil || m.Caller.ID != "nats:client" || m.Caller.Name != "client" {
		t.Fatalf("the request was recorded as made by %+v, want the NATS user client", m.Caller)
	}
	// The session is the client's: an operator reads it, alice does not.
	if code, body := s.call("GET", "/v1/requests/ext_1", keys["ops"], ""); code != 200 {
		t.Fatalf("operator reads the client's request: HTTP %d %s", code, body)
	} else {
		var r protocol.Response
		if err := json.Unmarshal([]byte(body), &r); err != nil || r.RequestID != "ext_1" {
			t.Fatalf("%s", body)
		}
	}
	if code, _ := s.call("GET", "/v1/requests/ext_1", keys["alice"], ""); code != 404 {
		t.Fatalf("alice reads the client's request: HTTP %d", code)
	}

	// Into alice's session, or under another session than its subject names: never accepted.
	publish("alices", "ext_2", "alices")
	publish("ext_s3", "ext_3", "ext_other")
	publish("ext_s4", "ext_4", "ext_s4") // after both: once it is answered, they were handled
	waitFor(t, "the last request answered", func() bool { _, _, err := admin.Response(ctx, "ext_4", "ext_s4"); return err == nil })
	for id, session := range map[string]string{"ext_2": "alices", "ext_3": "ext_other"} {
		if _, err := admin.Plan(ctx, id); err == nil {
			t.Errorf("%s was accepted", id)
		}
		// Nor answered: an answer to a request refused here would land in another caller's
		// session, and pre-empt the id there.
		if _, r, err := admin.Response(ctx, id, session); err == nil {
			t.Errorf("%s was answered in session %s: %+v", id, session, r)
		}
	}
	// Every request taken, accepted or refused, has left the clients' stream (a work queue).
	waitFor(t, "the clients' stream drained", func() bool {
		info, err := admin.Clients.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
	// Anything but its own requests is refused by the server.
	s.violating = true
	for _, subject := range []string{protocol.SubjectRequest("ext_s5"), protocol.SubjectClientRequest("other", "ext_s5"), protocol.SubjectResponse("ext_1", "ext_s1")} {
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		if _, err := js.Publish(short, subject, []byte("{}")); err == nil {
			t.Errorf("the client published on %s", subject)
		}
		cancel()
	}
}

// A client's request that could never fit the record's margin is refused at once rather than
// wait, one at a time, in front of every other client's; the next is taken right after.
func TestAClientRequestTooLargeForTheRecordDoesNotHoldTheOthers(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, bus: bus.Config{MaxBytes: 512 << 10}})
	js := clientJS(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	publish := func(requestID string, blob int) {
		t.Helper()
		var calls []protocol.ToolCall
		for i := range 2 {
			calls = append(calls, protocol.ToolCall{ToolCallID: "c" + string(rune('0'+i)), Name: "echo", Arguments: []byte(`{"blob":"` + strings.Repeat("z", blob) + `"}`)})
		}
		publishClientRequest(ctx, t, js, requestID, &protocol.Request{RequestID: requestID, SessionID: requestID, ToolCalls: calls}, nil)
	}
	// The gateway knows the record's limit before it takes any client's request (Listen).
	publish("ext_huge", 75<<10) // writes about 4 × 150 KiB: more than 90 % of 512 KiB
	publish("ext_small", 10)
	_, admin := s.connect()
	waitForWithin(t, "the small request answered", 10*time.Second, func() bool {
		_, _, err := admin.Response(ctx, "ext_small", "ext_small")
		return err == nil
	})
	if _, err := admin.Plan(ctx, "ext_huge"); err == nil {
		t.Fatal("the request too large for the record was accepted")
	}
}

// publishClientRequest publishes req as the external client user "client" does, on the subject
// of subjectSession, its envelope claiming caller (nil: none).
// clientJS connects to the test's server as the NATS user of role client.
func clientJS(t *testing.T, s *system) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(s.srv.ConnectAs(t, bus.RoleClient))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func publishClientRequest(ctx context.Context, t *testing.T, js jetstream.JetStream, subjectSession string, req *protocol.Request, caller *protocol.Caller) {
	t.Helper()
	m, err := protocol.NewMessage(protocol.TypeRequest, req)
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID, m.Caller = protocol.MsgIDRequest(req.RequestID), req.RequestID, req.Session(), caller
	data, err := protocol.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, protocol.SubjectClientRequest("client", subjectSession), data); err != nil {
		t.Fatalf("the client could not publish a request: %v", err)
	}
}
