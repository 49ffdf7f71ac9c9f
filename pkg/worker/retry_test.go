package worker

import (
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

func TestRetryDelay(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	tests := []struct {
		name    string
		policy  protocol.RetryPolicy
		attempt int
		want    time.Duration
	}{
		{"first try gives the initial interval", protocol.RetryPolicy{InitialIntervalMS: 100, BackoffFactor: 2, MaxIntervalMS: 10_000}, 1, 100 * ms},
		{"second try doubles", protocol.RetryPolicy{InitialIntervalMS: 100, BackoffFactor: 2, MaxIntervalMS: 10_000}, 2, 200 * ms},
		{"fourth try is initial times factor cubed", protocol.RetryPolicy{InitialIntervalMS: 100, BackoffFactor: 2, MaxIntervalMS: 10_000}, 4, 800 * ms},
		{"fractional factor", protocol.RetryPolicy{InitialIntervalMS: 100, BackoffFactor: 1.5, MaxIntervalMS: 10_000}, 3, 225 * ms},
		{"factor three", protocol.RetryPolicy{InitialIntervalMS: 10, BackoffFactor: 3, MaxIntervalMS: 10_000}, 5, 810 * ms},
		{"capped at the max interval", protocol.RetryPolicy{InitialIntervalMS: 100, BackoffFactor: 2, MaxIntervalMS: 500}, 4, 500 * ms},
		{"cap reached exactly", protocol.RetryPolicy{InitialIntervalMS: 100, BackoffFactor: 2, MaxIntervalMS: 400}, 3, 400 * ms},
		{"stays capped on late tries", protocol.RetryPolicy{InitialIntervalMS: 100, BackoffFactor: 2, MaxIntervalMS: 1000}, 10, 1000 * ms},
		{"no overflow on a huge attempt", protocol.RetryPolicy{InitialIntervalMS: 100, BackoffFactor: 10, MaxIntervalMS: 60_000}, 200, 60_000 * ms},
		{"factor zero is treated as one", protocol.RetryPolicy{InitialIntervalMS: 100, BackoffFactor: 0, MaxIntervalMS: 10_000}, 5, 100 * ms},
		{"factor below one is treated as one", protocol.RetryPolicy{InitialIntervalMS: 100, BackoffFactor: 0.5, MaxIntervalMS: 10_000}, 5, 100 * ms},
		{"negative factor is treated as one", protocol.RetryPolicy{InitialIntervalMS: 100, BackoffFactor: -2, MaxIntervalMS: 10_000}, 3, 100 * ms},
		{"factor one keeps the interval", protocol.RetryPolicy{InitialIntervalMS: 250, BackoffFactor: 1, MaxIntervalMS: 10_000}, 7, 250 * ms},
		{"max below initial never cuts the initial interval", protocol.RetryPolicy{InitialIntervalMS: 300, BackoffFactor: 2, MaxIntervalMS: 100}, 3, 300 * ms},
		{"attempt zero is treated as the first", protocol.RetryPolicy{InitialIntervalMS: 100, BackoffFactor: 2, MaxIntervalMS: 10_000}, 0, 100 * ms},
		{"zero policy waits at least a millisecond", protocol.RetryPolicy{}, 3, 1 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RetryDelay(tt.policy, tt.attempt); got != tt.want {
				t.Errorf("RetryDelay(%+v, %d) = %v, want %v", tt.policy, tt.attempt, got, tt.want)
			}
		})
	}
}

func TestRetryDelayJitter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		policy  protocol.RetryPolicy
		attempt int
		base    time.Duration
	}{
		{"first try", protocol.RetryPolicy{InitialIntervalMS: 100, BackoffFactor: 2, MaxIntervalMS: 10_000, JitterMS: 50}, 1, 100 * time.Millisecond},
		{"third try", protocol.RetryPolicy{InitialIntervalMS: 100, BackoffFactor: 2, MaxIntervalMS: 10_000, JitterMS: 50}, 3, 400 * time.Millisecond},
		{"jitter is added after the cap", protocol.RetryPolicy{InitialIntervalMS: 100, BackoffFactor: 2, MaxIntervalMS: 150, JitterMS: 1000}, 5, 150 * time.Millisecond},
		{"one millisecond of jitter adds nothing", protocol.RetryPolicy{InitialIntervalMS: 100, BackoffFactor: 2, MaxIntervalMS: 10_000, JitterMS: 1}, 2, 200 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seen := map[time.Duration]bool{}
			for range 500 {
				d := RetryDelay(tt.policy, tt.attempt)
				if d < tt.base || d >= tt.base+time.Duration(tt.policy.JitterMS)*time.Millisecond {
					t.Fatalf("RetryDelay = %v, want in [%v, %v)", d, tt.base, tt.base+time.Duration(tt.policy.JitterMS)*time.Millisecond)
				}
				seen[d] = true
			}
			// 500 draws from ≥ 50 values all landing on one value is as good as impossible.
			if tt.policy.JitterMS > 1 && len(seen) < 2 {
				t.Errorf("500 delays with jitter_ms=%d were all %v; want a random jitter", tt.policy.JitterMS, tt.base)
			}
		})
	}
}

func TestRetryDelayNegativeJitterIgnored(t *testing.T) {
	t.Parallel()
	p := protocol.RetryPolicy{InitialIntervalMS: 100, BackoffFactor: 2, MaxIntervalMS: 10_000, JitterMS: -5}
	if got := RetryDelay(p, 2); got != 200*time.Millisecond {
		t.Errorf("RetryDelay with jitter_ms=-5 = %v, want 200ms", got)
	}
}
