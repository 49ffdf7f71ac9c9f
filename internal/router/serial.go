package router

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Serial requests. Requests reach a router in the order they were accepted within their
// session (one partition, one request at a time), so the router can chain a session's serial
// requests: each records its predecessor, the previous serial request of the session, and is
// dispatched once that one has its response. Until then it waits in BucketSessions under
// wait.<predecessor>, and the predecessor's response wakes it: the waiting request is published
// again (message id request:<id>:wake) and goes through its partition like any request — with
// its own trace, deliveries and dead-lettering — finding its predecessor answered. Every step
// is idempotent, so a request woken twice (by its own check and by the response) is dispatched
// once: the plan is created once and its calls carry deterministic message ids.

const noPredecessor = "-"

func tailKey(session string) string   { return "tail." + session }
func prevKey(requestID string) string { return "prev." + requestID }
func waitKey(requestID string) string { return "wait." + requestID }

// serialGate reports whether serial request m may be dispatched now. If not, m waits for its
// predecessor's response, which wakes it. raw is m as received, kept to dispatch it later.
func (r *Router) serialGate(ctx context.Context, m *protocol.Message, raw []byte) (bool, string, error) {
	if done, err := r.answered(ctx, m.RequestID); err != nil || done {
		// Answered already (dead-lettered while it waited, say): nothing is left to dispatch.
		return false, "", err
	}
	prev, err := r.predecessor(ctx, m)
	if err != nil || prev == noPredecessor {
		return err == nil, "", err
	}
	if done, err := r.answered(ctx, prev); err != nil || done {
		return done, prev, err
	}
	kv := r.cfg.Bus.Sessions
	if _, err := kv.Create(ctx, waitKey(prev), raw); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return false, prev, fmt.Errorf("router: park serial request: %w", err)
	}
	// The predecessor may have been answered in between, too early to find m waiting.
	done, err := r.answered(ctx, prev)
	return done, prev, err
}

// predecessor returns the previous serial request of m's session (noPredecessor for the
// first) and makes m the session's last. On a redelivery it returns what it recorded the
// first time.
func (r *Router) predecessor(ctx context.Context, m *protocol.Message) (string, error) {
	kv := r.cfg.Bus.Sessions
	prev := ""
	if e, err := kv.Get(ctx, prevKey(m.RequestID)); err == nil {
		prev = string(e.Value())
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", fmt.Errorf("router: read serial order: %w", err)
	}
	tail, rev, err := r.tail(ctx, m.SessionID)
	if err != nil {
		return "", err
	}
	if prev == "" {
		prev = tail
		if _, err := kv.Create(ctx, prevKey(m.RequestID), []byte(prev)); err != nil {
			return "", fmt.Errorf("router: record serial order: %w", err)
		}
	}
	if tail == prev { // move the tail on to m (not yet done, or undone by a crash in between)
		if rev == 0 {
			_, err = kv.Create(ctx, tailKey(m.SessionID), []byte(m.RequestID))
		} else {
			_, err = kv.Update(ctx, tailKey(m.SessionID), []byte(m.RequestID), rev)
		}
		if err != nil {
			return "", fmt.Errorf("router: record serial order: %w", err)
		}
	}
	return prev, nil
}

// tail returns the session's last serial request (noPredecessor when none) and the key's
// revision (0 when there is no key).
func (r *Router) tail(ctx context.Context, session string) (string, uint64, error) {
	e, err := r.cfg.Bus.Sessions.Get(ctx, tailKey(session))
	switch {
	case err == nil:
		return string(e.Value()), e.Revision(), nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return noPredecessor, 0, nil
	default:
		return "", 0, fmt.Errorf("router: read serial order: %w", err)
	}
}

func (r *Router) answered(ctx context.Context, requestID string) (bool, error) {
	_, err := r.cfg.Bus.Responses.Get(ctx, requestID)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("router: read response of %s: %w", requestID, err)
	}
}

// Wake publishes again the serial request waiting for requestID's response, if any, so that it
// is dispatched. Call it once requestID has its response recorded.
func (r *Router) Wake(ctx context.Context, requestID string) error {
	e, err := r.cfg.Bus.Sessions.Get(ctx, waitKey(requestID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("router: find the request waiting for %s: %w", requestID, err)
	}
	m, err := protocol.Unmarshal(e.Value())
	if err != nil { // stored by a router from bytes it had decoded: not expected
		r.log.Error("the request waiting for this one is undecodable; it cannot be woken", "after", requestID, "err", err)
		return nil
	}
	m.MsgID = protocol.MsgIDRequest(m.RequestID) + ":wake"
	r.log.Info("serial request woken by its predecessor's response", "request_id", m.RequestID, "session_id", m.SessionID,
		"msg_id", m.MsgID, "trace_id", m.Trace.TraceID, "after", requestID)
	if _, err := r.pub.Publish(ctx, protocol.SubjectRequest(m.SessionID), m); err != nil {
		return fmt.Errorf("router: wake serial request %s: %w", m.RequestID, err)
	}
	return nil
}
