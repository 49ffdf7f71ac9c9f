package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

func resultMsg(t *testing.T, rid, call, session, content string, role string) (*protocol.Message, *protocol.ToolResult) {
	t.Helper()
	res := &protocol.ToolResult{ToolCallID: call, Name: "echo", Status: protocol.ResultOK, Content: json.RawMessage(content)}
	m, err := protocol.NewMessage(protocol.TypeToolResult, res)
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDToolResult(rid, call), rid, session
	m.Sender.Role = role
	return m, res
}

func responseMsg(t *testing.T, rid, session, status string) *protocol.Message {
	t.Helper()
	m, err := protocol.NewMessage(protocol.TypeResponse, &protocol.Response{RequestID: rid, SessionID: session, Status: status,
		Results: []protocol.ToolResult{{ToolCallID: "a", Status: protocol.ResultOK, Content: json.RawMessage(`{}`)}}})
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDResponse(rid), rid, session
	return m
}

// A call's first result is its result: another, recorded later by anyone, is not stored, and
// the one recorded is returned; the same message recorded again is still this one's.
func TestRecordResultFirstWins(t *testing.T) {
	t.Parallel()
	b := bustest.NewServer(t).Provision(t, bus.Config{})
	ctx := t.Context()
	w1 := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleToolWorker, Instance: "w1"})
	w2 := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleToolWorker, Instance: "w2"})
	first, res := resultMsg(t, "r1", "a", "s1", `1`, "")
	rec, mine, err := b.RecordResult(ctx, w1, first, res)
	if err != nil || !mine || rec.Seq == 0 {
		t.Fatalf("first: %+v %v %v", rec, mine, err)
	}
	if _, again, err := b.RecordResult(ctx, w1, first, res); err != nil || !again {
		t.Fatalf("the same result again: mine %v, %v", again, err)
	}
	second, res2 := resultMsg(t, "r1", "a", "s1", `2`, "")
	second.MsgID += ":other" // past the duplicate window, or under another id
	got, mine, err := b.RecordResult(ctx, w2, second, res2)
	if err != nil || mine || got.Seq != rec.Seq || got.Msg.Sender.Instance != "w1" {
		t.Fatalf("second: %+v %v %v", got, mine, err)
	}
	// Under the same id (within the duplicate window) but other content: not this one's.
	third, res3 := resultMsg(t, "r1", "a", "s1", `3`, "")
	if got, mine, err := b.RecordResult(ctx, w2, third, res3); err != nil || mine || got.Seq != rec.Seq {
		t.Fatalf("third: %+v %v %v", got, mine, err)
	}
	info, err := b.Stream.Info(ctx, jetstream.WithSubjectFilter("hermes.result.>"))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[protocol.SubjectResult("r1", "a", "s1")]; n != 1 {
		t.Fatalf("%d results on the call's subject, want 1", n)
	}
	_, have, err := b.Result(ctx, "r1", "a", "s1", "")
	if err != nil || string(have.Content) != "1" {
		t.Fatalf("Result: %+v %v", have, err)
	}
	if _, _, err := b.Result(ctx, "r1", "b", "s1", ""); !errors.Is(err, bus.ErrNotFound) {
		t.Fatalf("a call without a result: %v", err)
	}
}

// A re-driven call's result supersedes the answer the dead-letter processor gave it, not the
// tool's own result.
func TestRecordRedrivenResultSupersedesOnlyADeadAnswer(t *testing.T) {
	t.Parallel()
	b := bustest.NewServer(t).Provision(t, bus.Config{})
	ctx := t.Context()
	dl := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleDeadLetter, Instance: "d"})
	w := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleToolWorker, Instance: "w"})
	dead, res := resultMsg(t, "r1", "a", "s1", `"dead"`, "")
	if _, _, err := b.RecordResult(ctx, dl, dead, res); err != nil {
		t.Fatal(err)
	}
	real, res2 := resultMsg(t, "r1", "a", "s1", `"real"`, "")
	real.MsgID = protocol.MsgIDRedrivenResult("r1", "a", "x")
	if _, mine, err := b.RecordRedrivenResult(ctx, w, real, res2); err != nil || !mine {
		t.Fatalf("over a dead answer: %v %v", mine, err)
	}
	again, res3 := resultMsg(t, "r1", "a", "s1", `"again"`, "")
	again.MsgID = protocol.MsgIDRedrivenResult("r1", "a", "y")
	if got, mine, err := b.RecordRedrivenResult(ctx, w, again, res3); err != nil || mine || string(mustResult(t, got).Content) != `"real"` {
		t.Fatalf("over a real result: %v %v", mine, err)
	}
	// With nothing recorded, it is the first result.
	fresh, res4 := resultMsg(t, "r1", "b", "s1", `"b"`, "")
	if _, mine, err := b.RecordRedrivenResult(ctx, w, fresh, res4); err != nil || !mine {
		t.Fatalf("fresh: %v %v", mine, err)
	}
}

func mustResult(t *testing.T, r *bus.Recorded) *protocol.ToolResult {
	t.Helper()
	res, err := r.Msg.DecodeToolResult()
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// A request's results are read in one batch; a batch that cannot include the result the
// caller holds is not taken.
func TestResultsReadsABatch(t *testing.T) {
	t.Parallel()
	b := bustest.NewServer(t).Provision(t, bus.Config{})
	ctx := t.Context()
	w := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleToolWorker, Instance: "w"})
	var last uint64
	for _, call := range []string{"a", "c"} {
		m, res := resultMsg(t, "r1", call, "s1", `"`+call+`"`, "")
		rec, _, err := b.RecordResult(ctx, w, m, res)
		if err != nil {
			t.Fatal(err)
		}
		last = rec.Seq
	}
	other, res := resultMsg(t, "r2", "a", "s1", `"other"`, "")
	if _, _, err := b.RecordResult(ctx, w, other, res); err != nil {
		t.Fatal(err)
	}
	got, err := b.Results(ctx, "r1", "s1", []string{"a", "b", "c"}, nil, last)
	if err != nil || len(got) != 2 || string(mustResult(t, got["a"]).Content) != `"a"` || string(mustResult(t, got["c"]).Content) != `"c"` {
		t.Fatalf("Results: %v %v", got, err)
	}
	if got, err := b.Results(ctx, "r9", "s1", []string{"a"}, nil, 0); err != nil || len(got) != 0 {
		t.Fatalf("no results: %v %v", got, err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := b.Results(short, "r1", "s1", []string{"a", "c"}, nil, last+100); err == nil {
		t.Fatal("a batch without the result held was taken")
	}
}

// The first response is the only one recorded, and the only one announced to callers awaiting
// it; Announce sends it again.
func TestRespondRecordsAndAnnouncesTheFirstResponse(t *testing.T) {
	t.Parallel()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{})
	ctx := t.Context()
	live := make(chan *nats.Msg, 8)
	listener := srv.Connect(t)
	sub, err := listener.ChanSubscribe(protocol.FilterLiveResponses, live)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := listener.Flush(); err != nil { // the server knows the subscription from here on
		t.Fatal(err)
	}
	r1 := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: "r1"})
	r2 := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: "r2"})
	if mine, err := b.Respond(ctx, r1, responseMsg(t, "q1", "s1", protocol.StatusSuccess)); err != nil || !mine {
		t.Fatalf("first: %v %v", mine, err)
	}
	late := responseMsg(t, "q1", "s1", protocol.StatusFailed)
	late.MsgID += ":late"
	if mine, err := b.Respond(ctx, r2, late); err != nil || mine {
		t.Fatalf("second: %v %v", mine, err)
	}
	announced := func() *protocol.Response {
		t.Helper()
		select {
		case msg := <-live:
			m, err := protocol.Unmarshal(msg.Data)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := m.DecodeResponse()
			if err != nil {
				t.Fatal(err)
			}
			return resp
		case <-time.After(5 * time.Second):
			t.Fatal("nothing announced")
			return nil
		}
	}
	// The stream announces the first; the responder that lost announces it again (a caller
	// may have missed it). The one that lost is never announced.
	for range 2 {
		if resp := announced(); resp.Status != protocol.StatusSuccess {
			t.Fatalf("announced %s", resp.Status)
		}
	}
	select {
	case msg := <-live:
		t.Fatalf("announced a third time: %s", msg.Data)
	case <-time.After(200 * time.Millisecond):
	}
	rec, resp, err := b.Response(ctx, "q1", "")
	if err != nil || resp.Status != protocol.StatusSuccess || rec.Msg.Sender.Instance != "r1" {
		t.Fatalf("Response: %+v %v", resp, err)
	}
	if err := b.Announce(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if resp := announced(); resp.Status != protocol.StatusSuccess {
		t.Fatalf("announced again %s", resp.Status)
	}
	for _, c := range []struct {
		rid, session string
		want         bool
	}{{"q1", "s1", true}, {"q1", "", true}, {"q2", "", false}, {"q1", "s2", false}} {
		if got, err := b.Answered(ctx, c.rid, c.session); err != nil || got != c.want {
			t.Errorf("Answered(%s, %q) = %v %v", c.rid, c.session, got, err)
		}
	}
}

// A record made before results and responses were kept on the stream alone gets direct reads
// and the announcement of stored responses, and the subjects it lacks.
func TestRecordFromBeforeTheStreamAlone(t *testing.T) {
	t.Parallel()
	srv := bustest.NewServer(t)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: protocol.StreamName, Subjects: []string{"hermes.request.*", "hermes.result.*", "hermes.response.*"}}); err != nil {
		t.Fatal(err)
	}
	b := srv.Provision(t, bus.Config{})
	cfg := b.Stream.CachedInfo().Config
	if !cfg.AllowDirect || cfg.RePublish == nil || len(b.Drift) == 0 {
		t.Fatalf("the old stream was not updated: direct %v, republish %+v, drift %v", cfg.AllowDirect, cfg.RePublish, b.Drift)
	}
	for _, s := range protocol.StreamSubjects() {
		if !slices.Contains(cfg.Subjects, s) {
			t.Errorf("the old stream does not capture %s", s)
		}
	}
	// What the stream captured before stays captured: nothing it holds is left unreachable.
	if !slices.Contains(cfg.Subjects, "hermes.response.*") {
		t.Errorf("subjects of the old stream were removed: %v", cfg.Subjects)
	}
	m, res := resultMsg(t, "new1", "a", "s1", `"new"`, "")
	if _, _, err := b.RecordResult(ctx, bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleToolWorker, Instance: "w"}), m, res); err != nil {
		t.Fatal(err)
	}
	if _, got, err := b.Result(ctx, "new1", "a", "s1", ""); err != nil || string(got.Content) != string(res.Content) {
		t.Fatalf("result recorded on the old stream: %v %v", got, err)
	}
}

// What a subject of a result or response holds counts only if it is one of that call or
// request: bytes no reader decodes, or a message of another call, is as good as nothing, and
// the first real one recorded supersedes it.
func TestRecordSupersedesWhatDoesNotCount(t *testing.T) {
	t.Parallel()
	b := bustest.NewServer(t).Provision(t, bus.Config{})
	ctx := t.Context()
	w := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleToolWorker, Instance: "w"})
	subject := protocol.SubjectResult("r1", "a", "s1")
	garbage, err := b.JS.Publish(ctx, subject, []byte("not msgpack"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Result(ctx, "r1", "a", "s1", ""); !errors.Is(err, bus.ErrNotFound) {
		t.Fatalf("garbage counted as a result: %v", err)
	}
	if got, err := b.Results(ctx, "r1", "s1", []string{"a"}, nil, garbage.Sequence); err != nil || len(got) != 0 {
		t.Fatalf("garbage in a batch: %v %v", got, err)
	}
	m, res := resultMsg(t, "r1", "a", "s1", `"real"`, "")
	rec, mine, err := b.RecordResult(ctx, w, m, res)
	if err != nil || !mine || rec.Seq <= garbage.Sequence {
		t.Fatalf("over garbage: %+v %v %v", rec, mine, err)
	}
	if _, got, err := b.Result(ctx, "r1", "a", "s1", ""); err != nil || string(got.Content) != `"real"` {
		t.Fatalf("read back: %+v %v", got, err)
	}
	// Another call's result on this call's subject: not this call's.
	forged, _ := resultMsg(t, "r2", "b", "s1", `"forged"`, "")
	data, _ := protocol.Marshal(forged)
	if _, err := b.JS.Publish(ctx, protocol.SubjectResult("r2", "c", "s1"), data); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Result(ctx, "r2", "c", "s1", ""); !errors.Is(err, bus.ErrNotFound) {
		t.Fatalf("another call's result counted: %v", err)
	}
	// A response subject holding garbage: not answered, and the first response supersedes it.
	if _, err := b.JS.Publish(ctx, protocol.SubjectResponse("q1", "s1"), []byte{0xdd, 0xff}); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Answered(ctx, "q1", ""); err != nil || ok {
		t.Fatalf("garbage answered a request: %v %v", ok, err)
	}
	r := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: "r"})
	if mine, err := b.Respond(ctx, r, responseMsg(t, "q1", "s1", protocol.StatusSuccess)); err != nil || !mine {
		t.Fatalf("over garbage: %v %v", mine, err)
	}
	if _, resp, err := b.Response(ctx, "q1", "s1"); err != nil || resp.Status != protocol.StatusSuccess {
		t.Fatalf("response: %+v %v", resp, err)
	}
}

// Responders writing at once on a cluster: one response is recorded, and every responder is
// told which (none fails for the write still in flight).
func TestRespondRacesOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a cluster test: skipped under -short")
	}
	c := bustest.NewCluster(t)
	b := c.Provision(t, bus.Config{Replicas: bustest.ClusterSize})
	ctx := t.Context()
	for i := range 20 {
		rid := "race" + string(rune('a'+i))
		type out struct {
			mine bool
			err  error
		}
		outs := make(chan out, 3)
		for j := range 3 {
			p := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: string(rune('x' + j))})
			m := responseMsg(t, rid, "s1", protocol.StatusSuccess)
			go func() {
				mine, err := b.Respond(ctx, p, m)
				outs <- out{mine, err}
			}()
		}
		won := 0
		for range 3 {
			o := <-outs
			if o.err != nil {
				t.Fatalf("%s: %v", rid, o.err)
			}
			if o.mine {
				won++
			}
		}
		if won != 1 {
			t.Fatalf("%s: %d responders were told theirs was recorded", rid, won)
		}
	}
}

// The record can be bounded in messages; by default it is bounded by age alone (it is also
// the work queue: a message limit drops work not yet done).
func TestRecordMessageLimit(t *testing.T) {
	t.Parallel()
	b := bustest.NewServer(t).Provision(t, bus.Config{MaxMsgs: 10})
	if got := b.Stream.CachedInfo().Config.MaxMsgs; got != 10 {
		t.Fatalf("record limit %d", got)
	}
	if def := bustest.NewServer(t).Provision(t, bus.Config{}); def.Stream.CachedInfo().Config.MaxMsgs != -1 {
		t.Fatalf("default limit %d", def.Stream.CachedInfo().Config.MaxMsgs)
	}
}

// Provisioning again with the same settings reports no drift: a stream whose limits this
// process leaves unset is not said to differ.
func TestProvisionAgainReportsNoDrift(t *testing.T) {
	t.Parallel()
	srv := bustest.NewServer(t)
	srv.Provision(t, bus.Config{})
	if again := srv.Provision(t, bus.Config{}); len(again.Drift) != 0 {
		t.Fatalf("drift: %v", again.Drift)
	}
}
