package coordination

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/hermesbus/hermes/internal/park"
	"github.com/hermesbus/hermes/internal/router"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// recheckEvery is how long a waiting call stays parked before its router looks again, should
// the wake-up of its turn be lost.
// It is well within ClaimWindow, so a call whose wake-up was lost still takes the turn passed
// to it before the turn lapses.
const recheckEvery = ClaimWindow / 3

// Stage is the dispatch pipeline's coordination stage, the last before a call leaves: every
// routed call whose tool's contract names a resource_key (and changes something) is put in
// line for its resource, and dispatched only once it holds it, carrying its grant (transaction
// id and fencing token) to the worker and the tool. A call that waits is held (its request
// parks until its turn comes), and its wait is an event on the record. Calls of one request
// that change the same resource are a conflict: ordered by their contracts' precedence and
// run one after another (on_conflict: order), or answered CONFLICT_RESOLVE_REQUIRED with the
// suggested order. A call that does not name its resource is answered RESOURCE_KEY_MISSING:
// it never runs unserialized.
type Stage struct {
	Store  *Store
	Events *Events
	// Turns ends a turn whose lease lapsed before its call took it, and passes it on.
	Turns *Turns
	// Wake wakes the request of a call granted its turn by this stage's write (a call of
	// another request, first in line, whose turn was passed on by nobody).
	Wake func(ctx context.Context, key string) error
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

var _ router.Stage = (*Stage)(nil)

// Name is "coordination".
func (s *Stage) Name() string { return "coordination" }

func (s *Stage) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Process puts job's pending calls that change a resource in line, and lets go only those that
// hold it.
func (s *Stage) Process(ctx context.Context, job *router.Job) (router.Verdict, error) {
	if job.Req.Sandbox != nil {
		return router.Continue(), nil
	}
	var keys []string
	groups := map[string][]*router.Call{}
	for _, c := range job.Calls {
		if !c.Pending() || c.Dispatch == nil || c.Contract == nil || !c.Contract.Coordinated() {
			continue
		}
		key, err := c.Contract.Resource(c.Call.Arguments)
		if err != nil {
			job.Log.Info("call names no resource; refused", "tool", c.Call.Name, "tool_call_id", c.Call.ToolCallID, "err", err)
			c.Decide(protocol.ErrorResult(protocol.CodeResourceKeyMissing, protocol.OriginHermes,
				fmt.Sprintf("call %s with the argument its contract names the resource by (resource_key %s)", c.Call.Name, c.Contract.ResourceKey),
				err.Error()), "")
			continue
		}
		if _, ok := groups[key]; !ok {
			keys = append(keys, key)
		}
		groups[key] = append(groups[key], c)
	}
	for _, key := range keys {
		calls := groups[key]
		if len(calls) > 1 {
			var refuse bool
			calls, refuse = ordered(calls)
			if refuse {
				// Refused only when none of them is in line already: one put in line on an
				// earlier delivery (the others held then by another stage) goes on, and the
				// rest follow it in order.
				inLine, err := s.Store.InLine(ctx, key, job.Msg.RequestID)
				if err != nil {
					return router.Continue(), fmt.Errorf("coordination stage: %s: %w", protocol.Shorten(key, 64), err)
				}
				if !inLine {
					if err := s.conflict(ctx, job, key, calls); err != nil {
						return router.Continue(), err
					}
					continue
				}
			}
		}
		if err := s.propose(ctx, job, key, calls); err != nil {
			return router.Continue(), err
		}
	}
	return router.Continue(), nil
}

// ordered puts calls that change one resource in their contracts' order; refuse says one of
// their contracts asks for the conflict to be refused.
func ordered(calls []*router.Call) ([]*router.Call, bool) {
	tools := make([]string, len(calls))
	byTool := map[string]*contract.Contract{}
	refuse := false
	for i, c := range calls {
		tools[i] = c.Call.Name
		byTool[c.Call.Name] = c.Contract.Contract
		refuse = refuse || c.Contract.OnConflictOrDefault() == contract.OnConflictRefuse
	}
	order := contract.Order(tools, func(t string) *contract.Contract { return byTool[t] })
	out := make([]*router.Call, len(calls))
	for i, j := range order {
		out[i] = calls[j]
	}
	return out, refuse
}

// conflict answers calls (in the suggested order) CONFLICT_RESOLVE_REQUIRED.
func (s *Stage) conflict(ctx context.Context, job *router.Job, key string, calls []*router.Call) error {
	suggested := make([]string, len(calls))
	for i, c := range calls {
		suggested[i] = c.Call.Name
	}
	first := suggested[0]
	msg := fmt.Sprintf("%d calls of this request change %s (%s): their order must be decided first", len(calls), protocol.Shorten(key, 64), strings.Join(suggested, ", "))
	hint := fmt.Sprintf("call %s first and the others one at a time after it, in the suggested order %s, or ask the user which change comes first",
		first, strings.Join(suggested, " → "))
	for _, c := range calls {
		res := protocol.ErrorResult(protocol.CodeConflictResolveRequired, protocol.OriginHermes, hint, msg)
		res.SuggestedOrder = suggested
		c.Decide(res, "")
		job.Log.Info("calls change one resource; refused as a conflict", "tool", c.Call.Name, "tool_call_id", c.Call.ToolCallID, "suggested_order", suggested)
		if err := s.Events.Record(ctx, job.Msg.SessionID, job.Msg.RequestID, &protocol.CoordinationEvent{Op: protocol.CoordConflict,
			ToolCallID: c.Call.ToolCallID, Tool: c.Call.Name, Resource: key, Tx: protocol.TxID(job.Msg.RequestID, key),
			Changes: c.Contract.Changes, SuggestedOrder: suggested, Reason: msg}); err != nil {
			return err
		}
	}
	return nil
}

// propose puts calls (that change key, in the order they are to run) in line, and sets the
// grant of the one that holds it, or holds the others.
func (s *Stage) propose(ctx context.Context, job *router.Job, key string, calls []*router.Call) error {
	m := job.Msg
	now := s.now().UTC()
	ps := make([]Proposal, len(calls))
	var run time.Duration
	for i, c := range calls {
		ps[i] = Proposal{RequestID: m.RequestID, CallID: c.Call.ToolCallID, SessionID: m.SessionID, Tool: c.Call.Name,
			Tx: protocol.TxID(m.RequestID, key), Changes: c.Contract.Changes, ProposedAt: now}
		run = max(run, Budget(&c.Dispatch.Action))
	}
	outs, change, err := s.Store.Propose(ctx, key, ps, run)
	if err != nil {
		return fmt.Errorf("coordination stage: %s: %w", protocol.Shorten(key, 64), err)
	}
	for i, c := range calls {
		o := outs[i]
		switch {
		case o.Busy:
			c.Decide(protocol.ErrorResult(protocol.CodeResourceBusy, protocol.OriginHermes, "try again later",
				fmt.Sprintf("%d calls already wait to change %s", MaxWaiting, protocol.Shorten(key, 64))), "")
		case o.Turn != nil:
			if leasedNow := change != nil && change.Leased && change.Granted.same(&ps[i]); !leasedNow {
				// Granted before (passed on to it, or on an earlier delivery): lease the
				// turn for the call's run, unless it lapsed meanwhile.
				ok, err := s.Store.Claim(ctx, key, o.Turn, Budget(&c.Dispatch.Action))
				if err != nil {
					return fmt.Errorf("coordination stage: claim %s: %w", protocol.Shorten(key, 64), err)
				}
				if !ok {
					if err := s.Turns.expire(ctx, protocol.ResourceToken(key), o.Turn.Fence); err != nil {
						return err
					}
					return fmt.Errorf("coordination stage: the turn of %s on %s lapsed before it was taken; the call is put in line again", c.Call.ToolCallID, protocol.Shorten(key, 64))
				}
			}
			c.Dispatch.Grant = &protocol.Grant{Tx: o.Turn.Tx, Fence: o.Turn.Fence, Resource: key, Changes: o.Turn.Changes}
			if err := s.Events.Granted(ctx, key, o.Turn); err != nil {
				return err
			}
		default:
			c.Hold = &park.Wait{Key: protocol.WakeOnTurn(m.RequestID, c.Call.ToolCallID), At: now.Add(recheckEvery)}
			callID := c.Call.ToolCallID
			c.Recheck = func(ctx context.Context) (bool, error) { return s.Store.Holds(ctx, key, m.RequestID, callID) }
			job.Log.Info("call waits for its turn on a resource", "tool", c.Call.Name, "tool_call_id", c.Call.ToolCallID,
				"resource", key, "position", o.Position, "held_by", o.HeldBy)
			if o.Proposed {
				if err := s.Events.Record(ctx, m.SessionID, m.RequestID, &protocol.CoordinationEvent{Op: protocol.CoordWaiting,
					ToolCallID: c.Call.ToolCallID, Tool: c.Call.Name, Resource: key, Tx: ps[i].Tx, HeldBy: heldBy(o, m.SessionID),
					Position: o.Position, Changes: c.Contract.Changes}); err != nil {
					return err
				}
			}
		}
	}
	if change != nil && !slices.ContainsFunc(ps, func(p Proposal) bool { return change.Granted.same(&p) }) {
		// The write granted the resource to another request's call, first in line with
		// nobody to pass it on: its request is woken (first: an event that fails to record
		// must not cost it the wake-up).
		if err := s.Wake(ctx, protocol.WakeOnTurn(change.Granted.RequestID, change.Granted.CallID)); err != nil {
			return err
		}
		if err := s.Events.Granted(ctx, key, change.Granted); err != nil {
			return err
		}
	}
	return nil
}

// heldBy names who holds the resource a call waits for, for the waiting call's session: the
// holder's request and call when it is of the same session, and no other session's ids.
func heldBy(o Outcome, session string) string {
	switch {
	case o.HeldBy == "":
		return ""
	case o.HolderSession == session:
		return o.HeldBy
	}
	return "a call of another session"
}

// Budget is how long a call routed with action a may take at most: every try's timeout, the
// waits between them, and a margin for the queue — its lease, between minLease and maxLease.
func Budget(a *protocol.Action) time.Duration {
	timeout := time.Duration(a.TimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = protocol.DefaultTimeoutMS * time.Millisecond
	}
	tries := max(a.Retry.MaxAttempts, 1)
	waits := time.Duration(tries-1) * time.Duration(max(a.Retry.MaxIntervalMS, protocol.DefaultMaxIntervalMS)) * time.Millisecond
	return min(max(time.Duration(tries)*timeout+waits+minLease, minLease), maxLease)
}

// Events records coordination events on the record (hermes.event.coordination.<session>).
type Events struct {
	Pub *bus.Publisher
	Now func() time.Time
	Log *slog.Logger
}

// Record records e about a call of request (of session); the same operation on the same call
// and fence is recorded once.
func (e *Events) Record(ctx context.Context, session, request string, ev *protocol.CoordinationEvent) error {
	if e == nil || e.Pub == nil {
		return nil
	}
	now := time.Now
	if e.Now != nil {
		now = e.Now
	}
	ev.At = now().UTC()
	m, err := protocol.NewMessage(protocol.TypeCoordination, ev)
	if err != nil {
		return bus.Permanent(err)
	}
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDCoordination(ev.Op, request, ev.ToolCallID, ev.Fence), request, session
	_, err = e.Pub.Publish(ctx, protocol.SubjectEvent(protocol.EventCoordination, session), m)
	if err != nil {
		return fmt.Errorf("coordination: record %s of %s/%s: %w", ev.Op, request, ev.ToolCallID, err)
	}
	return nil
}

// Granted records the grant of turn t on resource.
func (e *Events) Granted(ctx context.Context, resource string, t *Turn) error {
	return e.Record(ctx, t.SessionID, t.RequestID, &protocol.CoordinationEvent{Op: protocol.CoordGranted, ToolCallID: t.CallID,
		Tool: t.Tool, Resource: resource, Tx: t.Tx, Fence: t.Fence, Changes: t.Changes})
}

// Ended records the end of a turn (released or expired, with why) and the grant that followed.
func (e *Events) Ended(ctx context.Context, op, reason string, x *Ended) error {
	t := x.Ended
	if err := e.Record(ctx, t.SessionID, t.RequestID, &protocol.CoordinationEvent{Op: op, ToolCallID: t.CallID, Tool: t.Tool,
		Resource: x.Resource, Tx: t.Tx, Fence: t.Fence, Changes: t.Changes, Reason: protocol.Shorten(reason, 256)}); err != nil {
		return err
	}
	if x.Granted != nil {
		return e.Granted(ctx, x.Resource, x.Granted)
	}
	return nil
}
