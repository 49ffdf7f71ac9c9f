package retry

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Policy spaces out tries. The delay after failed try n (n ≥ 1) is Initial × Factor^(n-1),
// capped at Max (or at Initial when Max is below it), plus a random jitter in [0, Jitter). The zero Policy waits nothing between
// tries; a Factor below 1 counts as 1 (a fixed delay).
type Policy struct {
	// Initial is the delay after the first failure.
	Initial time.Duration
	// Factor multiplies the delay after each further failure.
	Factor float64
	// Max caps any one delay before jitter; zero means no cap, and a cap below Initial counts
	// as Initial.
	Max time.Duration
	// Jitter adds up to this much at random to each delay.
	Jitter time.Duration
}

// Fixed is a policy that waits d after every failure.
func Fixed(d time.Duration) Policy { return Policy{Initial: d, Factor: 1, Max: d} }

// Delay is the pause after failed try n (n ≥ 1; a smaller n counts as 1).
func (p Policy) Delay(n int) time.Duration {
	d := p.base(n)
	if p.Jitter > 0 {
		d += rand.N(p.Jitter)
	}
	return d
}

// base is Delay without jitter.
func (p Policy) base(n int) time.Duration {
	if p.Initial <= 0 {
		return 0
	}
	maxInterval := p.Max
	switch {
	case maxInterval <= 0:
		maxInterval = time.Duration(1 << 62)
	case maxInterval < p.Initial:
		maxInterval = p.Initial // a cap never cuts the first delay
	}
	if p.Factor <= 1 {
		return p.Initial
	}
	b := &backoff.ExponentialBackOff{
		InitialInterval:     p.Initial,
		Multiplier:          max(p.Factor, 1),
		MaxInterval:         maxInterval,
		RandomizationFactor: 0,
		MaxElapsedTime:      0,
		Stop:                backoff.Stop,
		Clock:               backoff.SystemClock,
	}
	b.Reset()
	d := b.NextBackOff()
	// Any try number Hermes sees is far below maxSteps; beyond it the delay stays where it is.
	for i := 1; i < min(n, maxSteps) && d < maxInterval; i++ {
		d = b.NextBackOff()
	}
	return d
}

const maxSteps = 1000

// Stop wraps err so that Do returns it at once instead of trying again.
func Stop(err error) error {
	if err == nil {
		return nil
	}
	return &stopError{err}
}

type stopError struct{ err error }

func (e *stopError) Error() string { return e.err.Error() }
func (e *stopError) Unwrap() error { return e.err }

// Do calls try until it returns nil, an error wrapped with Stop (returned unwrapped), or until
// ctx ends or the deadline passes (a zero deadline: none), when it returns try's last error.
// Between tries it waits p.Delay(n) after failure n; onRetry, when set, is told each failure
// and the pause that follows it.
func Do(ctx context.Context, p Policy, deadline time.Time, try func() error, onRetry func(err error, wait time.Duration)) error {
	for n := 1; ; n++ {
		err := try()
		if err == nil {
			return nil
		}
		var stop *stopError
		if errors.As(err, &stop) {
			return stop.err
		}
		wait := p.Delay(n)
		if !deadline.IsZero() && time.Now().Add(wait).After(deadline) {
			return err
		}
		if onRetry != nil {
			onRetry(err, wait)
		}
		if !Sleep(ctx, wait) {
			return err
		}
	}
}

// Sleep waits d or until ctx ends, and reports whether it waited the whole time.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
