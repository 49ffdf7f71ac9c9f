package router

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// handleResult records a call's result (first one wins) and, when every call of the request has
// one, publishes the response.
func (r *Router) handleResult(ctx context.Context, d *bus.Delivery) error {
	m, err := protocol.Unmarshal(d.Data)
	if err != nil {
		return bus.Permanent(err)
	}
	res, err := m.DecodeToolResult()
	if err != nil {
		return bus.Permanent(err)
	}
	if _, err := r.cfg.Bus.Calls.Create(ctx, callKey(m.RequestID, res.ToolCallID), d.Data); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("router: record result: %w", err)
	}
	entry, err := r.cfg.Bus.Calls.Get(ctx, m.RequestID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		r.log.Warn("result for a request with no plan; dropped", "request_id", m.RequestID, "tool_call_id", res.ToolCallID, "msg_id", m.MsgID)
		return nil
	}
	if err != nil {
		return fmt.Errorf("router: read plan: %w", err)
	}
	p, err := decodePlan(entry.Value())
	if err != nil {
		return bus.Permanent(err)
	}
	results := make([]protocol.ToolResult, len(p.CallIDs))
	for i, id := range p.CallIDs {
		if id == res.ToolCallID {
			results[i] = *res
			continue
		}
		e, err := r.cfg.Bus.Calls.Get(ctx, callKey(m.RequestID, id))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil // not complete yet; the last result completes it
		}
		if err != nil {
			return fmt.Errorf("router: read result: %w", err)
		}
		rm, err := protocol.Unmarshal(e.Value())
		if err != nil {
			return bus.Permanent(err)
		}
		other, err := rm.DecodeToolResult()
		if err != nil {
			return bus.Permanent(err)
		}
		results[i] = *other
	}
	return r.respond(ctx, m, p, results)
}

// respond builds the response from the results and makes it the request's one response.
func (r *Router) respond(ctx context.Context, cause *protocol.Message, p *plan, results []protocol.ToolResult) error {
	resp := &protocol.Response{RequestID: cause.RequestID, SessionID: p.SessionID, Status: protocol.ResponseStatus(results), Results: results}
	out, err := protocol.NewMessage(protocol.TypeResponse, resp)
	if err != nil {
		return bus.Permanent(err)
	}
	out.MsgID, out.RequestID, out.SessionID = protocol.MsgIDResponse(cause.RequestID), cause.RequestID, p.SessionID
	out.CausationID, out.Trace = p.RequestMsg, p.Trace
	mine, err := r.cfg.Bus.Respond(ctx, r.pub, out)
	if mine {
		r.responses.Add(1)
	}
	return err
}

// republish publishes a recorded response again; the stream drops it within the duplicate
// window, and a gateway still waiting for it receives it.
func (r *Router) republish(ctx context.Context, recorded []byte) error {
	m, err := protocol.Unmarshal(recorded)
	if err != nil {
		return bus.Permanent(err)
	}
	_, err = r.cfg.Bus.Respond(ctx, r.pub, m)
	return err
}
