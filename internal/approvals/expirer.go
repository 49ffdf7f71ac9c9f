package approvals

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Expirer ends approvals past their expiry — pending ones, and approved ones the requester
// was to call again — and records each expiry on the record (APPROVAL_EXPIRED). Every router
// runs one: the store decides each expiry once, and its event is recorded once. It follows
// the bucket, so approvals opened before a restart expire on time after it.
type Expirer struct {
	Store  *Store
	KV     jetstream.KeyValue // the bucket, watched
	Events *Events
	// Now is the clock (time.Now when nil); Every how often due approvals are looked for
	// (default 1 s).
	Now   func() time.Time
	Every time.Duration
	Log   *slog.Logger
}

// Run expires approvals until ctx ends, watching the bucket again whenever its watch ends.
func (e *Expirer) Run(ctx context.Context) error {
	log := orDiscard(e.Log)
	w := &dueWatch{kv: e.KV, now: e.Now, every: e.Every, log: log, what: "expiries",
		due: func(a *Approval) (time.Time, bool) {
			return a.ExpiresAt, a.State == Pending || a.State == Approved && a.Recall
		},
		fire: func(ctx context.Context, a *Approval, t time.Time) bool {
			got, expired, err := e.Store.Expire(ctx, a.ID, t)
			if err != nil {
				log.Warn("expire an approval", "approval_id", a.ID, "err", err)
				return false
			}
			if !expired || e.Events == nil {
				return true
			}
			if err := e.Events.Record(ctx, got, Decided(got), got.ExpiresAt); err != nil {
				log.Warn("record an approval's expiry", "approval_id", a.ID, "err", err)
				return false // recorded next time
			}
			log.Info("approval expired", "approval_id", a.ID, "tool", got.Tool, "session_id", got.SessionID)
			return true
		}}
	w.run(ctx)
	return nil
}

// Starter starts the runs of approved calls whose run was not seen to start: an approval of
// a call Hermes runs itself (one not recalled) still approved, not used, Grace after its
// decision — the gateway that decided it stopped between recording the decision and
// submitting the run, or the run's submission failed. Start must be idempotent (the run's
// request_id is the approval's id), so that every gateway may run a Starter and a run
// submitted twice is made once. Each approval is started at most once per Starter unless its
// state changes again (a run refused by a rate limit gives its approval back: started once
// more, which the run's request id answers from the record). An approval is started only
// within an hour of when it could have been decided at the latest (its expiry).
type Starter struct {
	KV    jetstream.KeyValue // the bucket, watched
	Start func(ctx context.Context, a *Approval) error
	// Grace is how long after its decision an approval's run is left to the decider
	// (default 5 s); Now the clock; Every how often due approvals are looked for (1 s).
	Grace time.Duration
	Now   func() time.Time
	Every time.Duration
	Log   *slog.Logger
}

// fresh reports whether a may still be started: not past an hour after it could have been
// decided at the latest, so that a call approved long ago does not run out of the blue (after
// a long outage, say).
func (s *Starter) fresh(a *Approval) bool {
	late := a.ExpiresAt
	if a.DecidedAt.After(late) {
		late = a.DecidedAt
	}
	return s.now().Before(late.Add(time.Hour))
}

func (s *Starter) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Run starts unstarted runs until ctx ends, watching the bucket again whenever its watch ends.
func (s *Starter) Run(ctx context.Context) error {
	log := orDiscard(s.Log)
	grace := s.Grace
	if grace <= 0 {
		grace = 5 * time.Second
	}
	w := &dueWatch{kv: s.KV, now: s.Now, every: s.Every, log: log, what: "unstarted runs",
		due: func(a *Approval) (time.Time, bool) {
			return a.DecidedAt.Add(grace), a.State == Approved && !a.Recall && a.UsedBy == "" && s.fresh(a)
		},
		fire: func(ctx context.Context, a *Approval, _ time.Time) bool {
			if !s.fresh(a) {
				return true // too old now: dropped
			}
			if err := s.Start(ctx, a); err != nil {
				log.Warn("start an approved call's run", "approval_id", a.ID, "err", err)
				return false
			}
			log.Info("approved call's run started again", "approval_id", a.ID, "tool", a.Tool, "session_id", a.SessionID)
			return true
		}}
	w.run(ctx)
	return nil
}

func orDiscard(log *slog.Logger) *slog.Logger {
	if log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return log
}

// dueWatch follows the bucket's approvals and fires each one due says is waiting, once its
// time has come, until fire says it is done or the approval changes.
type dueWatch struct {
	kv    jetstream.KeyValue
	now   func() time.Time
	every time.Duration
	log   *slog.Logger
	what  string // what waits while the bucket cannot be watched, for the log
	// due says whether a waits, and from when it is due.
	due func(a *Approval) (time.Time, bool)
	// fire acts on a, due at t; false keeps it for the next look.
	fire func(ctx context.Context, a *Approval, t time.Time) bool
}

func (d *dueWatch) run(ctx context.Context) {
	if d.now == nil {
		d.now = time.Now
	}
	if d.every <= 0 {
		d.every = time.Second
	}
	for ctx.Err() == nil {
		w, err := d.kv.Watch(ctx, "a.>")
		if err != nil {
			d.log.Warn("watch the approvals; "+d.what+" wait", "err", err)
		} else {
			d.follow(ctx, w)
		}
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
}

// follow takes the watch's changes and fires what is due, until the watch or ctx ends.
func (d *dueWatch) follow(ctx context.Context, w jetstream.KeyWatcher) {
	defer func() { _ = w.Stop() }()
	type waiting struct {
		a  *Approval
		at time.Time
	}
	due := map[string]waiting{}
	tick := time.NewTicker(d.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-w.Updates():
			if !ok {
				return
			}
			if u == nil {
				continue
			}
			id := strings.TrimPrefix(u.Key(), "a.")
			a, err := decode(id, u.Value())
			if u.Operation() != jetstream.KeyValuePut || err != nil {
				delete(due, id)
				continue
			}
			at, waits := d.due(a)
			if !waits {
				delete(due, id)
				continue
			}
			due[id] = waiting{a: a, at: at}
		case <-tick.C:
			t := d.now()
			for id, x := range due {
				if t.Before(x.at) {
					continue
				}
				if d.fire(ctx, x.a, t) {
					delete(due, id)
				}
			}
		}
	}
}
