package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/hermesbus/hermes/internal/tracing"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// handleResult aggregates: when every call of the result's request has a recorded result, it
// publishes the response. The response is built from the recorded results only — the first
// result recorded for a call is its result, whatever arrives later.
func (r *Router) handleResult(ctx context.Context, d *bus.Delivery) (err error) {
	m, err := protocol.Unmarshal(d.Data)
	if err != nil {
		return bus.Permanent(err)
	}
	ctx, span := tracing.Start(ctx, m, "hermes.aggregate", trace.SpanKindConsumer)
	defer func() { tracing.End(span, err) }()
	res, err := m.DecodeToolResult()
	if err != nil {
		return bus.Permanent(err)
	}
	// The call ids come with the result (copied from the dispatch); only results published by
	// others need the request's plan read back.
	p := &plan{SessionID: m.SessionID, Trace: m.Trace, RequestMsg: protocol.MsgIDRequest(m.RequestID)}
	if r.trustedCallIDs(res) {
		p.CallIDs, p.Serial = res.RequestCallIDs, res.RequestSerial
	} else {
		entry, err := r.cfg.Bus.Calls.Get(ctx, m.RequestID)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			r.log.Warn("result for a request with no plan; dropped", "request_id", m.RequestID, "session_id", m.SessionID,
				"msg_id", m.MsgID, "trace_id", m.Trace.TraceID, "tool_call_id", res.ToolCallID)
			return nil
		}
		if err != nil {
			return fmt.Errorf("router: read plan: %w", err)
		}
		if p, err = decodePlan(entry.Value()); err != nil {
			return bus.Permanent(err)
		}
	}
	// A result published as the recorded one need not be read back.
	ownRecorded := d.Header.Get(bus.HeaderRecorded) != ""
	results := make([]protocol.ToolResult, len(p.CallIDs))
	for i, id := range p.CallIDs {
		if id == res.ToolCallID && ownRecorded {
			results[i] = *res
			results[i].RequestCallIDs, results[i].RequestSerial = nil, false
			continue
		}
		key := bus.ResultKey(m.RequestID, id)
		e, err := r.cfg.Bus.Calls.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) && id == res.ToolCallID {
			// Results are recorded by whoever publishes them; record one that was published
			// without (the first one wins).
			if _, err := r.cfg.Bus.Calls.Create(ctx, key, d.Data); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
				return fmt.Errorf("router: record result: %w", err)
			}
			e, err = r.cfg.Bus.Calls.Get(ctx, key)
		}
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
		recorded, err := rm.DecodeToolResult()
		if err != nil {
			return bus.Permanent(err)
		}
		recorded.RequestCallIDs, recorded.RequestSerial = nil, false
		results[i] = *recorded
	}
	return r.respond(ctx, m, p, results)
}

// respond builds the response from the results and makes it the request's one response. A
// response too large for one bus message has its largest contents replaced by
// RESULT_TOO_LARGE errors until it fits.
func (r *Router) respond(ctx context.Context, cause *protocol.Message, p *plan, results []protocol.ToolResult) error {
	for {
		resp := &protocol.Response{RequestID: cause.RequestID, SessionID: p.SessionID, Status: protocol.ResponseStatus(results), Results: results}
		out, err := protocol.NewMessage(protocol.TypeResponse, resp)
		if err != nil {
			return bus.Permanent(err)
		}
		out.MsgID, out.RequestID, out.SessionID = protocol.MsgIDResponse(cause.RequestID), cause.RequestID, p.SessionID
		out.CausationID, out.Trace = p.RequestMsg, p.Trace
		tracing.Inject(ctx, &out.Trace)
		mine, err := r.cfg.Bus.Respond(ctx, r.pub, out)
		if errors.Is(err, bus.ErrTooLarge) && shrinkLargest(results, r.cfg.Bus.MaxMessageBytes()) {
			continue
		}
		if err != nil {
			return err
		}
		if mine {
			r.cfg.Metrics.Answered(resp)
		}
		if p.Serial {
			return r.Wake(ctx, cause.RequestID)
		}
		return nil
	}
}

// shrinkLargest replaces the largest ok content with a RESULT_TOO_LARGE error; it reports
// false when there is nothing left to shrink.
func shrinkLargest(results []protocol.ToolResult, limit int) bool {
	big := -1
	for i := range results {
		if len(results[i].Content) > 1024 && (big < 0 || len(results[i].Content) > len(results[big].Content)) {
			big = i
		}
	}
	if big < 0 {
		return false
	}
	r := &results[big]
	content, _ := json.Marshal(fmt.Sprintf("the content (%d bytes) was dropped: the whole response must fit in one bus message of %d bytes", len(r.Content), limit))
	r.Status, r.Content = protocol.ResultError, content
	r.ErrorCode, r.ErrorOrigin = protocol.CodeResultTooLarge, protocol.OriginHermes
	r.RecoveryHint = "the results of this request together exceed the bus message limit; ask for less per call or split the request"
	return true
}

// trustedCallIDs reports whether the call ids a result carries can stand in for the plan: a
// valid id list within the request limit that names the result's own call. Anything else —
// a result published by someone else, or forged — is aggregated by the plan.
func (r *Router) trustedCallIDs(res *protocol.ToolResult) bool {
	ids := res.RequestCallIDs
	limit := r.cfg.Limits.MaxToolCalls
	if limit <= 0 {
		limit = protocol.DefaultLimits.MaxToolCalls
	}
	if len(ids) == 0 || len(ids) > limit {
		return false
	}
	own := false
	for _, id := range ids {
		if !protocol.ValidToken(id, protocol.MaxIDLen) {
			return false
		}
		own = own || id == res.ToolCallID
	}
	return own
}
