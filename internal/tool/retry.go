package tool

import (
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// RetryDelay is the delay before the try after failed try number attempt (≥ 1) under policy p:
// InitialIntervalMS × BackoffFactor^(attempt-1), capped at MaxIntervalMS, plus a random jitter
// below JitterMS.
func RetryDelay(p protocol.RetryPolicy, attempt int) time.Duration {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     time.Duration(max(p.InitialIntervalMS, 1)) * time.Millisecond,
		Multiplier:          max(p.BackoffFactor, 1),
		MaxInterval:         time.Duration(max(p.MaxIntervalMS, p.InitialIntervalMS, 1)) * time.Millisecond,
		RandomizationFactor: 0,
		MaxElapsedTime:      0,
		Stop:                backoff.Stop,
		Clock:               backoff.SystemClock,
	}
	b.Reset()
	d := b.NextBackOff()
	for i := 1; i < attempt; i++ {
		d = b.NextBackOff()
	}
	if p.JitterMS > 0 {
		d += time.Duration(rand.IntN(p.JitterMS)) * time.Millisecond
	}
	return d
}
