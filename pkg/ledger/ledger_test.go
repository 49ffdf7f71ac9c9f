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
