package audit

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// sameRowsEitherOrder writes recs into two empty databases, split as first/second, in
// either order, and fails when the rows differ.
func sameRowsEitherOrder(t *testing.T, first, second []Record) {
	t.Helper()
	s1, p1 := newStore(t, nil)
	write(t, s1, first)
	write(t, s1, second)
	s2, p2 := newStore(t, nil)
	write(t, s2, second)
	write(t, s2, first)
	if a, b := dump(t, p1, "updated_at"), dump(t, p2, "updated_at"); a != b {
		t.Errorf("the rows depend on the order of writing:\nin order:\n%s\nout of order:\n%s", a, b)
	}
}

// An approval approved by bob and, unused, expired later (approvals.Decided records both): the
// earliest decision is the approval's, whichever is written first (a batch given back and
// written after a later one).
func TestAnApprovalsDecisionIsTheEarliestInAnyWriteOrder(t *testing.T) {
	t.Parallel()
	r := newRecords(t)
	r.add("hermes.event.policy.sess-1", protocol.TypePolicy, "req-1", "sess-1", protocol.PolicyEvent{ToolCallID: "c1", Tool: "send_email",
		Decision: protocol.PolicyDecision{Decision: protocol.PolicyParked, Rule: "confirm_required", Source: "policy", Version: 1, ApprovalID: "apr-1"}, At: r.at})
	r.add("hermes.event.policy.sess-1", protocol.TypePolicy, "req-1", "sess-1", protocol.PolicyEvent{ToolCallID: "c1", Tool: "send_email",
		Decision: protocol.PolicyDecision{Decision: protocol.PolicyApproved, Rule: "confirm_required", Source: "policy", Version: 1, ApprovalID: "apr-1",
			By: "oidc:https://id.example#bob"}, At: r.at.Add(time.Minute)})
	r.add("hermes.event.policy.sess-1", protocol.TypePolicy, "req-1", "sess-1", protocol.PolicyEvent{ToolCallID: "c1", Tool: "send_email",
		Decision: protocol.PolicyDecision{Decision: protocol.PolicyExpired, Rule: "confirm_required", Source: "policy", Version: 1, ApprovalID: "apr-1",
			Reason: "approved, and not called again by ..."}, At: r.at.Add(time.Hour)})
	sameRowsEitherOrder(t, r.recs[:2], r.recs[2:])
}

// Two genuine results of one call (a worker presumed dead, and the one that took over under a
// new turn): the first on the subject counts, with its route, grant and contract version, in
// either write order.
func TestTheCountedResultsGrantIsTheSteps(t *testing.T) {
	t.Parallel()
	r := newRecords(t)
	res := func(route string, fence uint64, version int) protocol.ToolResult {
		return protocol.ToolResult{ToolCallID: "c1", Name: "renew", Status: protocol.ResultOK, Attempts: 1, Route: route, ContractVersion: version,
			Grant: &protocol.Grant{Tx: protocol.TxID("req-1", "policy:p1"), Fence: fence, Resource: "policy:p1"}, Content: json.RawMessage(`{}`)}
	}
	r.add("hermes.result.req-1:c1.sess-1", protocol.TypeToolResult, "req-1", "sess-1", res("r1", 7, 1))
	r.add("hermes.result.req-1:c1.sess-1", protocol.TypeToolResult, "req-1", "sess-1", res("r2", 8, 2))
	sameRowsEitherOrder(t, r.recs[:1], r.recs[1:])
}

// A call dispatched twice (re-driven, under a new turn): the first dispatch stands, in either
// write order.
func TestTheFirstDispatchStandsInAnyWriteOrder(t *testing.T) {
	t.Parallel()
	r := newRecords(t)
	call := protocol.ToolCall{ToolCallID: "c1", Name: "renew", Arguments: json.RawMessage(`{}`)}
	disp := func(route string, fence uint64) protocol.Dispatch {
		return protocol.Dispatch{Call: call, Route: route, Action: protocol.Action{Kind: protocol.ActionHTTP, TimeoutMS: 1000,
			Retry: protocol.RetryPolicy{MaxAttempts: 1, BackoffFactor: 1, InitialIntervalMS: 1, MaxIntervalMS: 1}, HTTP: &protocol.HTTPAction{URL: "http://127.0.0.1:1/x"}},
			Grant: &protocol.Grant{Tx: protocol.TxID("req-1", "policy:p1"), Fence: fence, Resource: "policy:p1"}}
	}
	r.add("hermes.tool_http.renew.sess-1", protocol.TypeToolCall, "req-1", "sess-1", disp("r1", 7))
	r.add("hermes.tool_http.renew.sess-1", protocol.TypeToolCall, "req-1", "sess-1", disp("r2", 9))
	sameRowsEitherOrder(t, r.recs[:1], r.recs[1:])
}

// A blueprint step's "running" event written after its "succeeded" one (an earlier batch
// redelivered): the later event's status stands, and what only the earlier one said (its
// start, its request) is kept.
func TestABlueprintStepKeepsItsStartInAnyWriteOrder(t *testing.T) {
	t.Parallel()
	r := newRecords(t)
	at := r.at
	r.add("hermes.event.blueprint.bpr-run1", protocol.TypeBlueprintStep, "bpr-run1-1", "bpr-run1", protocol.BlueprintStep{RunID: "run1", Blueprint: "b", Version: 1,
		Step: "1", Tool: "t", Status: "running", RequestID: "bpr-run1-1", ToolCallID: "c1", At: at})
	r.add("hermes.event.blueprint.bpr-run1", protocol.TypeBlueprintStep, "bpr-run1-1", "bpr-run1", protocol.BlueprintStep{RunID: "run1", Blueprint: "b", Version: 1,
		Step: "1", Tool: "t", Status: "succeeded", DurationMS: 900, At: at.Add(time.Second)})
	sameRowsEitherOrder(t, r.recs[:1], r.recs[1:])
}
