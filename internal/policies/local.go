package policies

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Local decides the policy of a tool Hermes runs itself, in the process that offers it and
// outside the router (the chat loop's memory_write), by the rules the stage decides a routed
// call by: allowed_roles and max_recipients first, then rate_limit, counted in the windows
// every router shares, under the same keys (so a caller's calls are counted together whoever
// runs them). A call that may wait for its window (on_limit: wait) waits here, within max_wait
// and ctx; one that may not is refused RATE_LIMITED. A rule such a tool cannot honour —
// confirm_required: it answers at once and no router holds it for a person — refuses the call
// POLICY_UNAVAILABLE; the API refuses to apply one to a built-in tool (CheckBuiltin), so only
// a policy the API never checked can come to that. It is safe for concurrent use.
type Local struct {
	Rules Rules
	// Windows count the calls under a rate limit; nil refuses them POLICY_UNAVAILABLE.
	Windows *Windows
}

// Decide decides call, made in request requestID by caller (as the gateway authenticated it;
// nil for none): the decision it runs under (nil when the tool has no policy), or the result
// to answer it with instead. A policy that cannot be known now refuses the call
// POLICY_UNAVAILABLE: a built-in tool is never run unchecked.
func (l *Local) Decide(ctx context.Context, call *protocol.ToolCall, requestID string, caller *protocol.Caller) (*protocol.PolicyDecision, *protocol.ToolResult) {
	unavailable := func(reason string) *protocol.ToolResult {
		res := protocol.ErrorResult(protocol.CodePolicyUnavailable, protocol.OriginHermes, "try again shortly", fmt.Sprintf("the policy of %s %s", call.Name, reason))
		res.Policy = &protocol.PolicyDecision{Decision: protocol.PolicyUnavailable, Source: SourcePolicy, Reason: reason}
		return &res
	}
	r, err := l.Rules.Rule(call.Name, nil)
	switch {
	case err != nil:
		return nil, unavailable("cannot be read now")
	case r == nil:
		return nil, nil
	}
	refuse := func(f *refusal) (*protocol.PolicyDecision, *protocol.ToolResult) {
		res := r.refused(f)
		return nil, &res
	}
	role := ""
	if caller != nil {
		role = caller.Role
	}
	j := r.judge(role, nil, call)
	switch {
	case j.refusal != nil:
		return refuse(j.refusal)
	case j.confirm:
		return refuse(&refusal{code: protocol.CodePolicyUnavailable, decision: protocol.PolicyUnavailable, rule: policy.RuleConfirmRequired,
			reason: call.Name + " is Hermes' own tool and runs at once: no person can confirm its calls, so none is made",
			hint:   "an operator must remove confirm_required from the policy of " + call.Name})
	case !j.limit:
		return r.decision(protocol.PolicyAllowed, "", ""), nil
	case l.Windows == nil:
		return refuse(&refusal{code: protocol.CodePolicyUnavailable, decision: protocol.PolicyUnavailable, rule: policy.RuleRateLimit,
			reason: "the call is rate limited, and no rate windows are kept here", hint: "run the gateway on a bus with the rate windows' bucket"})
	}
	p := r.Policy
	key, id := WindowKey(call.Name, p.ScopeOrDefault(), windowCaller(caller)), CallID(requestID, call.ToolCallID)
	asked := &protocol.Message{CreatedAt: time.Now()}
	if d, ok := ctx.Deadline(); ok {
		asked.Deadline = d
	}
	for contended := 0; ; {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, at, err := l.Windows.Take(wctx, key, *p.RateLimit, id)
		cancel()
		if errors.Is(err, ErrContended) && contended < maxContended && ctx.Err() == nil {
			// Other processes took from the window meanwhile: read it again, as the stage's
			// redelivery would, after a moment.
			contended++
			time.Sleep(time.Duration(contended) * 10 * time.Millisecond)
			continue
		}
		switch {
		case err != nil: // still contended: the call is not held here for later
			// Its effects are Hermes' own (it writes): a limit that cannot be counted fails closed.
			return refuse(&refusal{code: protocol.CodePolicyUnavailable, decision: protocol.PolicyUnavailable, rule: policy.RuleRateLimit,
				reason: "the rate window could not be read, so the call was not made", hint: "try again shortly"})
		case ok:
			return r.decision(protocol.PolicyAllowed, "", ""), nil
		}
		wait, _, limited := r.overLimit(asked, at)
		if !wait {
			return refuse(limited)
		}
		t := time.NewTimer(time.Until(at))
		select {
		case <-ctx.Done():
			t.Stop()
			return refuse(&refusal{code: protocol.CodeRateLimited, decision: protocol.PolicyLimited, rule: policy.RuleRateLimit,
				reason: "the call waited for its rate window until the request ended", hint: "try again after " + at.UTC().Format(time.RFC3339), retryAt: at})
		case <-t.C:
		}
	}
}

// maxContended is how many times Local reads a window again that other processes changed
// under it before it refuses the call.
const maxContended = 8

// CheckBuiltin refuses, with a *policy.Error naming the field, a policy for a tool Hermes runs
// itself (Local) that asks for what such a tool cannot honour: confirm_required (no router holds
// its calls for a person) and max_recipients (it has no contract naming recipients).
func CheckBuiltin(tool string, p *policy.Policy) error {
	field := "policies." + tool
	switch {
	case p.ConfirmRequired:
		return &policy.Error{Field: field + ".confirm_required", Reason: tool + " is Hermes' own tool and answers at once; no person can confirm its calls (allowed_roles and rate_limit apply to it)"}
	case p.MaxRecipients > 0:
		return &policy.Error{Field: field + ".max_recipients", Reason: tool + " is Hermes' own tool and names no recipients (allowed_roles and rate_limit apply to it)"}
	}
	return nil
}
