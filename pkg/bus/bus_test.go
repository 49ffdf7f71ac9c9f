package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

func publishResult(t *testing.T, p *bus.Publisher, req, call string) *jetstream.PubAck {
	t.Helper()
	m, err := protocol.NewMessage(protocol.TypeToolResult, &protocol.ToolResult{ToolCallID: call, Status: protocol.ResultOK})
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDToolResult(req, call), req, "s1"
	ack, err := p.Publish(context.Background(), protocol.SubjectRedrivenResult("s1"), m)
	if err != nil {
		t.Fatal(err)
	}
	return ack
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPublishDeduplicatesByMsgID(t *testing.T) {
	t.Parallel()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{})
	p := bus.NewPublisher(b.JS, protocol.Sender{Role: "test", Instance: "t1"})
	if ack := publishResult(t, p, "r1", "c1"); ack.Duplicate {
		t.Fatal("first publish reported as duplicate")
	}
	if ack := publishResult(t, p, "r1", "c1"); !ack.Duplicate {
		t.Fatal("second publish of the same logical message was stored again")
	}
}

func TestSubscriberSettlesByHandlerResult(t *testing.T) {
	t.Parallel()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{})
	p := bus.NewPublisher(b.JS, protocol.Sender{Role: "test", Instance: "t1"})
	cons, err := b.Consumer(context.Background(), bus.ConsumerRouterResults)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	deliveries := map[string][]uint64{}
	h := bus.HandlerFunc(func(ctx context.Context, d *bus.Delivery) error {
		m, err := protocol.Unmarshal(d.Data)
		if err != nil {
			return bus.Permanent(err)
		}
		mu.Lock()
		deliveries[m.MsgID] = append(deliveries[m.MsgID], d.NumDelivered)
		mu.Unlock()
		switch {
		case m.RequestID == "retry" && d.NumDelivered < 3:
			return bus.RetryAfter(errors.New("try again"), 10*time.Millisecond)
		case m.RequestID == "term":
			return bus.Permanent(errors.New("never"))
		case m.RequestID == "panic" && d.NumDelivered == 1:
			panic("boom")
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&bus.Subscriber{Consumer: cons, Handler: h, Concurrency: 4}).Run(ctx) }()
	for _, r := range []string{"ok", "retry", "term", "panic"} {
		publishResult(t, p, r, "c")
	}
	count := func(id string) int { mu.Lock(); defer mu.Unlock(); return len(deliveries[id]) }
	waitFor(t, "retries", func() bool { return count(protocol.MsgIDToolResult("retry", "c")) == 3 })
	waitFor(t, "panic redelivery", func() bool { return count(protocol.MsgIDToolResult("panic", "c")) == 2 })
	waitFor(t, "all acked", func() bool {
		info, err := cons.Info(context.Background())
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
	if n := count(protocol.MsgIDToolResult("ok", "c")); n != 1 {
		t.Errorf("acked message delivered %d times", n)
	}
	if n := count(protocol.MsgIDToolResult("term", "c")); n != 1 {
		t.Errorf("terminated message delivered %d times", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v", err)
	}
}

func TestSubscriberBoundsConcurrency(t *testing.T) {
	t.Parallel()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{})
	p := bus.NewPublisher(b.JS, protocol.Sender{Role: "test", Instance: "t1"})
	cons, _ := b.Consumer(context.Background(), bus.ConsumerRouterResults)
	var running, peak, handled atomic.Int32
	release := make(chan struct{})
	h := bus.HandlerFunc(func(ctx context.Context, d *bus.Delivery) error {
		n := running.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		running.Add(-1)
		handled.Add(1)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&bus.Subscriber{Consumer: cons, Handler: h, Concurrency: 3}).Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v", err)
		}
	}()
	for i := range 10 {
		publishResult(t, p, "r", string(rune('a'+i)))
	}
	waitFor(t, "3 running", func() bool { return running.Load() == 3 })
	close(release)
	waitFor(t, "all handled", func() bool { return handled.Load() == 10 })
	if peak.Load() != 3 {
		t.Fatalf("peak concurrency %d, want 3", peak.Load())
	}
}

func TestToolConsumerCreatedLateDoesNotReplayHistory(t *testing.T) {
	t.Parallel()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{})
	p := bus.NewPublisher(b.JS, protocol.Sender{Role: "test", Instance: "t1"})
	publish := func(id string) {
		m, _ := protocol.NewMessage(protocol.TypeToolCall, &protocol.Dispatch{})
		m.MsgID, m.RequestID, m.SessionID = id, id, "s"
		if _, err := p.Publish(context.Background(), protocol.SubjectToolCall(protocol.ActionHTTP, "echo", "s"), m); err != nil {
			t.Fatal(err)
		}
	}
	publish("before")
	all, err := b.EnsureToolConsumer(context.Background(), protocol.ActionHTTP, "echo")
	if err != nil {
		t.Fatal(err)
	}
	cons := all[0]
	publish("after")
	// A second Ensure (another router) must keep the consumer's position.
	if _, err := b.EnsureToolConsumer(context.Background(), protocol.ActionHTTP, "echo"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the consumer to see the new call", func() bool {
		info, err := cons.Info(context.Background())
		return err == nil && info.NumPending >= 1
	})
	batch, err := cons.FetchNoWait(10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for msg := range batch.Messages() {
		got = append(got, msg.Headers().Get(jetstream.MsgIDHeader))
	}
	if len(got) != 1 || got[0] != "after" {
		t.Fatalf("consumer delivered %v, want only the call published after it was created", got)
	}
	if _, err := b.Tools.Get(context.Background(), protocol.KeyTool(protocol.ActionHTTP, "echo")); err != nil {
		t.Fatalf("tool not listed: %v", err)
	}
	if _, err := b.EnsureToolConsumer(context.Background(), protocol.ActionHTTP, "a.>"); err == nil {
		t.Fatal("EnsureToolConsumer accepted a tool name that is not a subject token")
	}
	if _, err := b.EnsureToolConsumer(context.Background(), "smtp", "echo"); err == nil {
		t.Fatal("EnsureToolConsumer accepted an unknown action kind")
	}
}

// TestSubscriberShutdownIsBounded: once ctx is done no new handler starts, and handlers still
// running after Grace are cancelled, so Run returns within about Grace + PullWait.
func TestSubscriberShutdownIsBounded(t *testing.T) {
	t.Parallel()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{})
	p := bus.NewPublisher(b.JS, protocol.Sender{Role: "test", Instance: "t1"})
	cons, _ := b.Consumer(context.Background(), bus.ConsumerRouterResults)
	var started atomic.Int32
	h := bus.HandlerFunc(func(ctx context.Context, d *bus.Delivery) error {
		started.Add(1)
		<-ctx.Done() // a handler that only stops when cancelled
		return ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- (&bus.Subscriber{Consumer: cons, Handler: h, Concurrency: 2, Grace: 100 * time.Millisecond,
			PullWait: 200 * time.Millisecond}).Run(ctx)
	}()
	for i := range 5 {
		publishResult(t, p, "r", string(rune('a'+i)))
	}
	waitFor(t, "2 handlers", func() bool { return started.Load() == 2 })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its grace period")
	}
	if n := started.Load(); n != 2 {
		t.Fatalf("%d handlers started; none may start after shutdown began", n)
	}
}

func TestEveryRunsUntilStopped(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	stop := bus.Every(5*time.Millisecond, func() { n.Add(1) })
	waitFor(t, "three runs", func() bool { return n.Load() >= 3 })
	stop()
	after := n.Load()
	stop()                            // twice is fine
	time.Sleep(30 * time.Millisecond) // time for runs that must not happen
	if n.Load() != after {
		t.Fatalf("ran %d more times after stop", n.Load()-after)
	}
}

func TestPublishBatch(t *testing.T) {
	t.Parallel()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{})
	p := bus.NewPublisher(b.JS, protocol.Sender{Role: "test", Instance: "t1"})
	var batch []bus.Outgoing
	for i := range 5 {
		m, _ := protocol.NewMessage(protocol.TypeToolResult, &protocol.ToolResult{ToolCallID: "c", Status: protocol.ResultOK})
		m.MsgID, m.RequestID, m.SessionID = fmt.Sprintf("batch-%d", i), "r", "s1"
		batch = append(batch, bus.Outgoing{Subject: protocol.SubjectRedrivenResult("s1"), Msg: m})
	}
	ctx := context.Background()
	for range 2 { // the second time, every message is a duplicate
		if err := p.PublishBatch(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	info, err := b.Stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 5 {
		t.Fatalf("%d messages stored, want 5", info.State.Msgs)
	}
	bad := []bus.Outgoing{batch[0], {Subject: "hermes.nowhere", Msg: batch[1].Msg}}
	if err := p.PublishBatch(ctx, bad); err == nil {
		t.Fatal("a publish to a subject no stream takes was not reported")
	}
}

// TestSubscriberLosesNothingUnderLoad pulls with a short wait while the CPU is saturated, so
// pulls often end while the server is still sending: every message must still be handled at
// once. A pull that dropped what the client had buffered when it ended would leave those
// messages pending until their ack deadline (here far beyond the test's wait), which is what
// a fetch bound to a context did.
func TestSubscriberLosesNothingUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("a load test: skipped under -short")
	}
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{AckWait: 10 * time.Minute})
	cons, err := b.Consumer(context.Background(), bus.ConsumerRouterResults)
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = (&bus.Subscriber{Consumer: cons, Concurrency: 64, PullWait: 20 * time.Millisecond,
			Handler: bus.HandlerFunc(func(context.Context, *bus.Delivery) error { handled.Add(1); return nil })}).Run(ctx)
	}()
	defer func() { cancel(); <-done }()
	spin, stopSpin := context.WithCancel(context.Background())
	defer stopSpin()
	for range 4 {
		go func() {
			for x := 0; spin.Err() == nil; x++ {
			}
		}()
	}
	const clients, each = 32, 100
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("r%d-%d", c, i)
				msg := &nats.Msg{Subject: protocol.SubjectRedrivenResult(id), Data: make([]byte, 200), Header: nats.Header{jetstream.MsgIDHeader: []string{id}}}
				if _, err := b.JS.PublishMsg(context.Background(), msg); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(time.Duration(i%5) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	stopSpin()
	deadline := time.Now().Add(60 * time.Second)
	for handled.Load() < clients*each && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := handled.Load(); got != clients*each {
		info, _ := cons.Info(context.Background())
		t.Fatalf("handled %d of %d messages; %d wait for their ack deadline", got, clients*each, info.NumAckPending)
	}
}

// TestRequestsArePartitionedBySession checks that the stream stores each request under the
// partition protocol.RequestPartition computes (the server's function) for the number of
// partitions the record was provisioned with, so tools that name stored subjects agree with
// the server.
func TestRequestsArePartitionedBySession(t *testing.T) {
	t.Parallel()
	for _, n := range []int{16, 5, protocol.MaxRequestPartitions} {
		srv := bustest.NewServer(t)
		b := srv.Provision(t, bus.Config{Partitions: n})
		if b.Partitions() != n {
			t.Fatalf("provisioned with %d partitions, the bus says %d", n, b.Partitions())
		}
		seen := map[int]bool{}
		for i := range 64 {
			session := fmt.Sprintf("sess-%d", i)
			if got, want := publishRequest(t, b, session), b.StoredSubjectRequest(session); got != want {
				t.Fatalf("%d partitions: stored as %s, want %s", n, got, want)
			}
			seen[protocol.RequestPartition(session, n)] = true
		}
		if len(seen) < min(n, 64)/2 {
			t.Fatalf("64 sessions fell in only %d of %d partitions", len(seen), n)
		}
		_, cons, err := b.RequestConsumers(context.Background())
		if err != nil || len(cons) != n {
			t.Fatalf("%d partitions: %d consumers (%v)", n, len(cons), err)
		}
	}
}

func TestRedactHidesEveryServersCredentials(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"nats://u:secret@a:4222":                        "nats://***@a:4222",
		"nats://u:secret@a:4222,nats://u:secret@b:4222": "nats://***@a:4222,nats://***@b:4222",
		"nats://a:4222,nats://tok@b:4222,nats://c:4222": "nats://a:4222,nats://***@b:4222,nats://c:4222",
		"nats://127.0.0.1:4222":                         "nats://127.0.0.1:4222",
	} {
		if got := bus.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestProvisionRefusesAnUnorderedPartitionConsumer: a request partition consumer that allows
// more than one message in flight would lose each session's order; provisioning says so.
func TestProvisionRefusesAnUnorderedPartitionConsumer(t *testing.T) {
	t.Parallel()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{})
	ctx := context.Background()
	name := bus.RequestConsumer(3)
	if err := b.Stream.DeleteConsumer(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy,
		FilterSubject: protocol.FilterRequestPartition(3), MaxAckPending: 64}); err != nil {
		t.Fatal(err)
	}
	_, err := bus.Provision(ctx, b.JS, bus.Config{})
	if err == nil || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "must allow 1") {
		t.Fatalf("Provision: %v; want an error naming %s", err, name)
	}
}

// TestProvisionOpenOnly: a client that opens the bus creates nothing, and says what is missing.
func TestProvisionOpenOnly(t *testing.T) {
	t.Parallel()
	srv := bustest.NewServer(t)
	nc := srv.Connect(t)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	if _, err := bus.Provision(ctx, js, bus.Config{OpenOnly: true}); !errors.Is(err, bus.ErrNotProvisioned) || !strings.Contains(err.Error(), protocol.StreamName) {
		t.Fatalf("open before any service: %v", err)
	}
	if _, err := js.Stream(ctx, protocol.StreamName); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("opening created the stream: %v", err)
	}
	srv.Provision(t, bus.Config{Replicas: 1})
	b, err := bus.Provision(ctx, js, bus.Config{OpenOnly: true, MaxAge: time.Hour})
	if err != nil || len(b.Drift) != 0 || b.Parked == nil || b.Timers == nil {
		t.Fatalf("open after a service: %v, drift %v", err, b.Drift)
	}
}

// Subscribers sharing a pool run at most its size of handlers between them, each within its
// own bound too; one in another pool is not held back by them (a bulkhead).
func TestSubscribersShareAPool(t *testing.T) {
	t.Parallel()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := bus.NewPublisher(b.JS, protocol.Sender{Role: "test", Instance: "t1"})
	heavy, light := bus.NewPool(2), bus.NewPool(4)
	var running [3]atomic.Int32
	var peakHeavy atomic.Int32
	release := make(chan struct{})
	var lightDone atomic.Int32
	for i, tool := range []string{"slow_a", "slow_b", "quick"} {
		cons, err := b.EnsureToolConsumer(ctx, protocol.ActionHTTP, tool)
		if err != nil {
			t.Fatal(err)
		}
		pool := heavy
		if tool == "quick" {
			pool = light
		}
		h := bus.HandlerFunc(func(ctx context.Context, d *bus.Delivery) error {
			running[i].Add(1)
			defer running[i].Add(-1)
			if tool == "quick" {
				lightDone.Add(1)
				return nil
			}
			if n := running[0].Load() + running[1].Load(); n > peakHeavy.Load() {
				peakHeavy.Store(n)
			}
			<-release
			return nil
		})
		go func() {
			_ = (&bus.Subscriber{Consumer: cons[0], Handler: h, Concurrency: 8, Pool: func() *bus.Pool { return pool }}).Run(ctx)
		}()
		for j := range 5 {
			m, _ := protocol.NewMessage(protocol.TypeToolCall, &protocol.Dispatch{})
			m.MsgID, m.RequestID, m.SessionID = tool+strconv.Itoa(j), tool+strconv.Itoa(j), "s"
			if _, err := p.Publish(ctx, protocol.SubjectToolCall(protocol.ActionHTTP, tool, "s"), m); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitFor(t, "the heavy pool full", func() bool { return heavy.InUse() == 2 })
	waitFor(t, "every light call done while the heavy ones wait", func() bool { return lightDone.Load() == 5 })
	time.Sleep(100 * time.Millisecond) // more heavy handlers would have started by now
	if n := running[0].Load() + running[1].Load(); n != 2 || peakHeavy.Load() > 2 {
		t.Fatalf("%d heavy handlers running (peak %d) in a pool of 2", n, peakHeavy.Load())
	}
	close(release)
	waitFor(t, "the heavy pool free", func() bool { return heavy.InUse() == 0 && running[0].Load()+running[1].Load() == 0 })
}
