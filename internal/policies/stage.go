package policies

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hermesbus/hermes/internal/park"
	"github.com/hermesbus/hermes/internal/router"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Rules gives the policy a tool's calls go under now (Book.Rule).
type Rules interface {
	Rule(tool string, k *contract.Compiled) (*Rule, error)
}

// Stage is the dispatch pipeline's policy stage: every pending call of a tool with a policy is
// decided here, after the contract stage and before the route stage, whatever door its
// request came through — so no path runs a call its policy does not let run. Rules are decided
// in order: allowed_roles (the caller's role, as the gateway authenticated it), max_recipients
// (counted in the arguments the contract names as recipients), confirm_required (the call
// waits as an approval; Gate), then rate_limit (the shared window, counted only for calls
// about to run). A call every rule lets run carries the decision in its dispatch; one kept
// from running is answered with it (POLICY_DENIED, RATE_LIMITED, POLICY_UNAVAILABLE,
// APPROVAL_REQUIRED), origin hermes, naming the rule and the policy's version; a call that
// waits for its rate window is held, and its wait is a policy event on the record.
//
// When a rate window cannot be read, a tool that changes nothing (contract effects: none) is
// let through, and any other is answered POLICY_UNAVAILABLE: a limit on what changes the world
// fails closed. Sandbox requests (the contract sandbox's, made by Hermes for a tools admin) go
// under no policy.
type Stage struct {
	Rules   Rules
	Windows *Windows
	// Approvals decide calls whose policy asks for confirmation; nil refuses them
	// POLICY_UNAVAILABLE (none can be approved here).
	Approvals Gate
	// Events records the policy events of waits; nil records none.
	Events *Events
}

// Gate decides a call whose policy asks for confirmation: it returns the decision the call
// runs under when it has an approval it may run under now (used up by this call), or the
// result to answer it with (APPROVAL_REQUIRED with the approval's id, or why it cannot run).
// An error says nothing was decided (the delivery is tried again).
type Gate interface {
	Gate(ctx context.Context, job *router.Job, c *router.Call, r *Rule) (*protocol.ToolResult, *protocol.PolicyDecision, error)
	// Release gives back the approval decision d names, used by c, when a later rule keeps
	// c from running after all.
	Release(ctx context.Context, job *router.Job, c *router.Call, d *protocol.PolicyDecision) error
}

var _ router.Stage = (*Stage)(nil)

// Name is "policy".
func (s *Stage) Name() string { return "policy" }

// Process decides job's pending calls.
func (s *Stage) Process(ctx context.Context, job *router.Job) (router.Verdict, error) {
	if job.Req.Sandbox != nil {
		return router.Continue(), nil
	}
	for _, c := range job.Calls {
		if !c.Pending() {
			continue
		}
		r, err := s.Rules.Rule(c.Call.Name, c.Contract)
		if errors.Is(err, ErrNotFollowing) {
			// Not known for the moment: decided again later, never let through unchecked.
			return router.Continue(), fmt.Errorf("policy stage: %w", err)
		}
		if err != nil {
			job.Log.Warn("the tool's policy cannot be read; call refused", "tool", c.Call.Name, "tool_call_id", c.Call.ToolCallID, "err", err)
			res := protocol.ErrorResult(protocol.CodePolicyUnavailable, protocol.OriginHermes,
				"the tool's policy cannot be read; an operator must apply it again (hermes policies apply)", "the policy of "+c.Call.Name+" cannot be read")
			res.Policy = &protocol.PolicyDecision{Decision: protocol.PolicyUnavailable, Source: SourcePolicy, Reason: "the policy cannot be read"}
			c.Decide(res, "")
			continue
		}
		if r == nil {
			continue
		}
		if err := s.decide(ctx, job, c, r); err != nil {
			return router.Continue(), err
		}
	}
	return router.Continue(), nil
}

// decide decides one call under rule r.
func (s *Stage) decide(ctx context.Context, job *router.Job, c *router.Call, r *Rule) error {
	call := c.Call
	refuse := func(f *refusal) {
		job.Log.Info("call refused by its tool's policy", "tool", call.Name, "tool_call_id", call.ToolCallID, "policy", r.String(), "rule", f.rule, "reason", f.reason)
		c.Decide(r.refused(f), "")
	}
	j := r.judge(callerRole(job.Msg), c.Contract, call)
	if j.refusal != nil {
		refuse(j.refusal)
		return nil
	}
	allowed := r.decision(protocol.PolicyAllowed, "", "")
	if j.confirm {
		if s.Approvals == nil {
			refuse(&refusal{code: protocol.CodePolicyUnavailable, decision: protocol.PolicyUnavailable, rule: policy.RuleConfirmRequired,
				reason: "the call must be confirmed, and this router keeps no approvals", hint: "run the router with the approvals' bucket"})
			return nil
		}
		res, d, err := s.Approvals.Gate(ctx, job, c, r)
		if err != nil {
			return fmt.Errorf("policy stage: approval of %s: %w", call.ToolCallID, err)
		}
		if res != nil {
			job.Log.Info("call waits for its approval, or may not run under it", "tool", call.Name, "tool_call_id", call.ToolCallID,
				"code", res.ErrorCode, "approval_id", res.Policy.ApprovalID)
			c.Decide(*res, "")
			return nil
		}
		allowed = d
	}
	if j.limit {
		if err := s.limit(ctx, job, c, r, allowed, refuse); err != nil {
			return err
		}
		if c.Result != nil && allowed.ApprovalID != "" {
			// Its approval stays for the call's next try: a full window is no person's "no".
			if err := s.Approvals.Release(ctx, job, c, allowed); err != nil {
				return fmt.Errorf("policy stage: release the approval of %s: %w", call.ToolCallID, err)
			}
		}
		return nil
	}
	c.Policy = allowed
	return nil
}

// callerRole is the role of the caller of request m, as the gateway authenticated it ("" for
// none).
func callerRole(m *protocol.Message) string {
	if m.Caller == nil {
		return ""
	}
	return m.Caller.Role
}

// callerKey names the caller of request m in its rate windows (scope caller).
func callerKey(m *protocol.Message) string { return windowCaller(m.Caller) }

// windowCaller names caller in rate windows (scope caller): the same for a routed call and a
// call Hermes runs itself (Local).
func windowCaller(c *protocol.Caller) string {
	if c == nil {
		return ""
	}
	return c.ID + "#" + c.User
}

// refusal is why a rule keeps a call from running: the result's code, the decision, the rule,
// why, and what the caller can do.
type refusal struct {
	code, decision, rule, reason, hint string
	retryAt                            time.Time
}

// refused is the result a call kept from running by r answers with: f's code, origin hermes,
// naming the rule and the policy's version.
func (r *Rule) refused(f *refusal) protocol.ToolResult {
	res := protocol.ErrorResult(f.code, protocol.OriginHermes, f.hint, fmt.Sprintf("%s: %s (%s)", f.rule, f.reason, r))
	res.Policy = r.decision(f.decision, f.rule, f.reason)
	res.Policy.RetryAt = f.retryAt
	return res
}

// judgement is what r's rules that read no state decide about one call.
type judgement struct {
	// refusal, when set, keeps the call from running (allowed_roles, max_recipients).
	refusal *refusal
	// confirm: the call waits as an approval (confirm_required).
	confirm bool
	// limit: the call is counted in its rate window (rate_limit).
	limit bool
}

// judge decides r's rules that read no state about call, made by a caller of role (k: the
// tool's contract, nil for none), in the stage's order: allowed_roles, max_recipients, then
// whether the call must be confirmed and counted. The stage and Replay decide alike by it.
func (r *Rule) judge(role string, k *contract.Compiled, call *protocol.ToolCall) judgement {
	p := r.Policy
	denied := func(rule, reason, hint string) judgement {
		return judgement{refusal: &refusal{code: protocol.CodePolicyDenied, decision: protocol.PolicyDenied, rule: rule, reason: reason, hint: hint}}
	}
	if !p.Allows(role) {
		who := fmt.Sprintf("role %q", role)
		if role == "" {
			who = "no role (the request names no caller)"
		}
		return denied(policy.RuleAllowedRoles, fmt.Sprintf("%s may be called by %v only; the caller has %s", call.Name, p.AllowedRoles, who),
			"this tool is not for the caller's role; do not call it again, and tell the user it needs one of "+fmt.Sprint(p.AllowedRoles))
	}
	if p.MaxRecipients > 0 {
		var names []string
		if k != nil {
			names = k.Recipients
		}
		if len(names) == 0 {
			return denied(policy.RuleMaxRecipients, "the policy bounds the recipients, and the tool's contract names no argument that holds them",
				"an operator must add recipients to the tool's contract")
		}
		n, err := policy.CountRecipients(call.Arguments, names)
		if err != nil {
			return denied(policy.RuleMaxRecipients, err.Error(), "call "+call.Name+" with arguments that are a JSON object")
		}
		if n > p.MaxRecipients {
			return denied(policy.RuleMaxRecipients, fmt.Sprintf("the call names %d recipients; at most %d", n, p.MaxRecipients),
				fmt.Sprintf("split the call into calls of at most %d recipients each, or ask the user whom to leave out", p.MaxRecipients))
		}
	}
	return judgement{confirm: p.ConfirmRequired, limit: p.RateLimit != nil}
}

// overLimit decides a call of request m that r's rate window has no room for until at: it
// waits (on_limit: wait, when the window has room before max_wait and the request's deadline
// end) with the reason, or is refused RATE_LIMITED.
func (r *Rule) overLimit(m *protocol.Message, at time.Time) (wait bool, reason string, limited *refusal) {
	p := r.Policy
	scope := "each caller"
	if p.ScopeOrDefault() == policy.ScopeTool {
		scope = "all callers together"
	}
	over := fmt.Sprintf("over %s for %s; the window has room at %s", p.RateLimit, scope, at.UTC().Format(time.RFC3339Nano))
	refuse := func(reason string) *refusal {
		return &refusal{code: protocol.CodeRateLimited, decision: protocol.PolicyLimited, rule: policy.RuleRateLimit, reason: reason,
			hint: "try again after " + at.UTC().Format(time.RFC3339), retryAt: at}
	}
	if p.OnLimitOrDefault() != policy.OnLimitWait {
		return false, "", refuse(over)
	}
	until := m.CreatedAt.Add(p.MaxWaitOrDefault())
	if !m.Deadline.IsZero() && m.Deadline.Before(until) {
		until = m.Deadline
	}
	if at.After(until) {
		return false, "", refuse(over + fmt.Sprintf("; it would wait longer than max_wait %s", p.MaxWaitOrDefault()))
	}
	return true, over, nil
}

// limit counts the call in its rate window, or refuses or holds it.
func (s *Stage) limit(ctx context.Context, job *router.Job, c *router.Call, r *Rule, allowed *protocol.PolicyDecision, refuse func(*refusal)) error {
	p, call, m := r.Policy, c.Call, job.Msg
	key := WindowKey(call.Name, p.ScopeOrDefault(), callerKey(m))
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	ok, at, err := s.Windows.Take(wctx, key, *p.RateLimit, CallID(m.RequestID, call.ToolCallID))
	cancel()
	if errors.Is(err, ErrContended) {
		return fmt.Errorf("policy stage: %w", err)
	}
	if err != nil {
		if c.Contract != nil && c.Contract.EffectsOrDefault() == contract.EffectsNone {
			job.Log.Warn("the rate window cannot be read; a tool that changes nothing is let through", "tool", call.Name, "err", err)
			c.Policy = r.decision(protocol.PolicyAllowed, policy.RuleRateLimit, "the rate window could not be read; the tool changes nothing, so the call was let through")
			return nil
		}
		refuse(&refusal{code: protocol.CodePolicyUnavailable, decision: protocol.PolicyUnavailable, rule: policy.RuleRateLimit,
			reason: "the rate window could not be read, and the tool may change something, so the call was not made", hint: "try again shortly"})
		return nil
	}
	if ok {
		c.Policy = allowed
		return nil
	}
	wait, over, limited := r.overLimit(m, at)
	if !wait {
		refuse(limited)
		return nil
	}
	d := r.decision(protocol.PolicyWaited, policy.RuleRateLimit, over)
	d.RetryAt = at
	if s.Events != nil {
		if err := s.Events.Record(ctx, m, call.ToolCallID, call.Name, d, at.UnixMilli()); err != nil {
			return fmt.Errorf("policy stage: record the wait of %s: %w", call.ToolCallID, err)
		}
	}
	job.Log.Info("call waits for its rate window", "tool", call.Name, "tool_call_id", call.ToolCallID, "until", at)
	c.Hold = &park.Wait{Key: protocol.WakeAt("rate." + m.RequestID + "." + call.ToolCallID), At: at}
	return nil
}

// Events records policy events on the record (hermes.event.policy.<session>).
type Events struct {
	Pub *bus.Publisher
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Record records decision d about call callID (of tool) of cause's request; n tells events of
// one decision about one call apart (the same n is the same event: recorded once).
func (e *Events) Record(ctx context.Context, cause *protocol.Message, callID, tool string, d *protocol.PolicyDecision, n int64) error {
	now := time.Now
	if e.Now != nil {
		now = e.Now
	}
	m, err := protocol.NewMessage(protocol.TypePolicy, &protocol.PolicyEvent{ToolCallID: callID, Tool: tool, Decision: *d, At: now().UTC()})
	if err != nil {
		return bus.Permanent(err)
	}
	m.Follow(cause, protocol.MsgIDPolicy(cause.RequestID, callID, d.Decision, n))
	m.Correlation = nil
	_, err = e.Pub.Publish(ctx, protocol.SubjectEvent(protocol.EventPolicy, cause.SessionID), m)
	return err
}
