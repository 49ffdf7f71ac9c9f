package service

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// record notes when each service started and stopped, in order.
type record struct {
	mu     sync.Mutex
	events []string
}

func (r *record) note(s string) {
	r.mu.Lock()
	r.events = append(r.events, s)
	r.mu.Unlock()
}

func (r *record) index(s string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, e := range r.events {
		if e == s {
			return i
		}
	}
	return -1
}

// waits runs until ctx ends, then takes drain to stop.
func waits(r *record, name string, drain time.Duration) Service {
	return Func(name, func(ctx context.Context) error {
		r.note(name + " started")
		<-ctx.Done()
		time.Sleep(drain)
		r.note(name + " stopped")
		return nil
	})
}

// On shutdown, the front stops and drains while the back still runs; the back stops after.
func TestTheFrontStopsFirst(t *testing.T) {
	var r record
	var l List
	l.Add(Front, waits(&r, "gateway", 50*time.Millisecond))
	l.Add(Back, waits(&r, "router", 0), waits(&r, "worker", 0))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- l.Run(ctx) }()
	for r.index("worker started") < 0 || r.index("router started") < 0 || r.index("gateway started") < 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, back := range []string{"router stopped", "worker stopped"} {
		if r.index(back) < r.index("gateway stopped") {
			t.Fatalf("%s before the front had drained: %v", back, r.events)
		}
	}
	if got := strings.Join(l.Names(), ","); got != "gateway,router,worker" {
		t.Fatalf("names %s", got)
	}
}

// A process of back services alone (a router, a tool worker) runs until ctx ends; a front
// service that returns early stops nothing.
func TestBackServicesRunUntilTheEnd(t *testing.T) {
	var r record
	var l List
	l.Add(Front, Func("done at once", func(context.Context) error { return nil }))
	l.Add(Back, waits(&r, "router", 0))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- l.Run(ctx) }()
	for r.index("router started") < 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	if r.index("router stopped") >= 0 {
		t.Fatal("the back stopped before ctx ended")
	}
	cancel()
	if err := <-done; err != nil || r.index("router stopped") < 0 {
		t.Fatalf("err %v, events %v", err, r.events)
	}
}

// A service that fails stops every other, the front first, and its failure is returned named.
func TestAFailureStopsEverything(t *testing.T) {
	var r record
	var l List
	l.Add(Front, waits(&r, "gateway", 0))
	l.Add(Back, Func("router", func(context.Context) error { return errors.New("the stream is gone") }))
	err := l.Run(t.Context())
	if err == nil || err.Error() != "router: the stream is gone" {
		t.Fatalf("err %v", err)
	}
	if r.index("gateway stopped") < 0 {
		t.Fatal("the front did not stop")
	}
}

type misconfigured struct{ Service }

func (misconfigured) Validate() error { return errors.New("--llm-turns must be positive") }

// A service configured wrong starts nothing: every service is checked before any runs.
func TestNothingRunsWhenAServiceIsMisconfigured(t *testing.T) {
	var r record
	var l List
	l.Add(Front, waits(&r, "gateway", 0))
	l.Add(Back, misconfigured{Func("summarizer", nil)})
	err := l.Run(t.Context())
	if err == nil || err.Error() != "summarizer: --llm-turns must be positive" {
		t.Fatalf("err %v", err)
	}
	if len(r.events) > 0 {
		t.Fatalf("ran: %v", r.events)
	}
}

// Consume looks again for a consumer that is missing, and stops when ctx ends.
func TestConsumeLooksAgain(t *testing.T) {
	old := LookAgain
	LookAgain = time.Millisecond
	t.Cleanup(func() { LookAgain = old })
	ctx, cancel := context.WithCancel(t.Context())
	tries, runs := 0, 0
	Consume(ctx, slog.New(slog.DiscardHandler), "test messages", func(context.Context) (jetstream.Consumer, error) {
		tries++
		if tries < 3 {
			return nil, jetstream.ErrConsumerNotFound
		}
		return nil, nil
	}, func(context.Context, jetstream.Consumer) error {
		if runs++; runs == 2 {
			cancel()
		}
		return errors.New("the consumer was deleted")
	})
	if tries != 4 || runs != 2 {
		t.Fatalf("%d tries, %d runs", tries, runs)
	}
}
