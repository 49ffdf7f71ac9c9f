package submit

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// A Submitter keeps nothing of a request it accepted that another needs: one started after it
// (a gateway restarted, or another gateway) joins the request while it runs, under the first
// submission's trace, and once it is answered gives its response, replayed — the request
// published once.
func TestAnotherSubmitterJoinsWhatTheFirstAccepted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	f.hold.Store(true) // nothing is answered but by the test
	if out, err := f.s.Submit(ctx, Submission{Request: req("i1", "c"), Trace: protocol.TraceContext{TraceID: "trace-1"}, Wait: 100 * time.Millisecond}); err != nil || !out.Pending {
		t.Fatalf("first gateway: %+v %v", out, err)
	}
	second, err := New(Config{Conn: f.srv.Connect(t), Bus: f.b, Sender: protocol.Sender{Role: protocol.RoleGateway, Instance: "restarted"}})
	if err != nil {
		t.Fatal(err)
	}
	stop, err := second.Listen()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stop() })

	// Joined while it runs: pending under the first submission's trace, not published again.
	out, err := second.Submit(ctx, Submission{Request: req("i1", "c"), Trace: protocol.TraceContext{TraceID: "trace-2"}, Wait: 300 * time.Millisecond})
	if err != nil || !out.Pending || out.TraceID != "trace-1" {
		t.Fatalf("the second gateway: %+v %v; want it pending under the first trace", out, err)
	}
	res := protocol.ToolResult{ToolCallID: "c", Name: "echo", Status: protocol.ResultOK, Content: json.RawMessage(`{"n":1}`), Attempts: 1}
	resp := &protocol.Response{RequestID: "i1", SessionID: "i1", Status: protocol.StatusSuccess, Results: []protocol.ToolResult{res}}
	m, _ := protocol.NewMessage(protocol.TypeResponse, resp)
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDResponse("i1"), "i1", "i1"
	if _, err := f.b.Respond(ctx, bus.NewPublisher(f.b.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: "r"}), m); err != nil {
		t.Fatal(err)
	}
	again, err := second.Submit(ctx, Submission{Request: req("i1", "c"), Wait: 10 * time.Second})
	if err != nil || !again.Replayed || again.Response == nil || string(again.Response.Results[0].Content) != `{"n":1}` {
		t.Fatalf("once answered: %+v %v", again, err)
	}
	info, err := f.b.Stream.Info(ctx, jetstream.WithSubjectFilter(f.b.StoredSubjectRequest("i1")))
	if err != nil || info.State.Subjects[f.b.StoredSubjectRequest("i1")] != 1 {
		t.Fatalf("i1 published %v times (%v), want once", info.State.Subjects, err)
	}
}
