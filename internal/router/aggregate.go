package router

import (
	"context"
	"errors"
	"fmt"

	"github.com/hermesbus/hermes/internal/answer"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// aggregator turns results into responses: when every call of a result's request has a
// recorded result, it answers the request. The response is built from the recorded results
// only — the first result recorded for a call is its result, whatever arrives later.
type aggregator struct {
	bus     *bus.Bus
	answer  *answer.Responder
	maxCall int // the most call ids a trusted correlation may hold
}

// handle aggregates one result delivery (the bus middleware has decoded it).
func (a *aggregator) handle(ctx context.Context, d *bus.Delivery) error {
	m := d.Msg
	res, err := m.DecodeToolResult()
	if err != nil {
		return bus.Permanent(err)
	}
	// The call ids come with the result (copied from the dispatch); only results published by
	// others, or by Hermes before correlation travelled in the envelope, need the plan.
	callIDs, serial, trace, cause := []string(nil), false, m.Trace, protocol.MsgIDRequest(m.RequestID)
	if a.trusted(m.Correlation, res) {
		callIDs, serial = m.Correlation.CallIDs, m.Correlation.Serial
	} else {
		p, err := a.bus.Plan(ctx, m.RequestID)
		if errors.Is(err, bus.ErrNotFound) {
			d.Log.Warn("result for a request with no plan; dropped", "tool_call_id", res.ToolCallID)
			return nil
		}
		if err != nil {
			return fmt.Errorf("router: read plan: %w", err)
		}
		callIDs, serial, trace, cause = p.CallIDs, p.Serial, p.Trace, p.RequestMsg
	}
	// A result published as the recorded one need not be read back.
	ownRecorded := d.Header.Get(bus.HeaderRecorded) != ""
	results := make([]protocol.ToolResult, len(callIDs))
	for i, id := range callIDs {
		if id == res.ToolCallID && ownRecorded {
			results[i] = *res
			continue
		}
		_, recorded, _, err := a.bus.Result(ctx, m.RequestID, id)
		if errors.Is(err, bus.ErrNotFound) && id == res.ToolCallID {
			// Results are recorded by whoever publishes them; record one that was published
			// without (the first one wins).
			if _, err := a.bus.Calls.Create(ctx, protocol.KeyResult(m.RequestID, id), d.Data); err != nil && !isKeyExists(err) {
				return fmt.Errorf("router: record result: %w", err)
			}
			_, recorded, _, err = a.bus.Result(ctx, m.RequestID, id)
		}
		if errors.Is(err, bus.ErrNotFound) {
			return nil // not complete yet; the last result completes it
		}
		if err != nil {
			return fmt.Errorf("router: read result: %w", err)
		}
		results[i] = *recorded
	}
	_, err = a.answer.Respond(ctx, &answer.Response{RequestID: m.RequestID, SessionID: m.SessionID, Results: results,
		Cause: cause, Trace: trace, Serial: serial})
	return err
}

// trusted reports whether a result's correlation can stand in for the plan: a valid id list
// within the request limit that names the result's own call. Anything else — a result
// published by someone else, or forged — is aggregated by the plan.
func (a *aggregator) trusted(c *protocol.Correlation, res *protocol.ToolResult) bool {
	if c == nil || len(c.CallIDs) == 0 || len(c.CallIDs) > a.maxCall {
		return false
	}
	own := false
	for _, id := range c.CallIDs {
		if !protocol.ValidToken(id, protocol.MaxIDLen) {
			return false
		}
		own = own || id == res.ToolCallID
	}
	return own
}
