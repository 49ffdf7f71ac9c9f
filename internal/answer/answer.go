// Package answer gives a request its one response: the router when every call has a result,
// the dead-letter processor when a request is given up, a cancellation. All of them go
// through Responder, so a response is built, sized, recorded, counted and followed up the same
// way whoever answers.
//
// Guarantees: a request has at most one recorded response (the first recorded wins, whoever
// records it; the others publish that one again); a response too large for one bus message has
// its largest contents replaced by RESULT_TOO_LARGE errors until it fits; once a serial
// request's response is recorded, the session's next serial request is woken.
package answer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/internal/park"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/tracing"
)

// Responder records responses. It is safe for concurrent use.
type Responder struct {
	bus     *bus.Bus
	pub     *bus.Publisher
	lot     *park.Lot
	metrics *metrics.Metrics
	log     *slog.Logger
}

// New returns a Responder publishing with pub and waking through lot; m counts answered
// requests (nil: unexported metrics).
func New(b *bus.Bus, pub *bus.Publisher, lot *park.Lot, m *metrics.Metrics, logger *slog.Logger) *Responder {
	if m == nil {
		m = metrics.New(nil)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Responder{bus: b, pub: pub, lot: lot, metrics: m, log: logger}
}

// Response is what to answer a request with.
type Response struct {
	// RequestID and SessionID name the request.
	RequestID, SessionID string
	// Results, one per call in the request's order.
	Results []protocol.ToolResult
	// Error, when set, says why the request failed as a whole.
	Error *protocol.ResponseError
	// Cause is the message this answers (its id becomes the response's causation id).
	Cause string
	// Trace is the request's trace context.
	Trace protocol.TraceContext
	// Serial is the request's Serial: its response wakes the session's next serial request.
	Serial bool
	// Cancelled is what a cancellation's results say its response's error says (who
	// cancelled, and why): the message of the CANCELLED error given a response without Error.
	Cancelled string
}

// maxCancelledMessage bounds Response.Cancelled: "cancelled by " and who, ": " and why.
const maxCancelledMessage = 2*protocol.MaxCancelTextBytes + 16

// CancelledMessage is the error message of a request cancelled by by for reason.
func CancelledMessage(by, reason string) string {
	msg := "cancelled by " + by
	if reason != "" {
		msg += ": " + reason
	}
	return msg
}

// Respond makes r the request's one response, unless it has one already. It reports whether r
// was recorded (false: an earlier response stands, and was published again). A response with
// no Error whose results include a cancellation's CANCELLED ones gets the error CANCELLED, with
// r.Cancelled as its message. No result in it carries a rejected answer (rejected_content).
func (a *Responder) Respond(ctx context.Context, r *Response) (bool, error) {
	results := r.Results
	if slices.ContainsFunc(results, func(res protocol.ToolResult) bool { return res.Rejected != nil }) {
		// An answer that broke its tool's contract stays in the call's result on the record,
		// for whoever debugs the tool; it is never delivered.
		results = slices.Clone(results)
		for i := range results {
			results[i].Rejected = nil
		}
	}
	failure := r.Error
	if failure == nil && slices.ContainsFunc(results, func(res protocol.ToolResult) bool { return res.Cancelled() }) {
		// Answered from results a cancellation recorded, by someone other than the canceller
		// (who got there first, or finishes what a canceller left half-way).
		msg := r.Cancelled
		if msg == "" || len(msg) > maxCancelledMessage {
			msg = "the request was cancelled before every call finished"
		}
		failure = &protocol.ResponseError{Code: protocol.CodeCancelled, Message: msg}
	}
	for {
		out, resp, err := r.message(ctx, results, failure)
		if err != nil {
			return false, err
		}
		mine, err := a.bus.Respond(ctx, a.pub, out)
		if errors.Is(err, bus.ErrTooLarge) && shrinkLargest(results, a.bus.MaxMessageBytes()) {
			continue
		}
		if err != nil {
			return false, err
		}
		if mine {
			a.metrics.Answered(resp)
		}
		if r.Serial {
			if err := a.WakeNext(ctx, r.RequestID); err != nil {
				return mine, err
			}
		}
		return mine, nil
	}
}

// Message is r as the response message that records it, and the response it carries: what
// Respond records, for who answers a request before recording it (the fast lane). Results that
// carry a rejected answer are delivered without it. A response too large for one bus message
// is for Respond to shrink; the bus refuses it here.
func (r *Response) Message(ctx context.Context) (*protocol.Message, *protocol.Response, error) {
	results := r.Results
	if slices.ContainsFunc(results, func(res protocol.ToolResult) bool { return res.Rejected != nil }) {
		results = slices.Clone(results)
		for i := range results {
			results[i].Rejected = nil
		}
	}
	return r.message(ctx, results, r.Error)
}

// message is the response message of r with results and failure.
func (r *Response) message(ctx context.Context, results []protocol.ToolResult, failure *protocol.ResponseError) (*protocol.Message, *protocol.Response, error) {
	resp := &protocol.Response{RequestID: r.RequestID, SessionID: r.SessionID, Status: protocol.ResponseStatus(results),
		Results: results, Error: failure}
	if err := resp.Validate(); err != nil {
		// What no reader could decode must never be the request's one response.
		return nil, nil, bus.Permanent(fmt.Errorf("answer: response of %s: %w", r.RequestID, err))
	}
	out, err := protocol.NewMessage(protocol.TypeResponse, resp)
	if err != nil {
		return nil, nil, bus.Permanent(err)
	}
	out.MsgID, out.RequestID, out.SessionID = protocol.MsgIDResponse(r.RequestID), r.RequestID, r.SessionID
	out.CausationID, out.Trace = r.Cause, r.Trace
	tracing.Inject(ctx, &out.Trace)
	return out, resp, nil
}

// Record names a request to answer from its recorded results.
type Record struct {
	// RequestID and SessionID name the request; CallIDs are its calls, in order.
	RequestID, SessionID string
	CallIDs              []string
	// Names, when known (the request's plan), are the tools of CallIDs, in order: a result
	// sealed by a key trusted with some tools only is checked against its call's tool (without
	// them, the bus reads the plan when it meets one).
	Names []string
	// AtLeast is the sequence of a recorded result the caller holds (0: none): only a read
	// that includes it is taken (bus.Bus.Results).
	AtLeast uint64
	// Held, when set, is the result of call HeldCall that the caller holds, as recorded on
	// its call's subject (AtLeast is its sequence).
	Held     *bus.Recorded
	HeldCall string
	// Cause, Trace and Serial are as in Response.
	Cause  string
	Trace  protocol.TraceContext
	Serial bool
}

// FromRecord answers r's request from the recorded results of its calls once every call has
// one, and reports whether every call had one; until then the request is not answered, and
// the last result recorded completes it. The response says CANCELLED, as the canceller would,
// when results a cancellation recorded are among them. A recorded result that cannot be read
// is a Permanent error.
func (a *Responder) FromRecord(ctx context.Context, r *Record) (bool, error) {
	var recorded map[string]*bus.Recorded
	if r.Held != nil && len(r.CallIDs) == 1 && r.CallIDs[0] == r.HeldCall && r.AtLeast != 0 {
		// The request's one result is in hand, as recorded: nothing to read.
		recorded = map[string]*bus.Recorded{r.HeldCall: r.Held}
	} else {
		var err error
		if recorded, err = a.bus.Results(ctx, r.RequestID, r.SessionID, r.CallIDs, r.Names, r.AtLeast); err != nil {
			return false, err
		}
	}
	results := make([]protocol.ToolResult, len(r.CallIDs))
	cancelled := ""
	for i, id := range r.CallIDs {
		rec := recorded[id]
		if rec == nil {
			return false, nil
		}
		got, err := rec.Msg.DecodeToolResult()
		if err != nil {
			return false, bus.Permanent(fmt.Errorf("answer: recorded result of %s/%s: %w", r.RequestID, id, err))
		}
		results[i] = *got
		if got.Cancelled() && rec.Msg.Correlation != nil && cancelled == "" {
			cancelled = rec.Msg.Correlation.Cancelled
		}
	}
	_, err := a.Respond(ctx, &Response{RequestID: r.RequestID, SessionID: r.SessionID, Results: results,
		Cause: r.Cause, Trace: r.Trace, Serial: r.Serial, Cancelled: cancelled})
	return true, err
}

// WakeNext lets go whatever waits for requestID's response (the session's next serial
// request). Call it once the response is recorded; calling it again is harmless.
func (a *Responder) WakeNext(ctx context.Context, requestID string) error {
	_, err := a.lot.Wake(ctx, protocol.WakeOnResponse(requestID))
	return err
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
	dropped := protocol.ErrorResult(protocol.CodeResultTooLarge, protocol.OriginHermes,
		"the results of this request together exceed the bus message limit; ask for less per call or split the request",
		fmt.Sprintf("the content (%d bytes) was dropped: the whole response must fit in one bus message of %d bytes", len(r.Content), limit))
	dropped.ToolCallID, dropped.Name, dropped.Route, dropped.Attempts, dropped.ExecutionTimeMS = r.ToolCallID, r.Name, r.Route, r.Attempts, r.ExecutionTimeMS
	*r = dropped
	return true
}
