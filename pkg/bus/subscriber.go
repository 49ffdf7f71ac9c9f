package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/retry"
)

// Delivery is one message handed to a Handler.
type Delivery struct {
	Subject string
	Data    []byte
	Header  nats.Header
	// NumDelivered counts deliveries of this message by its consumer, starting at 1.
	NumDelivered uint64
	// StreamSeq is the message's sequence in the stream.
	StreamSeq uint64
	// Published is when the stream stored the message.
	Published time.Time
	// Msg is the decoded envelope, set by the Decode middleware.
	Msg *protocol.Message
	// Log names the message in every line, set by the Log middleware; nil before it.
	Log *slog.Logger
}

// Handler handles one delivery. Its result alone decides the message's fate: nil acks it, an
// error wrapped with Permanent terminates it, one wrapped with RetryAfter naks it with that
// delay, and any other error naks it with a delay growing with NumDelivered.
type Handler interface {
	Handle(ctx context.Context, d *Delivery) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, d *Delivery) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, d *Delivery) error { return f(ctx, d) }

// Subscriber runs a Handler over a durable pull consumer with bounded concurrency.
//
// It pulls only as many messages as it has free handler slots, so every message it receives
// starts its handler at once: none waits in a client buffer while its ack deadline runs out
// (with a Pool, one may wait for a slot of it, kept in progress).
type Subscriber struct {
	// Consumer to read from. Required.
	Consumer jetstream.Consumer
	// Handler for each message. Required. Panics are always recovered (Recover).
	Handler Handler
	// Middleware wraps Handler; Middleware[0] is the outermost.
	Middleware []Middleware
	// Concurrency bounds handlers running at once in this process. Default 16.
	Concurrency int
	// Progress, when positive, signals the server that a message is still being worked on every
	// Progress while its handler runs, so a handler may outlive the consumer's AckWait. Keep it
	// at most AckWait/3.
	Progress time.Duration
	// Grace is how long Run waits, once ctx is done, for running handlers before cancelling
	// them. Default 10 s.
	Grace time.Duration
	// PullWait is how long one pull request waits for messages; it also bounds how long Run
	// takes to stop pulling once ctx is done. Default 500 ms.
	PullWait time.Duration
	// Pool, when set, names the pool of handler slots shared with other subscribers that each
	// message handled here also takes a slot of (a bulkhead). It is asked again before every
	// pull, so a subscriber moved to another pool uses that one next; a pull waits for a free
	// slot of it (without holding one while it waits for messages) and asks for no more
	// messages than the pool has free slots; one that must still wait is kept in progress.
	Pool func() *Pool
	// Logger for failures; nil discards.
	Logger *slog.Logger
}

// Pool is a number of handler slots shared by subscribers (a bulkhead): subscribers of one
// pool wait only for each other. It is safe for concurrent use.
type Pool struct{ slots chan struct{} }

// NewPool returns a pool of n slots (at least 1).
func NewPool(n int) *Pool {
	p := &Pool{slots: make(chan struct{}, max(n, 1))}
	for range cap(p.slots) {
		p.slots <- struct{}{}
	}
	return p
}

// Size is how many slots the pool has.
func (p *Pool) Size() int { return cap(p.slots) }

// InUse is how many of its slots are taken now.
func (p *Pool) InUse() int { return cap(p.slots) - len(p.slots) }

// TryTake takes a free slot now, without waiting: false when none is free. Put gives it back.
func (p *Pool) TryTake() bool {
	select {
	case <-p.slots:
		return true
	default:
		return false
	}
}

// TakeWithin takes a slot, waiting at most d for one to be free: false when none was, or ctx
// ended first. Put gives it back.
func (p *Pool) TakeWithin(ctx context.Context, d time.Duration) bool {
	if p.TryTake() {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.slots:
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}

// Put gives back a slot TryTake or TakeWithin took.
func (p *Pool) Put() { p.slots <- struct{}{} }

// free waits until the pool has a free slot, without taking it; false when ctx ended first.
func (p *Pool) free(ctx context.Context) bool {
	select {
	case <-p.slots:
		p.slots <- struct{}{}
		return true
	case <-ctx.Done():
		return false
	}
}

// take takes a slot for msg, keeping msg in progress every progress while it waits; false
// when ctx ended first.
func (p *Pool) take(ctx context.Context, msg jetstream.Msg, progress time.Duration) bool {
	select {
	case <-p.slots:
		return true
	default:
	}
	if progress <= 0 {
		progress = 5 * time.Second
	}
	t := time.NewTicker(progress)
	defer t.Stop()
	for {
		select {
		case <-p.slots:
			return true
		case <-t.C:
			_ = msg.InProgress()
		case <-ctx.Done():
			return false
		}
	}
}

// Run consumes until ctx is done, then stops pulling (a message that arrives after that is
// nak'ed for prompt redelivery, not handled), gives running handlers Grace to finish, cancels
// those still running (their messages are nak'ed too) and returns nil. It returns an error if
// the consumer cannot be read (e.g. it was deleted or the connection closed).
func (s *Subscriber) Run(ctx context.Context) error {
	if s.Consumer == nil || s.Handler == nil {
		return errors.New("bus: Subscriber needs a Consumer and a Handler")
	}
	n := max(s.Concurrency, 1)
	if s.Concurrency <= 0 {
		n = 16
	}
	grace := s.Grace
	if grace <= 0 {
		grace = 10 * time.Second
	}
	wait := s.PullWait
	if wait <= 0 {
		wait = 500 * time.Millisecond
	}
	logger := orDiscard(s.Logger)
	h := Chain(s.Handler, append([]Middleware{Recover()}, s.Middleware...)...)
	// Handlers get their own context, cancelled only after the grace period at shutdown.
	hctx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()
	var wg sync.WaitGroup
	free := make(chan struct{}, n) // one token per free handler slot
	for range n {
		free <- struct{}{}
	}
	runErr := s.pull(ctx, hctx, h, free, n, wait, &wg, logger)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		cancelHandlers()
		<-done
	}
	return runErr
}

// pull fetches as many messages as there are free slots and starts a handler for each, until
// ctx is done or the consumer fails. Once ctx is done it issues no new pull, and naks what the
// pull under way still delivers, so nothing waits out its ack deadline.
func (s *Subscriber) pull(ctx, hctx context.Context, h Handler, free chan struct{}, n int, wait time.Duration, wg *sync.WaitGroup, logger *slog.Logger) error {
	failures := 0
	backoff := func() bool { // waits after a failure; false when ctx ended meanwhile
		failures++
		return retry.Sleep(ctx, pullRetry.Delay(failures))
	}
	for {
		if ctx.Err() != nil { // checked first: a free slot must not win over shutdown
			return nil
		}
		select {
		case <-free:
		case <-ctx.Done():
			return nil
		}
		var pool *Pool
		if s.Pool != nil {
			if pool = s.Pool(); pool != nil && !pool.free(ctx) {
				free <- struct{}{}
				return nil
			}
		}
		k := 1
	more:
		// No more messages than the pool has free slots now: each is then kept in progress
		// while it waits for one taken meanwhile by another subscriber (rarely).
		for k < n && (pool == nil || k < len(pool.slots)) {
			select {
			case <-free:
				k++
			default:
				break more
			}
		}
		batch, err := s.Consumer.Fetch(k, jetstream.FetchMaxWait(wait))
		if err != nil {
			for range k {
				free <- struct{}{}
			}
			if err := s.terminal(ctx, err); err != nil {
				return err
			}
			logger.Warn("pull failed", "err", err)
			if !backoff() {
				return nil
			}
			continue
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			if ctx.Err() != nil {
				_ = msg.Nak() // shutting down: let another instance take it now
				free <- struct{}{}
				continue
			}
			wg.Add(1)
			go func() {
				defer func() { free <- struct{}{}; wg.Done() }()
				if pool != nil {
					if !pool.take(ctx, msg, s.Progress) {
						_ = msg.Nak()
						return
					}
					defer func() { pool.slots <- struct{}{} }()
				}
				s.handle(hctx, h, msg, logger)
			}()
		}
		for range k - got {
			free <- struct{}{}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			if err := s.terminal(ctx, err); err != nil {
				return err
			}
			logger.Warn("pull ended with an error", "err", err)
			if !backoff() {
				return nil
			}
			continue
		}
		failures = 0
	}
}

// terminal returns a wrapped err when the consumer cannot be read any more: deleted, the
// connection closed, or "no responders" for a consumer that no longer exists. A consumer that
// is missing only while JetStream comes back (a server restarting, JetStream re-enabled: the
// stream is loaded before its consumers) is not gone: it must stay missing for consumerGone.
func (s *Subscriber) terminal(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, jetstream.ErrBadRequest) || errors.Is(err, nats.ErrConnectionClosed):
		return fmt.Errorf("bus: consume: %w", err)
	case errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, nats.ErrNoResponders):
		if gone := s.gone(ctx); gone != nil {
			return fmt.Errorf("bus: consume: %w", gone)
		}
	}
	return nil
}

// consumerGone is how long a consumer must be missing before a subscriber stops.
const consumerGone = 3 * time.Second

// gone returns the error that says the consumer does not exist, if it stays so for
// consumerGone; nil if it is there (again), or its state cannot be told.
func (s *Subscriber) gone(ctx context.Context) error {
	deadline := time.Now().Add(consumerGone)
	for {
		_, err := s.Consumer.Info(ctx)
		if !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		if !retry.Sleep(ctx, 250*time.Millisecond) {
			return nil
		}
	}
}

// handle runs the handler for msg and settles it: the one place that decides ack, nak or term.
func (s *Subscriber) handle(ctx context.Context, h Handler, msg jetstream.Msg, logger *slog.Logger) {
	d := &Delivery{Subject: msg.Subject(), Data: msg.Data(), Header: msg.Headers()}
	if md, err := msg.Metadata(); err == nil {
		d.NumDelivered = md.NumDelivered
		d.StreamSeq = md.Sequence.Stream
		d.Published = md.Timestamp
	}
	if s.Progress > 0 {
		defer Every(s.Progress, func() { _ = msg.InProgress() })()
	}
	err := h.Handle(ctx, d)
	var settleErr error
	switch {
	case err == nil:
		settleErr = msg.Ack()
	case IsPermanent(err):
		logger.Error("message terminated", append(d.logAttrs(), "err", err)...)
		settleErr = msg.TermWithReason(truncate(err.Error(), 256))
	case ctx.Err() != nil:
		settleErr = msg.Nak() // shutting down: let another instance take it now
	default:
		delay, ok := retryDelay(err)
		if !ok {
			delay = DefaultRetryDelay(d.NumDelivered)
		}
		logger.Warn("message will be redelivered", append(d.logAttrs(), "delivered", d.NumDelivered, "delay", delay, "err", err)...)
		settleErr = msg.NakWithDelay(delay)
	}
	if settleErr != nil {
		logger.Warn("settle message", append(d.logAttrs(), "err", settleErr)...)
	}
}

// logAttrs names the delivery in log lines: its subject and sequence, and the request,
// session, message and trace ids its headers carry (Hermes sets them on every message).
func (d *Delivery) logAttrs() []any {
	return []any{"subject", d.Subject, "seq", d.StreamSeq,
		"request_id", d.Header.Get(HeaderRequestID), "session_id", d.Header.Get(HeaderSessionID),
		"msg_id", d.Header.Get(jetstream.MsgIDHeader), "trace_id", d.Header.Get(HeaderTraceID)}
}

// RedeliveryPolicy spaces out redeliveries of a message whose handler failed without asking
// for a delay of its own: 100 ms doubling up to 5 s.
var RedeliveryPolicy = retry.Policy{Initial: 100 * time.Millisecond, Factor: 2, Max: 5 * time.Second}

// pullRetry spaces out pulls after failed ones: 100 ms doubling up to 2 s.
var pullRetry = retry.Policy{Initial: 100 * time.Millisecond, Factor: 2, Max: 2 * time.Second}

// DefaultRetryDelay is the redelivery delay after the n-th failed delivery of a handler error
// that asked for none (RedeliveryPolicy).
func DefaultRetryDelay(n uint64) time.Duration { return RedeliveryPolicy.Delay(int(min(n, 1<<20))) }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
