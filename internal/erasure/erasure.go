// Package erasure erases from the record what Hermes keeps there about a memory owner, when the
// owner asks. A gateway forgets the owner's fragments at once (DELETE /v1/memory) and asks here
// for the rest: the owner's memory history on the record (every value a fragment had, the
// contexts of its archived intents) and, with_history, every session of the owner. The record
// is Hermes' proof of what happened, so no gateway may purge it: an Eraser, running as the bus
// role eraser (the one service that may), follows the asks and erases what each names. An ask
// names an owner and nothing else: the eraser finds the owner's history itself (its memory
// session) and its sessions (those whose latest request the record says the owner made, as
// the gateway that admitted it named it), so a gateway can have erased only what the record
// holds of an owner, never any other part of it.
//
// An ask is kept in the bucket until it is done, and done again after a crash (erasing what is
// erased finds nothing); the gateway shows its state (GET /v1/erasure). What the record holds
// about the owner when the eraser runs is erased; what the owner does after is kept. What is
// kept outside the record — dead letters, a session's plans and chat answers in their buckets
// — ages out on its own time and is not erased.
package erasure

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/kvwatch"
	"github.com/hermesbus/hermes/internal/memory"
	"github.com/hermesbus/hermes/internal/record"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Bucket holds the asks, one per owner (key: the owner's memory token).
const Bucket = "hermes-erasures"

// Buckets is the erasures' bucket: written by gateways (an ask) and the eraser (its state),
// followed by the eraser; its keys are kept as long as the record may hold what they name.
func Buckets() []bus.Bucket {
	return []bus.Bucket{{Name: Bucket, Description: "Hermes: the erasures owners asked for, until the eraser has done them", MaxBytes: 64 << 20, Strict: true, AsLongAsPlans: true,
		Watchers: []bus.Role{bus.RoleEraser}, Writers: []bus.Role{bus.RoleGateway, bus.RoleEraser}}}
}

// States of an ask.
const (
	StateAsked = "asked"
	StateDone  = "done"
)

// MaxSessions bounds the sessions one erasure purges (the owner's latest).
const MaxSessions = 100_000

// Ask is an owner's erasure, as the bucket keeps it.
type Ask struct {
	Owner string `json:"owner"`
	// WithHistory: every session of the owner is erased too.
	WithHistory bool      `json:"with_history"`
	AskedAt     time.Time `json:"asked_at"`
	// AskedBy is the id of the caller that asked (the owner, an application acting for it, or
	// an admin).
	AskedBy string `json:"asked_by,omitempty"`
	State   string `json:"state"`
	// Tries counts the eraser's tries; LastError says why the last failed (for people: the
	// details are in the eraser's log), and NextTryAt when the eraser tries again.
	Tries     int       `json:"tries,omitempty"`
	LastError string    `json:"last_error,omitempty"`
	NextTryAt time.Time `json:"next_try_at,omitzero"`
	DoneAt    time.Time `json:"done_at,omitzero"`
	// Erased is what the erasure removed from the record; set once done.
	Erased *Erased `json:"erased,omitempty"`
}

// Erased counts what an erasure removed from the record (its sessions are not named: an ask
// outlives them, and says nothing of what it erased but how much).
type Erased struct {
	// HistoryMessages were the owner's memory.v1 events.
	HistoryMessages uint64 `json:"history_messages"`
	// Sessions were the owner's sessions, of SessionMessages messages in all.
	Sessions        int    `json:"sessions"`
	SessionMessages uint64 `json:"session_messages"`
	// Truncated: the owner had more sessions than one erasure purges (MaxSessions); the
	// latest were purged, and asking again purges more.
	Truncated bool `json:"truncated,omitempty"`
}

// ErrNotFound: no erasure was asked for the owner (or its record has aged out).
var ErrNotFound = errors.New("erasure: none asked")

// maxAskBytes bounds an ask read from the bucket.
const maxAskBytes = 64 << 10

// decode reads an ask; what is no ask is an error naming the key.
func decode(key string, b []byte) (*Ask, error) {
	if len(b) > maxAskBytes {
		return nil, fmt.Errorf("erasure: %s holds %d bytes; an ask is at most %d", key, len(b), maxAskBytes)
	}
	var a Ask
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("erasure: %s holds no ask: %w", key, err)
	}
	if a.Owner == "" || (a.State != StateAsked && a.State != StateDone) {
		return nil, fmt.Errorf("erasure: %s holds no ask (owner %q, state %q)", key, protocol.Shorten(a.Owner, 64), protocol.Shorten(a.State, 16))
	}
	return &a, nil
}

// key is owner's key in the bucket.
func key(owner string) string { return "o." + memory.Token(owner) }

// Asks are the asks in the bucket. It is safe for concurrent use.
type Asks struct {
	KV jetstream.KeyValue
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

func (s *Asks) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Ask asks for owner's erasure (withHistory: its sessions too), by caller by. An ask still
// waiting takes withHistory in too; a done one is asked again. Every write is a compare-and-set:
// two asks at once are one ask with what both want.
func (s *Asks) Ask(ctx context.Context, owner string, withHistory bool, by string) (*Ask, error) {
	k := key(owner)
	for range 16 {
		a := &Ask{Owner: owner, WithHistory: withHistory, AskedAt: s.now().UTC(), AskedBy: by, State: StateAsked}
		e, err := s.KV.Get(ctx, k)
		var rev uint64
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return nil, fmt.Errorf("erasure: read the ask: %w", err)
		default:
			rev = e.Revision()
			if prev, err := decode(k, e.Value()); err == nil && prev.State == StateAsked {
				a.WithHistory = a.WithHistory || prev.WithHistory
				a.Tries, a.LastError, a.NextTryAt = prev.Tries, prev.LastError, prev.NextTryAt // asking again hurries nothing
			}
		}
		b, _ := json.Marshal(a)
		if rev == 0 {
			_, err = s.KV.Create(ctx, k, b)
		} else {
			_, err = s.KV.Update(ctx, k, b, rev)
		}
		switch {
		case err == nil:
			return a, nil
		case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
			continue
		default:
			return nil, fmt.Errorf("erasure: write the ask: %w", err)
		}
	}
	return nil, errors.New("erasure: the ask kept changing under this write; try again")
}

// Get is owner's last ask: ErrNotFound when none.
func (s *Asks) Get(ctx context.Context, owner string) (*Ask, error) {
	k := key(owner)
	e, err := s.KV.Get(ctx, k)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, ErrNotFound
	case err != nil:
		return nil, fmt.Errorf("erasure: read the ask: %w", err)
	}
	return decode(k, e.Value())
}

// Eraser follows the asks and erases what each names, one at a time. A failed erasure is tried
// again after Retry, twice as long after each failure up to maxRetry; when it is next tried is
// kept in the ask (NextTryAt), so no eraser, restarted or another, tries it sooner. Run it as
// the bus role eraser.
type Eraser struct {
	Asks *Asks
	// JS reaches the record.
	JS jetstream.JetStream
	// Retry is how long a first failed erasure waits before it is tried again (default 5 s).
	Retry time.Duration
	// Erased, when set, is told each erasure done.
	Erased func(Ask)
	Log    *slog.Logger

	mu      sync.Mutex
	pending map[string]bool
	timers  map[string]*time.Timer // one per key waiting for its next try
	wake    chan struct{}
}

// maxRetry bounds the wait between two tries of a failing erasure.
const maxRetry = 10 * time.Minute

// Run erases what is asked until ctx ends.
func (e *Eraser) Run(ctx context.Context) error {
	if e.Log == nil {
		e.Log = slog.New(slog.DiscardHandler)
	}
	e.pending, e.timers, e.wake = map[string]bool{}, map[string]*time.Timer{}, make(chan struct{}, 1)
	defer e.stopTimers()
	f := &kvwatch.Follower{
		Watch:     func(ctx context.Context) (jetstream.KeyWatcher, error) { return e.Asks.KV.WatchAll(ctx) },
		Apply:     e.apply,
		Following: func(bool) {},
		What:      "the erasures",
		Log:       e.Log,
	}
	if err := f.Start(ctx); err != nil {
		return fmt.Errorf("erasure: follow the asks: %w", err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-e.wake:
		}
		for {
			k, ok := e.next()
			if !ok {
				break
			}
			if err := e.erase(ctx, k); err != nil && ctx.Err() == nil {
				e.Log.Warn("erasure failed; tried again later", "key", k, "err", err)
			}
		}
	}
}

// retry is how long an erasure that failed tries times waits for its next try.
func (e *Eraser) retry(tries int) time.Duration {
	d := e.Retry
	if d <= 0 {
		d = 5 * time.Second
	}
	for range min(tries-1, 16) {
		d *= 2
	}
	return min(d, maxRetry)
}

// later pushes k after d, replacing a wait k had.
func (e *Eraser) later(k string, d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if t := e.timers[k]; t != nil {
		t.Stop()
	}
	e.timers[k] = time.AfterFunc(d, func() {
		e.mu.Lock()
		delete(e.timers, k)
		e.mu.Unlock()
		e.push(k)
	})
}

func (e *Eraser) stopTimers() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, t := range e.timers {
		t.Stop()
		delete(e.timers, k)
	}
}

// apply takes an ask or a change of one from the watch.
func (e *Eraser) apply(entry jetstream.KeyValueEntry) {
	if entry.Operation() != jetstream.KeyValuePut {
		return
	}
	a, err := decode(entry.Key(), entry.Value())
	if err == nil && entry.Key() != key(a.Owner) {
		err = fmt.Errorf("erasure: %s holds the ask of another owner", entry.Key())
	}
	if err != nil {
		e.Log.Warn("the erasures' bucket holds what is no ask; left alone", "err", err)
		return
	}
	if a.State != StateAsked {
		return
	}
	if wait := a.NextTryAt.Sub(e.Asks.now()); wait > 0 {
		e.later(entry.Key(), wait)
		return
	}
	e.push(entry.Key())
}

func (e *Eraser) push(k string) {
	e.mu.Lock()
	e.pending[k] = true
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

func (e *Eraser) next() (string, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range e.pending {
		delete(e.pending, k)
		return k, true
	}
	return "", false
}

// erase does the ask under k, as the bucket holds it now, and marks it done unless it was
// asked again meanwhile (then the watch brings it back).
func (e *Eraser) erase(ctx context.Context, k string) error {
	entry, err := e.Asks.KV.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	a, err := decode(k, entry.Value())
	if err != nil || a.State != StateAsked || k != key(a.Owner) {
		return nil
	}
	if wait := a.NextTryAt.Sub(e.Asks.now()); wait > 0 {
		e.later(k, wait) // pushed early (a timer of an earlier failure): not yet
		return nil
	}
	out, truncated, err := e.eraseRecord(ctx, a)
	if err != nil {
		// The failure is kept in the ask with when to try again; the watch brings it back,
		// and it waits for that. Should the ask not be written, it waits here.
		a.Tries, a.LastError = a.Tries+1, "the record could not be purged now; the eraser tries again"
		wait := e.retry(a.Tries)
		a.NextTryAt = e.Asks.now().Add(wait).UTC()
		b, _ := json.Marshal(a)
		if _, werr := e.Asks.KV.Update(ctx, k, b, entry.Revision()); werr != nil {
			e.later(k, wait)
		}
		return err
	}
	a.Tries, a.LastError, a.NextTryAt, a.State, a.DoneAt = a.Tries+1, "", time.Time{}, StateDone, e.Asks.now().UTC()
	a.Erased = &Erased{HistoryMessages: out.History, Sessions: len(out.Sessions), SessionMessages: out.SessionMessages, Truncated: truncated}
	b, _ := json.Marshal(a)
	if _, err := e.Asks.KV.Update(ctx, k, b, entry.Revision()); err != nil {
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
			return nil // asked again meanwhile: the watch brings the new ask
		}
		return fmt.Errorf("erasure: mark done: %w", err)
	}
	e.Log.Info("erased", "owner", a.Owner, "history_messages", out.History, "sessions", len(out.Sessions), "session_messages", out.SessionMessages)
	if e.Erased != nil {
		e.Erased(*a)
	}
	return nil
}

// eraseRecord erases what a names from the record; truncated when the owner had more sessions
// than one erasure purges.
func (e *Eraser) eraseRecord(ctx context.Context, a *Ask) (out memory.Erasure, truncated bool, err error) {
	var sessions []string
	if a.WithHistory && a.Owner != memory.Anonymous {
		if sessions, truncated, err = OwnerSessions(ctx, e.JS, a.Owner); err != nil {
			return memory.Erasure{Owner: a.Owner}, false, err
		}
	}
	out, err = memory.EraseRecord(ctx, e.JS, a.Owner, sessions)
	return out, truncated, err
}

// OwnerSessions are owner's latest sessions on the record, MaxSessions at most (truncated when
// there may be more): those whose latest request names the owner (record.RecentSessions). What
// cannot be a session of a request (no subject token, a memory or sandbox session) is never
// one, whatever a request's headers say.
func OwnerSessions(ctx context.Context, js jetstream.JetStream, owner string) (sessions []string, truncated bool, err error) {
	list, err := record.RecentSessions(ctx, js, MaxSessions, owner)
	if err != nil {
		return nil, false, fmt.Errorf("erasure: the owner's sessions: %w", err)
	}
	for _, s := range list {
		if protocol.CheckID("session", s.ID) == nil && !protocol.IsSandboxSession(s.ID) && !strings.HasPrefix(s.ID, protocol.MemorySessionPrefix) {
			sessions = append(sessions, s.ID)
		}
	}
	return sessions, len(list) >= MaxSessions, nil
}
