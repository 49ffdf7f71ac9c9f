package router

import (
	"context"
	"errors"
	"fmt"
	"slices"

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
	// release ends the turn a result's call ran under (Config.Release); nil: none.
	release func(ctx context.Context, g *protocol.Grant, requestID, callID, session, status string) error
}

// handle aggregates one result delivery (the bus middleware has decoded it).
func (a *aggregator) handle(ctx context.Context, d *bus.Delivery) error {
	m := d.Msg
	res, err := m.DecodeToolResult()
	if err != nil {
		return bus.Permanent(err)
	}
	// With trusted result keys, a result counts only when a key trusted for its call's tool
	// sealed it: anything else is refused here — a dead letter saying why — and never
	// aggregated (nor taken for the call's result by any reader of the record).
	keys := a.bus.ResultKeys()
	signer, sealed := keys.Signer(m)
	if keys != nil && !sealed {
		return bus.Permanent(fmt.Errorf("router: refused result of %s/%s: %w", m.RequestID, res.ToolCallID,
			keys.VerifyResult(m, res, "")))
	}
	// The call ids come with the result (copied from the dispatch); only results published by
	// others, or by Hermes before correlation travelled in the envelope, need the plan — and
	// those sealed by a key trusted with some tools only, whose call's tool the plan says.
	callIDs, names, serial, trace, cause := []string(nil), []string(nil), false, m.Trace, protocol.MsgIDRequest(m.RequestID)
	if a.trusted(m.Correlation, res) && (keys == nil || signer.AnyTool()) {
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
		if len(p.Names) == len(p.CallIDs) {
			names = p.Names
		}
	}
	if keys != nil {
		tool := ""
		if i := slices.Index(callIDs, res.ToolCallID); i >= 0 && names != nil {
			tool = names[i]
		} else if i < 0 {
			return bus.Permanent(fmt.Errorf("router: refused result of %s/%s: its request has no such call", m.RequestID, res.ToolCallID))
		}
		if err := keys.VerifyResult(m, res, tool); err != nil {
			return bus.Permanent(fmt.Errorf("router: refused result of %s/%s: %w", m.RequestID, res.ToolCallID, err))
		}
	}
	// The results of the request, read in one batch, with this one's among them: a replica
	// that has not stored this one yet is not read from, so every result recorded before this
	// one is seen, and whichever result is recorded last completes the request.
	rec := &answer.Record{RequestID: m.RequestID, SessionID: m.SessionID, CallIDs: callIDs, Names: names, AtLeast: d.StreamSeq,
		Held: &bus.Recorded{Msg: m, Data: d.Data, Seq: d.StreamSeq}, HeldCall: res.ToolCallID,
		Cause: cause, Trace: trace, Serial: serial}
	// A result counts where the session's stream keeps it, and only there.
	redriven := d.Subject == a.bus.Layout().SubjectRedrivenResult(m.SessionID)
	switch {
	case redriven:
		// A copy on the session's subject (a re-drive): the results are read from the stream
		// leader, the call's own among them.
		rec.AtLeast, rec.Held = 0, nil
	case d.Subject != a.bus.Layout().SubjectResult(m.RequestID, res.ToolCallID, m.SessionID):
		// Not on its own call's subject (no Hermes service puts it there): it is not what
		// was recorded for its call; the record says what was.
		rec.AtLeast, rec.Held = 0, nil
	}
	if g := grantOf(m); g != nil && a.release != nil && (rec.Held != nil || redriven) {
		// The call's result is on the record: its turn on the resource it changed ends, and
		// the next call in line gets it. (A result not on its own call's subject ends none.)
		if err := a.release(ctx, g, m.RequestID, res.ToolCallID, m.SessionID, res.Status); err != nil {
			return fmt.Errorf("router: end the turn of %s/%s: %w", m.RequestID, res.ToolCallID, err)
		}
	}
	_, err = a.answer.FromRecord(ctx, rec)
	return err
}

// grantOf is the grant a result's call ran under, as its correlation carries it from the
// dispatch; nil when none, or not a grant.
func grantOf(m *protocol.Message) *protocol.Grant {
	if m.Correlation == nil || m.Correlation.Grant == nil || m.Correlation.Grant.Check() != nil {
		return nil
	}
	return m.Correlation.Grant
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
