package approvals

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hermesbus/hermes/internal/policies"
	"github.com/hermesbus/hermes/internal/router"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Gate decides the calls whose policy asks for confirmation, for the router's policy stage:
// a call runs only under an approval that is approved, unused, unexpired and bound to the
// same tool, arguments and caller, and using it marks it used (compare-and-set: once,
// whichever router runs it). Any other call opens an approval, or finds the one it opened on
// an earlier delivery, and is answered APPROVAL_REQUIRED with its id.
type Gate struct {
	Store *Store
	// Events records the parking (nil: not recorded).
	Events *Events
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

var _ policies.Gate = (*Gate)(nil)

// Release implements policies.Gate: the approval d names is unused again by the call.
func (g *Gate) Release(ctx context.Context, job *router.Job, c *router.Call, d *protocol.PolicyDecision) error {
	return g.Store.Release(ctx, d.ApprovalID, job.Msg.RequestID+"/"+c.Call.ToolCallID)
}

func (g *Gate) now() time.Time {
	if g.Now != nil {
		return g.Now()
	}
	return time.Now()
}

// Gate implements policies.Gate.
func (g *Gate) Gate(ctx context.Context, job *router.Job, c *router.Call, r *policies.Rule) (*protocol.ToolResult, *protocol.PolicyDecision, error) {
	m, call, now := job.Msg, c.Call, g.now()
	hash := Hash(call.Name, call.Arguments, m.Caller)
	self := m.RequestID + "/" + call.ToolCallID
	if id := job.Req.Approval; id != "" {
		// Hermes' own request, made when id was approved.
		a, err := g.Store.Use(ctx, id, hash, self, now)
		if err != nil {
			return refusal(err, id, r)
		}
		return nil, approved(a, r), nil
	}
	if a, _, err := g.Store.Get(ctx, ID(m.RequestID, call.ToolCallID)); err == nil {
		// A redelivery of the call that opened a: answered as it was, unless it was decided
		// against since.
		if a.State == Denied || a.State == Expired {
			return refusal(decidable(a, now), a.ID, r)
		}
		if a.State == Pending {
			if err := g.Store.Index(ctx, a); err != nil {
				return nil, nil, err
			}
		}
		return g.parked(ctx, a, r)
	} else if !errors.Is(err, ErrNotFound) {
		return nil, nil, err
	}
	if job.Req.Recall {
		a, err := g.Store.ByHash(ctx, hash)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return nil, nil, err
		case a.State == Used && a.UsedBy == self:
			return nil, approved(a, r), nil
		case a.State == Approved:
			used, err := g.Store.Use(ctx, a.ID, hash, self, now)
			if err == nil {
				return nil, approved(used, r), nil
			}
			if !errors.Is(err, ErrDecided) && !errors.Is(err, ErrExpired) {
				return nil, nil, err
			}
			// Used by another call, or lapsed: this call asks again.
		case a.State == Pending && now.Before(a.ExpiresAt):
			// The same call again while its approval waits: one approval, not two.
			return required(a, r), nil, nil
		}
	}
	p := r.Policy
	a := &Approval{ID: ID(m.RequestID, call.ToolCallID), RequestID: m.RequestID, SessionID: m.SessionID, ToolCallID: call.ToolCallID,
		Tool: call.Name, Arguments: call.Arguments, Hash: hash, Requester: m.Caller, Approvers: p.Approvers,
		Source: r.Source, Version: r.Version, Recall: job.Req.Recall, State: Pending,
		CreatedAt: now.UTC(), ExpiresAt: now.Add(p.ExpiresInOrDefault()).UTC(), Trace: m.Trace}
	a, created, err := g.Store.Create(ctx, a)
	if err != nil {
		return nil, nil, err
	}
	if created {
		job.Log.Info("call parked for approval", "tool", call.Name, "tool_call_id", call.ToolCallID, "approval_id", a.ID, "expires_at", a.ExpiresAt)
	}
	return g.parked(ctx, a, r)
}

// parked answers the call that opened a, recording its parking (once, however often it is
// answered: a delivery cut off between keeping a and recording it records it next time).
func (g *Gate) parked(ctx context.Context, a *Approval, r *policies.Rule) (*protocol.ToolResult, *protocol.PolicyDecision, error) {
	res := required(a, r)
	if g.Events != nil {
		if err := g.Events.Record(ctx, a, *res.Policy, a.CreatedAt); err != nil {
			return nil, nil, err
		}
	}
	return res, nil, nil
}

// decision is a decision about a under rule r.
func decision(a *Approval, r *policies.Rule, d, reason string) *protocol.PolicyDecision {
	return &protocol.PolicyDecision{Decision: d, Rule: policy.RuleConfirmRequired, Source: r.Source, Version: r.Version, Reason: reason, ApprovalID: a.ID}
}

// approved is the decision of a call that runs under a.
func approved(a *Approval, r *policies.Rule) *protocol.PolicyDecision {
	d := decision(a, r, protocol.PolicyApproved, "approved by "+a.DecidedBy)
	d.By = a.DecidedBy
	return d
}

// required answers a call waiting for a.
func required(a *Approval, r *policies.Rule) *protocol.ToolResult {
	who := "the user who asked for it"
	if len(a.Approvers) > 0 {
		who = fmt.Sprintf("a caller with one of the roles %v", a.Approvers)
	}
	then := "Hermes then runs it, and its result comes to the session"
	if a.Recall {
		then = "then make the same call again, with the same arguments, to run it"
	}
	res := protocol.ErrorResult(protocol.CodeApprovalRequired, protocol.OriginHermes,
		fmt.Sprintf("do not call %s again until it is approved; tell the user that %s must confirm it (approval %s)", a.Tool, who, a.ID),
		fmt.Sprintf("%s must be confirmed before it runs: approval %s, by %s, until %s (POST /v1/approvals/%s/approve); %s",
			a.Tool, a.ID, who, a.ExpiresAt.Format(time.RFC3339), a.ID, then))
	res.Policy = decision(a, r, protocol.PolicyParked, "the policy asks for confirmation; the call waits as approval "+a.ID)
	return &res
}

// refusal answers a call that may not run under approval id, for err; an error that says
// nothing of the approval is returned (the delivery is tried again).
func refusal(err error, id string, r *policies.Rule) (*protocol.ToolResult, *protocol.PolicyDecision, error) {
	var code, d string
	switch {
	case errors.Is(err, ErrExpired):
		code, d = protocol.CodeApprovalExpired, protocol.PolicyExpired
	case errors.Is(err, ErrPending):
		code, d = protocol.CodeApprovalRequired, protocol.PolicyParked
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrForbidden), errors.Is(err, ErrDecided):
		code, d = protocol.CodeApprovalDenied, protocol.PolicyRejected
	default:
		return nil, nil, err
	}
	res := protocol.ErrorResult(code, protocol.OriginHermes, "the call did not run; ask the user whether to make it again", err.Error())
	res.Policy = &protocol.PolicyDecision{Decision: d, Rule: policy.RuleConfirmRequired, Source: r.Source, Version: r.Version, Reason: err.Error(), ApprovalID: id}
	return &res, nil, nil
}

// Events records approvals' decisions on the record (hermes.event.policy.<session>), as
// policy events of the approval's call.
type Events struct {
	Pub *bus.Publisher
}

// Record records decision d about a's call, made at at; the same decision about the same
// approval is recorded once.
func (e *Events) Record(ctx context.Context, a *Approval, d protocol.PolicyDecision, at time.Time) error {
	m, err := protocol.NewMessage(protocol.TypePolicy, &protocol.PolicyEvent{ToolCallID: a.ToolCallID, Tool: a.Tool, Decision: d, At: at.UTC()})
	if err != nil {
		return bus.Permanent(err)
	}
	m.MsgID = protocol.MsgIDPolicy(a.RequestID, a.ToolCallID, d.Decision, 0)
	m.RequestID, m.SessionID, m.Caller, m.Trace = a.RequestID, a.SessionID, a.Requester, a.Trace
	m.CausationID = protocol.MsgIDRequest(a.RequestID)
	_, err = e.Pub.Publish(ctx, protocol.SubjectEvent(protocol.EventPolicy, a.SessionID), m)
	return err
}

// Decided is the policy decision an approval's decision (approved, denied or expired) is
// recorded as.
func Decided(a *Approval) protocol.PolicyDecision {
	d := protocol.PolicyDecision{Rule: policy.RuleConfirmRequired, Source: a.Source, Version: a.Version, ApprovalID: a.ID, By: a.DecidedBy, Reason: a.Reason}
	switch a.State {
	case Approved, Used:
		d.Decision = protocol.PolicyApproved
	case Denied:
		d.Decision = protocol.PolicyRejected
	case Expired:
		d.Decision, d.By = protocol.PolicyExpired, ""
		d.Reason = "nobody decided it by " + a.ExpiresAt.UTC().Format(time.RFC3339)
		if a.State == Expired && a.DecidedBy != "" {
			d.Reason = "approved, and not called again by " + a.ExpiresAt.UTC().Format(time.RFC3339)
		}
	default:
		d.Decision = protocol.PolicyParked
	}
	return d
}

// Decisions decides approvals for people (the gateway's API, the chat doors' confirmation
// round) and records each decision on the record.
type Decisions struct {
	Store  *Store
	Events *Events
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Get returns approval id (Store.Get).
func (d *Decisions) Get(ctx context.Context, id string) (*Approval, error) {
	a, _, err := d.Store.Get(ctx, id)
	return a, err
}

// Decide decides approval id as Store.Decide does, recording the decision — or the expiry
// it found — on the record. A decision that stands in the bucket but could not be recorded
// is returned with the recording's error wrapped in ErrUnrecorded.
func (d *Decisions) Decide(ctx context.Context, id string, who Decider, approve bool, reason string) (*Approval, error) {
	now := time.Now
	if d.Now != nil {
		now = d.Now
	}
	a, err := d.Store.Decide(ctx, id, who, approve, reason, now())
	if a == nil || !(err == nil || errors.Is(err, ErrExpired) && a.State == Expired) {
		return a, err
	}
	at := a.DecidedAt
	if a.State == Expired {
		at = a.ExpiresAt
	}
	if rerr := d.Events.Record(context.WithoutCancel(ctx), a, Decided(a), at); rerr != nil && err == nil {
		return a, fmt.Errorf("%w: %w", ErrUnrecorded, rerr)
	}
	return a, err
}

// ErrUnrecorded: the decision stands, and the record does not show it yet.
var ErrUnrecorded = errors.New("approvals: decided, and not recorded")
