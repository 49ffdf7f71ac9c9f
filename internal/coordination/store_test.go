package coordination

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

func newStore(t *testing.T) *Store {
	t.Helper()
	s := bustest.NewServer(t)
	b := s.Provision(t, bus.Config{Buckets: Buckets()})
	return &Store{KV: b.Bucket(Bucket), JS: b.JS}
}

func proposal(req, call, key string) Proposal {
	return Proposal{RequestID: req, CallID: call, SessionID: "s_" + req, Tool: "address_update", Tx: protocol.TxID(req, key)}
}

func TestTurnsGoInTheOrderProposedWithRisingFences(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	const key = "order_123"
	var outs []Outcome
	for _, r := range []string{"r1", "r2", "r3"} {
		o, _, err := s.Propose(ctx, key, []Proposal{proposal(r, "c", key)}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, o[0])
	}
	if outs[0].Turn == nil || outs[1].Position != 1 || outs[2].Position != 2 || outs[1].HeldBy != "r1/c" {
		t.Fatalf("outcomes %+v", outs)
	}
	fences := []uint64{outs[0].Turn.Fence}
	for i, r := range []string{"r1", "r2"} {
		x, err := s.Release(ctx, key, r, "c", fences[i])
		if err != nil || x == nil || x.Granted == nil {
			t.Fatalf("release %s: %+v %v", r, x, err)
		}
		if want := fmt.Sprintf("r%d", i+2); x.Granted.RequestID != want {
			t.Fatalf("granted to %s, want %s", x.Granted.RequestID, want)
		}
		if x.Granted.Fence <= fences[i] {
			t.Fatalf("fence %d after %d", x.Granted.Fence, fences[i])
		}
		fences = append(fences, x.Granted.Fence)
	}
	// A release by a call whose turn it is not, or with another fence, changes nothing.
	if x, err := s.Release(ctx, key, "r2", "c", fences[2]); err != nil || x != nil {
		t.Fatalf("stale release: %+v %v", x, err)
	}
	if x, err := s.Release(ctx, key, "r3", "c", fences[2]); err != nil || x == nil || x.Granted != nil {
		t.Fatalf("last release: %+v %v", x, err)
	}
	if st, err := s.List(ctx); err != nil || len(st) != 0 {
		t.Fatalf("left %+v %v", st, err)
	}
	// The emptied entry made again: the fence still rises.
	o, _, err := s.Propose(ctx, key, []Proposal{proposal("r4", "c", key)}, time.Minute)
	if err != nil || o[0].Turn == nil || o[0].Turn.Fence <= fences[2] {
		t.Fatalf("after emptying: %+v %v (last fence %d)", o, err, fences[2])
	}
	// Proposing again changes nothing: the same turn.
	again, ch, err := s.Propose(ctx, key, []Proposal{proposal("r4", "c", key)}, time.Minute)
	if err != nil || ch != nil || again[0].Turn == nil || again[0].Turn.Fence != o[0].Turn.Fence {
		t.Fatalf("again: %+v %+v %v", again, ch, err)
	}
}

func TestALapsedLeasePassesTheTurnOn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := newStore(t)
	s.ClaimFor, s.MinRun = time.Second, time.Second
	const key = "order_9"
	a, _, err := s.Propose(ctx, key, []Proposal{proposal("dead", "c", key)}, time.Second)
	if err != nil || a[0].Turn == nil {
		t.Fatal(a, err)
	}
	if b, _, err := s.Propose(ctx, key, []Proposal{proposal("next", "c", key)}, time.Second); err != nil || b[0].Position != 1 {
		t.Fatal(b, err)
	}
	woken := make(chan string, 4)
	turns := &Turns{Store: s, Wake: func(_ context.Context, k string) error { woken <- k; return nil }, SweepEvery: time.Hour}
	go func() { _ = turns.Run(ctx) }()
	select {
	case k := <-woken:
		if k != protocol.WakeOnTurn("next", "c") {
			t.Fatalf("woke %s", k)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the lapsed lease never passed the turn on")
	}
	o, _, err := s.Propose(ctx, key, []Proposal{proposal("next", "c", key)}, time.Second)
	if err != nil || o[0].Turn == nil || o[0].Turn.Fence <= a[0].Turn.Fence {
		t.Fatalf("next: %+v %v", o, err)
	}
	// The dead holder's late result ends nothing.
	if x, err := s.Release(ctx, key, "dead", "c", a[0].Turn.Fence); err != nil || x != nil {
		t.Fatalf("late release: %+v %v", x, err)
	}
}

// TestManyCallsOnFewKeysNeverOverlap runs N calls on K keys from concurrent proposers, each
// waiting for its wake-up as a parked request would: no two hold one key at once, every call
// runs once, and the fences of each key rise in the order of its turns.
func TestManyCallsOnFewKeysNeverOverlap(t *testing.T) {
	t.Parallel()
	const n, k = 48, 3
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := newStore(t)
	var mu sync.Mutex
	wakes := map[string]chan struct{}{}
	wakeOf := func(key string) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		if wakes[key] == nil {
			wakes[key] = make(chan struct{}, 1)
		}
		return wakes[key]
	}
	wake := func(_ context.Context, key string) error {
		select {
		case wakeOf(key) <- struct{}{}:
		default:
		}
		return nil
	}
	turns := &Turns{Store: s, Wake: wake}
	inFlight := make([]atomic.Int32, k)
	var overlaps, ran atomic.Int32
	fences := make([][]uint64, k)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("order_%d", i%k)
			p := proposal(fmt.Sprintf("r%d", i), "c", key)
			for {
				o, ch, err := s.Propose(ctx, key, []Proposal{p}, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if ch != nil && !ch.Granted.same(&p) {
					_ = wake(ctx, protocol.WakeOnTurn(ch.Granted.RequestID, ch.Granted.CallID))
				}
				if o[0].Turn != nil {
					if inFlight[i%k].Add(1) > 1 {
						overlaps.Add(1)
					}
					mu.Lock()
					fences[i%k] = append(fences[i%k], o[0].Turn.Fence)
					mu.Unlock()
					time.Sleep(time.Millisecond)
					inFlight[i%k].Add(-1)
					ran.Add(1)
					if err := turns.Release(ctx, &protocol.Grant{Tx: p.Tx, Fence: o[0].Turn.Fence, Resource: key}, p.RequestID, p.CallID, "", "ok"); err != nil {
						t.Error(err)
					}
					return
				}
				select {
				case <-wakeOf(protocol.WakeOnTurn(p.RequestID, p.CallID)):
				case <-ctx.Done():
					t.Error("a call never got its turn")
					return
				}
			}
		}()
	}
	wg.Wait()
	if overlaps.Load() != 0 || ran.Load() != n {
		t.Fatalf("overlaps %d, ran %d of %d", overlaps.Load(), ran.Load(), n)
	}
	for key, fs := range fences {
		for i := 1; i < len(fs); i++ {
			if fs[i] <= fs[i-1] {
				t.Fatalf("key %d: fences %v do not rise", key, fs)
			}
		}
	}
	t.Logf("%d calls on %d keys: overlaps 0; fences per key %v", n, k, fences)
}

// A proposer that loses the race to lease its own grant (another router leased it for a
// claim window first) says so: the stage then claims the turn for the call's run, so the
// lease is never shorter than the call.
func TestAGrantLeasedByAnotherIsClaimed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	s.ClaimFor, s.MinRun = time.Second, 20*time.Second
	const key = "order_race"
	token := protocol.ResourceToken(key)
	x := proposal("rx", "c", key)
	rev, err := s.write(ctx, token, &State{Resource: key, Waiting: []Proposal{x}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.putLease(ctx, token, lease{RequestID: x.RequestID, CallID: x.CallID, Fence: rev}, s.claimWindow(), 0); err != nil {
		t.Fatal(err)
	}
	outs, ch, err := s.Propose(ctx, key, []Proposal{x}, 20*time.Second)
	if err != nil || outs[0].Turn == nil || ch == nil || ch.Leased {
		t.Fatalf("granted with another's lease: %+v %+v %v", outs, ch, err)
	}
	if ok, err := s.Claim(ctx, key, outs[0].Turn, 20*time.Second); err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	time.Sleep(2 * time.Second) // past the claim window it was leased for at first
	if rev, err := s.liveLease(ctx, token, outs[0].Turn.Fence); err != nil || rev == 0 {
		t.Fatalf("the claimed lease lapsed with the claim window: %d %v", rev, err)
	}
}

// A release whose wake-up failed is retried: the wake-up is tried before anything else, so
// the retry (which finds the turn passed on) is not what wakes the next call.
func TestAFailedWakeUpFailsTheRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	const key = "order_w"
	a, b := proposal("ra", "c", key), proposal("rb", "c", key)
	o, _, _ := s.Propose(ctx, key, []Proposal{a}, time.Minute)
	_, _, _ = s.Propose(ctx, key, []Proposal{b}, time.Minute)
	var woke []string
	turns := &Turns{Store: s, Wake: func(_ context.Context, k string) error { woke = append(woke, k); return nil },
		Events: &Events{}}
	if err := turns.Release(ctx, &protocol.Grant{Tx: a.Tx, Fence: o[0].Turn.Fence, Resource: key}, a.RequestID, a.CallID, "", "ok"); err != nil {
		t.Fatal(err)
	}
	if len(woke) != 1 || woke[0] != protocol.WakeOnTurn("rb", "c") {
		t.Fatalf("woke %v", woke)
	}
}

// Proposals on a resource seen for the first time that end up waiting are recorded as
// proposed (their wait is an event); a proposal of an answered request is dropped from the
// line rather than granted.
func TestFreshProposalsWaitAndAnsweredOnesAreDropped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	const key = "fresh"
	a, b := proposal("r", "a", key), proposal("r", "b", key)
	outs, _, err := s.Propose(ctx, key, []Proposal{a, b}, time.Minute)
	if err != nil || outs[0].Turn == nil || outs[1].Position != 1 || !outs[1].Proposed {
		t.Fatalf("%+v %v", outs, err)
	}
	gone := proposal("gone", "c", key)
	next := proposal("next", "c", key)
	for _, p := range []Proposal{gone, next} {
		if _, _, err := s.Propose(ctx, key, []Proposal{p}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	s.Answered = func(_ context.Context, rid string) (bool, error) { return rid == "gone", nil }
	x, err := s.Release(ctx, key, "r", "a", outs[0].Turn.Fence)
	if err != nil || x.Granted == nil || x.Granted.CallID != "b" {
		t.Fatalf("release a: %+v %v", x, err)
	}
	x, err = s.Release(ctx, key, "r", "b", x.Granted.Fence)
	if err != nil || x.Granted == nil || x.Granted.RequestID != "next" {
		t.Fatalf("the answered request's proposal was not skipped: %+v %v", x, err)
	}
}

// A holder whose request is answered without a release (a cancellation's results carry no
// grant) loses its turn at the first sweep after its worker stopped, not when its lease lapses.
func TestTheSweepEndsAnAnsweredHoldersTurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	const key = "order_c"
	a, b := proposal("cancelled", "c", key), proposal("next", "c", key)
	if _, _, err := s.Propose(ctx, key, []Proposal{a}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Propose(ctx, key, []Proposal{b}, time.Hour); err != nil {
		t.Fatal(err)
	}
	var woke []string
	turns := &Turns{Store: s, Events: &Events{}, Wake: func(_ context.Context, k string) error { woke = append(woke, k); return nil }}
	if err := turns.Sweep(ctx); err != nil || len(woke) != 0 {
		t.Fatalf("a running call's turn ended: %v %v", woke, err)
	}
	s.Answered = func(_ context.Context, rid string) (bool, error) { return rid == "cancelled", nil }
	// Answered, but its worker has not stopped yet (it learns of a cancellation at its next
	// renewal): the turn stays.
	running := true
	s.Running = func(_ context.Context, rid, cid string) (bool, error) {
		return running && rid == "cancelled" && cid == "c", nil
	}
	if err := turns.Sweep(ctx); err != nil || len(woke) != 0 {
		t.Fatalf("the turn of a call still running ended: %v %v", woke, err)
	}
	running = false
	if err := turns.Sweep(ctx); err != nil || len(woke) != 1 || woke[0] != protocol.WakeOnTurn("next", "c") {
		t.Fatalf("after the answer: %v %v", woke, err)
	}
}

// Holds says whose the turn is now: what a held call asks once its request is parked, in case
// its turn came before the park (and its wake-up found nothing to wake).
func TestHoldsSaysWhoseTurnItIsNow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	const key = "order_9"
	o, _, err := s.Propose(ctx, key, []Proposal{proposal("r1", "c", key), proposal("r1", "d", key)}, time.Minute)
	if err != nil || o[0].Turn == nil {
		t.Fatalf("propose: %+v %v", o, err)
	}
	holds := func(call string) bool {
		t.Helper()
		h, err := s.Holds(ctx, key, "r1", call)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	if !holds("c") || holds("d") {
		t.Fatalf("before the release: c holds %t, d holds %t; want c only", holds("c"), holds("d"))
	}
	if x, err := s.Release(ctx, key, "r1", "c", o[0].Turn.Fence); err != nil || x == nil || x.Granted == nil {
		t.Fatalf("release: %+v %v", x, err)
	}
	if holds("c") || !holds("d") {
		t.Fatalf("after the release: c holds %t, d holds %t; want d only", holds("c"), holds("d"))
	}
	if h, err := s.Holds(ctx, "order_none", "r1", "c"); err != nil || h {
		t.Fatalf("a resource nobody proposed for: holds %t, %v", h, err)
	}
}
