package answer

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/internal/park"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

func newResponder(t *testing.T) (*Responder, *bus.Bus, *park.Lot, *metrics.Metrics) {
	t.Helper()
	b := bustest.NewServer(t).Provision(t, bus.Config{})
	pub := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: "r"})
	lot := park.New(b, pub, nil)
	m := metrics.New(nil)
	return New(b, pub, lot, m, nil), b, lot, m
}

func ok(id string, content string) protocol.ToolResult {
	return protocol.ToolResult{ToolCallID: id, Name: "echo", Status: protocol.ResultOK, Content: json.RawMessage(content), Attempts: 1}
}

func request(t *testing.T, id string) []byte {
	t.Helper()
	m, _ := protocol.NewMessage(protocol.TypeRequest, &protocol.Request{RequestID: id, SessionID: "s", Serial: true,
		ToolCalls: []protocol.ToolCall{{ToolCallID: "c", Name: "echo"}}})
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDRequest(id), id, "s"
	raw, _ := protocol.Marshal(m)
	return raw
}

func TestRespondOnceAndWakeTheNext(t *testing.T) {
	t.Parallel()
	a, b, lot, m := newResponder(t)
	ctx := t.Context()
	// A serial request waits for r1's response.
	if _, err := lot.Park(ctx, park.Wait{Key: protocol.WakeOnResponse("r1")}, "r2", protocol.SubjectRequest("s"), request(t, "r2")); err != nil {
		t.Fatal(err)
	}
	r := &Response{RequestID: "r1", SessionID: "s", Results: []protocol.ToolResult{ok("a", `{}`), protocol.ErrorResult(protocol.CodeNoRoute, protocol.OriginHermes, "h", "x").For(&protocol.ToolCall{ToolCallID: "b", Name: "fax"}, "")},
		Cause: protocol.MsgIDRequest("r1"), Serial: true}
	mine, err := a.Respond(ctx, r)
	if err != nil || !mine {
		t.Fatalf("first: %v %v", mine, err)
	}
	rec, resp, err := b.Response(ctx, "r1", "s")
	if err != nil {
		t.Fatal(err)
	}
	msg := rec.Msg
	if resp.Status != protocol.StatusPartialSuccess || msg.CausationID != protocol.MsgIDRequest("r1") || msg.MsgID != protocol.MsgIDResponse("r1") {
		t.Fatalf("recorded %+v %+v %v", msg, resp, err)
	}
	if n, _ := lot.Parked(ctx, protocol.WakeOnResponse("r1")); n != 0 {
		t.Error("the next serial request was not woken")
	}
	info, err := b.Stream.Info(ctx, jetstream.WithSubjectFilter(b.StoredSubjectRequest("s")))
	if err != nil || info.State.Subjects[b.StoredSubjectRequest("s")] != 1 {
		t.Fatalf("woken requests published: %+v %v; want r2", info.State.Subjects, err)
	}
	// A second answer (another router, the dead-letter processor) changes nothing.
	other := *r
	other.Results = []protocol.ToolResult{ok("a", `{}`), ok("b", `{}`)}
	if mine, err := a.Respond(ctx, &other); err != nil || mine {
		t.Fatalf("second: %v %v", mine, err)
	}
	if _, resp, _ := b.Response(ctx, "r1", ""); resp.Status != protocol.StatusPartialSuccess {
		t.Errorf("the first response was replaced: %+v", resp)
	}
	if n := testutil.ToFloat64(m.Responses.WithLabelValues(protocol.StatusPartialSuccess)); n != 1 {
		t.Errorf("counted %v", n)
	}
}

func TestRespondRefusesWhatNoReaderCouldDecode(t *testing.T) {
	t.Parallel()
	a, b, _, _ := newResponder(t)
	_, err := a.Respond(t.Context(), &Response{RequestID: "bad", SessionID: "s", Results: []protocol.ToolResult{{Status: protocol.ResultOK}}})
	if !bus.IsPermanent(err) || !strings.Contains(err.Error(), "tool_call_id") {
		t.Fatalf("%v", err)
	}
	if answered, _ := b.Answered(t.Context(), "bad", ""); answered {
		t.Fatal("an undecodable response was recorded")
	}
}

// Results that fit one by one but not together: the largest contents give way.
func TestRespondShrinksToFit(t *testing.T) {
	t.Parallel()
	a, b, _, _ := newResponder(t)
	limit := b.MaxMessageBytes()
	big := `"` + strings.Repeat("x", limit/2) + `"`
	r := &Response{RequestID: "big", SessionID: "s", Results: []protocol.ToolResult{ok("a", big), ok("b", big), ok("c", `{"small":true}`)}}
	if _, err := a.Respond(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	_, resp, err := b.Response(t.Context(), "big", "")
	if err != nil {
		t.Fatal(err)
	}
	dropped := 0
	for _, res := range resp.Results {
		if res.ErrorCode == protocol.CodeResultTooLarge {
			dropped++
			if res.ToolCallID == "c" || res.Name != "echo" || res.Attempts != 1 {
				t.Errorf("dropped %+v", res)
			}
		}
	}
	if dropped != 1 || resp.Results[2].Status != protocol.ResultOK {
		t.Errorf("%d dropped: %+v", dropped, resp.Results)
	}
}

// Answered from results a cancellation recorded by someone other than the canceller, the
// response still says the request was cancelled; an error given stands.
func TestRespondFromCancelledResultsSaysCancelled(t *testing.T) {
	t.Parallel()
	a, b, _, _ := newResponder(t)
	ctx := t.Context()
	cancelled := protocol.CancelledResult(&protocol.ToolCall{ToolCallID: "b", Name: "echo"}, "", 1, "http 127.0.0.1:1")
	for _, c := range []struct {
		id   string
		err  *protocol.ResponseError
		want string
	}{
		{"from_results", nil, "the request was cancelled before every call finished"},
		{"by_canceller", &protocol.ResponseError{Code: protocol.CodeCancelled, Message: "cancelled by http 127.0.0.1:1: stop"}, "cancelled by http 127.0.0.1:1: stop"},
	} {
		if _, err := a.Respond(ctx, &Response{RequestID: c.id, SessionID: "s", Results: []protocol.ToolResult{ok("a", `{}`), cancelled}, Error: c.err}); err != nil {
			t.Fatal(err)
		}
		_, resp, err := b.Response(ctx, c.id, "")
		if err != nil || resp.Error == nil || resp.Error.Code != protocol.CodeCancelled || resp.Error.Message != c.want {
			t.Fatalf("%s: %+v %v", c.id, resp, err)
		}
	}
	if _, err := a.Respond(ctx, &Response{RequestID: "plain", SessionID: "s", Results: []protocol.ToolResult{ok("a", `{}`)}}); err != nil {
		t.Fatal(err)
	}
	if _, resp, err := b.Response(ctx, "plain", ""); err != nil || resp.Error != nil {
		t.Fatalf("plain: %+v %v", resp, err)
	}
}
