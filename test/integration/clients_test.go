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
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"alice": auth.RoleUser, "ops": auth.RoleOperator})
	if code, body := s.call("POST", "/v1/route", keys["alice"], `{"request_id":"alice_1","session_id":"alices","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{}}]}`); code != 200 {
		t.Fatalf("alice: HTTP %d %s", code, body)
	}
	nc := s.srv.ConnectAs(t, bus.RoleClient)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	publish := func(subjectSession, requestID, session string) {
		t.Helper()
		req := &protocol.Request{RequestID: requestID, SessionID: session, ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: "echo", Arguments: []byte(`{"from":"crm"}`)}}}
		m, err := protocol.NewMessage(protocol.TypeRequest, req)
		if err != nil {
			t.Fatal(err)
		}
		m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDRequest(requestID), requestID, session
		m.Caller = &protocol.Caller{ID: "key:someone-else", Name: "admin", Role: "admin"} // claimed, not believed
		data, err := protocol.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, protocol.SubjectClientRequest("client", subjectSession), data); err != nil {
			t.Fatalf("the client could not publish a request: %v", err)
		}
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
		// Nor answered: an answer to a request refused here (the dead-letter processor's)
		// would land in another caller's session, and pre-empt the id there.
		time.Sleep(200 * time.Millisecond)
		if _, r, err := admin.Response(ctx, id, session); err == nil {
			t.Errorf("%s was answered in session %s: %+v", id, session, r)
		}
	}
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
