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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	hf := takeOver(t, fast, "r.d")
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

// A result begun by a holder presumed dead stands for the holder that took the call over, which
// does not take the mark over; the first holder, taken over, leaves what is there standing too;
// a cancelled or finished call is settled for everyone.
func TestARecordingBegunByAnotherHolderIsSettled(t *testing.T) {
	t.Parallel()
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
	h2 := takeOver(t, second, "r.c")
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
	// The first holder, taken over, leaves standing what is there too: it may be the
	// taker-over's.
	if settled, _ := first.Settled(ctx, "r.c"); !settled {
		t.Fatal("a holder whose call was taken over is not settled")
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
	t.Parallel()
	b := claims(t)
	ctx := context.Background()
	if _, err := b.Claims.Create(ctx, "r.c", []byte(`{"holder":"old/1","attempt":1}`)); err != nil {
		t.Fatal(err)
	}
	l := ledger.New(b.Claims, "new", 30*time.Millisecond)
	if h := takeOver(t, l, "r.c"); h.Attempt() != 2 {
		t.Fatalf("attempt %d", h.Attempt())
	}
	if settled, err := l.Settled(ctx, "r.c"); err != nil || !settled {
		t.Fatalf("an earlier version's claim, taken over, is not settled: %v %v", settled, err)
	}
}

// A cancellation that lands while a holder marks its recording is not undone by the holder's
// next renewal: the renewal sees it.
func TestACancellationDuringTheRecordingMarkStands(t *testing.T) {
	t.Parallel()
	b := claims(t)
	ctx := context.Background()
	l := ledger.New(b.Claims, "w", time.Hour)
	h, _, err := l.Acquire(ctx, "r.c")
	if err != nil {
		t.Fatal(err)
	}
	if err := ledger.Cancel(ctx, b.Claims, "r.c"); err != nil {
		t.Fatal(err)
	}
	if mine, err := h.Recording(ctx); err != nil || !mine {
		t.Fatalf("mark: %v %v", mine, err)
	}
	if h.Renew(ctx) || !h.Cancelled() {
		t.Fatal("the renewal after the mark did not see the cancellation")
	}
	if cancelled, err := ledger.IsCancelled(ctx, b.Claims, "r.c"); err != nil || !cancelled {
		t.Fatalf("the cancellation was undone: %v %v", cancelled, err)
	}
}

// A holder presumed dead that marks its recording on a claim another holder now has does not
// make that holder lose it: its renewals go on, keeping the mark.
func TestAMarkByAHolderPresumedDeadKeepsTheLiveHolder(t *testing.T) {
	t.Parallel()
	b := claims(t)
	ctx := context.Background()
	slow := ledger.New(b.Claims, "slow", 30*time.Millisecond)
	hs, _, err := slow.Acquire(ctx, "r.c")
	if err != nil {
		t.Fatal(err)
	}
	live := ledger.New(b.Claims, "live", 30*time.Millisecond)
	hl := takeOver(t, live, "r.c")
	if mine, err := hs.Recording(ctx); err != nil || !mine {
		t.Fatalf("the presumed-dead holder's mark: %v %v", mine, err)
	}
	if !hl.Renew(ctx) || hl.Lost() {
		t.Fatal("the live holder lost its claim to another's recording mark")
	}
	if !hl.Renew(ctx) {
		t.Fatal("the live holder's second renewal failed")
	}
	for name, l := range map[string]*ledger.Ledger{"the live holder": live, "the presumed-dead holder": slow} {
		if settled, _ := l.Settled(ctx, "r.c"); !settled {
			t.Errorf("%s does not leave what is recorded first standing", name)
		}
	}
}

// takeOver acquires key with l once the claim's earlier holder's lease has lapsed (it never
// renews), failing t after 5 s.
func takeOver(t *testing.T, l *ledger.Ledger, key string) *ledger.Hold {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if h, _, err := l.Acquire(context.Background(), key); err == nil {
			return h
		}
		if time.Now().After(deadline) {
			t.Fatal("never taken over")
		}
		time.Sleep(10 * time.Millisecond) // waiting for the lease to lapse
	}
}

// Running: a claim held within its lease runs (cancelled or not, until its holder stops); one
// never claimed, released, finished or lapsed does not.
func TestRunningFollowsTheClaim(t *testing.T) {
	t.Parallel()
	b := claims(t)
	ctx := context.Background()
	running := func(key string, lease time.Duration) bool {
		t.Helper()
		ok, err := ledger.Running(ctx, b.Claims, key, lease)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if running("r.none", time.Hour) {
		t.Fatal("a call nobody claimed runs")
	}
	w := ledger.New(b.Claims, "worker-a", time.Hour)
	h, _, err := w.Acquire(ctx, "r.a")
	if err != nil {
		t.Fatal(err)
	}
	if !running("r.a", time.Hour) {
		t.Fatal("a held call does not run")
	}
	if running("r.a", time.Nanosecond) {
		t.Fatal("a lapsed claim runs")
	}
	if err := ledger.Cancel(ctx, b.Claims, "r.a"); err != nil {
		t.Fatal(err)
	}
	if !running("r.a", time.Hour) {
		t.Fatal("a cancelled call whose holder has not renewed since does not run")
	}
	h2, _, err := w.Acquire(ctx, "r.b")
	if err != nil {
		t.Fatal(err)
	}
	if err := h2.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if running("r.b", time.Hour) {
		t.Fatal("a finished call runs")
	}
	_ = h
}
