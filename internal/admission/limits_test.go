package admission

import (
	"net/http"
	"testing"

	"github.com/hermesbus/hermes/internal/auth"
)

// Each caller is held to its waiting requests, its event streams and one listing at a time
// (429 with a Retry-After); another caller is not affected, and a hold given back is free
// again.
func TestCallerHolds(t *testing.T) {
	l := NewLimits(CallerLimits{RequestsPerSecond: 0.01, Burst: 3, Waiting: 2, Streams: 1})
	alice := &auth.Caller{ID: "key:a"}
	for _, k := range []Hold{HoldWaiting, HoldStream, HoldListing} {
		limit := map[Hold]int{HoldWaiting: 2, HoldStream: 1, HoldListing: 1}[k]
		var releases []func()
		for range limit {
			release, refused := l.hold(alice, k)
			if refused != nil {
				t.Fatalf("hold %v: refused within the limit: %v", k, refused)
			}
			releases = append(releases, release)
		}
		if _, refused := l.hold(alice, k); refused == nil || refused.Status != http.StatusTooManyRequests || refused.RetryAfter <= 0 {
			t.Fatalf("hold %v: over the limit: %+v", k, refused)
		}
		if _, refused := l.hold(&auth.Caller{ID: "key:b"}, k); refused != nil {
			t.Fatalf("hold %v: another caller refused", k)
		}
		releases[0]()
		if _, refused := l.hold(alice, k); refused != nil {
			t.Fatalf("hold %v: refused after one was released", k)
		}
	}
	if _, refused := l.hold(alice, HoldNone); refused != nil {
		t.Fatal("HoldNone refused")
	}
}
