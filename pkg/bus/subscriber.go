package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
type Subscriber struct {
	// Consumer to read from. Required.
	Consumer jetstream.Consumer
	// Handler for each message. Required.
	Handler Handler
	// Concurrency bounds handlers running at once in this process; it is also how many messages
	// are buffered, so AckWait never runs out on a message waiting in the client. Default 16.
	Concurrency int
	// Progress, when positive, signals the server that a message is still being worked on every
	// Progress while its handler runs, so a handler may outlive the consumer's AckWait. Keep it
	// at most AckWait/3.
	Progress time.Duration
	// Grace is how long Run waits for running handlers at shutdown before cancelling them.
	// Default 10 s.
	Grace time.Duration
	// Logger for failures; nil discards.
	Logger *slog.Logger
}

// Run consumes until ctx is done, then stops pulling, lets running handlers finish within
// Grace, cancels those still running (their messages are nak'ed for prompt redelivery) and
// returns nil. It returns an error if the consumer cannot be read (e.g. it was deleted).
func (s *Subscriber) Run(ctx context.Context) error {
	if s.Consumer == nil || s.Handler == nil {
		return errors.New("bus: Subscriber needs a Consumer and a Handler")
	}
	n := s.Concurrency
	if n <= 0 {
		n = 16
	}
	grace := s.Grace
	if grace <= 0 {
		grace = 10 * time.Second
	}
	logger := orDiscard(s.Logger)
	it, err := s.Consumer.Messages(jetstream.PullMaxMessages(n))
	if err != nil {
		return fmt.Errorf("bus: consume: %w", err)
	}
	// Handlers get their own context, cancelled only after the grace period at shutdown.
	hctx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()
	var wg sync.WaitGroup
	sem := make(chan struct{}, n)
	var runErr error
	draining := false
	for {
		var msg jetstream.Msg
		var err error
		if draining {
			msg, err = it.Next()
		} else {
			msg, err = it.Next(jetstream.NextContext(ctx))
		}
		if err != nil {
			if !draining && ctx.Err() != nil {
				draining = true
				it.Drain()
				continue
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				if !draining {
					runErr = fmt.Errorf("bus: consumer closed: %w", err)
				}
				break
			}
			if isTerminal(err) {
				it.Stop()
				runErr = fmt.Errorf("bus: consume: %w", err)
				break
			}
			logger.Warn("consume", "err", err)
			continue
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			s.handle(hctx, msg, logger)
		}()
	}
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

func isTerminal(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrBadRequest) ||
		errors.Is(err, nats.ErrConnectionClosed)
}

// handle runs the handler for msg and settles it: the one place that decides ack, nak or term.
func (s *Subscriber) handle(ctx context.Context, msg jetstream.Msg, logger *slog.Logger) {
	d := &Delivery{Subject: msg.Subject(), Data: msg.Data(), Header: msg.Headers()}
	if md, err := msg.Metadata(); err == nil {
		d.NumDelivered = md.NumDelivered
		d.StreamSeq = md.Sequence.Stream
		d.Published = md.Timestamp
	}
	if s.Progress > 0 {
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			t := time.NewTicker(s.Progress)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					_ = msg.InProgress()
				}
			}
		}()
	}
	err := s.call(ctx, d)
	var settleErr error
	switch {
	case err == nil:
		settleErr = msg.Ack()
	case IsPermanent(err):
		logger.Error("message terminated", "subject", d.Subject, "seq", d.StreamSeq, "err", err)
		settleErr = msg.TermWithReason(truncate(err.Error(), 256))
	case ctx.Err() != nil:
		settleErr = msg.Nak() // shutting down: let another instance take it now
	default:
		delay, ok := retryDelay(err)
		if !ok {
			delay = DefaultRetryDelay(d.NumDelivered)
		}
		logger.Warn("message will be redelivered", "subject", d.Subject, "seq", d.StreamSeq,
			"delivered", d.NumDelivered, "delay", delay, "err", err)
		settleErr = msg.NakWithDelay(delay)
	}
	if settleErr != nil {
		logger.Warn("settle message", "subject", d.Subject, "seq", d.StreamSeq, "err", settleErr)
	}
}

// call runs the handler, turning a panic into an error.
func (s *Subscriber) call(ctx context.Context, d *Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("bus: handler panic: %v\n%s", r, debug.Stack())
		}
	}()
	return s.Handler.Handle(ctx, d)
}

// DefaultRetryDelay is the redelivery delay after the n-th failed delivery of a handler error
// that asked for none: 100 ms doubling up to 5 s.
func DefaultRetryDelay(n uint64) time.Duration {
	d := 100 * time.Millisecond
	for i := uint64(1); i < n && d < 5*time.Second; i++ {
		d *= 2
	}
	return min(d, 5*time.Second)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
