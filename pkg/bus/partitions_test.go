package bus_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// publishRequest records a request of session the way the gateway does (before the
// transform), and returns the subject it was stored under.
func publishRequest(t *testing.T, b *bus.Bus, session string) string {
	t.Helper()
	msg := &nats.Msg{Subject: protocol.SubjectRequest(session), Data: []byte("x"), Header: nats.Header{jetstream.MsgIDHeader: []string{"r-" + session}}}
	ack, err := b.JS.PublishMsg(context.Background(), msg)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := b.Stream.GetMsg(context.Background(), ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	return raw.Subject
}

// routeAll takes and acks every request waiting in b's partitions, as routers would.
func routeAll(t *testing.T, b *bus.Bus) {
	t.Helper()
	ctx := context.Background()
	_, cons, err := b.RequestConsumers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cons {
		for {
			info, err := c.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.NumPending+uint64(info.NumAckPending) == 0 {
				break
			}
			batch, err := c.Fetch(1, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			for m := range batch.Messages() {
				if err := m.DoubleAck(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

func consumerNames(t *testing.T, b *bus.Bus) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	names := b.Stream.ConsumerNames(context.Background())
	for n := range names.Name() {
		out[n] = true
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestRepartitionSpreadsRequestsOverTheNewNumber(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{Partitions: 8})
	done, err := b.Repartition(ctx, 3)
	if err != nil || done.Before != 8 || done.After != 3 || len(done.Kept)+len(done.Raced) > 0 {
		t.Fatalf("Repartition(3) = %+v, %v", done, err)
	}
	names := consumerNames(t, b)
	for p := range 8 {
		if want := p < 3; names[bus.RequestConsumer(p)] != want {
			t.Errorf("partition %d's consumer exists: %t, want %t", p, names[bus.RequestConsumer(p)], want)
		}
	}
	if got := publishRequest(t, b, "s_after"); got != protocol.StoredSubjectRequest("s_after", 3) {
		t.Errorf("a request after the change stored as %s, want %s", got, protocol.StoredSubjectRequest("s_after", 3))
	}
	routeAll(t, b)
	// Every process that opens the bus now finds 3, whatever it was configured with: a
	// difference is reported, not applied.
	other, err := bus.Provision(ctx, b.JS, bus.Config{Partitions: 16})
	if err != nil {
		t.Fatal(err)
	}
	if other.Partitions() != 3 || !strings.Contains(strings.Join(other.Drift, "\n"), "over 3 partitions, this process was configured with 16") {
		t.Fatalf("a process configured with 16 partitions: has %d, drift %q", other.Partitions(), other.Drift)
	}
	if _, err := b.Repartition(ctx, 20); err != nil {
		t.Fatal(err)
	}
	if _, cons, err := b.RequestConsumers(ctx); err != nil || len(cons) != 20 {
		t.Fatalf("after growing to 20: %d consumers, %v", len(cons), err)
	}
	for _, n := range []int{0, -1, protocol.MaxRequestPartitions + 1} {
		if _, err := b.Repartition(ctx, n); err == nil || !strings.Contains(err.Error(), fmt.Sprint(n)) {
			t.Errorf("Repartition(%d): %v, want it refused", n, err)
		}
	}
}

func TestRepartitionWaitsForRequestsToBeRouted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{Partitions: 4})
	publishRequest(t, b, "s_waiting")
	_, err := b.Repartition(ctx, 2)
	if err == nil || !strings.Contains(err.Error(), "not yet routed") {
		t.Fatalf("Repartition with a request waiting: %v, want it refused", err)
	}
	if b.Partitions() != 4 || publishRequest(t, b, "s_next") != protocol.StoredSubjectRequest("s_next", 4) {
		t.Fatal("a refused change changed the partitions")
	}
	// Routed (acked on the consumer a router reads): the change goes ahead.
	routeAll(t, b)
	if _, err := b.Repartition(ctx, 2); err != nil {
		t.Fatalf("Repartition once routed: %v", err)
	}
}

func TestRepartitionRefusesWhileARouterReads(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{Partitions: 4})
	c, err := b.Consumer(ctx, bus.RequestConsumer(1))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { // a router's reading of one partition: one request at a time, pull after pull
		ran <- (&bus.Subscriber{Consumer: c, Handler: bus.HandlerFunc(func(context.Context, *bus.Delivery) error { return nil }), Concurrency: 1}).Run(rctx)
	}()
	defer func() { stop(); <-ran }()
	_, err = b.Repartition(ctx, 8)
	if err == nil || !strings.Contains(err.Error(), "a router reads request partition 1") {
		t.Fatalf("Repartition while a router reads: %v, want it refused", err)
	}
	if b.Partitions() != 4 {
		t.Fatalf("a refused change left %d partitions", b.Partitions())
	}
}

// sessionIn returns a session whose requests a record of n partitions puts in partition p.
func sessionIn(t *testing.T, p, n int, prefix string) string {
	t.Helper()
	for i := range 100_000 {
		if s := fmt.Sprintf("%s_%d", prefix, i); protocol.RequestPartition(s, n) == p {
			return s
		}
	}
	t.Fatalf("no session in partition %d of %d", p, n)
	return ""
}

func pending(t *testing.T, b *bus.Bus, p int) uint64 {
	t.Helper()
	c, err := b.Consumer(context.Background(), bus.RequestConsumer(p))
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.NumPending + uint64(info.NumAckPending)
}

// TestRepartitionLosesNothingAGatewaySendsMeanwhile: with a gateway still running, a request
// sent into a partition just added is routed (its consumer existed before the transform
// changed), one sent under the old number into a partition that goes keeps that partition
// (read by routers, deleted once routed), and one sent into a partition that stays is named as
// raced. Not parallel: it hooks Repartition.
func TestRepartitionLosesNothingAGatewaySendsMeanwhile(t *testing.T) {
	ctx := context.Background()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{Partitions: 4})
	grown := sessionIn(t, 6, 8, "grown")
	var stored string
	bus.OnRepartitionStep(t.Cleanup, func(step string) {
		if step == "after the transform" {
			stored = publishRequest(t, b, grown) // stored in partition 6, just added
		}
	})
	done, err := b.Repartition(ctx, 8)
	if err != nil || done.After != 8 {
		t.Fatalf("Repartition(8) = %+v, %v", done, err)
	}
	// A consumer learns of a stored message asynchronously (the stream signals its consumers
	// from a queue): its count of pending messages may lag the publish's ack for a moment.
	var n uint64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if n = pending(t, b, 6); n == 1 || time.Now().After(deadline) {
			break
		}
	}
	if n != 1 {
		t.Fatalf("the request sent into partition 6 as it was added (stored as %s) waits there %d times, want 1 (lost: its consumer began after it)", stored, n)
	}
	routeAll(t, b)

	left := sessionIn(t, 5, 8, "left")   // partition 5 of 8 goes when shrinking to 3
	stays := sessionIn(t, 1, 8, "stays") // partition 1 stays
	bus.OnRepartitionStep(t.Cleanup, func(step string) {
		if step == "before the transform" {
			publishRequest(t, b, left)
			publishRequest(t, b, stays)
		}
	})
	done, err = b.Repartition(ctx, 3)
	if err != nil || !slices.Equal(done.Kept, []int{5}) || !slices.Equal(done.Raced, []int{1, 5}) {
		t.Fatalf("Repartition(3) with requests sent meanwhile = %+v, %v; want partition 5 kept, and 1 and 5 raced", done, err)
	}
	bus.OnRepartitionStep(t.Cleanup, func(string) {})
	_, cons, err := b.RequestConsumers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	last := cons[len(cons)-1]
	if len(cons) != 4 || last.Partition != 5 || !last.Left {
		t.Fatalf("routers read %d partitions (last %d, left %t), want the 3 and the one kept", len(cons), last.Partition, last.Left)
	}
	// A router reading the kept partition keeps it too: deleting it under the router would
	// stop the router.
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() {
		ran <- (&bus.Subscriber{Consumer: last.Consumer, Handler: bus.HandlerFunc(func(context.Context, *bus.Delivery) error { return nil }), Concurrency: 1}).Run(rctx)
	}()
	waitFor(t, "the kept partition to be routed", func() bool { return pending(t, b, 5) == 0 })
	if done, err := b.Repartition(ctx, 3); err != nil || !slices.Equal(done.Kept, []int{5}) {
		t.Fatalf("Repartition(3) again while a router reads the kept partition = %+v, %v; want it kept", done, err)
	}
	stop()
	if err := <-ran; err != nil {
		t.Fatalf("the router reading the kept partition: %v", err)
	}
	if done, err := b.Repartition(ctx, 3); err != nil || len(done.Kept) > 0 || consumerNames(t, b)[bus.RequestConsumer(5)] {
		t.Fatalf("Repartition(3) once the kept partition is routed and read by none = %+v, %v; want it deleted", done, err)
	}
}
