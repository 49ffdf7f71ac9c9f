package submit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hermesbus/hermes/internal/answer"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/ledger"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Cancellation says who cancels a request, and why.
type Cancellation struct {
	// By names who asked, as the edge knows the caller (e.g. "http 127.0.0.1:51234"); at most
	// protocol.MaxCancelTextBytes.
	By string
	// Reason is the caller's own words, if any; at most protocol.MaxCancelTextBytes.
	Reason string
}

// cancelTimeout bounds one cancellation.
const cancelTimeout = 10 * time.Second

// Cancel cancels requestID: calls not started are never started, running ones are told to
// stop (their workers' contexts end), and the request is answered once, with a CANCELLED
// result for every call that had not finished and the error CANCELLED naming who cancelled.
// The record gets a cancel message saying so. It returns the request's response; replayed is
// true when the request had been cancelled before (cancelling is idempotent). A request that
// finished first gets ErrFinished with its response; an unknown one ErrNotFound.
//
// Order makes it safe against everything running at once: each unfinished call is first
// marked cancelled in the call ledger (no worker acquires it any more; its holder learns it at
// its next renewal); then the CANCELLED results are recorded (a result recorded before stays:
// that call finished) and the response from the recorded results, before anything about the
// cancellation is published; then the cancellation is announced (workers stop what they run)
// and the results published. A router that answers in between — a worker's result of a call
// that finished meanwhile, a redelivered request finding every result recorded — answers
// from the same recorded results, and its response says CANCELLED too (without the reason).
func (s *Submitter) Cancel(ctx context.Context, requestID string, c Cancellation) (resp *protocol.Response, replayed bool, err error) {
	if len(c.By) > protocol.MaxCancelTextBytes || len(c.Reason) > protocol.MaxCancelTextBytes {
		return nil, false, &protocol.FieldError{Field: "reason", Reason: fmt.Sprintf("may hold at most %d bytes", protocol.MaxCancelTextBytes)}
	}
	if !s.Connected() {
		return nil, false, ErrNotConnected
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelTimeout)
	defer cancel()
	if resp, ok := s.recorded(ctx, requestID, ""); ok {
		// Answered: a cancellation that stopped half-way (or whoever answered) may not have
		// let the session's next serial request go yet; doing it again is harmless.
		if err := s.answer.WakeNext(ctx, requestID); err != nil {
			return nil, false, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		if cancelledResponse(resp) {
			return resp, true, nil
		}
		return resp, false, ErrFinished
	}
	plan, err := s.planForCancel(ctx, requestID)
	if err != nil {
		return nil, false, err
	}
	log := s.log.With("request_id", requestID, "session_id", plan.SessionID, "trace_id", plan.Trace.TraceID)
	// 1. No worker starts a call from now on.
	for _, id := range plan.CallIDs {
		if err := ledger.Cancel(ctx, s.cfg.Bus.Claims, ledger.Key(requestID, id)); err != nil {
			return nil, false, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
	}
	at := time.Now().UTC()
	ev, err := protocol.NewMessage(protocol.TypeCancel, &protocol.Cancel{By: c.By, Reason: c.Reason, At: at})
	if err != nil {
		return nil, false, err
	}
	ev.MsgID, ev.RequestID, ev.SessionID, ev.Trace = protocol.MsgIDCancel(requestID), requestID, plan.SessionID, plan.Trace
	ev.CausationID = plan.RequestMsg
	// 2. Every call without a result gets CANCELLED; a result recorded before stands. They are
	// recorded, not published yet: nothing may aggregate them before the response is recorded.
	results := make([]protocol.ToolResult, len(plan.CallIDs))
	cancelledAny := false
	for i, id := range plan.CallIDs {
		call := &protocol.ToolCall{ToolCallID: id, Name: nameAt(plan.Names, i)}
		tries, _ := ledger.Last(ctx, s.cfg.Bus.Claims, ledger.Key(requestID, id))
		res := protocol.CancelledResult(call, "", tries, c.By)
		m, err := protocol.NewMessage(protocol.TypeToolResult, &res)
		if err != nil {
			return nil, false, err
		}
		m.MsgID, m.RequestID, m.SessionID, m.Trace = protocol.MsgIDToolResult(requestID, id), requestID, plan.SessionID, plan.Trace
		m.CausationID = ev.MsgID
		// Whoever answers from these results says who cancelled, and why, as this would.
		m.Correlation = &protocol.Correlation{CallIDs: plan.CallIDs, Serial: plan.Serial, Cancelled: answer.CancelledMessage(c.By, c.Reason)}
		recorded, _, err := s.cfg.Bus.RecordResult(ctx, s.pub, m, &res)
		if err != nil {
			return nil, false, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		got, err := recorded.Msg.DecodeToolResult()
		if err != nil {
			return nil, false, err
		}
		results[i] = *got
		cancelledAny = cancelledAny || got.Cancelled() // by this cancellation, or one before that stopped half-way
	}
	// Every call had finished (its result recorded) before the cancellation: nothing was
	// cancelled. The request is answered as it finished, and the caller told so.
	var cancelErr *protocol.ResponseError
	if cancelledAny {
		cancelErr = &protocol.ResponseError{Code: protocol.CodeCancelled}
	}
	// 3. The one response, from the recorded results.
	if cancelErr != nil {
		cancelErr.Message = answer.CancelledMessage(c.By, c.Reason)
	}
	mine, err := s.answer.Respond(ctx, &answer.Response{RequestID: requestID, SessionID: plan.SessionID, Results: results,
		Error: cancelErr, Cause: ev.MsgID, Trace: plan.Trace, Serial: plan.Serial})
	if err != nil {
		return nil, false, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	// 4. The record says who cancelled, and workers running a call stop it (they record
	// nothing new: every unfinished call has its CANCELLED result).
	if cancelledAny {
		if _, err := s.pub.Publish(ctx, protocol.SubjectEvent(protocol.EventCancel, plan.SessionID), ev); err != nil {
			log.Warn("the cancellation was recorded but not announced; running calls stop at their next claim renewal", "err", err)
		}
	}
	resp, ok := s.recorded(ctx, requestID, plan.SessionID)
	if !ok {
		return nil, false, fmt.Errorf("%w: the response was recorded but cannot be read back", ErrUnavailable)
	}
	if !mine && !cancelledResponse(resp) {
		return resp, false, ErrFinished
	}
	if !cancelledAny {
		return resp, false, ErrFinished
	}
	log.Info("request cancelled", "by", c.By)
	return resp, false, nil
}

// planForCancel returns requestID's plan, recorded as the request was accepted.
func (s *Submitter) planForCancel(ctx context.Context, requestID string) (*bus.Plan, error) {
	p, err := s.cfg.Bus.Plan(ctx, requestID)
	switch {
	case err == nil:
		return p, nil
	case errors.Is(err, bus.ErrNotFound):
		return nil, fmt.Errorf("%w: no request %s is known (or it is older than the record)", ErrNotFound, requestID)
	}
	return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
}

// cancelledResponse reports whether r answers a cancelled request: it says so, or (recorded by
// a router that aggregated the cancellation's results a moment first) holds CANCELLED results
// of Hermes' own (a tool may report a code of that name too).
func cancelledResponse(r *protocol.Response) bool {
	if r.Error != nil && r.Error.Code == protocol.CodeCancelled {
		return true
	}
	for i := range r.Results {
		if r.Results[i].Cancelled() {
			return true
		}
	}
	return false
}

func nameAt(names []string, i int) string {
	if i < len(names) {
		return names[i]
	}
	return ""
}
