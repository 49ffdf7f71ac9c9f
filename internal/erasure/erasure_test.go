package erasure

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/memory"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

func newAsks(t *testing.T) (*Asks, *bus.Bus) {
	t.Helper()
	b := bustest.NewServer(t).Provision(t, bus.Config{Buckets: append(Buckets(), memory.Buckets(0)...)})
	now := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)
	return &Asks{KV: b.Bucket(Bucket), Now: func() time.Time { return now }}, b
}

// An ask still waiting takes a later one in (with_history once asked stays asked); Get says
// ErrNotFound for an owner no one asked for.
func TestAsksMergeWhileWaiting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	asks, _ := newAsks(t)
	if _, err := asks.Get(ctx, "key:alice"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("no ask: %v", err)
	}
	if _, err := asks.Ask(ctx, "key:alice", true, "key:alice"); err != nil {
		t.Fatal(err)
	}
	a, err := asks.Ask(ctx, "key:alice", false, "key:admin")
	if err != nil || !a.WithHistory || a.State != StateAsked || a.AskedBy != "key:admin" {
		t.Fatalf("%+v %v", a, err)
	}
	got, err := asks.Get(ctx, "key:alice")
	if err != nil || !got.WithHistory || got.Owner != "key:alice" {
		t.Fatalf("%+v %v", got, err)
	}
	if _, err := asks.Get(ctx, "key:bob"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("bob: %v", err)
	}
}

// publish puts n messages on subject of the record.
func publish(t *testing.T, b *bus.Bus, subject string, n int) {
	t.Helper()
	for i := range n {
		if _, err := b.JS.Publish(context.Background(), subject, []byte(`{}`), jetstream.WithMsgID(subject+string(rune('a'+i)))); err != nil {
			t.Fatal(err)
		}
	}
}

func held(t *testing.T, b *bus.Bus, subject string) uint64 {
	t.Helper()
	info, err := b.Stream.Info(context.Background(), jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

// The eraser erases the owner's memory history from the record, marks the ask done with what
// it erased, and leaves another owner's history and what is no ask alone.
func TestEraserErasesWhatIsAskedAndMarksItDone(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	asks, b := newAsks(t)
	alice := protocol.SubjectEvent(protocol.EventMemory, memory.HistorySession("key:alice"))
	bob := protocol.SubjectEvent(protocol.EventMemory, memory.HistorySession("key:bob"))
	publish(t, b, alice, 3)
	publish(t, b, bob, 2)
	if _, err := asks.KV.Put(ctx, "o.junk", []byte(`{"owner":1}`)); err != nil {
		t.Fatal(err)
	}
	// An ask of bob's under carol's key is no ask: it erases nothing.
	forged, _ := json.Marshal(Ask{Owner: "key:bob", State: StateAsked})
	if _, err := asks.KV.Put(ctx, key("key:carol"), forged); err != nil {
		t.Fatal(err)
	}
	done := make(chan Ask, 4)
	e := &Eraser{Asks: asks, JS: b.JS, Erased: func(a Ask) { done <- a }}
	go func() { _ = e.Run(ctx) }()
	if _, err := asks.Ask(ctx, "key:alice", false, "key:alice"); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-done:
		if a.Owner != "key:alice" || a.State != StateDone || a.Erased == nil || a.Erased.HistoryMessages != 3 || a.DoneAt.IsZero() {
			t.Fatalf("done: %+v %+v", a, a.Erased)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the eraser did not erase")
	}
	if n := held(t, b, alice); n != 0 {
		t.Errorf("alice's history: %d left", n)
	}
	if n := held(t, b, bob); n != 2 {
		t.Errorf("bob's history: %d of 2 left", n)
	}
	if a, err := asks.Get(ctx, "key:alice"); err != nil || a.State != StateDone || a.Tries != 1 {
		t.Fatalf("the ask: %+v %v", a, err)
	}
	// Asked again once done, it is done again (and finds nothing more).
	if a, err := asks.Ask(ctx, "key:alice", false, "key:alice"); err != nil || a.State != StateAsked || a.Tries != 0 {
		t.Fatalf("asked again: %+v %v", a, err)
	}
	select {
	case a := <-done:
		if a.Erased.HistoryMessages != 0 {
			t.Fatalf("again: %+v", a.Erased)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the eraser did not erase again")
	}
}

// An ask with history purges the sessions whose latest request names its owner, and no other;
// the anonymous owner's sessions are every anonymous caller's, and are never purged.
func TestAnAskWithHistoryErasesItsOwnersSessionsOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	asks, b := newAsks(t)
	for session, owner := range map[string]string{"s_alice": "key:alice", "s_anon": memory.Anonymous, "s_bob": "key:bob"} {
		msg := nats.NewMsg(protocol.SubjectRequest(session))
		msg.Header.Set(bus.HeaderOwner, owner)
		msg.Header.Set(bus.HeaderRequestID, "r_"+session)
		msg.Data = []byte(`{}`)
		if _, err := b.JS.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	e := &Eraser{Asks: asks, JS: b.JS}
	out, truncated, err := e.eraseRecord(ctx, &Ask{Owner: memory.Anonymous, WithHistory: true, State: StateAsked})
	if err != nil || len(out.Sessions) != 0 || truncated {
		t.Fatalf("the anonymous owner: %+v %v", out, err)
	}
	out, _, err = e.eraseRecord(ctx, &Ask{Owner: "key:alice", WithHistory: true, State: StateAsked})
	if err != nil || len(out.Sessions) != 1 || out.Sessions[0] != "s_alice" {
		t.Fatalf("alice: %+v %v", out, err)
	}
	for session, want := range map[string]uint64{"s_alice": 0, "s_anon": 1, "s_bob": 1} {
		if n := held(t, b, b.StoredSubjectRequest(session)); n != want {
			t.Errorf("%s: %d requests left, want %d", session, n, want)
		}
	}
}

func TestDecodeNamesWhatIsWrong(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`{`, "holds no ask"},
		{`{"owner":"a","state":"maybe"}`, `state "maybe"`},
		{`{"state":"asked"}`, `owner ""`},
		{`"` + strings.Repeat("x", maxAskBytes) + `"`, "at most"},
	} {
		if _, err := decode("o.k", []byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "o.k") {
			t.Errorf("%.40s: %v, want %q", tc.in, err, tc.want)
		}
	}
	a := Ask{Owner: "key:alice", State: StateDone, Erased: &Erased{HistoryMessages: 2, Sessions: 3}}
	b, _ := json.Marshal(a)
	got, err := decode("o.k", b)
	if err != nil || got.Owner != a.Owner || got.Erased.HistoryMessages != 2 || got.Erased.Sessions != 3 {
		t.Fatalf("%+v %v", got, err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"owner":"key:a","state":"asked","with_history":true}`))
	f.Add([]byte(`{"owner":"key:a","state":"done","erased":{"history":1}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := decode("o.k", b)
		if err == nil && (a.Owner == "" || (a.State != StateAsked && a.State != StateDone)) {
			t.Fatalf("accepted %+v", a)
		}
	})
}

// A failing erasure waits for its next try, Retry after the first failure (no tight loop of
// tries, each a write to the bucket), and says why without the bus's details.
func TestAFailingErasureWaitsForItsNextTry(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	asks, b := newAsks(t)
	asks.Now = time.Now
	if err := b.JS.DeleteStream(ctx, protocol.StreamName); err != nil {
		t.Fatal(err)
	}
	e := &Eraser{Asks: asks, JS: b.JS, Retry: time.Minute}
	go func() { _ = e.Run(ctx) }()
	if _, err := asks.Ask(ctx, "key:alice", false, "key:alice"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		a, err := asks.Get(ctx, "key:alice")
		if err != nil {
			t.Fatal(err)
		}
		if a.Tries > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the eraser never tried")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond)
	a, err := asks.Get(ctx, "key:alice")
	if err != nil {
		t.Fatal(err)
	}
	if a.Tries != 1 || a.State != StateAsked || time.Until(a.NextTryAt) < 50*time.Second {
		t.Fatalf("after a failure: %d tries, state %s, next try in %v", a.Tries, a.State, time.Until(a.NextTryAt))
	}
	if strings.Contains(a.LastError, "stream") || a.LastError == "" {
		t.Fatalf("last error: %q", a.LastError)
	}
	// Asking again hurries nothing.
	if again, err := asks.Ask(ctx, "key:alice", true, "key:alice"); err != nil || !again.NextTryAt.Equal(a.NextTryAt) || again.Tries != 1 {
		t.Fatalf("asked again: %+v %v", again, err)
	}
	time.Sleep(500 * time.Millisecond)
	if a, _ := asks.Get(ctx, "key:alice"); a.Tries != 1 {
		t.Fatalf("asked again: tried %d times", a.Tries)
	}
}

func TestRetryDoublesUpToItsBound(t *testing.T) {
	t.Parallel()
	e := &Eraser{Retry: time.Second}
	for tries, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 4: 8 * time.Second, 30: maxRetry} {
		if got := e.retry(tries); got != want {
			t.Errorf("retry(%d) = %v, want %v", tries, got, want)
		}
	}
}
