package bus

import (
	"errors"
	"time"
)

// ErrNotProvisioned is returned by Provision with Config.OpenOnly when a stream, bucket or
// consumer Hermes needs does not exist.
var ErrNotProvisioned = errors.New("bus: Hermes is not set up on this NATS server")

// ErrInboxRefused is returned by Connect when the NATS server does not let the connection
// subscribe under its inbox prefix: every request it made (each JetStream call) would go
// unanswered. The user's permissions name its inbox (Access.Inbox).
var ErrInboxRefused = errors.New("bus: the NATS user may not receive replies under this connection's inbox prefix")

// permanentError marks a failure that no redelivery can fix: the message is terminated.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent wraps err so that Subscriber terminates the message instead of redelivering it.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// retryError asks for redelivery after a given delay.
type retryError struct {
	err   error
	delay time.Duration
}

func (e *retryError) Error() string { return e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }

// RetryAfter wraps err so that Subscriber redelivers the message after delay.
func RetryAfter(err error, delay time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryError{err: err, delay: delay}
}

// retryDelay returns the delay asked for with RetryAfter, if any.
func retryDelay(err error) (time.Duration, bool) {
	var r *retryError
	if errors.As(err, &r) {
		return r.delay, true
	}
	return 0, false
}
