package worker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/pkg/ledger"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// running knows the calls this worker is handling, by request, so that a cancellation stops
// them. It is safe for concurrent use.
type running struct {
	mu sync.Mutex
	m  map[string]map[*runningCall]struct{}
}

type runningCall struct {
	callID string
	stop   context.CancelCauseFunc
}

// add registers a call of requestID until the returned func is called.
func (r *running) add(requestID, callID string, stop context.CancelCauseFunc) (remove func()) {
	c := &runningCall{callID: callID, stop: stop}
	r.mu.Lock()
	if r.m == nil {
		r.m = map[string]map[*runningCall]struct{}{}
	}
	calls := r.m[requestID]
	if calls == nil {
		calls = map[*runningCall]struct{}{}
		r.m[requestID] = calls
	}
	calls[c] = struct{}{}
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(calls, c)
		if len(calls) == 0 && r.m[requestID] != nil && len(r.m[requestID]) == 0 {
			delete(r.m, requestID)
		}
	}
}

// of returns the calls of requestID running now.
func (r *running) of(requestID string) []*runningCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*runningCall, 0, len(r.m[requestID]))
	for c := range r.m[requestID] {
		out = append(out, c)
	}
	return out
}

// listenForCancels subscribes to cancellations (the record's cancel events, which every
// worker receives) and stops the calls of a cancelled request running here. A cancellation
// is acted on only once the call ledger says so — the canceller marks every unfinished call
// there before it announces the cancellation — so a forged event stops nothing; the ledger is
// also the slower path by which a holder that missed the event learns of it.
func (w *Worker) listenForCancels(ctx context.Context) (stop func(), err error) {
	nc := w.cfg.Bus.JS.Conn()
	if nc == nil {
		return func() {}, nil
	}
	on := func(msg *nats.Msg) {
		m, err := protocol.Unmarshal(msg.Data)
		if err != nil || m.Type != protocol.TypeCancel {
			return
		}
		calls := w.running.of(m.RequestID)
		if len(calls) == 0 {
			return
		}
		by := ""
		if c, err := m.DecodeCancel(); err == nil {
			by = c.By
		}
		// Handled here, one event after another: a flood of (forged) events costs a ledger
		// read per running call of the request each, never a goroutine each.
		w.stopCancelled(ctx, m.RequestID, by, calls)
	}
	// Each record stream's sessions' cancellations (one subscription each).
	var subs []*nats.Subscription
	stop = func() {
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
	}
	for k := range w.cfg.Bus.Layout().Streams() {
		sub, err := nc.Subscribe(protocol.FilterEventsIn(k, protocol.EventCancel), on)
		if err != nil {
			stop()
			return nil, fmt.Errorf("worker: listen for cancellations: %w", err)
		}
		subs = append(subs, sub)
	}
	return stop, nil
}

// stopCancelled stops each of calls whose claim is marked cancelled; by names who cancelled.
func (w *Worker) stopCancelled(ctx context.Context, requestID, by string, calls []*runningCall) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	for _, c := range calls {
		ok, err := ledger.IsCancelled(ctx, w.cfg.Bus.Claims, ledger.Key(requestID, c.callID))
		if err != nil {
			w.log.Warn("could not confirm a cancellation; the claim's renewal will", "request_id", requestID, "tool_call_id", c.callID, "err", err)
			continue
		}
		if ok {
			w.log.Info("stopping a call of a cancelled request", "request_id", requestID, "tool_call_id", c.callID)
			c.stop(&CancelledError{By: by})
		}
	}
}

// CancelledError is the cause of a try's context when its request was cancelled; it matches
// ErrCancelled.
type CancelledError struct {
	// By names who cancelled, when the worker was told.
	By string
}

func (e *CancelledError) Error() string {
	if e.By == "" {
		return ErrCancelled.Error()
	}
	return ErrCancelled.Error() + " by " + e.By
}

// Is makes a CancelledError match ErrCancelled.
func (e *CancelledError) Is(target error) bool { return target == ErrCancelled }
