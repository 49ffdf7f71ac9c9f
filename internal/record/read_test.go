package record

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// publishStarted publishes one tool_started event of request req in session, as a worker would.
func publishStarted(t *testing.T, pub *bus.Publisher, session, req string, attempt int) uint64 {
	t.Helper()
	m, err := protocol.NewMessage(protocol.TypeToolStarted, &protocol.ToolStarted{ToolCallID: "c", Name: "echo", Attempt: attempt})
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDToolStarted(req, "c", attempt), req, session
	ack, err := pub.Publish(context.Background(), protocol.SubjectEvent(protocol.EventToolStarted, session), m)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

func newRecord(t testing.TB) (jetstream.JetStream, *bus.Publisher) {
	t.Helper()
	b := bustest.NewServer(t).Provision(t, bus.Config{})
	return b.JS, bus.NewPublisher(b.JS, protocol.Sender{Role: "test", Instance: "test-1"})
}

func collect(t *testing.T, js jetstream.JetStream, session string, from Start) []*Entry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got []*Entry
	n, err := ReadSession(ctx, js, session, from, func(e *Entry) error {
		got = append(got, e)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != len(got) {
		t.Fatalf("Read says %d, delivered %d", n, len(got))
	}
	return got
}

func TestReadSession(t *testing.T) {
	t.Parallel()
	js, pub := newRecord(t)
	var seqs []uint64
	for i := 1; i <= 3; i++ {
		seqs = append(seqs, publishStarted(t, pub, "s1", "r1", i))
		publishStarted(t, pub, "s2", "r2", i) // another session, interleaved
	}
	got := collect(t, js, "s1", Start{})
	if len(got) != 3 {
		t.Fatalf("read %d messages of s1, want 3", len(got))
	}
	for i, e := range got {
		if e.Err != nil || e.Seq != seqs[i] || e.Msg.SessionID != "s1" || e.Payload.(*protocol.ToolStarted).Attempt != i+1 {
			t.Fatalf("entry %d: %+v", i, e)
		}
	}
	if got := collect(t, js, "s1", Start{Seq: seqs[1]}); len(got) != 2 || got[0].Seq != seqs[1] {
		t.Fatalf("from seq %d: %d entries", seqs[1], len(got))
	}
	if got := collect(t, js, "s1", Start{Seq: 1 << 40}); len(got) != 0 {
		t.Fatalf("from a sequence past the end: %d entries", len(got))
	}
	if got := collect(t, js, "s1", Start{Time: time.Now().Add(time.Hour)}); len(got) != 0 {
		t.Fatalf("from the future: %d entries", len(got))
	}
	if got := collect(t, js, "s1", Start{Time: time.Now().Add(-time.Hour)}); len(got) != 3 {
		t.Fatalf("since an hour ago: %d entries", len(got))
	}
	// An unknown session: nothing, at once.
	if got := collect(t, js, "nobody", Start{}); len(got) != 0 {
		t.Fatalf("unknown session: %d entries", len(got))
	}
}

func TestReadEndsWithWhatWasThere(t *testing.T) {
	t.Parallel()
	js, pub := newRecord(t)
	publishStarted(t, pub, "s1", "r1", 1)
	last := publishStarted(t, pub, "s1", "r1", 2)
	// Messages stored while reading are not read: the reading ends at the end it saw.
	var got []uint64
	_, err := ReadSession(context.Background(), js, "s1", Start{}, func(e *Entry) error {
		if len(got) == 0 {
			publishStarted(t, pub, "s1", "r1", 3)
		}
		got = append(got, e.Seq)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1] != last {
		t.Fatalf("read %v, want up to %d", got, last)
	}
}

func TestReadKeepsGoingPastUnreadableMessages(t *testing.T) {
	t.Parallel()
	js, pub := newRecord(t)
	publishStarted(t, pub, "s1", "r1", 1)
	if _, err := js.Publish(context.Background(), protocol.SubjectRedrivenResult("s1"), []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	publishStarted(t, pub, "s1", "r1", 2)
	got := collect(t, js, "s1", Start{})
	if len(got) != 3 || got[0].Err != nil || got[1].Err == nil || got[2].Err != nil {
		t.Fatalf("entries %+v", got)
	}
}

func TestReadErrors(t *testing.T) {
	t.Parallel()
	js, _ := newRecord(t)
	ctx := context.Background()
	noop := func(*Entry) error { return nil }
	for _, s := range []string{"*", ">", "a.b", ""} {
		if _, err := ReadSession(ctx, js, s, Start{}, noop); !errors.Is(err, protocol.ErrInvalid) {
			t.Errorf("session %q: %v, want ErrInvalid", s, err)
		}
	}
	if _, err := ReadSession(ctx, js, "s1", Start{Seq: 1, Time: time.Now()}, noop); !errors.Is(err, ErrStart) {
		t.Errorf("seq and time: %v", err)
	}
	bare, err := jetstream.New(bustest.NewServer(t).Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ReadSession(ctx, bare, "s1", Start{}, noop); !errors.Is(err, ErrNoRecord) {
		t.Errorf("server without the stream: %v", err)
	}
	stop := fmt.Errorf("stop")
	publishStarted(t, bus.NewPublisher(js, protocol.Sender{Role: "test"}), "s1", "r1", 1)
	if _, err := ReadSession(ctx, js, "s1", Start{}, func(*Entry) error { return stop }); err != stop {
		t.Errorf("handler error: %v", err)
	}
}

func TestFollow(t *testing.T) {
	t.Parallel()
	js, pub := newRecord(t)
	publishStarted(t, pub, "s1", "old", 1) // before following: not delivered
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	got := make(chan *Entry, 16)
	done := make(chan error, 1)
	filters, err := SessionFilters("session", "s1")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		done <- Follow(ctx, js, filters, func() { close(ready) }, func(e *Entry) error {
			got <- e
			return nil
		})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Follow returned %v before it was ready", err)
	case <-time.After(20 * time.Second):
		t.Fatal("Follow never ready")
	}
	publishStarted(t, pub, "s2", "other", 1)
	want := publishStarted(t, pub, "s1", "new", 1)
	select {
	case e := <-got:
		if e.Seq != want || e.Msg.RequestID != "new" {
			t.Fatalf("followed %+v, want seq %d of request new", e, want)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a new message was not followed")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Follow returned %v after its context ended", err)
	}
	if len(got) != 0 {
		t.Fatalf("followed more: %+v", <-got)
	}
}
