package blueprints

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/kvwatch"
)

// Resumer follows the runs' bucket: it starts, on its engine, every run that goes on and
// whose holder's lease lapsed (its holder stopped: killed, cut off), so that a run resumes
// within about a lease of losing its runner. It also counts the runs going on per owner, for
// the bound on each caller's concurrent runs.
type Resumer struct {
	KV     jetstream.KeyValue // RunsBucket
	Engine *Engine
	// Every is how often lapsed leases are looked for (default 1 s).
	Every time.Duration
	Log   *slog.Logger

	mu    sync.Mutex
	going map[string]going // runs not final, by id
}

type going struct {
	owner string
	until time.Time
}

// Run follows the bucket and resumes runs until ctx ends.
func (rs *Resumer) Run(ctx context.Context) error {
	log := rs.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rs.mu.Lock()
	rs.going = map[string]going{}
	rs.mu.Unlock()
	f := &kvwatch.Follower{What: "the blueprint runs", Log: log,
		Watch: func(ctx context.Context) (jetstream.KeyWatcher, error) {
			return rs.KV.WatchAll(ctx, jetstream.IgnoreDeletes())
		},
		Apply:     rs.apply,
		Following: func(bool) {}}
	if err := f.Start(ctx); err != nil && ctx.Err() == nil {
		log.Warn("follow the blueprint runs; runs resume once it can", "err", err)
	}
	every := rs.Every
	if every <= 0 {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			rs.Engine.Wait()
			return nil
		case <-t.C:
			now := rs.Engine.now()
			rs.mu.Lock()
			var due []string
			for id, g := range rs.going {
				if now.After(g.until) {
					due = append(due, id)
				}
			}
			rs.mu.Unlock()
			for _, id := range due {
				rs.Engine.Start(ctx, id)
			}
		}
	}
}

func (rs *Resumer) apply(e jetstream.KeyValueEntry) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		delete(rs.going, e.Key())
		return
	}
	// Only what the resumer needs is decoded: a run's steps and outputs stay unread.
	var r struct {
		RunID      string    `json:"run_id"`
		Status     Status    `json:"status"`
		Owner      string    `json:"owner"`
		LeaseUntil time.Time `json:"lease_until"`
	}
	if err := json.Unmarshal(e.Value(), &r); err != nil || r.RunID != e.Key() || r.Status == "" || r.Status.Final() {
		delete(rs.going, e.Key())
		return
	}
	rs.going[e.Key()] = going{owner: r.Owner, until: r.LeaseUntil}
}

// Note counts run r as going at once, before the watch delivers it: the gateway that began it
// counts it against its owner's bound from then on.
func (rs *Resumer) Note(r *Run) {
	if r.Status.Final() {
		return
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.going == nil {
		rs.going = map[string]going{}
	}
	if _, seen := rs.going[r.RunID]; !seen {
		rs.going[r.RunID] = going{owner: r.Owner, until: r.LeaseUntil}
	}
}

// Going is how many runs of owner go on, as last seen.
func (rs *Resumer) Going(owner string) int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	n := 0
	for _, g := range rs.going {
		if g.owner == owner {
			n++
		}
	}
	return n
}
