package ledger

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
)

// A worker whose clock runs an hour ahead (or behind) judges leases as the server does: a live
// claim is not taken over, a lapsed one is.
func TestLeasesFollowTheServersClock(t *testing.T) {
	t.Parallel()
	b := bustest.NewServer(t).Provision(t, bus.Config{})
	ctx := context.Background()
	live := New(b.Claims, "live", time.Hour)
	if _, _, err := live.Acquire(ctx, "r.c"); err != nil {
		t.Fatal(err)
	}
	for _, skew := range []time.Duration{time.Hour + time.Minute, -time.Hour} {
		skewed := New(b.Claims, "skewed", time.Hour)
		skewed.localNow = func() time.Time { return time.Now().Add(skew) }
		if _, wait, err := skewed.Acquire(ctx, "r.c"); !errors.Is(err, ErrClaimed) || wait <= 0 || wait > time.Hour {
			t.Fatalf("clock %v off: a live claim: wait %v, %v", skew, wait, err)
		}
	}
	short := New(b.Claims, "a", 100*time.Millisecond)
	if _, _, err := short.Acquire(ctx, "r.d"); err != nil {
		t.Fatal(err)
	}
	behind := New(b.Claims, "behind", 100*time.Millisecond)
	behind.localNow = func() time.Time { return time.Now().Add(-time.Hour) }
	deadline := time.Now().Add(5 * time.Second)
	for {
		h, _, err := behind.Acquire(ctx, "r.d")
		if err == nil {
			if h.Attempt() != 2 {
				t.Fatalf("attempt %d", h.Attempt())
			}
			break
		}
		if !errors.Is(err, ErrClaimed) || time.Now().After(deadline) {
			t.Fatalf("a lapsed claim was not taken over by a worker whose clock is behind: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // waiting for the lease to lapse on the server's clock
	}
}
