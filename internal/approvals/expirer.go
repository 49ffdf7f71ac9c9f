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
	log := e.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now := e.Now
	if now == nil {
		now = time.Now
	}
	every := e.Every
	if every <= 0 {
		every = time.Second
	}
	for ctx.Err() == nil {
		w, err := e.KV.Watch(ctx, "a.>")
		if err != nil {
			log.Warn("watch the approvals; expiries wait", "err", err)
		} else {
			e.follow(ctx, w, now, every, log)
		}
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
	return nil
}

// follow takes the watch's changes and expires what is due, until the watch or ctx ends.
func (e *Expirer) follow(ctx context.Context, w jetstream.KeyWatcher, now func() time.Time, every time.Duration, log *slog.Logger) {
	defer func() { _ = w.Stop() }()
	due := map[string]time.Time{}
	tick := time.NewTicker(every)
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
			if u.Operation() != jetstream.KeyValuePut || err != nil || !(a.State == Pending || a.State == Approved && a.Recall) {
				delete(due, id)
				continue
			}
			due[id] = a.ExpiresAt
		case <-tick.C:
			t := now()
			for id, at := range due {
				if t.Before(at) {
					continue
				}
				a, expired, err := e.Store.Expire(ctx, id, t)
				if err != nil {
					log.Warn("expire an approval", "approval_id", id, "err", err)
					continue
				}
				delete(due, id)
				if !expired || e.Events == nil {
					continue
				}
				if err := e.Events.Record(ctx, a, Decided(a), a.ExpiresAt); err != nil {
					log.Warn("record an approval's expiry", "approval_id", id, "err", err)
					due[id] = at // recorded next time
					continue
				}
				log.Info("approval expired", "approval_id", id, "tool", a.Tool, "session_id", a.SessionID)
			}
		}
	}
}
