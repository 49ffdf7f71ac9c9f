package worker

import (
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/retry"
)

// RetryPolicy is a route's retry policy as a retry.Policy: the delay before try n+1 is
// initial_interval_ms × backoff_factor^(n-1), capped at max_interval_ms (never below the
// initial interval), plus a random jitter below jitter_ms; at least a millisecond.
func RetryPolicy(p protocol.RetryPolicy) retry.Policy {
	initial := time.Duration(max(p.InitialIntervalMS, 1)) * time.Millisecond
	return retry.Policy{
		Initial: initial,
		Factor:  p.BackoffFactor,
		Max:     max(time.Duration(p.MaxIntervalMS)*time.Millisecond, initial),
		Jitter:  time.Duration(max(p.JitterMS, 0)) * time.Millisecond,
	}
}

// RetryDelay is the delay before the try after failed try number attempt (≥ 1) under p.
func RetryDelay(p protocol.RetryPolicy, attempt int) time.Duration {
	return RetryPolicy(p).Delay(attempt)
}
