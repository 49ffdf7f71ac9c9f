// Package ledger is the call ledger in the hermes-claims bucket: which worker is running each
// tool call (key <request_id>.<tool_call_id>), how many tries it has had, and its last failure.
//
// Guarantees: at most one worker holds a call at a time, as long as holders renew within the
// lease (a holder that stops renewing — it died — loses the call after the lease, and the next
// worker takes it over with a compare-and-set, so two can never take it over at once). Try
// numbers grow by one with each acquisition, whoever makes it.
package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// claim is a worker's hold on one call in the hermes-claims ledger. A claim is held while its
// worker renews it within the lease; a released claim keeps the last failure of the call, so
// whoever gives up on the call can report it.
type claim struct {
	Worker        string `json:"worker,omitempty"`
	Attempt       int    `json:"attempt"`
	Released      bool   `json:"released,omitempty"`
	LastErrorCode string `json:"last_error_code,omitempty"`
}

// ErrClaimed means another live worker is running the call.
var ErrClaimed = errors.New("ledger: call is being run by another worker")

// Ledger is the hermes-claims bucket seen by one worker. It is safe for concurrent use.
type Ledger struct {
	kv     jetstream.KeyValue
	worker string
	lease  time.Duration
}

// New returns worker's view of the ledger in kv; a claim not renewed within lease is presumed
// abandoned.
func New(kv jetstream.KeyValue, worker string, lease time.Duration) *Ledger {
	return &Ledger{kv: kv, worker: worker, lease: lease}
}

// Lease is how long a claim holds without renewal.
func (l *Ledger) Lease() time.Duration { return l.lease }

// Key is the ledger key of one call.
func Key(requestID, callID string) string { return requestID + "." + callID }

// Hold is a claim this worker owns, at a known revision. Its methods must not be called
// concurrently with each other.
type Hold struct {
	l   *Ledger
	key string
	rev uint64
	c   claim
}

// Attempt is the number of the try this hold is for, from 1.
func (h *Hold) Attempt() int { return h.c.Attempt }

// Acquire claims key for the next try of the call; the hold's Attempt numbers that try (1 for
// the first). It fails with ErrClaimed, and the time left on the other worker's lease, when a
// live worker holds the call.
func (l *Ledger) Acquire(ctx context.Context, key string) (*Hold, time.Duration, error) {
	c := claim{Worker: l.worker, Attempt: 1}
	val, _ := json.Marshal(&c)
	rev, err := l.kv.Create(ctx, key, val)
	if err == nil {
		return &Hold{l: l, key: key, rev: rev, c: c}, 0, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return nil, 0, fmt.Errorf("ledger: claim %s: %w", key, err)
	}
	e, err := l.kv.Get(ctx, key)
	if err != nil {
		return nil, 0, fmt.Errorf("ledger: read claim %s: %w", key, err)
	}
	var prev claim
	_ = json.Unmarshal(e.Value(), &prev) // an unreadable claim is treated as stale
	if age := time.Since(e.Created()); !prev.Released && prev.Worker != l.worker && prev.Worker != "" && age < l.lease {
		return nil, l.lease - age, ErrClaimed
	}
	c.Attempt, c.LastErrorCode = prev.Attempt+1, prev.LastErrorCode
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

// Renew extends the lease. It reports false when the claim was taken over (this worker was
// presumed dead); the caller may finish, and the first recorded result wins.
func (h *Hold) Renew(ctx context.Context) bool {
	val, _ := json.Marshal(&h.c)
	rev, err := h.l.kv.Update(ctx, h.key, val, h.rev)
	if err != nil {
		return false
	}
	h.rev = rev
	return true
}

// Release gives the call up after a failed try, recording the failure for whoever comes next.
func (h *Hold) Release(ctx context.Context, errorCode string) {
	h.c.Released, h.c.Worker = true, ""
	if errorCode != "" {
		h.c.LastErrorCode = errorCode
	}
	h.Renew(ctx)
}

// KeepAlive renews h every interval until stop is closed or ctx is done.
func (h *Hold) KeepAlive(ctx context.Context, interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
			h.Renew(ctx)
		}
	}
}

// Last reads the last try number and failure recorded for a call (0 and "" when none).
func Last(ctx context.Context, kv jetstream.KeyValue, key string) (attempt int, errorCode string) {
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
