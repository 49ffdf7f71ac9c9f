// Package kvwatch follows a key-value bucket: every value it holds, then each change, and a
// watch that ends is watched again, so that a reader knows when what it holds is current.
package kvwatch

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Follower follows one bucket's keys. Apply takes each value and change, in order; Following
// is told true once a watch has given every value the bucket held, and false whenever the
// watch ends (until it is watched again, what the reader holds may be stale).
type Follower struct {
	Watch     func(ctx context.Context) (jetstream.KeyWatcher, error)
	Apply     func(jetstream.KeyValueEntry)
	Following func(bool)
	// What names what is followed in logs ("the contracts").
	What string
	Log  *slog.Logger
}

// Start follows the bucket until ctx ends, returning once every value it holds was applied;
// an error says the first watch could not be made.
func (f *Follower) Start(ctx context.Context) error {
	w, err := f.Watch(ctx)
	if err != nil {
		return err
	}
	ready := make(chan struct{})
	go f.follow(ctx, w, ready)
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// follow takes the watch's changes, and watches again should it end before ctx.
func (f *Follower) follow(ctx context.Context, w jetstream.KeyWatcher, ready chan struct{}) {
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		if w != nil && f.run(ctx, w, ready) {
			ready, delay = nil, 100*time.Millisecond // a watch that served: the next gap is short
		}
		f.Following(false)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		f.Log.Warn("the watch of " + f.What + " ended; watching again")
		var err error
		if w, err = f.Watch(ctx); err != nil {
			f.Log.Error("watch "+f.What, "err", err)
			w = nil
		}
	}
}

// run takes one watch's changes until it ends; once it has given every value the bucket
// held, Following is told, ready closed (when not nil), and run reports it served.
func (f *Follower) run(ctx context.Context, w jetstream.KeyWatcher, ready chan struct{}) (served bool) {
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return served
		case e, ok := <-w.Updates():
			if !ok {
				return served
			}
			if e != nil {
				f.Apply(e)
				continue
			}
			f.Following(true)
			if ready != nil && !served {
				close(ready)
			}
			served = true
		}
	}
}
