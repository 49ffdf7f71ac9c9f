package router

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hermesbus/hermes/internal/answer"
	"github.com/hermesbus/hermes/internal/park"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/tracing"
)

// parker parks messages (package park's Lot).
type parker interface {
	Park(ctx context.Context, w park.Wait, item, subject string, raw []byte) (park.Spot, error)
	Unpark(ctx context.Context, sp park.Spot) error
	Wake(ctx context.Context, key string) (int, error)
}

// busOutlet carries a pipeline's decisions out on the bus: decided results are recorded and
// published (then aggregated like any tool's), dispatches are published together, and held
// calls park the request. Every message carries its deterministic id and the request's
// correlation (its call ids, whether it is serial), so a redelivery publishes nothing twice
// and any router can aggregate the results without reading the plan.
type busOutlet struct {
	bus  *bus.Bus
	pub  *bus.Publisher
	lot  parker
	seal *SealKey // nil: calls go unsealed
}

var _ Outlet = (*busOutlet)(nil)

// Park parks the job's request under w; it is published again to where requests enter.
func (o *busOutlet) Park(ctx context.Context, job *Job, w park.Wait) (func(context.Context) error, error) {
	sp, err := o.lot.Park(ctx, w, job.Msg.RequestID, protocol.SubjectRequest(job.Msg.SessionID), job.Raw)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return o.lot.Unpark(ctx, sp) }, nil
}

// Emit records decided results, publishes the dispatches as one batch, and parks the request
// once for each distinct wait of its held calls.
func (o *busOutlet) Emit(ctx context.Context, job *Job) error {
	corr := correlation(job)
	m := job.Msg
	batch := make([]bus.Outgoing, 0, len(job.Calls))
	waits := map[park.Wait][]func(context.Context) (bool, error){}
	for _, c := range job.Calls {
		switch {
		case c.Done:
		case c.Result != nil:
			if err := o.record(ctx, m, corr, c.Result); err != nil {
				return err
			}
		case c.Hold != nil:
			waits[*c.Hold] = append(waits[*c.Hold], c.Recheck)
		case c.Dispatch != nil:
			out, err := o.call(ctx, m, corr, c)
			if err != nil {
				return err
			}
			batch = append(batch, out)
		default:
			// A pending call no stage resolved: a stage is missing; nothing can send it.
			return bus.Permanent(fmt.Errorf("call %s (%s) left the pipeline unresolved", c.Call.ToolCallID, c.Call.Name))
		}
	}
	// The calls go out together: they are independent, and none waits for another's ack.
	if len(batch) > 0 {
		if err := o.pub.PublishBatch(ctx, batch); err != nil {
			return err
		}
	}
	for w, checks := range waits {
		if _, err := o.Park(ctx, job, w); err != nil {
			return err
		}
		// What a call waits for may have come between its stage's look and the park (its
		// wake-up found nothing parked): asked again now, it wakes the request at once.
		ready, err := anyReady(ctx, checks)
		if err != nil {
			return err
		}
		if ready {
			if _, err := o.lot.Wake(ctx, w.Key); err != nil {
				return err
			}
		}
	}
	return nil
}

// anyReady asks the held calls' rechecks (nil: none) whether what one waits for came already.
func anyReady(ctx context.Context, checks []func(context.Context) (bool, error)) (bool, error) {
	for _, check := range checks {
		if check == nil {
			continue
		}
		if ready, err := check(ctx); err != nil || ready {
			return ready, err
		}
	}
	return false, nil
}

// call is the message that dispatches c, a call of the request m with correlation corr,
// sealed when the router seals, and where it goes.
func (o *busOutlet) call(ctx context.Context, m *protocol.Message, corr *protocol.Correlation, c *Call) (bus.Outgoing, error) {
	out, err := protocol.NewMessage(protocol.TypeToolCall, c.Dispatch)
	if err != nil {
		return bus.Outgoing{}, bus.Permanent(err)
	}
	out.Follow(m, protocol.MsgIDToolCall(m.RequestID, c.Call.ToolCallID))
	out.Correlation = corr
	if g := c.Dispatch.Grant; g != nil {
		// The grant travels back with the call's result, which ends its turn.
		withGrant := *corr
		withGrant.Grant = g
		out.Correlation = &withGrant
	}
	tracing.Inject(ctx, &out.Trace)
	out.Recipient = bus.ToolConsumer(c.Dispatch.Action.Kind, c.Call.Name)
	if k := o.seal; k != nil {
		// No longer than the call ledger remembers the call: a seal that outlived its
		// claim could have a captured call run twice.
		ttl := k.TTL
		if ttl <= 0 {
			ttl = min(24*time.Hour, o.bus.Config().StateTTL)
		}
		out.SealWith(k.Key, k.ID, time.Now().Add(ttl))
	}
	return bus.Outgoing{Subject: protocol.SubjectToolCall(c.Dispatch.Action.Kind, c.Call.Name, m.SessionID), Msg: out}, nil
}

// decided is the message of a result the pipeline decided itself (e.g. NO_ROUTE) for a call of
// the request cause with correlation corr.
func decided(ctx context.Context, cause *protocol.Message, corr *protocol.Correlation, res *protocol.ToolResult) (*protocol.Message, error) {
	out, err := protocol.NewMessage(protocol.TypeToolResult, res)
	if err != nil {
		return nil, bus.Permanent(err)
	}
	out.Follow(cause, protocol.MsgIDToolResult(cause.RequestID, res.ToolCallID))
	out.Correlation = corr
	tracing.Inject(ctx, &out.Trace)
	return out, nil
}

// record records and publishes a result the pipeline decided itself (e.g. NO_ROUTE).
func (o *busOutlet) record(ctx context.Context, cause *protocol.Message, corr *protocol.Correlation, res *protocol.ToolResult) error {
	out, err := decided(ctx, cause, corr, res)
	if err != nil {
		return err
	}
	_, _, err = o.bus.RecordResult(ctx, o.pub, out, res)
	return err
}

// correlation is what the job's tool calls and results carry back to aggregation.
func correlation(job *Job) *protocol.Correlation {
	ids := make([]string, len(job.Req.ToolCalls))
	for i := range job.Req.ToolCalls {
		ids[i] = job.Req.ToolCalls[i].ToolCallID
	}
	return &protocol.Correlation{CallIDs: ids, Serial: job.Req.Serial}
}

// busPlans is the plan stage's store on the bus.
type busPlans struct {
	bus    *bus.Bus
	pub    *bus.Publisher
	answer *answer.Responder
}

var _ planStore = (*busPlans)(nil)

func (p *busPlans) CreatePlan(ctx context.Context, requestID string, plan *bus.Plan) (bool, *bus.Plan, error) {
	return p.bus.CreatePlan(ctx, requestID, plan)
}

func (p *busPlans) HaveResults(ctx context.Context, requestID, session string, callIDs []string) (map[string]bool, error) {
	recorded, err := p.bus.Results(ctx, requestID, session, callIDs, nil, 0)
	if err != nil {
		return nil, err
	}
	have := make(map[string]bool, len(recorded))
	for id := range recorded {
		have[id] = true
	}
	return have, nil
}

func (p *busPlans) AnswerFromResults(ctx context.Context, requestID, session string) error {
	plan, err := p.bus.Plan(ctx, requestID)
	if err != nil {
		return err
	}
	return answerFromResults(ctx, p.answer, requestID, plan)
}

// answerFromResults answers requestID from its plan and its calls' recorded results, every
// call having one.
func answerFromResults(ctx context.Context, a *answer.Responder, requestID string, plan *bus.Plan) error {
	complete, err := a.FromRecord(ctx, &answer.Record{RequestID: requestID, SessionID: plan.SessionID, CallIDs: plan.CallIDs,
		Cause: plan.RequestMsg, Trace: plan.Trace, Serial: plan.Serial})
	if err == nil && !complete {
		err = fmt.Errorf("router: a result of %s is missing", requestID)
	}
	return err
}

func (p *busPlans) Announce(ctx context.Context, requestID, session string) (bool, error) {
	rec, _, err := p.bus.Response(ctx, requestID, session)
	switch {
	case errors.Is(err, bus.ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, p.bus.Announce(ctx, rec)
}
