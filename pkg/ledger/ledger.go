// Package ledger is the call ledger in the hermes-claims bucket: which worker is running each
// tool call (key protocol.KeyClaim), how many tries it has had, its last failure, and whether
// its request was cancelled.
//
// Guarantees: at most one holder runs a call at a time, as long as holders renew within the
// lease. A holder is one Ledger value, i.e. one worker process: its claims carry a token unique
// to the process, and a process never takes over a call it is already running, even if the
// same call is delivered to it twice. A holder that stops renewing (it died) loses the call
// after the lease, and the next worker takes it over with a compare-and-set, so two can never
// take it over at once. Try numbers grow by one with each acquisition, whoever makes it.
//
// A cancelled call (Cancel) is never acquired again, and its holder learns of the cancellation
// at its next renewal (Hold.Cancelled), a durable second path beside any faster signal.
//
// A finished call (Hold.Finish: its result is on the record) is never acquired again either:
// the ledger, not a read of the record, is how a worker knows a call needs no further try, so
// a worker's credential need not read the record. A worker that stops between recording a
// result and finishing its claim leaves the call to be run again; the record keeps the first
// result.
//
// Leases are judged by the server's clock alone: the server's timestamp of the claim's last
// write against the server's current time (the bucket's stream information, asked only when a
// call is found held by another), so workers' clocks may be anything.
package ledger

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// KV is the part of a JetStream key-value bucket the ledger uses; jetstream.KeyValue has it.
type KV interface {
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
}

var _ KV = jetstream.KeyValue(nil)

// serverClock is a KV that can tell the server's current time: jetstream.KeyValue, whose
// status carries the time the server gathered it.
type serverClock interface {
	Status(ctx context.Context) (jetstream.KeyValueStatus, error)
}

// claim is a worker's hold on one call. A claim is held while its holder renews it within the
// lease; a released claim keeps the last failure of the call, so whoever gives up on the call
// can report it.
type claim struct {
	Holder        string `json:"holder,omitempty"`
	Attempt       int    `json:"attempt"`
	Released      bool   `json:"released,omitempty"`
	LastErrorCode string `json:"last_error_code,omitempty"`
	Cancelled     bool   `json:"cancelled,omitempty"`
	// Finished says the call's result is recorded: no further try.
	Finished bool `json:"finished,omitempty"`
	// Recording is the holder that began recording a result of the call (Hold.Recording),
	// set once and kept across takeovers: a result on the record before another holder's
	// may be that one's.
	Recording string `json:"recording,omitempty"`
	// V is claimVersion in every claim this version writes; a claim without it was written
	// by a Hermes that marked neither finished calls nor recordings.
	V int `json:"v,omitempty"`
}

// claimVersion marks claims that say when a call is finished and who began recording it.
const claimVersion = 1

// earlierVersion stands for the holder of a claim written by a Hermes before claimVersion, which
// may have recorded a result without saying so: taken over, such a call's result is recorded
// only where none is.
const earlierVersion = "an earlier version of Hermes"

// ErrClaimed means a live holder — another worker, or this one — is running the call.
var ErrClaimed = errors.New("ledger: call is being run by a live worker")

// ErrCancelled means the call's request was cancelled: it must not run.
var ErrCancelled = errors.New("ledger: call cancelled")

// ErrFinished means the call's result is recorded (Hold.Finish): it must not run again.
var ErrFinished = errors.New("ledger: call finished")

// Ledger is the hermes-claims bucket seen by one worker process. It is safe for concurrent use.
type Ledger struct {
	kv     KV
	holder string
	lease  time.Duration
	// localNow is this process's clock: used only when the store cannot tell the server's.
	localNow func() time.Time

	mu   sync.Mutex
	held map[string]bool
}

// New returns the view of the ledger in kv of the worker named instance; a claim not renewed
// within lease is presumed abandoned.
func New(kv KV, instance string, lease time.Duration) *Ledger {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &Ledger{kv: kv, holder: instance + "/" + hex.EncodeToString(b[:]), lease: lease, held: map[string]bool{}, localNow: time.Now}
}

// Lease is how long a claim holds without renewal.
func (l *Ledger) Lease() time.Duration { return l.lease }

// Key is the ledger key of one call (protocol.KeyClaim).
func Key(requestID, callID string) string { return protocol.KeyClaim(requestID, callID) }

// Hold is a claim this worker owns, at a known revision. Its methods must not be called
// concurrently with each other; Done (or Release) must be called when the try is over.
type Hold struct {
	l         *Ledger
	key       string
	rev       uint64
	c         claim
	lost      bool
	fresh     bool
	done      bool
	cancelled bool
}

// Fresh reports whether this is the call's first claim ever: no worker tried it before, so it
// cannot have a result yet.
func (h *Hold) Fresh() bool { return h.fresh }

// Attempt is the number of the try this hold is for, from 1.
func (h *Hold) Attempt() int { return h.c.Attempt }

// LastErrorCode is the error code of the call's last failed try before this one, as its holder
// released it ("" when none failed, or none said why).
func (h *Hold) LastErrorCode() string { return h.c.LastErrorCode }

// Lost reports whether a renewal found the claim taken over: this worker was presumed dead.
func (h *Hold) Lost() bool { return h.lost }

// Cancelled reports whether a renewal found the call cancelled.
func (h *Hold) Cancelled() bool { return h.cancelled }

// Acquire claims key for the next try of the call; the hold's Attempt numbers that try (1 for
// the first). It fails with ErrClaimed, and how long to wait before asking again, when a live
// holder has the call, with ErrFinished when its result is recorded, and with ErrCancelled
// when the call was cancelled (and not finished).
func (l *Ledger) Acquire(ctx context.Context, key string) (*Hold, time.Duration, error) {
	l.mu.Lock()
	if l.held[key] {
		l.mu.Unlock()
		return nil, l.lease, ErrClaimed
	}
	l.held[key] = true // reserved while we try
	l.mu.Unlock()
	h, wait, err := l.acquire(ctx, key)
	if err != nil {
		l.drop(key)
	}
	return h, wait, err
}

func (l *Ledger) acquire(ctx context.Context, key string) (*Hold, time.Duration, error) {
	c := claim{Holder: l.holder, Attempt: 1, V: claimVersion}
	val, _ := json.Marshal(&c)
	rev, err := l.kv.Create(ctx, key, val)
	if err == nil {
		return &Hold{l: l, key: key, rev: rev, c: c, fresh: true}, 0, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return nil, 0, fmt.Errorf("ledger: claim %s: %w", key, err)
	}
	e, err := l.kv.Get(ctx, key)
	if err != nil {
		return nil, 0, fmt.Errorf("ledger: read claim %s: %w", key, err)
	}
	var prev claim
	_ = json.Unmarshal(e.Value(), &prev) // an unreadable claim is treated as abandoned
	if prev.Finished {
		return nil, 0, ErrFinished
	}
	if prev.Cancelled {
		return nil, 0, ErrCancelled
	}
	// A claim by this very process that it does not hold (an earlier Create whose reply was
	// lost) is ours to take: the reservation above guarantees nothing here runs the call.
	if !prev.Released && prev.Holder != "" && prev.Holder != l.holder {
		now, err := l.serverNow(ctx)
		if err != nil {
			return nil, 0, fmt.Errorf("ledger: read the server's time for claim %s: %w", key, err)
		}
		if age := now.Sub(e.Created()); age < l.lease {
			return nil, l.lease - max(age, 0), ErrClaimed
		}
	}
	c.Attempt, c.LastErrorCode, c.Recording = prev.Attempt+1, prev.LastErrorCode, prev.Recording
	if prev.V < claimVersion && prev.Attempt > 0 && c.Recording == "" {
		c.Recording = earlierVersion
	}
	val, _ = json.Marshal(&c)
	rev, err = l.kv.Update(ctx, key, val, e.Revision())
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return nil, l.lease, ErrClaimed // another worker took it just now
	}
	if err != nil {
		return nil, 0, fmt.Errorf("ledger: take over claim %s: %w", key, err)
	}
	return &Hold{l: l, key: key, rev: rev, c: c}, 0, nil
}

// serverNow is the current time on the server that stores the claims, so that a claim's age
// compares two readings of one clock. A store that cannot tell (not a JetStream bucket, or a
// server too old to stamp its answers) gives this process's time.
func (l *Ledger) serverNow(ctx context.Context) (time.Time, error) {
	sc, ok := l.kv.(serverClock)
	if !ok {
		return l.localNow(), nil
	}
	st, err := sc.Status(ctx)
	if err != nil {
		return time.Time{}, err
	}
	if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok && bs.StreamInfo() != nil && !bs.StreamInfo().TimeStamp.IsZero() {
		return bs.StreamInfo().TimeStamp, nil
	}
	return l.localNow(), nil
}

func (l *Ledger) drop(key string) {
	l.mu.Lock()
	delete(l.held, key)
	l.mu.Unlock()
}

// Renew extends the lease. It reports false when the claim was taken over (this worker was
// presumed dead) or cannot be read; the caller may finish its try, and the first recorded
// result wins. A renewal whose reply was lost but which the server applied is recognised on
// the next renewal and adopted.
func (h *Hold) Renew(ctx context.Context) bool {
	if h.lost {
		return false
	}
	val, _ := json.Marshal(&h.c)
	rev, err := h.l.kv.Update(ctx, h.key, val, h.rev)
	if err == nil {
		h.rev = rev
		return true
	}
	e, gerr := h.l.kv.Get(ctx, h.key)
	if gerr != nil {
		return false // unknown for now; the next renewal tries again
	}
	if e.Revision() != h.rev && bytes.Equal(e.Value(), val) {
		h.rev = e.Revision() // our earlier write went through
		return true
	}
	var now claim
	if e.Revision() != h.rev && json.Unmarshal(e.Value(), &now) == nil && now.Recording != h.c.Recording {
		// Only the recording mark changed (a holder presumed dead began recording): the
		// claim is still ours; keep its mark, and renew at its revision.
		mark := now
		mark.Recording = h.c.Recording
		if again, _ := json.Marshal(&mark); bytes.Equal(again, val) {
			h.c.Recording, h.rev = now.Recording, e.Revision()
			return h.Renew(ctx)
		}
	}
	if e.Revision() != h.rev {
		var now claim
		if json.Unmarshal(e.Value(), &now) == nil && now.Cancelled {
			h.cancelled = true
		}
		h.lost = true
	}
	return false
}

// Release gives the call up after a failed try, recording the failure (if errorCode is not
// empty) for whoever comes next, and ends the hold.
func (h *Hold) Release(ctx context.Context, errorCode string) {
	defer h.Done()
	if h.lost {
		return
	}
	h.c.Released, h.c.Holder = true, ""
	if errorCode != "" {
		h.c.LastErrorCode = errorCode
	}
	h.Renew(ctx)
}

// Recording notes on the claim that this holder is about to record the call's result, before
// it does — unless another holder noted so first, whose mark stays: a holder that takes the call
// over later (this one died before finishing the claim), or that held it while this one was
// presumed dead, then knows that a result on the record may be this one's, and leaves it
// standing (Settled). It writes whether or not the hold was lost, and reports whether the mark
// is this holder's; an error leaves it unknown (Settled reads it again).
func (h *Hold) Recording(ctx context.Context) (bool, error) {
	mine := false
	err := update(ctx, h.l.kv, h.key, "mark the recording of", func(c *claim) bool {
		mine = c.Recording == "" || c.Recording == h.l.holder
		if c.Recording != "" {
			return false
		}
		c.Recording = h.l.holder
		return true
	})
	if err == nil && mine {
		// The claim changed under the hold: the next renewal adopts the write, whose bytes are
		// the hold's claim, and nothing else (a cancellation since is seen as one).
		h.c.Recording = h.l.holder
	}
	return mine, err
}

// Finish marks the call finished — its result is recorded — and ends the hold: no worker
// acquires it again. It writes whether or not this hold was lost (the holder that took the
// call over learns at its next renewal, and its result is not the record's), keeps the call's
// tries and last failure, and is idempotent.
func (h *Hold) Finish(ctx context.Context) error {
	defer h.Done()
	return Finish(ctx, h.l.kv, h.key)
}

// Finish marks the call at key finished, as Hold.Finish does, for whoever records a result of
// a call it does not hold (the dead-letter processor's answer): before recording it, so that a
// worker finding that answer on the record first knows it counts.
func Finish(ctx context.Context, kv KV, key string) error {
	return update(ctx, kv, key, "finish", func(c *claim) bool {
		if c.Finished {
			return false
		}
		c.Finished, c.Released, c.Holder = true, true, ""
		return true
	})
}

// Reopen clears the finished and recording marks of the call at key, keeping its tries, so
// that it may run again: for a call re-driven from the dead letters, whose recorded result is
// the dead-letter processor's answer, not its tool's (the re-driver read the record). It is
// idempotent.
func Reopen(ctx context.Context, kv KV, key string) error {
	return update(ctx, kv, key, "reopen", func(c *claim) bool {
		if !c.Finished && c.Recording == "" {
			return false
		}
		c.Finished, c.Recording = false, ""
		return true
	})
}

// Settled reports whether whatever is recorded first for the call at key is its result, so
// that this process's must not follow it: the call is finished or cancelled, or another holder
// began recording a result (Hold.Recording) — what this process began is its own.
func (l *Ledger) Settled(ctx context.Context, key string) (bool, error) {
	e, err := l.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("ledger: read claim %s: %w", key, err)
	}
	var c claim
	if json.Unmarshal(e.Value(), &c) != nil {
		return false, nil
	}
	other := func(h string) bool { return h != "" && h != l.holder }
	// Another holder's mark, or a claim another holder took over from this process (which
	// was presumed dead): what is there may be that one's.
	return c.Finished || c.Cancelled || other(c.Recording) || other(c.Holder) && !c.Released, nil
}

// Done ends the hold in this process without writing (Finish writes that the call is finished;
// Release that it is given up).
func (h *Hold) Done() {
	if !h.done {
		h.done = true
		h.l.drop(h.key)
	}
}

// KeepAlive renews h every interval until the returned stop is called; stop waits for a
// renewal in progress, so h may be released right after. onCancel, when set, is called (once,
// from the renewal) when a renewal finds the call cancelled.
func (h *Hold) KeepAlive(ctx context.Context, interval time.Duration, onCancel func()) (stop func()) {
	told := false
	return bus.Every(interval, func() {
		h.Renew(ctx)
		if h.cancelled && !told && onCancel != nil {
			told = true
			onCancel()
		}
	})
}

// Cancel marks the call at key cancelled: no worker acquires it from now on, and the worker
// holding it, if any, learns so at its next renewal. It keeps the call's tries and last
// failure, and is idempotent.
func Cancel(ctx context.Context, kv KV, key string) error {
	return update(ctx, kv, key, "cancel", func(c *claim) bool {
		if c.Cancelled {
			return false
		}
		c.Cancelled = true
		if c.Holder == "" {
			c.Released = true
		}
		return true
	})
}

// update changes the claim at key with change (which reports whether it changed anything),
// creating it when there is none, and retrying when another write comes first; what names the
// change in errors.
func update(ctx context.Context, kv KV, key, what string, change func(*claim) bool) error {
	for range 16 { // each round loses only to a concurrent write of the same claim
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			c := claim{V: claimVersion}
			if !change(&c) {
				return nil
			}
			val, _ := json.Marshal(&c)
			if _, err = kv.Create(ctx, key, val); err == nil || !isConflict(err) {
				return wrap(what, key, err)
			}
			continue
		}
		if err != nil {
			return wrap(what, key, err)
		}
		var c claim
		_ = json.Unmarshal(e.Value(), &c)
		if !change(&c) {
			return nil
		}
		c.V = claimVersion
		val, _ := json.Marshal(&c)
		if _, err = kv.Update(ctx, key, val, e.Revision()); err == nil || !isConflict(err) {
			return wrap(what, key, err)
		}
	}
	return fmt.Errorf("ledger: %s %s: the claim keeps changing", what, key)
}

func isConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

func wrap(what, key string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("ledger: %s %s: %w", what, key, err)
}

// Last reads the last try number and failure recorded for a call (0 and "" when none).
func Last(ctx context.Context, kv KV, key string) (attempt int, errorCode string) {
	e, err := kv.Get(ctx, key)
	if err != nil {
		return 0, ""
	}
	var c claim
	if json.Unmarshal(e.Value(), &c) != nil {
		return 0, ""
	}
	return c.Attempt, c.LastErrorCode
}

// IsCancelled reports whether the call at key was cancelled (Cancel).
func IsCancelled(ctx context.Context, kv KV, key string) (bool, error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("ledger: read claim %s: %w", key, err)
	}
	var c claim
	return json.Unmarshal(e.Value(), &c) == nil && c.Cancelled, nil
}

// Running reports whether a worker may still be running the call at key: a holder claimed or
// renewed it within lease by the server's clock, and neither released nor finished it. A
// cancelled call counts as running until its holder's lease lapses, for the holder learns of
// the cancellation only at its next renewal. A call nobody claimed is not running.
func Running(ctx context.Context, kv KV, key string, lease time.Duration) (bool, error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("ledger: read claim %s: %w", key, err)
	}
	var c claim
	if json.Unmarshal(e.Value(), &c) != nil || c.Holder == "" || c.Released || c.Finished {
		return false, nil
	}
	l := &Ledger{kv: kv, localNow: time.Now}
	now, err := l.serverNow(ctx)
	if err != nil {
		return false, fmt.Errorf("ledger: read the server's time for claim %s: %w", key, err)
	}
	return now.Sub(e.Created()) < lease, nil
}
