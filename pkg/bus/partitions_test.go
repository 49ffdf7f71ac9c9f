package bus_test

import (
	"context"
	"fmt"
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
	cons, err := b.RequestConsumers(ctx)
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
	before, err := b.Repartition(ctx, 3)
	if err != nil || before != 8 {
		t.Fatalf("Repartition(3) = %d, %v", before, err)
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
	if cons, err := b.RequestConsumers(ctx); err != nil || len(cons) != 20 {
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
	cc, err := c.Consume(func(jetstream.Msg) {}) // a router, pulling
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	_, err = b.Repartition(ctx, 8)
	if err == nil || !strings.Contains(err.Error(), "a router reads request partition 1") {
		t.Fatalf("Repartition while a router reads: %v, want it refused", err)
	}
	if b.Partitions() != 4 {
		t.Fatalf("a refused change left %d partitions", b.Partitions())
	}
}
