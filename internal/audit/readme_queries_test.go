package audit

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/audit/pgtest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// The contract sandbox's trial calls are not callers': "retries by error code" leaves a trial
// that retries out (hermes_retries.sandbox), as the failure rate leaves its calls out.
func TestTheRetriesQueryLeavesTheSandboxOut(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, nil)
	r := newRecords(t)
	r.at = time.Now().Add(-time.Hour)
	sess := protocol.SandboxSession("get_policy")
	r.add("hermes.event.tool_started."+sess, protocol.TypeToolStarted, "sandbox-get_policy-1", sess, protocol.ToolStarted{ToolCallID: "c1", Name: "get_policy",
		Attempt: 2, StartedAt: r.at, Retrying: "TOOL_HTTP_5XX"})
	write(t, s, r.recs)
	if got := pgtest.Rows(t, pool, pgtest.READMEQueries(t, "../../README.md")["retries by error code"]); len(got) != 0 {
		t.Errorf("retries by error code counts the sandbox's trial: %q", got)
	}
}

// A call parked for approval gets an error result (APPROVAL_REQUIRED); once approved it runs
// in the approval's own request (request_id = approval id), a second hermes_steps row: the
// failure rate counts the run, not the parking, as the tool's.
func TestTheFailureRateCountsAnApprovedCallOnce(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, nil)
	r := newRecords(t)
	r.at = time.Now().Add(-time.Hour)
	call := protocol.ToolCall{ToolCallID: "c1", Name: "send_email", Arguments: json.RawMessage(`{}`)}
	r.add("hermes.request.1.sess-1", protocol.TypeRequest, "req-1", "sess-1", protocol.Request{RequestID: "req-1", SessionID: "sess-1", ToolCalls: []protocol.ToolCall{call}})
	parked := protocol.ErrorResult(protocol.CodeApprovalRequired, protocol.OriginHermes, "wait", "must be confirmed")
	parked.ToolCallID, parked.Name = "c1", "send_email"
	parked.Policy = &protocol.PolicyDecision{Decision: protocol.PolicyParked, Rule: "confirm_required", Source: "policy", Version: 1, ApprovalID: "apr-0123"}
	r.add("hermes.result.req-1:c1.sess-1", protocol.TypeToolResult, "req-1", "sess-1", parked)
	r.add("hermes.request.1.sess-1", protocol.TypeRequest, "apr-0123", "sess-1", protocol.Request{RequestID: "apr-0123", SessionID: "sess-1", Approval: "apr-0123",
		ToolCalls: []protocol.ToolCall{call}})
	r.add("hermes.result.apr-0123:c1.sess-1", protocol.TypeToolResult, "apr-0123", "sess-1", protocol.ToolResult{ToolCallID: "c1", Name: "send_email",
		Status: protocol.ResultOK, Attempts: 1, Content: json.RawMessage(`{}`)})
	if w := write(t, s, r.recs); w.failed != 0 {
		t.Fatalf("%+v", w)
	}
	got := pgtest.Rows(t, pool, pgtest.READMEQueries(t, "../../README.md")["failure rate by tool, last 24 h"])
	if len(got) != 1 || !strings.HasPrefix(got[0], "send_email | 1 | 0") {
		t.Errorf("failure rate by tool: %q; one call, approved and run, that did not fail", got)
	}
}
