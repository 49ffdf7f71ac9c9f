package record

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// streamOf runs Stream on session from start in the background and returns its entries as they
// come, and a func that stops it and returns its error.
func streamOf(t *testing.T, js jetstream.JetStream, session string, from Start) (<-chan *Entry, func() error) {
	t.Helper()
	filters, err := SessionFilters("session", session)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan *Entry, 64)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Stream(ctx, js, filters, from, func() { close(ready) }, func(e *Entry) error {
			got <- e
			return nil
		})
	}()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("Stream returned %v before it was ready", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("Stream never ready")
	}
	stop := sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	t.Cleanup(func() { _ = stop() })
	return got, stop
}

func nextEntry(t *testing.T, got <-chan *Entry) *Entry {
	t.Helper()
	select {
	case e := <-got:
		return e
	case <-time.After(20 * time.Second):
		t.Fatal("no entry streamed")
		return nil
	}
}

func TestStreamHistoryThenLive(t *testing.T) {
	t.Parallel()
	js, pub := newRecord(t)
	old1 := publishStarted(t, pub, "s1", "r1", 1)
	publishStarted(t, pub, "s2", "r2", 1)
	old2 := publishStarted(t, pub, "s1", "r1", 2)
	got, stop := streamOf(t, js, "s1", Start{})
	for _, want := range []uint64{old1, old2} {
		if e := nextEntry(t, got); e.Seq != want || e.Err != nil {
			t.Fatalf("history: %+v, want seq %d", e, want)
		}
	}
	publishStarted(t, pub, "s2", "r2", 2)
	live := publishStarted(t, pub, "s1", "r1", 3)
	if e := nextEntry(t, got); e.Seq != live || e.Msg.RequestID != "r1" {
		t.Fatalf("live: %+v, want seq %d", e, live)
	}
	if err := stop(); err != nil {
		t.Fatalf("Stream returned %v after its context ended", err)
	}
	if len(got) != 0 {
		t.Fatalf("streamed more: %+v", <-got)
	}
}

func TestStreamFromSequence(t *testing.T) {
	t.Parallel()
	js, pub := newRecord(t)
	var seqs []uint64
	for i := 1; i <= 3; i++ {
		seqs = append(seqs, publishStarted(t, pub, "s1", "r1", i))
	}
	got, _ := streamOf(t, js, "s1", Start{Seq: seqs[1] + 1})
	if e := nextEntry(t, got); e.Seq != seqs[2] {
		t.Fatalf("from %d: first entry %d, want %d", seqs[1]+1, e.Seq, seqs[2])
	}
	// Past the end of the record: from its end, so what is stored next is streamed.
	far, _ := streamOf(t, js, "s1", Start{Seq: 1 << 40})
	next := publishStarted(t, pub, "s1", "r1", 4)
	if e := nextEntry(t, far); e.Seq != next {
		t.Fatalf("from past the end: %d, want %d", e.Seq, next)
	}
	if e := nextEntry(t, got); e.Seq != next {
		t.Fatalf("from %d, live: %d, want %d", seqs[1]+1, e.Seq, next)
	}
}

func TestStreamErrors(t *testing.T) {
	t.Parallel()
	js, _ := newRecord(t)
	noop := func(*Entry) error { return nil }
	if err := Stream(context.Background(), js, nil, Start{Seq: 1, Time: time.Now()}, nil, noop); err != ErrStart {
		t.Errorf("seq and time: %v", err)
	}
	stop := fmt.Errorf("stop")
	pub := bus.NewPublisher(js, protocol.Sender{Role: "test"})
	publishStarted(t, pub, "s1", "r1", 1)
	filters, _ := SessionFilters("session", "s1")
	if err := Stream(context.Background(), js, filters, Start{}, nil, func(*Entry) error { return stop }); err != stop {
		t.Errorf("handler error: %v", err)
	}
}
