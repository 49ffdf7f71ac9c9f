package fastlane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/retry"
)

// DefaultBuffer is how many answered requests may wait for their record at once, unless
// configured otherwise.
const DefaultBuffer = 4096

// writeBatch bounds the requests written together.
const writeBatch = 64

// writeRetry spaces out tries to write a batch the bus refused or did not answer.
var writeRetry = retry.Policy{Initial: 50 * time.Millisecond, Factor: 2, Max: 2 * time.Second}

// record is what the fast lane writes of one request it answered, in order: its plan, the
// request, its calls (on the fast calls' event subject), their results, and the response.
type record struct {
	requestID string
	// written, when set, is told when the write ended and whether it stored the record.
	written  func(ok bool)
	plan     *nats.Msg
	messages []bus.Encoded
}

// Writer writes what the fast lane answered onto the record, off the callers' path: a bounded
// buffer of answered requests, written in batches in the order they were answered. A request is
// answered on the fast lane only once a place in the buffer is reserved for it (Reserve), so a
// full buffer sends requests down the durable path instead of dropping their record. A batch the
// bus refuses or does not answer is written again (every message keeps its id, results and
// responses are written only where nothing is yet) until it is stored, or until Run's context
// ends and what is left could not be written within the drain time.
type Writer struct {
	bus   *bus.Bus
	pub   *bus.Publisher
	log   *slog.Logger
	queue chan *record
	held  atomic.Int64 // places reserved and not yet written
	size  int64
	// waiting, when set, follows held.
	waiting prometheus.Gauge

	written atomic.Int64 // requests whose record is on the bus
	lost    atomic.Int64 // requests whose record could not be written before shutdown
	retries atomic.Int64 // batches written again
}

// NewWriter returns a Writer of size places (DefaultBuffer when ≤ 0), publishing with pub.
func NewWriter(b *bus.Bus, pub *bus.Publisher, size int, log *slog.Logger) *Writer {
	if size <= 0 {
		size = DefaultBuffer
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Writer{bus: b, pub: pub, log: log, queue: make(chan *record, size), size: int64(size)}
}

// Reserve takes a place in the buffer for a request about to be answered: false when the buffer
// is full. A reserved place is filled (Fill) or given back (Release).
func (w *Writer) Reserve() bool {
	if w.held.Add(1) > w.size {
		w.held.Add(-1)
		return false
	}
	w.gauge(1)
	return true
}

// Release gives back a place reserved for a request that was not answered here.
func (w *Writer) Release() {
	w.held.Add(-1)
	w.gauge(-1)
}

func (w *Writer) gauge(n int) {
	if w.waiting != nil {
		w.waiting.Add(float64(n))
	}
}

// Fill puts the record of a request answered in a reserved place; it never waits.
func (w *Writer) Fill(r *record) { w.queue <- r }

// Waiting is how many requests' records are reserved or waiting to be written.
func (w *Writer) Waiting() int64 { return w.held.Load() }

// Stats are the writer's counts: requests written, batches written again, and requests lost to
// a shutdown that could not write them.
func (w *Writer) Stats() (written, retries, lost int64) {
	return w.written.Load(), w.retries.Load(), w.lost.Load()
}

// drainTime bounds writing what is left once Run's context ends.
const drainTime = 10 * time.Second

// Run writes records until ctx ends, then what is left within drainTime.
func (w *Writer) Run(ctx context.Context) error {
	batch := make([]*record, 0, writeBatch)
	for {
		batch = batch[:0]
		select {
		case r := <-w.queue:
			batch = append(batch, r)
		case <-ctx.Done():
			return w.drain(nil)
		}
	more:
		for len(batch) < writeBatch {
			select {
			case r := <-w.queue:
				batch = append(batch, r)
			default:
				break more
			}
		}
		if !w.write(ctx, batch) {
			return w.drain(batch) // ctx ended while it was written
		}
	}
}

// drain writes left, then what is queued, within drainTime.
func (w *Writer) drain(left []*record) error {
	ctx, cancel := context.WithTimeout(context.Background(), drainTime)
	defer cancel()
	for {
		batch := append(make([]*record, 0, writeBatch), left...)
		left = nil
	fill:
		for len(batch) < writeBatch {
			select {
			case r := <-w.queue:
				batch = append(batch, r)
			default:
				break fill
			}
		}
		if len(batch) == 0 {
			return nil
		}
		if !w.write(ctx, batch) {
			lost := int64(len(batch) + len(w.queue))
			w.lost.Add(lost)
			w.log.Error("the fast lane could not write the record of answered requests before stopping", "requests", lost)
			return fmt.Errorf("fastlane: %d answered requests not recorded", lost)
		}
	}
}

// write writes batch until it is stored (true), or ctx ends (false).
func (w *Writer) write(ctx context.Context, batch []*record) bool {
	err := retry.Do(ctx, writeRetry, time.Time{}, func() error { return w.writeOnce(ctx, batch) }, func(err error, wait time.Duration) {
		w.retries.Add(1)
		w.log.Warn("writing the fast lane's record failed; trying again", "requests", len(batch), "err", err, "in", wait)
	})
	for _, r := range batch {
		if r.written != nil {
			r.written(err == nil)
		}
	}
	if err != nil {
		return false
	}
	w.held.Add(-int64(len(batch)))
	w.gauge(-len(batch))
	w.written.Add(int64(len(batch)))
	return true
}

// writeOnce writes the plans of batch, then its messages, in order.
func (w *Writer) writeOnce(ctx context.Context, batch []*record) error {
	js := w.bus.JS
	futures := make([]jetstream.PubAckFuture, 0, len(batch))
	for _, r := range batch {
		f, err := js.PublishMsgAsync(r.plan)
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			_, err = js.PublishMsg(ctx, r.plan)
			if err != nil && !bus.IsExisting(err) {
				return fmt.Errorf("fastlane: record the plan of %s: %w", r.requestID, err)
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("fastlane: record the plan of %s: %w", r.requestID, err)
		}
		futures = append(futures, f)
	}
	var all []bus.Encoded
	for _, r := range batch {
		all = append(all, r.messages...)
	}
	err := w.pub.PublishEncoded(ctx, all)
	for _, f := range futures {
		select {
		case <-f.Ok():
		case perr := <-f.Err():
			if !bus.IsExisting(perr) && err == nil {
				// The request was planned before (a request_id asked again): its plan stands.
				err = fmt.Errorf("fastlane: record a plan: %w", perr)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return err
}
