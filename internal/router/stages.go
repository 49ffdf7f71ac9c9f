package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/park"
	"github.com/hermesbus/hermes/internal/routes"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// kv is the part of a JetStream key-value bucket the stages use.
type kv interface {
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
	Put(ctx context.Context, key string, value []byte) (uint64, error)
}

var _ kv = jetstream.KeyValue(nil)

// answeredFunc reports whether a request of session has its response recorded.
type answeredFunc func(ctx context.Context, requestID, session string) (bool, error)

// SerialStage holds back a serial request until the session's previous serial requests have
// their responses. Requests reach a router in the order they were accepted within their
// session (one partition, one request at a time), so the stage can chain a session's serial
// requests: each records its predecessor once (hermes-sessions: protocol.KeySerialPrev, and the
// session's last one under KeySerialTail) and waits, parked, until that one is answered; the
// predecessor's response wakes it (package answer), and it goes through the pipeline again.
//
// An answered predecessor that went — it passed this stage (marked under KeySerialWent), so
// its own predecessors were all answered then — ends the wait. One answered without going
// (cancelled or dead-lettered while it waited) does not: the wait goes on for the one before
// it, so a session's serial requests never run at the same time. A serial request answered
// already goes no further, but lets its successor go — again, in case whoever answered it
// stopped before that.
type SerialStage struct {
	Sessions kv
	Answered answeredFunc
	// Plan reads a request's plan (bus.Bus.Plan): one recorded by a router (not at intake),
	// not Cancelled, means the request passed this stage (the earlier version marked nothing
	// else).
	Plan func(ctx context.Context, requestID string) (*bus.Plan, error)
	// WakeNext wakes what waits for a request's response (answer.Responder.WakeNext).
	WakeNext func(ctx context.Context, requestID string) error
}

const (
	noPredecessor = protocol.ReservedRequestID
	// maxHops bounds how far back one delivery follows predecessors answered without going.
	maxHops = 256
)

// Name is "serial".
func (s *SerialStage) Name() string { return "serial" }

// Process parks job's request while a predecessor is unanswered.
func (s *SerialStage) Process(ctx context.Context, job *Job) (Verdict, error) {
	if !job.Req.Serial {
		return Continue(), nil
	}
	v, err := s.decide(ctx, job)
	if err != nil || v.kind != goOn {
		return v, err
	}
	return v, s.markWent(ctx, job.Msg.RequestID)
}

// decide says whether job's serial request goes, waits, or is done.
func (s *SerialStage) decide(ctx context.Context, job *Job) (Verdict, error) {
	rid, session := job.Msg.RequestID, job.Msg.SessionID
	if done, err := s.Answered(ctx, rid, session); err != nil || done {
		if err == nil && s.WakeNext != nil {
			err = s.WakeNext(ctx, rid)
		}
		return Stop(), err
	}
	if _, err := s.Sessions.Get(ctx, protocol.KeySerialWent(rid)); err == nil {
		// It went before (a wake-up from a later stage's hold, a redelivery): decided then,
		// whatever expired of its predecessors since.
		return Continue(), nil
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return Continue(), fmt.Errorf("read serial order: %w", err)
	}
	// Its first pass through this stage, unanswered: nothing of it was dispatched yet (the
	// plan stage need not look for results).
	job.FirstPass = true
	prev, err := s.predecessor(ctx, job)
	if err != nil || prev == noPredecessor {
		return Continue(), err
	}
	first := prev
	wait := func(reason string) (Verdict, error) {
		if prev != first {
			// Stepped over requests answered without going: it waits for prev from now on,
			// without needing their records (they may expire first).
			if _, err := s.Sessions.Put(ctx, protocol.KeySerialPrev(rid), []byte(prev)); err != nil {
				return Continue(), fmt.Errorf("record serial order: %w", err)
			}
		}
		job.Log.Info(reason, "after", prev)
		return Park(park.Wait{Key: protocol.WakeOnResponse(prev)}, s.recheck(rid, prev, session)), nil
	}
	for range maxHops {
		done, err := s.Answered(ctx, prev, session)
		if err != nil {
			return Continue(), err
		}
		if !done {
			return wait("serial request waits for a previous one's response")
		}
		went, err := s.went(ctx, prev)
		if err != nil || went {
			return Continue(), err
		}
		// Answered without going: what it waited for is waited for now.
		before, err := s.recorded(ctx, prev)
		if err != nil || before == "" || before == noPredecessor {
			return Continue(), err
		}
		prev = before
	}
	// Parked under the one reached, and woken by the recheck if it is answered already: the
	// next delivery steps on from there.
	return wait("serial request stepped over many requests answered without going; it steps on after a wake-up")
}

// markWent records that requestID passed this stage: once answered, it lets its successors
// go, even if it never ran (cancelled right after).
func (s *SerialStage) markWent(ctx context.Context, requestID string) error {
	if _, err := s.Sessions.Put(ctx, protocol.KeySerialWent(requestID), []byte{'1'}); err != nil {
		return fmt.Errorf("record serial order: %w", err)
	}
	return nil
}

// recheck is asked once a request is parked to wait for prev: a response recorded in between
// ends the wait if prev went (and the request goes, marked so). If prev was answered without
// going (cancelled in between), the copy just parked is woken again at once, to wait for what
// prev waited for.
func (s *SerialStage) recheck(rid, prev, session string) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		done, err := s.Answered(ctx, prev, session)
		if err != nil || !done {
			return false, err
		}
		went, err := s.went(ctx, prev)
		if err != nil {
			return false, err
		}
		if went {
			return true, s.markWent(ctx, rid)
		}
		if s.WakeNext == nil {
			return false, nil
		}
		return false, s.WakeNext(ctx, prev)
	}
}

// went reports whether requestID passed this stage: marked so, or planned by a router (the
// earlier version marked nothing). An undecodable plan counts as not gone: stepping back over
// a request that did go reaches only answered ones.
func (s *SerialStage) went(ctx context.Context, requestID string) (bool, error) {
	_, err := s.Sessions.Get(ctx, protocol.KeySerialWent(requestID))
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, fmt.Errorf("read serial order: %w", err)
	}
	p, err := s.Plan(ctx, requestID)
	switch {
	case err == nil:
		return !p.Cancelled && !p.AtIntake, nil
	case errors.Is(err, bus.ErrNotFound), bus.IsPermanent(err):
		return false, nil
	default:
		return false, fmt.Errorf("read the plan of %s: %w", requestID, err)
	}
}

// recorded returns the predecessor recorded for requestID, or "" when none is.
func (s *SerialStage) recorded(ctx context.Context, requestID string) (string, error) {
	e, err := s.Sessions.Get(ctx, protocol.KeySerialPrev(requestID))
	switch {
	case err == nil:
		return string(e.Value()), nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return "", nil
	default:
		return "", fmt.Errorf("read serial order: %w", err)
	}
}

// predecessor returns the previous serial request of the job's session (noPredecessor for
// the first) and makes the job's request the session's last. On a redelivery it returns what
// it recorded the first time. A request woken by its predecessor's response after its order
// expired from hermes-sessions (the state TTL) knows its predecessor from the wake key.
func (s *SerialStage) predecessor(ctx context.Context, job *Job) (string, error) {
	m := job.Msg
	prev := ""
	if e, err := s.Sessions.Get(ctx, protocol.KeySerialPrev(m.RequestID)); err == nil {
		prev = string(e.Value())
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", fmt.Errorf("read serial order: %w", err)
	} else if after, ok := strings.CutPrefix(job.WokenBy, protocol.WakeOnResponse("")); ok && after != "" {
		return after, nil
	} else if job.Woken {
		// Woken by anything but a response: parked by a later stage (a held call), so it
		// passed this stage before; queued again, it would wait for its own successors.
		return noPredecessor, nil
	}
	tail, rev, err := s.tail(ctx, m.SessionID)
	if err != nil {
		return "", err
	}
	if prev == "" && tail == m.RequestID {
		// The session's last already, its own order forgotten (expired): nothing before it
		// is left to wait for.
		return noPredecessor, nil
	}
	if prev == "" {
		prev = tail
		if _, err := s.Sessions.Create(ctx, protocol.KeySerialPrev(m.RequestID), []byte(prev)); err != nil {
			return "", fmt.Errorf("record serial order: %w", err)
		}
	}
	// Move the tail on to m: not yet done, or undone by a crash in between. A tail missing
	// when m is delivered again (not woken: a woken m moved it before) expired in between:
	// anything that followed m would be younger than m's order.
	if tail == prev || (rev == 0 && !job.Woken) {
		if rev == 0 {
			_, err = s.Sessions.Create(ctx, protocol.KeySerialTail(m.SessionID), []byte(m.RequestID))
		} else {
			_, err = s.Sessions.Update(ctx, protocol.KeySerialTail(m.SessionID), []byte(m.RequestID), rev)
		}
		if err != nil {
			return "", fmt.Errorf("record serial order: %w", err)
		}
	}
	return prev, nil
}

// tail returns the session's last serial request (noPredecessor when none) and the key's
// revision (0 when there is no key).
func (s *SerialStage) tail(ctx context.Context, session string) (string, uint64, error) {
	e, err := s.Sessions.Get(ctx, protocol.KeySerialTail(session))
	switch {
	case err == nil:
		return string(e.Value()), e.Revision(), nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return noPredecessor, 0, nil
	default:
		return "", 0, fmt.Errorf("read serial order: %w", err)
	}
}

// planStore is where the plan stage records plans and finds what a request has already.
type planStore interface {
	CreatePlan(ctx context.Context, requestID string, p *bus.Plan) (bool, *bus.Plan, error)
	// HaveResults reports which of callIDs have their result recorded.
	HaveResults(ctx context.Context, requestID, session string, callIDs []string) (map[string]bool, error)
	// Announce announces requestID's recorded response again to callers awaiting it, if it
	// has one, and reports whether it had.
	Announce(ctx context.Context, requestID, session string) (bool, error)
	// AnswerFromResults answers requestID from its plan and its calls' recorded results
	// (every call has one), unless it has a response already.
	AnswerFromResults(ctx context.Context, requestID, session string) error
}

// PlanStage makes sure the request's plan is recorded before anything is dispatched, so that any
// router can aggregate its results and a cancellation knows its calls. A request accepted by the
// gateway had its plan recorded then (Job.Planned on its first delivery); one published by
// others gets it here. A request seen before — a
// redelivery, a repeated request, a wake-up — goes on only with the calls that have no result
// yet; one already answered announces its response again and stops; one whose request_id was
// used first for other content is ignored (the first request keeps the id).
type PlanStage struct {
	Plans planStore
	// WakeNext wakes what waits for a request's response (answer.Responder.WakeNext).
	WakeNext func(ctx context.Context, requestID string) error
	// Now stamps plans; nil means time.Now.
	Now func() time.Time
	// StateTTL is how long the serial stage's marks are kept (bus.Config.StateTTL); 0 means
	// for ever.
	StateTTL time.Duration
}

// Name is "plan".
func (s *PlanStage) Name() string { return "plan" }

// Process records or resumes job's plan.
func (s *PlanStage) Process(ctx context.Context, job *Job) (Verdict, error) {
	mine := bus.PlanOf(job.Msg, job.Req, s.now())
	if job.Planned {
		// Recorded when the request was accepted, and this is the first delivery of its
		// first publication: nothing was dispatched yet.
		job.Plan = mine
		return Continue(), nil
	}
	created, first, err := s.Plans.CreatePlan(ctx, job.Msg.RequestID, mine)
	if err != nil {
		return Continue(), err
	}
	job.Plan = first
	if created {
		return Continue(), nil
	}
	if first.Fingerprint != "" && first.Fingerprint != mine.Fingerprint {
		job.Log.Warn("request_id reused for a different request; ignored")
		return Stop(), nil
	}
	if job.FirstPass && first.AtIntake && !first.Cancelled && s.young(first) {
		// Passing the serial stage for the first time, which found it unanswered: nothing
		// was dispatched, and no call has a result to look for. (A plan recorded by a router
		// of an earlier version, which marked nothing else, says the request went; so may
		// the mark's absence on a request older than the serial order is kept.)
		return Continue(), nil
	}
	if answered, err := s.Plans.Announce(ctx, job.Msg.RequestID, job.Msg.SessionID); err != nil || answered {
		if err == nil && first.Serial && s.WakeNext != nil {
			err = s.WakeNext(ctx, job.Msg.RequestID) // whoever answered may have stopped before
		}
		return Stop(), err
	}
	job.Log.Info("request seen before; going on with the calls that have no result yet")
	ids := make([]string, len(job.Calls))
	for i, c := range job.Calls {
		ids[i] = c.Call.ToolCallID
	}
	have, err := s.Plans.HaveResults(ctx, job.Msg.RequestID, job.Msg.SessionID, ids)
	if err != nil {
		return Continue(), err
	}
	all := len(job.Calls) > 0
	for _, c := range job.Calls {
		c.Done = have[c.Call.ToolCallID]
		all = all && c.Done
	}
	if all {
		// Every call has its result, yet there is no response (whoever recorded the last
		// one stopped before it was aggregated): answer from the recorded results here. (A
		// result published again could be dropped as a duplicate, or add a copy to the record.)
		return Stop(), s.Plans.AnswerFromResults(ctx, job.Msg.RequestID, job.Msg.SessionID)
	}
	if first.Cancelled {
		// Planned by a cancellation, which answers it: nothing may run. Calls it has not
		// answered yet (it may have stopped half-way) are answered CANCELLED here.
		for _, c := range job.Calls {
			if c.Pending() {
				c.Decide(protocol.CancelledResult(c.Call, "", 0, ""), "")
			}
		}
	}
	return Continue(), nil
}

// young reports whether p's request is recent enough that the serial stage's marks of it are
// still kept (within half the state TTL, leaving room for clocks that differ).
func (s *PlanStage) young(p *bus.Plan) bool {
	return s.StateTTL <= 0 || s.now().Sub(p.AcceptedAt) < s.StateTTL/2
}

func (s *PlanStage) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// RouteStage matches each pending call against the routes table and resolves its action. A
// call no rule matches is answered NO_ROUTE; one whose action is of a kind Hermes does not run
// (Kinds) is answered ACTION_UNSUPPORTED; the others get their Dispatch, and their tool's
// consumer is made sure to exist before anything is published to it.
type RouteStage struct {
	// Table returns the routes in use (they may be reloaded).
	Table func() *routes.Table
	// Kinds are the action kinds Hermes dispatches; others are ACTION_UNSUPPORTED.
	Kinds []string
	// Ensure makes sure the consumer of tool's calls of kind exists, with at most maxInFlight
	// calls in flight across the workers;
	// maxInFlight is the contract's execution_policy.max_in_flight (0: the bus's default).
	Ensure func(ctx context.Context, kind, tool string, maxInFlight int) error
}

// Name is "route".
func (s *RouteStage) Name() string { return "route" }

// Process routes job's pending calls.
func (s *RouteStage) Process(ctx context.Context, job *Job) (Verdict, error) {
	table := s.Table()
	for _, c := range job.Calls {
		if !c.Pending() {
			continue
		}
		call := c.Call
		sb := job.Req.Sandbox
		if sb != nil && c.Contract == nil {
			c.Decide(protocol.ErrorResult(protocol.CodeContractUnavailable, protocol.OriginHermes,
				"this router reads no contracts, so it cannot run the sandbox; run it where contracts are followed", "no candidate contract for a sandbox call"), "")
			continue
		}
		rule, params, ok := table.Match(call.Name, job.Req.Intent)
		switch {
		case sb != nil && c.Contract.Sandbox != nil:
			// The sandbox tries the tool where its contract says it may be tried.
			rule, params, ok = &routes.Rule{Name: SandboxRoute(call.Name), Action: *c.Contract.Sandbox}, nil, true
		case c.Contract != nil && c.Contract.Reach != nil:
			// The contract says where the tool is: it wins over the routes file.
			rule, params, ok = &routes.Rule{Name: ContractRoute(call.Name), Action: *c.Contract.Reach}, nil, true
		}
		if !ok && c.Contract != nil {
			job.Log.Info("no route", "tool", call.Name, "tool_call_id", call.ToolCallID, "contract_version", c.Contract.Version)
			c.Decide(protocol.ErrorResult(protocol.CodeNoRoute, protocol.OriginHermes,
				fmt.Sprintf("the contract of %s names no reach: add a reach section to it, or a rule for tool_name %s to the routes file (%s)", call.Name, call.Name, table.File),
				fmt.Sprintf("no route matches tool %q with this intent", call.Name)), "")
			continue
		}
		if !ok {
			job.Log.Info("no route", "tool", call.Name, "tool_call_id", call.ToolCallID)
			c.Decide(protocol.ErrorResult(protocol.CodeNoRoute, protocol.OriginHermes,
				fmt.Sprintf("add a rule for tool_name %s to the routes file (%s), or check the tool name and intent", call.Name, table.File),
				fmt.Sprintf("no route matches tool %q with this intent", call.Name)), "")
			continue
		}
		kind := rule.Action.Kind
		if !s.runs(kind) {
			job.Log.Info("action kind not supported", "tool", call.Name, "tool_call_id", call.ToolCallID, "kind", kind, "route", rule.Name)
			c.Decide(protocol.ErrorResult(protocol.CodeActionUnsupported, protocol.OriginHermes,
				fmt.Sprintf("route %s uses a %q action, which Hermes does not run yet; route the tool over one of %v", rule.Name, kind, s.Kinds),
				fmt.Sprintf("action kind %q is not supported", kind)), rule.Name)
			continue
		}
		probe := sb != nil && call.ToolCallID == sb.Probe
		var health protocol.Action
		if probe {
			var ok bool
			if health, ok = healthAction(rule.Action); !ok {
				c.Decide(protocol.ToolResult{Status: protocol.ResultOK, Content: json.RawMessage(`{"health":"not asked: only tools reached over HTTP have a /health"}`)}, rule.Name)
				continue
			}
		}
		inFlight := 0
		switch {
		case sb != nil:
			inFlight = -1 // a candidate's bound is not the tool's until it is registered
		case c.Contract != nil && c.Contract.ExecutionPolicy != nil:
			inFlight = c.Contract.ExecutionPolicy.MaxInFlight
		}
		if err := s.Ensure(ctx, kind, call.Name, inFlight); err != nil {
			return Continue(), err
		}
		c.Dispatch = &protocol.Dispatch{Call: *call, Route: rule.Name, Params: params, Action: rule.Action, Policy: c.Policy,
			ReadOnly: rule.ReadOnly && sb == nil}
		switch {
		case probe:
			c.Dispatch.Action = health
		case c.Contract != nil:
			c.Dispatch.Action = c.Contract.Apply(rule.Action)
			c.Dispatch.Contract = c.Contract.Ref()
			c.Dispatch.Contract.Sandbox = sb != nil
			// The contract says what the tool does, over the route's read_only.
			c.Dispatch.ReadOnly = sb == nil && c.Contract.EffectsOrDefault() == contract.EffectsNone
		}
		job.Log.Debug("routed", "tool", call.Name, "tool_call_id", call.ToolCallID, "route", rule.Name, "kind", kind)
	}
	return Continue(), nil
}

// ContractRoute names the route of a call that goes where its tool's contract says.
func ContractRoute(tool string) string { return "contract:" + tool }

// SandboxRoute names the route of a sandbox call that goes where its candidate's sandbox
// reach says.
func SandboxRoute(tool string) string { return "sandbox:" + tool }

// healthTimeoutMS bounds the one try of a sandbox's /health probe.
const healthTimeoutMS = 3000

// healthAction is a: the GET of /health at its URL's origin, tried once, with a's headers (a
// tool that asks for a key asks for it there too); false when a is no HTTP action.
func healthAction(a protocol.Action) (protocol.Action, bool) {
	if a.Kind != protocol.ActionHTTP || a.HTTP == nil {
		return a, false
	}
	h := *a.HTTP
	u, err := url.Parse(h.URL)
	if err != nil || u.Host == "" {
		return a, false
	}
	h.URL = (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: "/health"}).String()
	h.Method = http.MethodGet
	a.HTTP = &h
	if a.TimeoutMS <= 0 || a.TimeoutMS > healthTimeoutMS {
		a.TimeoutMS = healthTimeoutMS
	}
	a.Retry.MaxAttempts = 1
	return a, true
}

func (s *RouteStage) runs(kind string) bool {
	for _, k := range s.Kinds {
		if k == kind {
			return true
		}
	}
	return false
}
