package coordination

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Turns ends turns and passes them on: Release when a call's result is recorded (aggregation
// calls it), and Run, which every router runs, when a holder's lease lapses. Either way the
// next call in line is granted the resource and its request woken, and both are events on the
// record. Any number of routers may do this at once: every change is a compare-and-set, so a
// turn ends once.
type Turns struct {
	Store  *Store
	Events *Events
	// Wake wakes a parked request by wake key.
	Wake func(ctx context.Context, key string) error
	Log  *slog.Logger
	// SweepEvery is how often Run looks at every held resource for a lease that lapsed
	// unseen (default 30 s): a backstop for markers missed while no router ran.
	SweepEvery time.Duration
}

// Release ends the turn grant g gave the call (requestID, callID), whose result (status) is
// recorded. Nothing happens when the turn already ended.
func (t *Turns) Release(ctx context.Context, g *protocol.Grant, requestID, callID, _ /* session */, status string) error {
	x, err := t.Store.Release(ctx, g.Resource, requestID, callID, g.Fence)
	if err != nil || x == nil {
		return err
	}
	return t.ended(ctx, protocol.CoordReleased, "its result is recorded ("+status+")", x)
}

// ended records the end of a turn and the grant after it, and wakes the granted call's request.
func (t *Turns) ended(ctx context.Context, op, reason string, x *Ended) error {
	// The wake-up first: an event that fails to record must not cost the next call its turn
	// (a retry finds the turn passed on already, and wakes nobody).
	if g := x.Granted; g != nil {
		if err := t.Wake(ctx, protocol.WakeOnTurn(g.RequestID, g.CallID)); err != nil {
			return err
		}
	}
	return t.Events.Ended(ctx, op, reason, x)
}

// expire ends the turn with fence on the resource of token if its lease is gone.
func (t *Turns) expire(ctx context.Context, token string, fence uint64) error {
	x, err := t.Store.Expire(ctx, token, fence)
	if err != nil || x == nil {
		return err
	}
	t.log().Warn("a turn's lease lapsed before its call's result was recorded; the resource goes to the next in line",
		"resource", x.Resource, "request_id", x.Ended.RequestID, "tool_call_id", x.Ended.CallID, "fence", fence)
	return t.ended(ctx, protocol.CoordExpired, "its lease lapsed before its result was recorded", x)
}

func (t *Turns) log() *slog.Logger {
	if t.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return t.Log
}

// Run follows the leases until ctx is done: each one removed (lapsed, or given back) ends its
// turn if it is still the resource's, and a sweep does the same for leases that lapsed unseen.
func (t *Turns) Run(ctx context.Context) error {
	every := t.SweepEvery
	if every <= 0 {
		every = 30 * time.Second
	}
	go func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if err := t.Sweep(ctx); err != nil && ctx.Err() == nil {
					t.log().Warn("coordination sweep", "err", err)
				}
			}
		}
	}()
	for ctx.Err() == nil {
		if err := t.watch(ctx); err != nil && ctx.Err() == nil {
			t.log().Warn("coordination: the leases' watch ended; watching again", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

// watch follows the leases' keys until ctx is done or the watch fails.
func (t *Turns) watch(ctx context.Context) error {
	w, err := t.Store.KV.Watch(ctx, "l.>")
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("the watch stopped")
			}
			if e == nil || e.Operation() == jetstream.KeyValuePut {
				continue
			}
			token, fence, ok := parseLeaseKey(e.Key())
			if !ok {
				continue
			}
			if err := t.expire(ctx, token, fence); err != nil && ctx.Err() == nil {
				t.log().Warn("coordination: end a lapsed turn", "key", e.Key(), "err", err)
			}
		}
	}
}

// Sweep ends every turn whose lease is gone.
func (t *Turns) Sweep(ctx context.Context) error {
	states, err := t.Store.List(ctx)
	if err != nil {
		return err
	}
	for _, st := range states {
		if st.Holder == nil {
			// In line with nobody holding it (whoever wrote the first proposal stopped
			// before granting it): the first in line gets it.
			_, ch, err := t.Store.Propose(ctx, st.Resource, nil, 0)
			if err == nil && ch != nil {
				if err = t.Wake(ctx, protocol.WakeOnTurn(ch.Granted.RequestID, ch.Granted.CallID)); err == nil {
					err = t.Events.Granted(ctx, ch.Resource, ch.Granted)
				}
			}
			if err != nil {
				// One resource's trouble (the record's leader out of reach, say) keeps the
				// sweep from none of the others.
				t.log().Warn("coordination sweep: grant a resource nobody holds", "resource", st.Resource, "err", err)
			}
			continue
		}
		token := protocol.ResourceToken(st.Resource)
		if err := t.expire(ctx, token, st.Holder.Fence); err != nil {
			t.log().Warn("coordination sweep: end a lapsed turn", "resource", st.Resource, "err", err)
		}
		// A holder whose request is answered without its result carrying the grant (a
		// cancellation records results of its own) ends here, not when its lease lapses.
		x, err := t.Store.EndAnswered(ctx, token, st.Holder.Fence)
		if err != nil {
			t.log().Warn("coordination sweep: end an answered call's turn", "resource", st.Resource, "err", err)
		} else if x != nil {
			if err := t.ended(ctx, protocol.CoordReleased, "its request is answered", x); err != nil {
				t.log().Warn("coordination sweep: pass the turn on", "resource", st.Resource, "err", err)
			}
		}
	}
	return nil
}

// parseLeaseKey reads l.<token>.<fence>.
func parseLeaseKey(key string) (string, uint64, bool) {
	rest, ok := strings.CutPrefix(key, "l.")
	if !ok {
		return "", 0, false
	}
	token, f, ok := strings.Cut(rest, ".")
	if !ok || len(token) != 32 {
		return "", 0, false
	}
	fence, err := strconv.ParseUint(f, 10, 64)
	return token, fence, err == nil && fence > 0
}
