package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/park"
	"github.com/hermesbus/hermes/internal/routes"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

func newRouter(t *testing.T) (*Router, *bus.Bus) {
	t.Helper()
	b := bustest.NewServer(t).Provision(t, bus.Config{})
	table, err := routes.Parse("r.yaml", []byte("version: 1.0\nrules:\n  - name: echo\n    match: {tool_name: echo}\n    action: {http: {url: 'http://x/'}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Bus: b, Routes: table, Instance: "router-test"})
	if err != nil {
		t.Fatal(err)
	}
	return r, b
}

// The bus outlet records decided results, dispatches the rest as one batch with the request's
// correlation, and parks the request for each held call; aggregation then answers from the
// recorded results alone.
func TestOutletAndAggregation(t *testing.T) {
	t.Parallel()
	r, b := newRouter(t)
	ctx := t.Context()
	j := job(t, "r1", "s1", true, "fax", "a", "echo", "b", "echo", "c")
	if err := (&Pipeline{Stages: r.pipeline.Stages[2:], Out: &outlet{}}).Run(ctx, j); err != nil { // route only
		t.Fatal(err)
	}
	hold := park.Wait{Key: protocol.WakeAt("r1.c"), At: time.Now().Add(time.Hour)}
	j.Calls[2].Dispatch, j.Calls[2].Hold = nil, &hold
	if err := r.pipeline.Out.Emit(ctx, j); err != nil {
		t.Fatal(err)
	}
	// a: NO_ROUTE, recorded and published with the correlation.
	rec, res, err := b.Result(ctx, "r1", "a", "s1", "")
	if err != nil {
		t.Fatal(err)
	}
	if m := rec.Msg; res.ErrorCode != protocol.CodeNoRoute || m.Correlation == nil || strings.Join(m.Correlation.CallIDs, ",") != "a,b,c" || !m.Correlation.Serial {
		t.Fatalf("decided result %+v %+v", m, res)
	}
	// b: dispatched to its kind's subject.
	raw, err := b.Stream.GetLastMsgForSubject(ctx, protocol.SubjectToolCall(protocol.ActionHTTP, "echo", "s1"))
	if err != nil {
		t.Fatal(err)
	}
	dm, err := protocol.Unmarshal(raw.Data)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dm.DecodeDispatch()
	if err != nil || d.Call.ToolCallID != "b" || d.Route != "echo" || dm.MsgID != protocol.MsgIDToolCall("r1", "b") ||
		dm.Recipient != bus.ToolConsumer(protocol.ActionHTTP, "echo") || dm.Correlation == nil || len(dm.Correlation.CallIDs) != 3 {
		t.Fatalf("dispatch %+v %+v %v", dm, d, err)
	}
	// c: held, the request parked under its wait.
	if n, err := r.lot.Parked(ctx, hold.Key); n != 1 || err != nil {
		t.Fatalf("parked %d %v", n, err)
	}
	// Not complete: no response yet.
	if err := r.agg.handle(ctx, delivery(t, b, "r1", "a")); err != nil {
		t.Fatal(err)
	}
	if answered, _ := b.Answered(ctx, "r1", "s1"); answered {
		t.Fatal("answered before every call has a result")
	}
	for _, id := range []string{"b", "c"} {
		recordOK(t, b, "r1", id, &protocol.Correlation{CallIDs: []string{"a", "b", "c"}, Serial: true})
	}
	if err := r.agg.handle(ctx, delivery(t, b, "r1", "c")); err != nil {
		t.Fatal(err)
	}
	_, resp, err := b.Response(ctx, "r1", "s1")
	if err != nil || resp.Status != protocol.StatusPartialSuccess || len(resp.Results) != 3 || resp.Results[0].ErrorCode != protocol.CodeNoRoute {
		t.Fatalf("response %+v %v", resp, err)
	}
	// A result whose correlation does not name its own call is aggregated by the plan: with
	// no plan recorded, it is dropped.
	res2 := protocol.ToolResult{ToolCallID: "z", Status: protocol.ResultOK, Content: json.RawMessage(`{}`)}
	fm, _ := protocol.NewMessage(protocol.TypeToolResult, &res2)
	fm.MsgID, fm.RequestID, fm.SessionID, fm.Correlation = "x", "forged", "s1", &protocol.Correlation{CallIDs: []string{"y"}}
	data, _ := protocol.Marshal(fm)
	d2 := &bus.Delivery{Data: data, Msg: fm, Header: nats.Header{}, Log: slog.New(slog.DiscardHandler)}
	if err := r.agg.handle(ctx, d2); err != nil {
		t.Fatal(err)
	}
	if answered, _ := b.Answered(ctx, "forged", "s1"); answered {
		t.Fatal("a forged correlation made a response")
	}
}

// A held call whose wait ended between its stage's look and the park (its wake-up found
// nothing parked: a resource's turn granted as the call before it finished) wakes the request
// as soon as it is parked, instead of at the wait's deadline; one whose wait goes on stays
// parked.
func TestAHeldCallWhoseTurnCameBeforeTheParkIsWoken(t *testing.T) {
	t.Parallel()
	r, b := newRouter(t)
	ctx := t.Context()
	for _, came := range []bool{true, false} {
		id := fmt.Sprintf("turn_%t", came)
		j := job(t, id, "s1", false, "echo", "a", "echo", "b")
		if err := (&Pipeline{Stages: r.pipeline.Stages[2:], Out: &outlet{}}).Run(ctx, j); err != nil { // route only
			t.Fatal(err)
		}
		hold := park.Wait{Key: protocol.WakeOnTurn(id, "b"), At: time.Now().Add(time.Hour)}
		j.Calls[1].Dispatch, j.Calls[1].Hold = nil, &hold
		j.Calls[1].Recheck = func(context.Context) (bool, error) { return came, nil }
		if err := r.pipeline.Out.Emit(ctx, j); err != nil {
			t.Fatal(err)
		}
		n, err := r.lot.Parked(ctx, hold.Key)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int{true: 0, false: 1}[came]; n != want {
			t.Fatalf("turn came before the park: %t; %d parked, want %d", came, n, want)
		}
		if !came {
			continue
		}
		woken, err := b.Stream.GetLastMsgForSubject(ctx, b.StoredSubjectRequest("s1"))
		if err != nil || woken.Header.Get(bus.HeaderWoken) == "" {
			t.Fatalf("the request was not published again, woken: %v", err)
		}
	}
}

func recordOK(t *testing.T, b *bus.Bus, rid, call string, corr *protocol.Correlation) {
	t.Helper()
	res := protocol.ToolResult{ToolCallID: call, Name: "echo", Status: protocol.ResultOK, Content: json.RawMessage(`{}`), Attempts: 1}
	m, _ := protocol.NewMessage(protocol.TypeToolResult, &res)
	m.MsgID, m.RequestID, m.SessionID, m.Correlation = protocol.MsgIDToolResult(rid, call), rid, "s1", corr
	pub := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleToolWorker, Instance: "w"})
	if _, _, err := b.RecordResult(t.Context(), pub, m, &res); err != nil {
		t.Fatal(err)
	}
}

// delivery is the delivery of call's recorded result, as the results consumer hands it.
func delivery(t *testing.T, b *bus.Bus, rid, call string) *bus.Delivery {
	t.Helper()
	rec, _, err := b.Result(t.Context(), rid, call, "s1", "")
	if err != nil {
		t.Fatal(err)
	}
	return &bus.Delivery{Subject: protocol.SubjectResult(rid, call, "s1"), Data: rec.Data, Msg: rec.Msg, StreamSeq: rec.Seq,
		Header: nats.Header{}, Log: slog.New(slog.DiscardHandler)}
}

func TestTrustedCorrelation(t *testing.T) {
	t.Parallel()
	a := &aggregator{maxCall: 3}
	res := &protocol.ToolResult{ToolCallID: "b"}
	for _, c := range []struct {
		corr *protocol.Correlation
		want bool
	}{
		{&protocol.Correlation{CallIDs: []string{"a", "b"}}, true},
		{nil, false},
		{&protocol.Correlation{}, false},
		{&protocol.Correlation{CallIDs: []string{"a", "c"}}, false},           // not its own call
		{&protocol.Correlation{CallIDs: []string{"a", "b", "c", "d"}}, false}, // over the limit
		{&protocol.Correlation{CallIDs: []string{"b", "x.*"}}, false},         // not tokens
		{&protocol.Correlation{CallIDs: []string{"b"}, Serial: true}, true},
	} {
		if got := a.trusted(c.corr, res); got != c.want {
			t.Errorf("trusted(%+v) = %v, want %v", c.corr, got, c.want)
		}
	}
}

func TestRouterStages(t *testing.T) {
	t.Parallel()
	r, _ := newRouter(t)
	if got := strings.Join(r.Stages(), ","); got != "serial,plan,route" {
		t.Errorf("stages %s", got)
	}
}

// A request redelivered with every result recorded and no response (whoever recorded the last
// stopped before aggregating it) is answered from the recorded results, once, and adds no copy
// of a result to the record.
func TestARequestWithEveryResultIsAnsweredFromThem(t *testing.T) {
	t.Parallel()
	r, b := newRouter(t)
	ctx := t.Context()
	j := job(t, "again", "s_again", false, "fax", "a")
	if err := (&Pipeline{Stages: r.pipeline.Stages[1:], Out: r.pipeline.Out}).Run(ctx, j); err != nil { // plan, route
		t.Fatal(err)
	}
	if _, _, err := b.Response(ctx, "again", "s_again"); !errors.Is(err, bus.ErrNotFound) {
		t.Fatalf("a response before aggregation: %v", err)
	}
	for range 2 {
		if err := r.pipeline.Run(ctx, job(t, "again", "s_again", false, "fax", "a")); err != nil {
			t.Fatal(err)
		}
	}
	_, resp, err := b.Response(ctx, "again", "s_again")
	if err != nil || len(resp.Results) != 1 || resp.Results[0].ErrorCode != protocol.CodeNoRoute {
		t.Fatalf("response %+v, %v", resp, err)
	}
	info, err := b.Stream.Info(ctx, jetstream.WithSubjectFilter("hermes.>"))
	if err != nil {
		t.Fatal(err)
	}
	if n, m := info.State.Subjects[protocol.SubjectResult("again", "a", "s_again")], info.State.Subjects[protocol.SubjectResponse("again", "s_again")]; n != 1 || m != 1 {
		t.Fatalf("%d results and %d responses in the stream, want 1 and 1", n, m)
	}
}
