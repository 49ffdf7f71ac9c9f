package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/ledger"
)

func claims(t *testing.T) *bus.Bus {
	t.Helper()
	return bustest.NewServer(t).Provision(t, bus.Config{})
}

func TestAcquireReleaseTakeOver(t *testing.T) {
	b := claims(t)
	ctx := context.Background()
	a := ledger.New(b.Claims, "worker-a", time.Hour)
	other := ledger.New(b.Claims, "worker-b", time.Hour)

	h, _, err := a.Acquire(ctx, "r.c")
	if err != nil || !h.Fresh() || h.Attempt() != 1 {
		t.Fatalf("first acquire: %v fresh=%v attempt=%d", err, h != nil && h.Fresh(), h.Attempt())
	}
	// A live claim is not taken: not by another worker, not by the same process twice.
	if _, wait, err := other.Acquire(ctx, "r.c"); !errors.Is(err, ledger.ErrClaimed) || wait <= 0 {
		t.Fatalf("other worker: %v wait=%v", err, wait)
	}
	if _, _, err := a.Acquire(ctx, "r.c"); !errors.Is(err, ledger.ErrClaimed) {
		t.Fatalf("same process, second delivery: %v", err)
	}
	if !h.Renew(ctx) {
		t.Fatal("renewal of a held claim failed")
	}
	h.Release(ctx, "TOOL_HTTP_5XX")
	// Released: the next try is taken by anyone, numbered 2, and the failure is kept.
	h2, _, err := other.Acquire(ctx, "r.c")
	if err != nil || h2.Fresh() || h2.Attempt() != 2 {
		t.Fatalf("after release: %v attempt=%d", err, h2.Attempt())
	}
	if attempt, code := ledger.Last(ctx, b.Claims, "r.c"); attempt != 2 || code != "TOOL_HTTP_5XX" {
		t.Fatalf("Last = %d %q", attempt, code)
	}
	h2.Done()
	h2.Done() // idempotent
}

func TestLapsedClaimIsTakenOverOnce(t *testing.T) {
	b := claims(t)
	ctx := context.Background()
	dead := ledger.New(b.Claims, "dead", 50*time.Millisecond)
	if _, _, err := dead.Acquire(ctx, "r.c"); err != nil {
		t.Fatal(err)
	}
	// The dead worker never renews. After the lease two workers race to take over: one wins.
	a := ledger.New(b.Claims, "a", 50*time.Millisecond)
	c := ledger.New(b.Claims, "c", 50*time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for {
		ha, _, ea := a.Acquire(ctx, "r.c")
		hc, _, ec := c.Acquire(ctx, "r.c")
		if ea == nil && ec == nil {
			t.Fatal("two workers hold the same call")
		}
		if ea == nil || ec == nil {
			h := ha
			if h == nil {
				h = hc
			}
			if h.Attempt() != 2 {
				t.Fatalf("takeover attempt %d, want 2", h.Attempt())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("lapsed claim never taken over")
		}
		time.Sleep(10 * time.Millisecond) // waiting for the lease to lapse
	}
}

func TestRenewDetectsTakeover(t *testing.T) {
	b := claims(t)
	ctx := context.Background()
	slow := ledger.New(b.Claims, "slow", 30*time.Millisecond)
	h, _, err := slow.Acquire(ctx, "r.c")
	if err != nil {
		t.Fatal(err)
	}
	fast := ledger.New(b.Claims, "fast", 30*time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, _, err := fast.Acquire(ctx, "r.c"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never taken over")
		}
		time.Sleep(10 * time.Millisecond) // waiting for the lease to lapse
	}
	if h.Renew(ctx) || !h.Lost() {
		t.Fatal("renewal after a takeover should report the claim lost")
	}
}

// A finished call is never acquired again — not by another worker, not after a cancellation,
// not by the holder that lost it — and finishing keeps its tries.
func TestAFinishedCallIsNotAcquiredAgain(t *testing.T) {
	b := claims(t)
	ctx := context.Background()
	a := ledger.New(b.Claims, "a", time.Hour)
	h, _, err := a.Acquire(ctx, "r.c")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.Finish(ctx); err != nil { // idempotent
		t.Fatal(err)
	}
	for _, l := range []*ledger.Ledger{a, ledger.New(b.Claims, "b", time.Hour)} {
		if _, _, err := l.Acquire(ctx, "r.c"); !errors.Is(err, ledger.ErrFinished) {
			t.Fatalf("acquired a finished call: %v", err)
		}
	}
	if err := ledger.Cancel(ctx, b.Claims, "r.c"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Acquire(ctx, "r.c"); !errors.Is(err, ledger.ErrFinished) {
		t.Fatalf("a finished call, cancelled after: %v", err)
	}
	if attempt, _ := ledger.Last(ctx, b.Claims, "r.c"); attempt != 1 {
		t.Fatalf("Last = %d, want 1", attempt)
	}

	// A holder presumed dead that finishes after all: the call is finished, and the holder that
	// took it over learns at its next renewal that it lost it.
	slow := ledger.New(b.Claims, "slow", 30*time.Millisecond)
	hs, _, err := slow.Acquire(ctx, "r.d")
	if err != nil {
		t.Fatal(err)
	}
	fast := ledger.New(b.Claims, "fast", 30*time.Millisecond)
	var hf *ledger.Hold
	deadline := time.Now().Add(5 * time.Second)
	for hf == nil {
		if hf, _, _ = fast.Acquire(ctx, "r.d"); hf == nil {
			if time.Now().After(deadline) {
				t.Fatal("never taken over")
			}
			time.Sleep(10 * time.Millisecond) // waiting for the lease to lapse
		}
	}
	if err := hs.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if hf.Renew(ctx) || !hf.Lost() {
		t.Fatal("the holder that took over did not learn the call is finished")
	}
	hf.Done()
	if _, _, err := fast.Acquire(ctx, "r.d"); !errors.Is(err, ledger.ErrFinished) {
		t.Fatalf("acquired a finished call: %v", err)
	}
}

// A result begun by a holder presumed dead stands for the holder that took the call over: its
// Settled says so, while the first holder's own does not (what it began is its own); a
// cancelled or finished call is settled for everyone.
func TestARecordingBegunByAnotherHolderIsSettled(t *testing.T) {
	b := claims(t)
	ctx := context.Background()
	first := ledger.New(b.Claims, "first", 30*time.Millisecond)
	h, _, err := first.Acquire(ctx, "r.c")
	if err != nil {
		t.Fatal(err)
	}
	if settled, err := first.Settled(ctx, "r.c"); err != nil || settled {
		t.Fatalf("a held call is settled: %v %v", settled, err)
	}
	if mine, err := h.Recording(ctx); err != nil || !mine {
		t.Fatalf("the recording mark was not written: %v %v", mine, err)
	}
	second := ledger.New(b.Claims, "second", 30*time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	var h2 *ledger.Hold
	for {
		if h2, _, err = second.Acquire(ctx, "r.c"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never taken over")
		}
		time.Sleep(10 * time.Millisecond) // waiting for the lease to lapse
	}
	if settled, err := second.Settled(ctx, "r.c"); err != nil || !settled {
		t.Fatalf("the taker-over does not leave the first holder's result standing: %v %v", settled, err)
	}
	// The taker-over, about to record its own, does not take the mark over.
	if mine, err := h2.Recording(ctx); err != nil || mine {
		t.Fatalf("the taker-over took the recording mark: %v %v", mine, err)
	}
	if settled, _ := second.Settled(ctx, "r.c"); !settled {
		t.Fatal("the first holder's recording is no longer settled for the taker-over")
	}
	if settled, _ := first.Settled(ctx, "r.c"); settled {
		t.Fatal("the first holder's own recording is settled for it")
	}
	if err := ledger.Cancel(ctx, b.Claims, "r.x"); err != nil {
		t.Fatal(err)
	}
	if settled, _ := first.Settled(ctx, "r.x"); !settled {
		t.Fatal("a cancelled call is not settled")
	}
}

// A claim written by a Hermes that marked neither finished calls nor recordings, taken over,
// is settled for the new holder: a result its old holder may have recorded stands.
func TestAClaimOfAnEarlierVersionIsSettledWhenTakenOver(t *testing.T) {
	b := claims(t)
	ctx := context.Background()
	if _, err := b.Claims.Create(ctx, "r.c", []byte(`{"holder":"old/1","attempt":1}`)); err != nil {
		t.Fatal(err)
	}
	l := ledger.New(b.Claims, "new", 30*time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for {
		h, _, err := l.Acquire(ctx, "r.c")
		if err == nil {
			if h.Attempt() != 2 {
				t.Fatalf("attempt %d", h.Attempt())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never taken over")
		}
		time.Sleep(10 * time.Millisecond) // waiting for the lease to lapse
	}
	if settled, err := l.Settled(ctx, "r.c"); err != nil || !settled {
		t.Fatalf("an earlier version's claim, taken over, is not settled: %v %v", settled, err)
	}
}
