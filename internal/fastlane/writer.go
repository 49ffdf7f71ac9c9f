package fastlane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

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

// record is what the fast lane writes of one request it answered, in order: the request, its
// calls (on the fast calls' event subject), their results, and the response. (Its plan was
// recorded before any worker was asked.)
type record struct {
	requestID string
	// written, when set, is told when the write ended and whether it stored the record.
	written  func(ok bool)
	messages []bus.Encoded
}

// size is what the record's messages hold.
func (r *record) size() int {
	n := 0
	for _, m := range r.messages {
		n += len(m.Data)
	}
	return n
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
	bytes atomic.Int64 // what the records waiting hold
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

// MaxBufferBytes bounds what the records waiting to be written hold.
const MaxBufferBytes = 256 << 20

// Reserve takes a place in the buffer for a request about to be answered: false when the buffer
// is full, by count or by bytes. A reserved place is filled (Fill) or given back (Release).
func (w *Writer) Reserve() bool {
	if w.bytes.Load() >= MaxBufferBytes {
		return false
	}
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

// Fits takes room for r's bytes in the buffer: false when they would take it past
// MaxBufferBytes (one record larger than that alone fits an empty buffer). A record it took room
// for is filled (Fill) at once.
func (w *Writer) Fits(r *record) bool {
	size := int64(r.size())
	for {
		cur := w.bytes.Load()
		if cur > 0 && cur+size > MaxBufferBytes {
			return false
		}
		if w.bytes.CompareAndSwap(cur, cur+size) {
			return true
		}
	}
}

// Fill puts the record of a request answered in a reserved place, room taken for it (Fits); it
// never waits.
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
		batch = w.more(batch, writeBatch)
		if !w.write(ctx, batch) {
			return w.drain(batch) // ctx ended while it was written
		}
	}
}

// more adds to batch what is queued, without waiting, until it holds n.
func (w *Writer) more(batch []*record, n int) []*record {
	for len(batch) < n {
		select {
		case r := <-w.queue:
			batch = append(batch, r)
		default:
			return batch
		}
	}
	return batch
}

// drain writes left, then what is queued, within drainTime.
func (w *Writer) drain(left []*record) error {
	ctx, cancel := context.WithTimeout(context.Background(), drainTime)
	defer cancel()
	for {
		batch := w.more(append(make([]*record, 0, writeBatch), left...), writeBatch)
		left = nil
		if len(batch) == 0 {
			return nil
		}
		if !w.write(ctx, batch) {
			batch = w.more(batch, len(batch)+len(w.queue))
			w.finish(batch, false)
			w.log.Error("the fast lane could not write the record of answered requests before stopping", "requests", len(batch))
			return fmt.Errorf("fastlane: %d answered requests not recorded", len(batch))
		}
	}
}

// stuckTries is how many tries of a batch, each failing while the connection is up, make the
// writer take its records one by one; a record failing as many tries alone is given up on.
const stuckTries = 8

// write writes batch until it is stored (true), or ctx ends (false). A record that cannot be
// stored however often it is tried while the bus answers (say, larger than the stream takes) is
// given up on, logged and counted lost, rather than holding up every record behind it.
func (w *Writer) write(ctx context.Context, batch []*record) bool {
	fails := 0
	for n := 1; ; n++ {
		err := w.writeOnce(ctx, batch)
		if err == nil {
			w.finish(batch, true)
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if refused(err) {
			fails++ // the bus said no to this batch; unanswered writes are tried on and on
		}
		switch {
		case fails >= stuckTries && len(batch) > 1:
			for _, r := range batch {
				if !w.write(ctx, []*record{r}) {
					return false
				}
			}
			return true
		case fails >= stuckTries:
			w.log.Error("the fast lane gave up on the record of an answered request", "request_id", batch[0].requestID, "err", err)
			w.finish(batch, false)
			return true
		}
		w.retries.Add(1)
		wait := writeRetry.Delay(n)
		w.log.Warn("writing the fast lane's record failed; trying again", "requests", len(batch), "err", err, "in", wait)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		}
	}
}

// refused reports whether err is the stream's own refusal of a message (an API error: too
// large, say), not the bus being away or slow (no responders, timeouts, a lost connection),
// which is waited out however long it lasts.
func refused(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.Code != 503
}

// finish settles batch: written (ok) or given up on.
func (w *Writer) finish(batch []*record, ok bool) {
	size := 0
	for _, r := range batch {
		size += r.size()
		if r.written != nil {
			r.written(ok)
		}
	}
	w.held.Add(-int64(len(batch)))
	w.bytes.Add(-int64(size))
	w.gauge(-len(batch))
	if ok {
		w.written.Add(int64(len(batch)))
	} else {
		w.lost.Add(int64(len(batch)))
	}
}

// writeOnce writes the messages of batch, in order.
func (w *Writer) writeOnce(ctx context.Context, batch []*record) error {
	var all []bus.Encoded
	for _, r := range batch {
		all = append(all, r.messages...)
	}
	return w.pub.PublishEncoded(ctx, all)
}
