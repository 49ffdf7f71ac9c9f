package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// earlierBus is a bus an earlier Hermes ran on, upgraded while work was under way: its record
// stream with the earlier subjects, then this version's provisioning, then what the earlier
// version left.
type earlierBus struct {
	srv *bustest.Server
	b   *bus.Bus
	// call is the stream sequence of the call queued in the consumer tool-echo.
	call uint64
}

// newEarlierBus leaves on a fresh server what earlier versions left, and what it holds:
//   - hermes-intake: old_q (accepted, neither planned nor answered: pending), old_done
//     (answered, in hermes-responses);
//   - hermes-responses: old_done's response, recorded nowhere else;
//   - the record: old_rec's response on hermes.response.<session> only;
//   - consumer tool-echo holding one call of request old_call (pending), and echo listed in
//     hermes-tools without a kind;
//   - hermes-sessions wait.old_prev: serial request old_next waiting (pending);
//   - hermes-calls old_run.a: a result of old_run, not answered (pending).
func newEarlierBus(t *testing.T) *earlierBus {
	t.Helper()
	srv := bustest.NewServer(t)
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: protocol.StreamName,
		Subjects: []string{"hermes.request.*", "hermes.tool.*.*", "hermes.result.*", "hermes.response.*"}}); err != nil {
		t.Fatal(err)
	}
	b := srv.Provision(t, withBuckets(bus.Config{}))
	e := &earlierBus{srv: srv, b: b}
	pub := bus.NewPublisher(js, protocol.Sender{Role: protocol.RoleRouter, Instance: "earlier"})
	encode := func(m *protocol.Message) []byte {
		data, err := protocol.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	response := func(rid, session string) *protocol.Message {
		m, err := protocol.NewMessage(protocol.TypeResponse, &protocol.Response{RequestID: rid, SessionID: session, Status: protocol.StatusSuccess,
			Results: []protocol.ToolResult{{ToolCallID: "a", Name: "echo", Status: protocol.ResultOK, Content: json.RawMessage(`{}`)}}})
		if err != nil {
			t.Fatal(err)
		}
		m.MsgID, m.RequestID, m.SessionID, m.Sender = protocol.MsgIDResponse(rid), rid, session, pub.Sender()
		return m
	}
	intake, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: earlierIntake})
	if err != nil {
		t.Fatal(err)
	}
	for rid, session := range map[string]string{"old_q": "s_q", "old_done": "s_done"} {
		if _, err := intake.Create(ctx, rid, []byte(`{"session_id":"`+session+`","trace_id":"t","call_ids":["a"],"names":["echo"]}`)); err != nil {
			t.Fatal(err)
		}
	}
	responses, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: earlierResponses})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := responses.Create(ctx, "old_done", encode(response("old_done", "s_done"))); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ctx, "hermes.response.s_rec", response("old_rec", "s_rec")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "tool-echo", FilterSubject: "hermes.tool.echo.*",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Tools.Create(ctx, "echo", []byte("tool-echo")); err != nil {
		t.Fatal(err)
	}
	call, err := protocol.NewMessage(protocol.TypeToolCall, &protocol.Dispatch{Call: protocol.ToolCall{ToolCallID: "a", Name: "echo"}, Route: "r",
		Action: protocol.Action{Kind: protocol.ActionHTTP, TimeoutMS: 100, HTTP: &protocol.HTTPAction{URL: "http://x/", Method: "POST"}}})
	if err != nil {
		t.Fatal(err)
	}
	call.MsgID, call.RequestID, call.SessionID = protocol.MsgIDToolCall("old_call", "a"), "old_call", "s_call"
	ack, err := pub.Publish(ctx, "hermes.tool.echo.s_call", call)
	if err != nil {
		t.Fatal(err)
	}
	e.call = ack.Sequence
	next, err := protocol.NewMessage(protocol.TypeRequest, &protocol.Request{RequestID: "old_next", SessionID: "s_ser", Serial: true,
		ToolCalls: []protocol.ToolCall{{ToolCallID: "a", Name: "echo"}}})
	if err != nil {
		t.Fatal(err)
	}
	next.MsgID, next.RequestID, next.SessionID = protocol.MsgIDRequest("old_next"), "old_next", "s_ser"
	if _, err := b.Sessions.Put(ctx, earlierWaitPrefix+"old_prev", encode(next)); err != nil {
		t.Fatal(err)
	}
	res, err := protocol.NewMessage(protocol.TypeToolResult, &protocol.ToolResult{ToolCallID: "a", Name: "echo", Status: protocol.ResultOK, Content: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	res.MsgID, res.RequestID, res.SessionID = protocol.MsgIDToolResult("old_run", "a"), "old_run", "s_run"
	if _, err := b.Calls.Create(ctx, "old_run.a", encode(res)); err != nil {
		t.Fatal(err)
	}
	return e
}

// migrate runs hermes migrate on e's server and returns its exit status and output.
func (e *earlierBus) migrate(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Exec(RunMigrate, append([]string{"--nats", e.srv.URL}, args...), Env{Stdout: &out, Stderr: &errOut})
	return code, out.String(), errOut.String()
}

// left reports what of the earlier layouts is still on e's bus.
func (e *earlierBus) left(t *testing.T) []string {
	t.Helper()
	ctx := t.Context()
	var out []string
	for _, bucket := range []string{earlierIntake, earlierResponses} {
		if _, err := e.b.JS.KeyValue(ctx, bucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
			out = append(out, "bucket "+bucket)
		}
	}
	if _, err := e.b.Stream.Consumer(ctx, "tool-echo"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		out = append(out, "consumer tool-echo")
	}
	for _, k := range []struct {
		kv  jetstream.KeyValue
		key string
	}{{e.b.Tools, "echo"}, {e.b.Sessions, earlierWaitPrefix + "old_prev"}, {e.b.Calls, "old_run.a"}} {
		if _, err := k.kv.Get(ctx, k.key); !errors.Is(err, jetstream.ErrKeyNotFound) {
			out = append(out, k.kv.Bucket()+" "+k.key)
		}
	}
	return out
}

// hermes migrate refuses while work is pending in what an earlier version left, naming each
// piece; records the earlier version's responses where this version reads them; removes it all
// once the work is done; and is a no-op run again. --dry-run changes nothing.
func TestMigrateRemovesTheEarlierLayoutsOnceDrained(t *testing.T) {
	t.Parallel()
	e := newEarlierBus(t)
	ctx := t.Context()
	all := e.left(t)
	if len(all) != 6 {
		t.Fatalf("the earlier layouts were not all made: %v", all)
	}

	code, out, errOut := e.migrate(t, "--dry-run")
	if code != 1 || !strings.Contains(out, "consumer tool-echo") || !strings.Contains(out, "2 to record again") {
		t.Fatalf("dry run: exit %d:\n%s%s", code, out, errOut)
	}
	if answered, err := e.b.Answered(ctx, "old_done", ""); err != nil || answered {
		t.Fatalf("a dry run recorded a response: %v %v", answered, err)
	}

	code, out, errOut = e.migrate(t)
	if code != 1 {
		t.Fatalf("migrate with work pending: exit %d:\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		"consumer tool-echo: 1 call(s) of echo not run (requests old_call)",
		"hermes-sessions wait.old_prev: serial request old_next (session s_ser) waits for old_prev's response",
		"hermes-calls old_run.a: the result of call a of request old_run",
		"hermes-intake old_q: request old_q (session s_q)",
		"2 recorded again on hermes.response.<request_id>.<session>, 0 there already",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report does not say %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errOut, "4 pending, nothing removed") || !strings.Contains(errOut, "--discard-pending") {
		t.Errorf("stderr: %s", errOut)
	}
	if strings.Contains(out, "old_done") || strings.Contains(out, "old_rec") {
		t.Errorf("answered requests reported pending:\n%s", out)
	}
	if got := e.left(t); len(got) != len(all) {
		t.Fatalf("removed while work was pending: %v left", got)
	}
	// The responses the earlier version recorded are read where this version reads them.
	for _, rid := range []string{"old_done", "old_rec"} {
		if _, resp, err := e.b.Response(ctx, rid, ""); err != nil || resp.RequestID != rid || resp.Status != protocol.StatusSuccess {
			t.Errorf("%s's response after migrate: %+v %v", rid, resp, err)
		}
	}

	// The earlier version finishes its work: it runs the queued call, wakes the serial request
	// (removing its key), answers old_run, and a router plans old_q.
	cons, err := e.b.Stream.Consumer(ctx, "tool-echo")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := msg.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.b.Sessions.Delete(ctx, earlierWaitPrefix+"old_prev"); err != nil {
		t.Fatal(err)
	}
	r, err := protocol.NewMessage(protocol.TypeResponse, &protocol.Response{RequestID: "old_run", SessionID: "s_run", Status: protocol.StatusSuccess,
		Results: []protocol.ToolResult{{ToolCallID: "a", Name: "echo", Status: protocol.ResultOK, Content: json.RawMessage(`{}`)}}})
	if err != nil {
		t.Fatal(err)
	}
	r.MsgID, r.RequestID, r.SessionID = protocol.MsgIDResponse("old_run"), "old_run", "s_run"
	if _, err := e.b.Respond(ctx, bus.NewPublisher(e.b.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: "earlier"}), r); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.b.CreatePlan(ctx, "old_q", &bus.Plan{SessionID: "s_q", CallIDs: []string{"a"}, Names: []string{"echo"}}); err != nil {
		t.Fatal(err)
	}

	code, out, errOut = e.migrate(t)
	if code != 0 || !strings.Contains(out, "Removed consumer tool-echo.") || !strings.Contains(out, "Removed bucket hermes-intake.") ||
		!strings.Contains(out, "0 recorded again on hermes.response.<request_id>.<session>, 2 there already") {
		t.Fatalf("migrate once drained: exit %d:\n%s%s", code, out, errOut)
	}
	if got := e.left(t); len(got) != 0 {
		t.Fatalf("left after migrate: %v", got)
	}
	for _, rid := range []string{"old_done", "old_rec", "old_run"} {
		if answered, err := e.b.Answered(ctx, rid, ""); err != nil || !answered {
			t.Errorf("%s is no longer answered: %v", rid, err)
		}
	}

	// Again: the earlier layouts are gone (the record keeps its history, already carried over).
	code, out, errOut = e.migrate(t)
	if code != 0 || !strings.Contains(out, "nothing to do") {
		t.Fatalf("migrate run again: exit %d:\n%s%s", code, out, errOut)
	}
	if n := e.recordedResponses(t, "old_rec"); n != 1 {
		t.Errorf("old_rec's response recorded %d times where this version reads it", n)
	}
}

// With --discard-pending hermes migrate removes the earlier layouts although work is pending
// in them, naming what is given up.
func TestMigrateDiscardsPendingWorkWhenTold(t *testing.T) {
	t.Parallel()
	e := newEarlierBus(t)
	provision := func() string {
		t.Helper()
		var out, errOut bytes.Buffer
		if err := RunProvision(t.Context(), []string{"--nats", e.srv.URL}, Env{Stdout: &out, Stderr: &errOut}); err != nil {
			t.Fatalf("provision on an earlier bus: %v: %s", err, errOut.String())
		}
		return out.String()
	}
	if out := provision(); !strings.Contains(out, "earlier      bucket hermes-intake, bucket hermes-responses, consumer tool-echo: left by earlier versions") {
		t.Errorf("provision does not point at what earlier versions left:\n%s", out)
	}
	code, out, errOut := e.migrate(t, "--discard-pending")
	if code != 0 {
		t.Fatalf("exit %d:\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"Given up (--discard-pending):", "consumer tool-echo: 1 call(s) of echo not run", "old_next", "old_run.a", "old_q",
		"Removed consumer tool-echo.", "Removed 1 key(s) of hermes-tools.", "Removed 1 key(s) of hermes-sessions.", "Removed 1 key(s) of hermes-calls.",
		"Removed bucket hermes-intake.", "Removed bucket hermes-responses."} {
		if !strings.Contains(out, want) {
			t.Errorf("the report does not say %q:\n%s", want, out)
		}
	}
	if got := e.left(t); len(got) != 0 {
		t.Fatalf("left after migrate: %v", got)
	}
	// The call given up stays in the record, as history.
	if _, err := e.b.RecordAt(t.Context(), protocol.StreamName, e.call); err != nil {
		t.Errorf("the record lost the call: %v", err)
	}
	if code, out, errOut := e.migrate(t); code != 0 || !strings.Contains(out, "nothing to do") {
		t.Fatalf("migrate run again: exit %d:\n%s%s", code, out, errOut)
	}
	if out := provision(); strings.Contains(out, "earlier") {
		t.Errorf("provision after migrate:\n%s", out)
	}
}

// A bus this version set up holds nothing of the earlier layouts: hermes migrate says so and
// changes nothing.
func TestMigrateOnABusWithoutEarlierLayouts(t *testing.T) {
	t.Parallel()
	srv := bustest.NewServer(t)
	srv.Provision(t, withBuckets(bus.Config{}))
	var out, errOut bytes.Buffer
	if code := Exec(RunMigrate, []string{"--nats", srv.URL}, Env{Stdout: &out, Stderr: &errOut}); code != 0 ||
		!strings.Contains(out.String(), "Nothing of an earlier Hermes is left") {
		t.Fatalf("exit %d:\n%s%s", code, out.String(), errOut.String())
	}
	// A server Hermes never provisioned: trouble, said so, and nothing created.
	empty := bustest.NewServer(t)
	out.Reset()
	errOut.Reset()
	if code := Exec(RunMigrate, []string{"--nats", empty.URL}, Env{Stdout: &out, Stderr: &errOut}); code != 2 || !strings.Contains(errOut.String(), "hermes provision") {
		t.Fatalf("unprovisioned: exit %d:\n%s%s", code, out.String(), errOut.String())
	}
	js, err := jetstream.New(empty.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(context.Background(), protocol.StreamName); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("migrate created the record: %v", err)
	}
}

// recordedResponses counts the messages on requestID's response subject.
func (e *earlierBus) recordedResponses(t *testing.T, requestID string) uint64 {
	t.Helper()
	filter := protocol.FilterResponseOf(requestID)
	info, err := e.b.Stream.Info(t.Context(), jetstream.WithSubjectFilter(filter))
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}
