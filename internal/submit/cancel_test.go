package submit

import (
	"errors"
	"testing"

	"github.com/hermesbus/hermes/internal/park"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// A cancellation that stopped after recording the response and before waking the session's
// next serial request is finished by cancelling again: the retry answers the recorded
// response, replayed, and wakes what waits for it. Cancelling a request that finished on its
// own wakes its successor too (whoever answered it may have stopped there) and says it had
// finished.
func TestCancellingAnAnsweredRequestWakesItsSuccessor(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	f.hold.Store(true) // nothing is answered but by the test
	pub := bus.NewPublisher(f.b.JS, protocol.Sender{Role: protocol.RoleGateway, Instance: "crashed"})
	lot := park.New(f.b, pub, nil)
	for _, c := range []struct {
		id, next  string
		cancelled bool
	}{
		{"w1", "w2", true},
		{"f1", "f2", false},
	} {
		// next waits in the lot for id's response, as the router parks a serial request.
		waiting := req(c.next, "c")
		waiting.SessionID, waiting.Serial = "s", true
		m, err := protocol.NewMessage(protocol.TypeRequest, waiting)
		if err != nil {
			t.Fatal(err)
		}
		m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDRequest(c.next), c.next, "s"
		raw, err := protocol.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lot.Park(ctx, park.Wait{Key: protocol.WakeOnResponse(c.id)}, c.next, protocol.SubjectRequest("s"), raw); err != nil {
			t.Fatal(err)
		}
		// id's response is on the record; nobody woke next.
		res := protocol.ToolResult{ToolCallID: "c", Name: "echo", Status: protocol.ResultOK, Content: []byte(`{}`), Attempts: 1}
		resp := &protocol.Response{RequestID: c.id, SessionID: "s"}
		if c.cancelled {
			res = protocol.CancelledResult(&protocol.ToolCall{ToolCallID: "c", Name: "echo"}, "", 0, "someone")
			resp.Error = &protocol.ResponseError{Code: protocol.CodeCancelled, Message: "cancelled by someone"}
		}
		resp.Results, resp.Status = []protocol.ToolResult{res}, protocol.ResponseStatus([]protocol.ToolResult{res})
		out, err := protocol.NewMessage(protocol.TypeResponse, resp)
		if err != nil {
			t.Fatal(err)
		}
		out.MsgID, out.RequestID, out.SessionID = protocol.MsgIDResponse(c.id), c.id, "s"
		if _, err := f.b.Respond(ctx, pub, out); err != nil {
			t.Fatal(err)
		}
		if n, err := lot.Parked(ctx, protocol.WakeOnResponse(c.id)); n != 1 || err != nil {
			t.Fatalf("%s parked %d, %v; want 1", c.next, n, err)
		}

		got, replayed, err := f.s.Cancel(ctx, c.id, Cancellation{By: "test"})
		switch {
		case c.cancelled && (err != nil || !replayed || got.Error == nil || got.Error.Code != protocol.CodeCancelled):
			t.Errorf("cancel %s again: %+v %v %v; want its cancelled response, replayed", c.id, got, replayed, err)
		case !c.cancelled && (!errors.Is(err, ErrFinished) || got == nil || got.Status != protocol.StatusSuccess):
			t.Errorf("cancel finished %s: %+v %v; want ErrFinished with its response", c.id, got, err)
		}
		if n, err := lot.Parked(ctx, protocol.WakeOnResponse(c.id)); n != 0 || err != nil {
			t.Errorf("%s still waits for %s (%d parked, %v)", c.next, c.id, n, err)
		}
	}
}
