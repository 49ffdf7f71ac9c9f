package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
)

// A call tried on the fast lane, its first try failing (BUSY): the record says try 1 and try 2
// retrying what try 1 failed with, whether the durable path takes the call over from the fast
// lane (its router waited too little for a second try) or records the fast lane's answer that
// no router recorded (its router gave up on it).
func TestTheFastLanesTriesReachTheRecord(t *testing.T) {
	for _, c := range []struct {
		within, outcome string
	}{{"100ms", protocol.FastRetry}, {"5s", protocol.FastAnswered}} {
		t.Run(c.outcome, func(t *testing.T) { fastTriesReachTheRecord(t, c.within, c.outcome) })
	}
}

func fastTriesReachTheRecord(t *testing.T, within, outcome string) {
	b := bustest.NewServer(t).Provision(t, bus.Config{})
	var tries atomic.Int64
	funcs, _ := worker.NewFuncs(map[string]worker.Func{"t": func(_ context.Context, args json.RawMessage) (any, error) {
		if tries.Add(1) == 1 {
			return nil, &worker.ToolError{Code: "BUSY", Retryable: true, Err: errors.New("busy")}
		}
		return json.RawMessage(args), nil
	}})
	w, err := worker.New(worker.Config{Bus: b, Instance: "w1", Executors: []worker.Executor{funcs}, Tools: []string{"t"}, FastLane: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	nc := b.JS.Conn()
	var mu sync.Mutex
	var starts []protocol.ToolStarted
	sub, err := nc.Subscribe(protocol.SubjectEvent(protocol.EventToolStarted, "s"), func(msg *nats.Msg) {
		m, err := protocol.Unmarshal(msg.Data)
		if err != nil {
			return
		}
		s, err := m.DecodeToolStarted()
		if err != nil {
			return
		}
		mu.Lock()
		starts = append(starts, *s)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	action := protocol.Action{Kind: protocol.ActionGo, TimeoutMS: 5000,
		Retry: protocol.RetryPolicy{MaxAttempts: 3, BackoffFactor: 1, InitialIntervalMS: 500, MaxIntervalMS: 500}}
	m, err := protocol.NewMessage(protocol.TypeToolCall, &protocol.Dispatch{Call: protocol.ToolCall{ToolCallID: "c", Name: "t", Arguments: json.RawMessage(`{}`)},
		Route: "rule", Action: action, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDToolCall("r_fast", "c"), "r_fast", "s"
	m.Correlation = &protocol.Correlation{CallIDs: []string{"c"}}
	m.Sender = protocol.Sender{Role: protocol.RoleRouter, Instance: "test-router"}
	if _, err := b.EnsureToolConsumer(t.Context(), protocol.ActionGo, "t"); err != nil {
		t.Fatal(err)
	}
	// The fast lane: the worker must be serving it first.
	data, err := protocol.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var reply *nats.Msg
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		reply, err = nc.RequestMsg(&nats.Msg{Subject: protocol.SubjectFastCall(protocol.ActionGo, "t"), Data: data,
			Header: nats.Header{bus.HeaderFastWithin: []string{within}}}, 10*time.Second)
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if got := reply.Header.Get(bus.HeaderFast); got != outcome {
		t.Fatalf("fast outcome %q (%s)", got, reply.Data)
	}
	// The durable path takes the same call over (no router recorded an answer).
	pub := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: "test-router"})
	if _, err := pub.Publish(t.Context(), protocol.SubjectToolCall(protocol.ActionGo, "t", "s"), m); err != nil {
		t.Fatal(err)
	}
	var res *protocol.ToolResult
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline) && res == nil; time.Sleep(10 * time.Millisecond) {
		if _, r, err := b.Result(t.Context(), "r_fast", "c", "s", ""); err == nil {
			res = r
		}
	}
	if res == nil {
		t.Fatal("no result")
	}
	// The starts are published before the result, on another path to this subscriber: wait
	// for both to arrive.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := len(starts)
		mu.Unlock()
		if n >= 2 {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(starts, func(i, j int) bool { return starts[i].Attempt < starts[j].Attempt })
	t.Logf("result attempts=%d status=%s; starts %+v", res.Attempts, res.Status, starts)
	if len(starts) != 2 || starts[0].Attempt != 1 || starts[1].Attempt != 2 || starts[1].Retrying != "TOOL_FAILED" && starts[1].Retrying != "BUSY" {
		t.Errorf("want starts of try 1 and of try 2 retrying the fast lane's code; got %+v", starts)
	}
}
