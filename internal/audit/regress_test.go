package audit

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// randomPrintable is n bytes of printable ASCII that does not compress.
func randomPrintable(n int) string {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('!' + r.IntN('~'-'!'))
	}
	return string(b)
}

// poison writes recs twice, as commit would, and reports what the store made of them: a
// poison record must become an audit_errors row, never an error commit retries forever.
func poison(t *testing.T, recs []Record) {
	t.Helper()
	s, pool := newStore(t, nil)
	for try := range 2 {
		w, err := s.write(context.Background(), recs)
		if err != nil {
			t.Errorf("try %d: write failed: commit retries this batch forever, and the stream's audit stalls: %v", try, err)
			continue
		}
		t.Logf("written %+v", w)
	}
	var n int
	_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM hermes_audit_errors`).Scan(&n)
	t.Logf("%d audit_errors rows", n)
}

// A worker's tool_started whose attempt does not fit a 32-bit integer: the columns are bigint,
// and the batch is written, not retried for ever.
func TestAnAttemptBeyondInt32DoesNotStallTheStream(t *testing.T) {
	t.Parallel()
	r := newRecords(t)
	r.add("hermes.event.tool_started.sess-1", protocol.TypeToolStarted, "req-1", "sess-1",
		protocol.ToolStarted{ToolCallID: "c1", Name: "get_policy", Attempt: 1 << 33, StartedAt: r.at})
	poison(t, r.recs)
}

// A tool_started naming a tool by a long, incompressible name, more than the btree on
// tool_name holds: the name is cut, and the batch is written.
func TestALongToolNameDoesNotStallTheStream(t *testing.T) {
	t.Parallel()
	r := newRecords(t)
	r.add("hermes.event.tool_started.sess-1", protocol.TypeToolStarted, "req-1", "sess-1",
		protocol.ToolStarted{ToolCallID: "c1", Name: randomPrintable(3000), Attempt: 1, StartedAt: r.at})
	poison(t, r.recs)
}

// A blueprint step named by 3000 printable bytes (DecodeBlueprintStep allows 4096), more than
// the primary key's btree holds: the name is cut, and the batch is written.
func TestALongBlueprintStepDoesNotStallTheStream(t *testing.T) {
	t.Parallel()
	r := newRecords(t)
	r.add("hermes.event.blueprint.bpr-run1", protocol.TypeBlueprintStep, "bpr-run1-1", "bpr-run1", protocol.BlueprintStep{RunID: "run1", Blueprint: "renewal", Version: 1,
		Step: randomPrintable(3000), Tool: "get_policy", Status: "running", At: r.at})
	poison(t, r.recs)
}

// A policy event with a long msg id (the envelope bounds none), hermes_policy_decisions' key:
// the key is cut, and the batch is written.
func TestALongMsgIDDoesNotStallTheStream(t *testing.T) {
	t.Parallel()
	r := newRecords(t)
	r.add("hermes.event.policy.sess-1", protocol.TypePolicy, "req-1", "sess-1", protocol.PolicyEvent{ToolCallID: "c2", Tool: "send_email",
		Decision: protocol.PolicyDecision{Decision: protocol.PolicyParked, Rule: "confirm_required", Source: "policy", Version: 3}, At: r.at},
		func(m *protocol.Message) { m.MsgID = randomPrintable(3000) })
	poison(t, r.recs)
}

// Replaying the record leaves the same rows, even where a call's last try starts (attempt 3)
// before the result that counts says 2 tries (a worker presumed dead answers after the
// takeover's start): the result's attempts and the starts seen (tries) are columns of their own.
func TestAReplayKeepsAttemptsAndTries(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, nil)
	r := newRecords(t)
	r.add("hermes.event.tool_started.sess-1", protocol.TypeToolStarted, "req-1", "sess-1", protocol.ToolStarted{ToolCallID: "c1", Name: "t", Attempt: 3, StartedAt: r.at})
	r.add("hermes.result.req-1:c1.sess-1", protocol.TypeToolResult, "req-1", "sess-1", protocol.ToolResult{ToolCallID: "c1", Name: "t",
		Status: protocol.ResultOK, Attempts: 2, Content: json.RawMessage(`{}`)})
	write(t, s, r.recs)
	once := dump(t, pool, "updated_at")
	write(t, s, r.recs)
	if twice := dump(t, pool, "updated_at"); twice != once {
		t.Errorf("replay changed the rows:\nonce:\n%s\ntwice:\n%s", once, twice)
	}
}

// Two results of one call (the worker presumed dead and the one that took over, both genuine):
// the first on the subject counts, in either write order (an earlier batch redelivered after a
// later one committed).
func TestTheFirstResultCountsInAnyWriteOrder(t *testing.T) {
	t.Parallel()
	r := newRecords(t)
	r.add("hermes.result.req-1:c1.sess-1", protocol.TypeToolResult, "req-1", "sess-1", protocol.ToolResult{ToolCallID: "c1", Name: "t",
		Status: protocol.ResultOK, Attempts: 1, Content: json.RawMessage(`{}`)})
	r.add("hermes.result.req-1:c1.sess-1", protocol.TypeToolResult, "req-1", "sess-1", protocol.ToolResult{ToolCallID: "c1", Name: "t",
		Status: protocol.ResultError, ErrorCode: "TOOL_ERROR", Attempts: 2, Content: json.RawMessage(`"x"`)})
	s1, p1 := newStore(t, nil)
	write(t, s1, r.recs[:1])
	write(t, s1, r.recs[1:])
	s2, p2 := newStore(t, nil)
	write(t, s2, r.recs[1:])
	write(t, s2, r.recs[:1])
	a, b := dump(t, p1, "updated_at"), dump(t, p2, "updated_at")
	if a != b {
		t.Errorf("in order:\n%s\nout of order:\n%s", a, b)
	}
}

// A blueprint step's events at the same instant: the one that ends the step stands, in either
// write order (a redelivered "running" does not overwrite "succeeded").
func TestABlueprintStepsEndStandsAtATie(t *testing.T) {
	t.Parallel()
	r := newRecords(t)
	at := r.at
	r.add("hermes.event.blueprint.bpr-run1", protocol.TypeBlueprintStep, "bpr-run1-1", "bpr-run1", protocol.BlueprintStep{RunID: "run1", Blueprint: "b", Version: 1,
		Step: "1", Tool: "t", Status: "running", At: at})
	r.add("hermes.event.blueprint.bpr-run1", protocol.TypeBlueprintStep, "bpr-run1-1", "bpr-run1", protocol.BlueprintStep{RunID: "run1", Blueprint: "b", Version: 1,
		Step: "1", Tool: "t", Status: "succeeded", At: at})
	s, pool := newStore(t, nil)
	write(t, s, r.recs)
	once := dump(t, pool, "updated_at")
	write(t, s, r.recs[:1]) // the first batch again, its ack lost
	if twice := dump(t, pool, "updated_at"); twice != once {
		t.Errorf("redelivery changed the rows:\nonce:\n%s\ntwice:\n%s", once, twice)
	}
}

// A key trusted with send_email only seals a result naming send_email for call c1, a
// get_policy call, with no dispatch written (a call the router answered itself, never
// dispatched): the request names the call's tool, and the forgery does not count.
func TestAForgedResultDoesNotCountWithoutItsDispatch(t *testing.T) {
	t.Parallel()
	s, pool, priv, toolPriv := newSendEmailOnlyStore(t)
	r := newRecords(t)
	req := protocol.Request{RequestID: "req-1", SessionID: "sess-1", ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: "get_policy", Arguments: json.RawMessage(`{}`)}}}
	r.add("hermes.request.1.sess-1", protocol.TypeRequest, "req-1", "sess-1", req)
	// The forgery, recorded before the router's own NO_ROUTE answer.
	r.add("hermes.result.req-1:c1.sess-1", protocol.TypeToolResult, "req-1", "sess-1", protocol.ToolResult{ToolCallID: "c1", Name: "send_email",
		Status: protocol.ResultOK, Attempts: 1, Content: json.RawMessage(`{}`)}, func(m *protocol.Message) { m.SealResult(toolPriv, "meeting") })
	r.add("hermes.result.req-1:c1.sess-1", protocol.TypeToolResult, "req-1", "sess-1", protocol.ToolResult{ToolCallID: "c1", Name: "get_policy",
		Status: protocol.ResultError, ErrorCode: protocol.CodeNoRoute, ErrorOrigin: protocol.OriginHermes, Content: json.RawMessage(`"no route"`)},
		func(m *protocol.Message) { m.SealResult(priv, "hermes") })
	w := write(t, s, r.recs)
	var tool, st string
	if err := pool.QueryRow(context.Background(), `SELECT tool_name, status FROM hermes_steps WHERE request_id = 'req-1' AND tool_call_id = 'c1'`).Scan(&tool, &st); err != nil {
		t.Fatal(err)
	}
	if tool != "get_policy" || st != "error" {
		t.Errorf("written %+v; step c1 is %s %s: the forged result of a key trusted with send_email only counted for a get_policy call", w, tool, st)
	}
}

// secretStaysOut writes what add records and fails t if the secret reached any table; it
// returns every row, as text.
func secretStaysOut(t *testing.T, where string, add func(r *records)) string {
	t.Helper()
	s, pool := newStore(t, nil)
	r := newRecords(t)
	add(r)
	write(t, s, r.recs)
	all := dump(t, pool)
	if strings.Contains(all, secret) {
		t.Errorf("a value reached the database through %s", where)
	}
	return all
}

// An LLM decision's error keeps only the HTTP status it names, never the backend's words (an
// answer that did not parse, quoted).
func TestADecisionsErrorKeepsNoWords(t *testing.T) {
	t.Parallel()
	secretStaysOut(t, "hermes_llm_decisions.error", func(r *records) {
		r.add("hermes.event.llm.sess-1", protocol.TypeLLMDecision, "run-9-1", "sess-1", protocol.LLMDecision{Run: "run-9", Turn: 1, Backend: "b", Model: "m",
			Error: `the answer did not parse: {"name":"get_policy","arguments":{"card":"` + secret + `"`})
	})
}

// A conflict's reason, as coordination.Stage.conflict writes it, names the resource key, which
// is an argument's value (contract resource_key: "policy:{policy_no}"): it is not kept.
func TestAConflictsReasonIsNotKept(t *testing.T) {
	t.Parallel()
	secretStaysOut(t, "hermes_coordination.reason", func(r *records) {
		key := "policy:" + secret
		msg := "2 calls of this request change " + protocol.Shorten(key, 64) + " (renew_policy, cancel_policy): their order must be decided first"
		r.add("hermes.event.coordination.sess-1", protocol.TypeCoordination, "req-1", "sess-1", protocol.CoordinationEvent{
			Op: protocol.CoordConflict, ToolCallID: "c1", Tool: "renew_policy", Resource: key, Tx: protocol.TxID("req-1", key),
			SuggestedOrder: []string{"renew_policy", "cancel_policy"}, Reason: msg, At: r.at})
	})
}

// A chat request's intent is the person's last message (chat.go: Request{Intent: intent}): it
// is not kept, as the model's decision's input is not.
func TestAChatIntentIsNotKept(t *testing.T) {
	t.Parallel()
	secretStaysOut(t, "hermes_requests.intent", func(r *records) {
		r.add("hermes.request.1.sess-1", protocol.TypeRequest, "run-9-1", "sess-1", protocol.Request{RequestID: "run-9-1", SessionID: "sess-1",
			Intent: "my card is " + secret, Recall: true, ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: "get_policy", Arguments: []byte(`{}`)}}})
	})
}
