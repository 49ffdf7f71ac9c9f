package bus_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// AuditConsumer makes the audit's consumer of each record stream as the audit needs it — every
// subject of the stream from its first message, retried without end — whatever the bus was
// opened with, and keeps one that is there as it is.
func TestAuditConsumer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{Streams: 2, Partitions: 4})
	for k := range b.Streams {
		c, err := b.AuditConsumer(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		got := c.CachedInfo().Config
		want := jetstream.ConsumerConfig{
			Durable:       bus.ConsumerAudit,
			Description:   "Hermes: the audit service takes every message of the record, to project it into PostgreSQL",
			FilterSubject: protocol.RecordRoot(k) + ".>",
			DeliverPolicy: jetstream.DeliverAllPolicy,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       30 * time.Second,
			MaxDeliver:    -1,
			MaxAckPending: 4096,
			Replicas:      0, // the stream's
		}
		if got.Durable != want.Durable || got.Description != want.Description || got.FilterSubject != want.FilterSubject || len(got.FilterSubjects) != 0 ||
			got.DeliverPolicy != want.DeliverPolicy || got.AckPolicy != want.AckPolicy || got.AckWait != want.AckWait ||
			got.MaxDeliver != want.MaxDeliver || got.MaxAckPending != want.MaxAckPending || got.Replicas != want.Replicas {
			t.Errorf("stream %d's audit consumer:\n%+v\nwant\n%+v", k, got, want)
		}
		if s := c.CachedInfo().Stream; s != protocol.RecordStream(k) {
			t.Errorf("stream %d's audit consumer is of %s", k, s)
		}
		// Asked again, the same consumer; one changed since is kept as it is.
		got.MaxAckPending = 10
		if _, err := b.Streams[k].UpdateConsumer(ctx, got); err != nil {
			t.Fatal(err)
		}
		again, err := b.AuditConsumer(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if !again.CachedInfo().Created.Equal(c.CachedInfo().Created) || again.CachedInfo().Config.MaxAckPending != 10 {
			t.Errorf("stream %d: asked again, made at %v (first %v), %d in flight", k, again.CachedInfo().Created, c.CachedInfo().Created, again.CachedInfo().Config.MaxAckPending)
		}
	}
	for _, k := range []int{-1, 2} {
		if _, err := b.AuditConsumer(ctx, k); err == nil || !strings.Contains(err.Error(), "2 streams, HERMES to HERMES_1") {
			t.Errorf("AuditConsumer(%d): %v", k, err)
		}
	}
	// It is the audit's own: made by a process that may provision nothing.
	if err := b.Streams[1].DeleteConsumer(ctx, bus.ConsumerAudit); err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []bus.Config{{OpenOnly: true}, {NoProvision: true}} {
		opened, err := bus.Provision(ctx, b.JS, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if c, err := opened.AuditConsumer(ctx, 1); err != nil || c.CachedInfo().Config.FilterSubject != protocol.RecordRoot(1)+".>" {
			t.Errorf("opened with %+v: %v", cfg, err)
		}
	}
}

// The auditor opens the bus, makes its consumer of each record stream, takes every message of
// the record from them and acks it, the server refusing it nothing.
func TestTheAuditorReadsTheRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := lockedWithApp(t)
	admin := s.Provision(t, bus.Config{Streams: 2, Partitions: 4})
	const sessions, each = 6, 2
	publishEvents(t, admin, "a", sessions, each)
	before := len(s.Violations())
	js, err := jetstream.New(s.ConnectAs(t, bus.RoleAuditor))
	if err != nil {
		t.Fatal(err)
	}
	b, err := bus.Provision(ctx, js, bus.Config{NoProvision: true})
	if err != nil {
		t.Fatal(err)
	}
	var read []string
	for k := range b.Streams {
		c, err := b.AuditConsumer(ctx, k)
		if err != nil {
			t.Fatalf("the auditor cannot make its consumer of %s: %v", protocol.RecordStream(k), err)
		}
		got := drainAudit(t, c)
		if len(got) == 0 {
			t.Errorf("nothing read from %s", protocol.RecordStream(k))
		}
		read = append(read, got...)
		if info, err := c.Info(ctx); err != nil || info.NumAckPending != 0 || info.NumPending != 0 {
			t.Errorf("%s: left %+v, %v", protocol.RecordStream(k), info, err)
		}
	}
	if len(read) != sessions*(each+1) { // and a summary each
		t.Errorf("read %d messages, want %d: %q", len(read), sessions*(each+1), read)
	}
	if v := s.Violations()[before:]; len(v) > 0 {
		t.Errorf("the server refused the auditor: %q", v)
	}
}

// A change of the record's streams neither waits for the audit nor deletes its consumers: one
// far behind does not hold the change up, and reads in the copies its stream receives what it
// had not read where the change removed it.
func TestRestreamLeavesTheAuditBe(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{Partitions: 6})
	const sessions, each = 12, 2
	publishEvents(t, b, "a", sessions, each)
	first, err := b.AuditConsumer(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Restream(ctx, 3); err != nil {
		t.Fatalf("Restream(3), the audit holding all: %v", err)
	}
	b3 := srv.Provision(t, bus.Config{})
	kept := func(when string) {
		t.Helper()
		c, err := b3.Stream.Consumer(ctx, bus.ConsumerAudit)
		if err != nil || !c.CachedInfo().Created.Equal(first.CachedInfo().Created) {
			t.Fatalf("%s, the audit's consumer of %s is not the one it made: %v", when, protocol.StreamName, err)
		}
	}
	kept("moved to 3 streams")
	for k := range b3.Streams {
		c, err := b3.AuditConsumer(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		drainAudit(t, c)
	}
	// New sessions' messages in every stream, none read by the audit; the streams HERMES_1 and
	// HERMES_2 are deleted with them.
	publishEvents(t, b3, "b", sessions, each)
	if _, err := b3.Restream(ctx, 1); err != nil {
		t.Fatalf("Restream(1), the audit holding round b: %v", err)
	}
	kept("moved back to 1 stream")
	var want []string
	for i := range sessions {
		for j := range each {
			want = append(want, fmt.Sprintf("b-%d-%d", i, j))
		}
		want = append(want, fmt.Sprintf("b-%d-sum", i))
	}
	got := drainAudit(t, first)
	for _, id := range want {
		if !slices.Contains(got, id) {
			t.Errorf("the audit never reads %s: it read %q", id, got)
			break
		}
	}
}

// drainAudit takes and acks everything audit consumer c has for its reader, and returns the
// messages' ids, in order.
func drainAudit(t *testing.T, c jetstream.Consumer) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for {
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending+uint64(info.NumAckPending) == 0 {
			return ids
		}
		if info.NumPending == 0 {
			t.Fatalf("%d messages taken and never acked", info.NumAckPending)
		}
		// No more than it has: a pull left waiting would look like a service reading.
		batch, err := c.Fetch(int(min(info.NumPending, 100)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			msg, err := protocol.Unmarshal(m.Data())
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, msg.MsgID)
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := batch.Error(); err != nil {
			t.Fatal(err)
		}
	}
}
