package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
	"time"
)

type countingVerifier struct {
	asked  map[string]int
	broken bool
}

func (v *countingVerifier) Verify(_ context.Context, cred string) (*Caller, error) {
	v.asked[cred]++
	switch {
	case v.broken:
		return nil, errors.New("store unreachable")
	case cred == "good":
		return &Caller{ID: "key:g", Role: RoleUser}, nil
	}
	return nil, fmt.Errorf("%w: unknown", ErrUnauthenticated)
}

// Answers are remembered for the TTL, good and bad alike; what could not be told is asked
// again; memory stays within Max.
func TestCachedVerifier(t *testing.T) {
	next := &countingVerifier{asked: map[string]int{}}
	now := time.Unix(1000, 0)
	c := &Cached{Next: next, TTL: 5 * time.Second, Max: 100, now: func() time.Time { return now }}
	ctx := t.Context()
	for range 3 {
		if got, err := c.Verify(ctx, "good"); err != nil || got.ID != "key:g" {
			t.Fatal(got, err)
		}
		if _, err := c.Verify(ctx, "bad"); !errors.Is(err, ErrUnauthenticated) {
			t.Fatal(err)
		}
	}
	if next.asked["good"] != 1 || next.asked["bad"] != 1 {
		t.Fatalf("asked %v within the TTL", next.asked)
	}
	now = now.Add(5 * time.Second)
	_, _ = c.Verify(ctx, "good")
	if next.asked["good"] != 2 {
		t.Fatalf("not asked again after the TTL: %v", next.asked)
	}
	next.broken = true
	now = now.Add(time.Minute)
	for range 2 {
		if _, err := c.Verify(ctx, "good"); err == nil || errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("an unreachable store: %v", err)
		}
	}
	if next.asked["good"] != 4 {
		t.Fatalf("what could not be told was remembered: %v", next.asked)
	}
	next.broken = false
	for i := range 1000 {
		now = now.Add(time.Millisecond)
		_, _ = c.Verify(ctx, fmt.Sprintf("guess-%d", i))
		if len(c.entries) > 100 {
			t.Fatalf("%d entries remembered, Max is 100", len(c.entries))
		}
	}
	if _, ok := c.entries[sha256.Sum256([]byte("guess-999"))]; !ok {
		t.Fatal("the newest guess was evicted")
	}
}
