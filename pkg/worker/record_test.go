package worker_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/ledger"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
)

// TestAWorkerReadsNoMessageOfTheRecord: a worker connected as a tool worker's NATS user —
// which may get no message of the record — retries, records, skips a call the ledger says is
// finished when it is delivered again, leaves a result recorded first for a call the ledger
// says is settled (a cancellation's) standing, records its result after bytes that are no result, and a re-driven call's result
// after the answer it supersedes; the server refuses it nothing all along.
func TestAWorkerReadsNoMessageOfTheRecord(t *testing.T) {
	t.Parallel()
	s := bustest.NewLockedServer(t)
	admin := s.Provision(t, bus.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(s.ConnectAs(t, bus.RoleWorker))
	if err != nil {
		t.Fatal(err)
	}
	wb, err := bus.Provision(ctx, js, bus.Config{NoProvision: true})
	if err != nil {
		t.Fatal(err)
	}
	_, sealKey, _ := ed25519.GenerateKey(rand.Reader)
	wb.SealResults("w1", sealKey)
	var runs atomic.Int64
	w, err := worker.New(worker.Config{Bus: wb, Instance: "w1", Tools: []string{"t"},
		Executors: []worker.Executor{goFunc(func(_ context.Context, args json.RawMessage) (any, error) {
			if runs.Add(1) == 1 {
				return nil, &worker.ToolError{Code: "BUSY", Retryable: true, Err: errors.New("busy")}
			}
			return json.RawMessage(args), nil
		})}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	}()
	all, err := admin.EnsureToolConsumer(ctx, protocol.ActionGo, "t")
	if err != nil {
		t.Fatal(err)
	}
	cons := all[0]
	// dispatch publishes a call and returns once the worker has acknowledged it.
	dispatch := func(rid, msgID string, hdr nats.Header) {
		t.Helper()
		m, err := protocol.NewMessage(protocol.TypeToolCall, &protocol.Dispatch{Call: protocol.ToolCall{ToolCallID: "c", Name: "t", Arguments: json.RawMessage(`{"n":1}`)},
			Route: "rule", Action: protocol.Action{Kind: protocol.ActionGo, TimeoutMS: 5000,
				Retry: protocol.RetryPolicy{MaxAttempts: 3, BackoffFactor: 1, InitialIntervalMS: 10, MaxIntervalMS: 10}}})
		if err != nil {
			t.Fatal(err)
		}
		m.MsgID, m.RequestID, m.SessionID, m.Sender = msgID, rid, "s", protocol.Sender{Role: protocol.RoleRouter, Instance: "r"}
		m.Correlation = &protocol.Correlation{CallIDs: []string{"c"}}
		data, err := protocol.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		msg := &nats.Msg{Subject: protocol.SubjectToolCall(protocol.ActionGo, "t", "s"), Data: data, Header: nats.Header{}}
		for k, v := range hdr {
			msg.Header[k] = v
		}
		msg.Header.Set(jetstream.MsgIDHeader, msgID)
		msg.Header.Set(bus.HeaderType, string(protocol.TypeToolCall))
		ack, err := admin.JS.PublishMsg(ctx, msg)
		if err != nil {
			t.Fatal(err)
		}
		for ctx.Err() == nil {
			if info, err := cons.Info(ctx); err == nil && info.AckFloor.Stream >= ack.Sequence {
				return
			}
			time.Sleep(10 * time.Millisecond) // polling the consumer's acknowledgements
		}
		t.Fatalf("the worker never acknowledged %s", msgID)
	}
	result := func(rid string) (*bus.Recorded, *protocol.ToolResult) {
		t.Helper()
		for ctx.Err() == nil {
			if rec, res, err := admin.Result(ctx, rid, "c", "s", ""); err == nil {
				return rec, res
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("no result of %s", rid)
		return nil, nil
	}
	onSubject := func(rid string) int {
		t.Helper()
		subject := protocol.SubjectResult(rid, "c", "s")
		info, err := admin.Stream.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			t.Fatal(err)
		}
		return int(info.State.Subjects[subject])
	}

	// Retried, recorded, the ledger told.
	dispatch("r1", protocol.MsgIDToolCall("r1", "c"), nil)
	if _, res := result("r1"); res.Status != protocol.ResultOK || res.Attempts != 2 || res.Name != "t" {
		t.Fatalf("result %+v", res)
	}
	// Delivered again (say its acknowledgement was lost): not run again, nothing recorded.
	dispatch("r1", "again", nil)
	if n := runs.Load(); n != 2 {
		t.Fatalf("the tool ran %d times, want 2", n)
	}
	if n := onSubject("r1"); n != 1 {
		t.Fatalf("%d messages on the call's subject, want its one result", n)
	}

	// A result recorded first (a cancellation's, by the gateway, which marked the ledger
	// first) stands: the worker's own CANCELLED does not follow it.
	if err := ledger.Cancel(ctx, admin.Claims, ledger.Key("r2", "c")); err != nil {
		t.Fatal(err)
	}
	cancelled := protocol.CancelledResult(&protocol.ToolCall{ToolCallID: "c", Name: "t"}, "rule", 0, "test")
	cm, _ := protocol.NewMessage(protocol.TypeToolResult, &cancelled)
	cm.MsgID, cm.RequestID, cm.SessionID = protocol.MsgIDToolResult("r2", "c"), "r2", "s"
	if _, mine, err := admin.RecordResult(ctx, bus.NewPublisher(admin.JS, protocol.Sender{Role: protocol.RoleGateway, Instance: "g"}), cm, &cancelled); err != nil || !mine {
		t.Fatalf("cancellation's result: %v %v", mine, err)
	}
	dispatch("r2", protocol.MsgIDToolCall("r2", "c"), nil)
	if _, res := result("r2"); res.ErrorCode != protocol.CodeCancelled || onSubject("r2") != 1 {
		t.Fatalf("the call's result is %+v, with %d messages on its subject; want the cancellation's alone", res, onSubject("r2"))
	}

	// Bytes that are no result, put first on a call's subject with a worker's credential and
	// under the message id a result of the call would have, do not keep the worker's result
	// off the record: it follows them, and readers find it.
	junk := &nats.Msg{Subject: protocol.SubjectResult("r4", "c", "s"), Data: []byte("junk"), Header: nats.Header{}}
	junk.Header.Set(jetstream.MsgIDHeader, protocol.MsgIDToolResult("r4", "c"))
	junk.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	if _, err := js.PublishMsg(ctx, junk); err != nil {
		t.Fatal(err)
	}
	dispatch("r4", protocol.MsgIDToolCall("r4", "c"), nil)
	if _, res := result("r4"); res.Status != protocol.ResultOK || onSubject("r4") != 2 {
		t.Fatalf("the call's result is %+v, with %d messages on its subject; want the tool's after the junk", res, onSubject("r4"))
	}

	// Re-driven over the dead-letter processor's answer: recorded after it, superseding it.
	dead := protocol.ErrorResult(protocol.CodeDeadLettered, protocol.OriginHermes, "gave up", "gave up")
	dead.ToolCallID, dead.Name = "c", "t"
	dm, _ := protocol.NewMessage(protocol.TypeToolResult, &dead)
	dm.MsgID, dm.RequestID, dm.SessionID = protocol.MsgIDToolResult("r3", "c"), "r3", "s"
	drec, _, err := admin.RecordResult(ctx, bus.NewPublisher(admin.JS, protocol.Sender{Role: protocol.RoleDeadLetter, Instance: "d"}), dm, &dead)
	if err != nil {
		t.Fatal(err)
	}
	after, err := admin.RedriveAfter(ctx, "r3", "c", "s", "t")
	if err != nil || after != drec.Seq {
		t.Fatalf("RedriveAfter = %d, %v; want %d", after, err, drec.Seq)
	}
	hdr := nats.Header{}
	hdr.Set(bus.HeaderRedrive, "rd1")
	hdr.Set(bus.HeaderRedriveAfter, strconv.FormatUint(after, 10))
	dispatch("r3", "redrive-1", hdr)
	for ctx.Err() == nil {
		if _, res := result("r3"); res.Status == protocol.ResultOK {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := admin.RedriveAfter(ctx, "r3", "c", "s", "t"); !errors.Is(err, bus.ErrAnswered) {
		t.Fatalf("a call with its tool's result is re-drivable: %v", err)
	}
	if attempt, _ := ledger.Last(ctx, admin.Claims, ledger.Key("r3", "c")); attempt != 1 {
		t.Errorf("the re-driven call's ledger says try %d, want 1", attempt)
	}
	if v := s.Violations(); len(v) != 0 {
		t.Fatalf("the worker was refused: %v", v)
	}
}
