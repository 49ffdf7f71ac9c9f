package router

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/hermesbus/hermes/internal/park"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Job is one delivery of a request on its way through the pipeline: the request, and what the
// stages decided so far about it and each of its calls.
type Job struct {
	// Msg is the request's envelope, Req its payload, Raw the message as delivered (what is
	// parked when the request waits).
	Msg *protocol.Message
	Req *protocol.Request
	Raw []byte
	// Woken is set when this delivery is a parked request published again; WokenBy is the
	// wake key that woke it.
	Woken   bool
	WokenBy string
	// Planned is set on the first delivery of a request's first publication by the gateway,
	// which recorded its plan as it accepted it (bus.HeaderPlanned).
	Planned bool
	// FirstPass is set by the serial stage when the request passes it for the first time,
	// unanswered: nothing of it was dispatched before this delivery.
	FirstPass bool
	// Log names the request in every line.
	Log *slog.Logger
	// Plan is the request's recorded plan, set by the plan stage.
	Plan *bus.Plan
	// Calls are the request's calls, in order.
	Calls []*Call
}

// Call is one call of a Job and what the stages decided about it. A call is pending until a
// stage marks it Done, gives it a Result, or Holds it; pending calls with a Dispatch are sent
// to their tools when the pipeline ends.
type Call struct {
	Call *protocol.ToolCall
	// Done: nothing is left to do for the call now (it has its result from an earlier
	// delivery).
	Done bool
	// Result, when set, is the call's result decided by a stage (NO_ROUTE, a refusal…): it is
	// recorded instead of dispatching the call.
	Result *protocol.ToolResult
	// Hold, when set, makes the call wait: it is not dispatched now, and the request is parked
	// until Hold wakes it, when the pipeline runs again.
	Hold *park.Wait
	// Recheck, when set with Hold, is asked once the request is parked: true says what the call
	// waits for came already (its wake-up may have passed before the park), and the request is
	// woken at once.
	Recheck func(ctx context.Context) (bool, error)
	// Dispatch is what a stage resolved for the tool; set on pending calls by the route stage.
	Dispatch *protocol.Dispatch
	// Contract is the tool's contract the call goes under, set by the contract stage (nil:
	// the tool has none).
	Contract *contract.Compiled
	// Policy is what the tool's policy decided for a call it let run, set by the policy
	// stage; the route stage carries it in the dispatch, so the record keeps it.
	Policy *protocol.PolicyDecision
}

// Pending reports whether no stage has settled c yet.
func (c *Call) Pending() bool { return !c.Done && c.Result == nil && c.Hold == nil }

// Decide settles c with result r (ids and name filled in from the call; route as given).
func (c *Call) Decide(r protocol.ToolResult, route string) {
	r = r.For(c.Call, route)
	c.Result = &r
}

// NewJob makes the job of a decoded request delivery; wokenBy is the wake key that published
// it again ("" for a first delivery).
func NewJob(m *protocol.Message, req *protocol.Request, raw []byte, wokenBy string, log *slog.Logger) *Job {
	j := &Job{Msg: m, Req: req, Raw: raw, Woken: wokenBy != "", WokenBy: wokenBy, Log: log, Calls: make([]*Call, len(req.ToolCalls))}
	for i := range req.ToolCalls {
		j.Calls[i] = &Call{Call: &req.ToolCalls[i]}
	}
	return j
}

// A Stage is one step of the dispatch pipeline: it looks at a request and its calls and says
// how it goes on. Stages are run in order for every delivery of a request — its first, a
// redelivery, a wake-up after parking — so each must be idempotent and decide again from what
// is recorded. Coming stages (contract checks, policies, rate limits, approvals, state
// coordination) are stages like these.
type Stage interface {
	// Name names the stage in logs and errors.
	Name() string
	// Process decides about job. It may settle calls (Call.Decide, Done, Hold) or set their
	// Dispatch, and returns how the pipeline goes on. An error wrapped with bus.Permanent
	// ends the request's delivery for good (it is dead-lettered); any other is retried.
	Process(ctx context.Context, job *Job) (Verdict, error)
}

// Verdict is what a stage says about the rest of the pipeline.
type Verdict struct {
	kind    verdictKind
	wait    park.Wait
	recheck func(context.Context) (bool, error)
}

type verdictKind int

const (
	goOn verdictKind = iota
	parkIt
	stopIt
)

// Continue lets the request go on to the next stage.
func Continue() Verdict { return Verdict{} }

// Stop ends this delivery: nothing is left to do with it (it is answered, or superseded).
func Stop() Verdict { return Verdict{kind: stopIt} }

// Park makes the whole request wait for w: it is parked and the delivery acked; when w wakes
// it, the pipeline runs again from the first stage. recheck, when set, is asked once the
// request is parked whether it may go on after all — what it waits for may have happened
// between the stage's check and the parking, too early to wake it — and true takes the
// parked copy out again and lets this delivery continue.
func Park(w park.Wait, recheck func(context.Context) (bool, error)) Verdict {
	return Verdict{kind: parkIt, wait: w, recheck: recheck}
}

// Outlet is where a pipeline's decisions leave it. The bus outlet records results, publishes
// dispatches and parks; tests use fakes.
type Outlet interface {
	// Park parks the job's request until w wakes it; unpark takes it out again, for a
	// delivery that goes on after all.
	Park(ctx context.Context, job *Job, w park.Wait) (unpark func(context.Context) error, err error)
	// Emit carries out what the stages decided for the job's calls: records decided results,
	// dispatches calls, parks the request for held calls.
	Emit(ctx context.Context, job *Job) error
}

// Pipeline runs requests through its stages and hands what they decided to its outlet.
type Pipeline struct {
	Stages []Stage
	Out    Outlet
}

// Run runs job through the stages, then emits it. It returns the first error, naming the
// stage.
func (p *Pipeline) Run(ctx context.Context, job *Job) error {
	for _, s := range p.Stages {
		v, err := s.Process(ctx, job)
		if err != nil {
			return fmt.Errorf("router: %s: %w", s.Name(), err)
		}
		switch v.kind {
		case stopIt:
			return nil
		case parkIt:
			unpark, err := p.Out.Park(ctx, job, v.wait)
			if err != nil {
				return fmt.Errorf("router: %s: park: %w", s.Name(), err)
			}
			if v.recheck == nil {
				return nil
			}
			ready, err := v.recheck(ctx)
			if err != nil {
				return fmt.Errorf("router: %s: recheck: %w", s.Name(), err)
			}
			if !ready {
				return nil
			}
			// Its wait is over already: the parked copy is taken out (its wake-up may have
			// passed), and this delivery goes on.
			if err := unpark(ctx); err != nil {
				return fmt.Errorf("router: %s: unpark: %w", s.Name(), err)
			}
		}
	}
	return p.Out.Emit(ctx, job)
}
