package audit

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// The chat door denies a parked call when the person answers something else, with the reason
// "the person answered something else: " + their message (internal/chat/confirm.go), which
// approvals.Decided records as the policy event's reason: the audit keeps no reason, as it
// keeps no chat request's intent.
func TestAPersonsWordsStayOutOfPolicyDecisions(t *testing.T) {
	t.Parallel()
	secretStaysOut(t, "hermes_policy_decisions", func(r *records) {
		r.add("hermes.event.policy.sess-1", protocol.TypePolicy, "run-9-1", "sess-1", protocol.PolicyEvent{ToolCallID: "c1", Tool: "send_email",
			Decision: protocol.PolicyDecision{Decision: protocol.PolicyRejected, Rule: "confirm_required", Source: "policy", Version: 1, ApprovalID: "apr-1",
				By: "key:k1", Reason: "the person answered something else: " + protocol.Shorten("no, my card is "+secret, 200)}, At: r.at})
	})
}

// A model that calls a tool it was not offered names it as it likes (agent.loop: Chosen
// Name: cutText(c.Function.Name), up to 16 KiB; the unknown_tool warning's Tool): the audit
// keeps such a name as "(not offered)", never the model's text.
func TestAModelsMadeUpToolNameIsNotKept(t *testing.T) {
	t.Parallel()
	all := secretStaysOut(t, "hermes_llm_decisions.chosen / warnings", func(r *records) {
		name := "the card number is " + secret
		r.add("hermes.event.llm.sess-1", protocol.TypeLLMDecision, "run-9-1", "sess-1", protocol.LLMDecision{Run: "run-9", Turn: 1, Backend: "b", Model: "m",
			Offered:  []string{"get_policy"},
			Chosen:   []protocol.LLMCall{{ID: "c1", Name: name, Arguments: `{}`}},
			Warnings: []protocol.LLMWarning{{Kind: protocol.WarnUnknownTool, Tool: protocol.Shorten(name, 128), CallID: "c1", Message: "unknown tool"}}})
	})
	if !strings.Contains(all, notOffered) {
		t.Errorf("the made-up name is not kept as %q:\n%s", notOffered, all)
	}
}

// A native request's intent is kept as its caller wrote it, bounded; with NoIntents, none is.
func TestAnIntentIsKeptBoundedOrNotAtAll(t *testing.T) {
	t.Parallel()
	for _, drop := range []bool{false, true} {
		s, pool := newStore(t, nil)
		s.noIntent = drop
		r := newRecords(t)
		long := "renew policy " + strings.Repeat("x", 2*MaxIntentBytes)
		r.add("hermes.request.1.sess-1", protocol.TypeRequest, "req-1", "sess-1", protocol.Request{RequestID: "req-1", SessionID: "sess-1", Intent: long,
			ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: "get_policy", Arguments: json.RawMessage(`{}`)}}})
		write(t, s, r.recs)
		var intent *string
		if err := pool.QueryRow(context.Background(), `SELECT intent FROM hermes_requests WHERE request_id = 'req-1'`).Scan(&intent); err != nil {
			t.Fatal(err)
		}
		switch {
		case drop && intent != nil:
			t.Errorf("NoIntents kept %q", *intent)
		case !drop && (intent == nil || len(*intent) > MaxIntentBytes || !strings.HasPrefix(*intent, "renew policy")):
			t.Errorf("the intent kept: %v", intent)
		}
	}
}
