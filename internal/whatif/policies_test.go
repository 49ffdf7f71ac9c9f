package whatif

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

var t0 = time.Unix(1_800_000_000, 0).UTC()

func policyFile(t *testing.T, yaml string) *policy.File {
	t.Helper()
	f, err := policy.ParseFile([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// call records one request of one call of tool by a caller of role at t0+after, and what was
// decided about it (nil: a dispatch with no decision; a decision on a dispatch when allowed,
// on a refusal's result otherwise).
func recordCall(p *Policies, id, role, tool, args string, after time.Duration, d *protocol.PolicyDecision) {
	at := t0.Add(after)
	req := &protocol.Request{RequestID: id, SessionID: "s1", ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: tool, Arguments: json.RawMessage(args)}}}
	m := &protocol.Message{Type: protocol.TypeRequest, RequestID: id, SessionID: "s1", CreatedAt: at, Caller: &protocol.Caller{ID: "key:" + role, Role: role}}
	p.Add(at, m, req)
	follow := &protocol.Message{RequestID: id, SessionID: "s1"}
	switch {
	case d == nil || d.Decision == protocol.PolicyAllowed:
		p.Add(at, follow, &protocol.Dispatch{Call: req.ToolCalls[0], Policy: d})
	case d.Decision == protocol.PolicyWaited:
		p.Add(at, follow, &protocol.PolicyEvent{ToolCallID: "c1", Tool: tool, Decision: *d})
		p.Add(at, follow, &protocol.Dispatch{Call: req.ToolCalls[0], Policy: &protocol.PolicyDecision{Decision: protocol.PolicyAllowed, Source: d.Source, Version: d.Version}})
	default:
		p.Add(at, follow, &protocol.ToolResult{ToolCallID: "c1", Name: tool, Status: protocol.ResultError, Policy: d})
	}
}

func changed(rep *PolicyReport) []string {
	var out []string
	for _, c := range rep.Changed {
		out = append(out, c.RequestID+" "+c.Tool+": "+Decided(c.Before)+" -> "+Decided(c.After))
	}
	return out
}

func decision(d, rule string) *protocol.PolicyDecision {
	return &protocol.PolicyDecision{Decision: d, Rule: rule, Source: "policy", Version: 1}
}

// Calls are decided again as the stage would decide them under the file's policies: a role
// no longer allowed, a rate that the recorded calls now exceed, recipients over a new bound;
// calls decided alike are not reported, and a call with no decision on record is allowed
// with no policy.
func TestComparePolicies(t *testing.T) {
	t.Parallel()
	var p Policies
	allowed := decision(protocol.PolicyAllowed, "")
	recordCall(&p, "r1", "admin", "meeting_book", `{}`, 0, allowed)
	recordCall(&p, "r2", "user", "meeting_book", `{}`, time.Second, nil)
	recordCall(&p, "r3", "admin", "meeting_book", `{}`, 2*time.Second, allowed)
	recordCall(&p, "r4", "admin", "meeting_book", `{}`, 3*time.Second, allowed)
	recordCall(&p, "r5", "admin", "meeting_book", `{}`, 70*time.Second, allowed)
	recordCall(&p, "r6", "user", "notify_send", `{"user_ids":["a","b","c"]}`, 0, nil)
	recordCall(&p, "r7", "user", "pay", `{}`, 0, decision(protocol.PolicyParked, policy.RuleConfirmRequired))
	recordCall(&p, "r8", "user", "fax_send", `{}`, 0, decision(protocol.PolicyDenied, policy.RuleAllowedRoles))
	// A request recorded again counts once; one nothing followed is not compared.
	recordCall(&p, "r1", "admin", "meeting_book", `{}`, 0, allowed)
	p.Add(t0, &protocol.Message{Type: protocol.TypeRequest, RequestID: "r9", Caller: &protocol.Caller{Role: "user"}},
		&protocol.Request{RequestID: "r9", ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: "meeting_book"}}})
	p.AddUnreadable()
	f := policyFile(t, `policies:
  meeting_book:
    allowed_roles: [admin]
    rate_limit: 2
  notify_send:
    max_recipients: 2
  pay:
    confirm_required: true
`)
	contracts := func(tool string) *contract.Compiled {
		if tool != "notify_send" {
			return nil
		}
		k, err := contract.Compile(&contract.Contract{Name: "notify_send", Recipients: []string{"user_ids"}}, 1, 1)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	rep := p.Compare(f, contracts)
	// In the order of the requests' times, then of the record.
	want := []string{
		"r6 notify_send: allowed (no policy) -> denied: max_recipients (file)",
		"r8 fax_send: denied: allowed_roles (policy v1) -> allowed (no policy)",
		"r2 meeting_book: allowed (no policy) -> denied: allowed_roles (file)",
		"r4 meeting_book: allowed (policy v1) -> limited: rate_limit (file)",
	}
	if got := changed(rep); !slices.Equal(got, want) {
		t.Errorf("changed:\n got %q\nwant %q", got, want)
	}
	if rep.Requests != 9 || rep.Calls != 9 || rep.Duplicates != 1 || rep.Unreadable != 1 || len(rep.NotDecided) != 1 || rep.NotDecided[0].RequestID != "r9" {
		t.Errorf("report: %d requests, %d calls, %d duplicates, %d unreadable, not decided %+v", rep.Requests, rep.Calls, rep.Duplicates, rep.Unreadable, rep.NotDecided)
	}
	if r := rep.Changed[len(rep.Changed)-1].After; r == nil || r.RetryAt.IsZero() {
		t.Errorf("a limited call without its retry time: %+v", r)
	}
}

// A call that would wait for its window takes its place in the window when the wait ends, as
// under the router: a later call finds the window full. A tool the file leaves out goes under
// its contract's policy block.
func TestComparePoliciesWaitsAndContractBlocks(t *testing.T) {
	t.Parallel()
	var p Policies
	for i, after := range []time.Duration{0, 0, 500 * time.Millisecond, 1500 * time.Millisecond} {
		recordCall(&p, "w"+string(rune('1'+i)), "user", "slow", `{}`, after, nil)
	}
	recordCall(&p, "k1", "user", "lookup", `{}`, 0, nil)
	f := policyFile(t, `policies:
  slow:
    rate_limit: 1/s
    on_limit: wait
    scope: tool
`)
	block := &policy.Policy{AllowedRoles: []string{"admin"}}
	contracts := func(tool string) *contract.Compiled {
		if tool != "lookup" {
			return nil
		}
		return &contract.Compiled{Contract: &contract.Contract{Name: "lookup", Policy: block}, Version: 3}
	}
	want := []string{
		"w2 slow: allowed (no policy) -> waited: rate_limit (file)",
		"k1 lookup: allowed (no policy) -> denied: allowed_roles (contract v3)",
		"w3 slow: allowed (no policy) -> waited: rate_limit (file)",
		// w2 ran at 1 s, when its wait ended: the window is full at 1.5 s.
		"w4 slow: allowed (no policy) -> waited: rate_limit (file)",
	}
	if got := changed(p.Compare(f, contracts)); !slices.Equal(got, want) {
		t.Errorf("changed:\n got %q\nwant %q", got, want)
	}
	// The same policies as recorded change nothing: a wait on record is a wait.
	var same Policies
	waited := &protocol.PolicyDecision{Decision: protocol.PolicyWaited, Rule: policy.RuleRateLimit, Source: "policy", Version: 1}
	recordCall(&same, "w1", "user", "slow", `{}`, 0, decision(protocol.PolicyAllowed, ""))
	recordCall(&same, "w2", "user", "slow", `{}`, 0, waited)
	if rep := same.Compare(f, nil); len(rep.Changed) != 0 {
		t.Errorf("the recorded policies again: %q", changed(rep))
	}
}
