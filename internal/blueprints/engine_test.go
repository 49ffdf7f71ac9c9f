package blueprints

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/answer"
	"github.com/hermesbus/hermes/internal/approvals"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/blueprint"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// fakeTools answers each step's request as a tool would, by tool name, and counts the
// requests it was asked for by id (a request asked for again is answered as it was: the
// record's answer), and the calls it ran.
type fakeTools struct {
	mu      sync.Mutex
	answer  func(call protocol.ToolCall, try int) protocol.ToolResult
	asked   map[string]int
	ran     map[string]int // request id/tool_call_id → times run
	answers map[string]*protocol.Response
	pending map[string]bool // request ids that never answer until cancelled
	cancels []string
	calls   map[string]string // request id → its calls, as first asked (another is a conflict)
}

func newFakeTools(answer func(call protocol.ToolCall, try int) protocol.ToolResult) *fakeTools {
	return &fakeTools{answer: answer, asked: map[string]int{}, ran: map[string]int{}, answers: map[string]*protocol.Response{}, pending: map[string]bool{},
		calls: map[string]string{}}
}

func (f *fakeTools) Submit(ctx context.Context, sub submit.Submission) (*submit.Outcome, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	req := sub.Request
	if err := req.Validate(protocol.Limits{}); err != nil {
		return nil, err
	}
	f.asked[req.RequestID]++
	calls, _ := json.Marshal(req.ToolCalls)
	if first, ok := f.calls[req.RequestID]; ok && first != string(calls) {
		return nil, fmt.Errorf("%w: %s asked with %s, then %s", submit.ErrConflict, req.RequestID, first, calls)
	}
	f.calls[req.RequestID] = string(calls)
	if resp, ok := f.answers[req.RequestID]; ok {
		return &submit.Outcome{Response: resp, Replayed: true}, nil
	}
	if f.pending[req.RequestID] {
		return &submit.Outcome{Pending: true}, nil
	}
	resp := &protocol.Response{RequestID: req.RequestID, SessionID: req.SessionID}
	for _, c := range req.ToolCalls {
		key := req.RequestID + "/" + c.ToolCallID
		f.ran[key]++
		res := f.answer(c, f.ran[key])
		res.ToolCallID, res.Name = c.ToolCallID, c.Name
		resp.Results = append(resp.Results, res)
	}
	f.answers[req.RequestID] = resp
	return &submit.Outcome{Response: resp}, nil
}

func (f *fakeTools) Cancel(_ context.Context, id string, c submit.Cancellation) (*protocol.Response, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cancels = append(f.cancels, id)
	delete(f.pending, id)
	f.answers[id] = &protocol.Response{RequestID: id, Results: []protocol.ToolResult{{ToolCallID: "s0", Status: protocol.ResultError, ErrorCode: protocol.CodeCancelled, Content: json.RawMessage(`"cancelled"`)}},
		Error: &protocol.ResponseError{Code: protocol.CodeCancelled, Message: answer.CancelledMessage(c.By, c.Reason)}}
	return f.answers[id], false, nil
}

func ok(v string) protocol.ToolResult {
	return protocol.ToolResult{Status: protocol.ResultOK, Content: json.RawMessage(v)}
}

func fail(code string) protocol.ToolResult {
	return protocol.ToolResult{Status: protocol.ResultError, ErrorCode: code, ErrorOrigin: protocol.OriginHermes, Content: json.RawMessage(`"it failed"`)}
}

// source serves one compiled blueprint.
type source struct{ b *blueprint.Blueprint }

func (s source) Compiled(context.Context, string, int) (*blueprint.Blueprint, error) { return s.b, nil }

func compile(t *testing.T, doc string) *blueprint.Blueprint {
	t.Helper()
	b, err := blueprint.Load([]byte(doc), nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// begin keeps a new run of b and returns an engine over it.
func begin(t *testing.T, b *blueprint.Blueprint, tools *fakeTools, runID, input string) (*Engine, *Runs) {
	t.Helper()
	runs := &Runs{KV: bustest.NewMemKV()}
	r := &Run{RunID: runID, Blueprint: b.Name, Version: 1, SessionID: protocol.RunSession(runID), UserInput: json.RawMessage(input),
		Fingerprint: Fingerprint(b.Name, json.RawMessage(input)), Status: Pending, CreatedAt: time.Now(), Steps: stepsOf(b)}
	if _, _, created, err := runs.Create(context.Background(), r); err != nil || !created {
		t.Fatal(created, err)
	}
	return &Engine{Runs: runs, Source: source{b}, Submit: tools, Instance: "test", Poll: 10 * time.Millisecond, StepWait: 50 * time.Millisecond}, runs
}

func drive(t *testing.T, e *Engine, runs *Runs, id string) *Run {
	t.Helper()
	if err := e.Drive(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	r, _, err := runs.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

const seed = `{"name":"check_and_urge","steps":[
 {"tool":"order_query","input_mapping":{"order_id":"$.user_input.order_id"},"output_key":"order_data"},
 {"tool":"logistics_urge","input_mapping":{"order_id":"$.order_data.success.order_id","reason":"用户咨询发货进度"},
  "condition":"($.order_data.success.status == 'created' || $.order_data.success.status == 'paid')","output_key":"urge_result"}],
 "fallback":{"message":"订单状态异常，已转人工客服","transfer_to":"human_agent"}}`

func orders(status string) *fakeTools {
	return newFakeTools(func(c protocol.ToolCall, _ int) protocol.ToolResult {
		switch c.Name {
		case "order_query":
			var a struct {
				OrderID string `json:"order_id"`
			}
			_ = json.Unmarshal(c.Arguments, &a)
			if a.OrderID == "missing" {
				return protocol.ToolResult{Status: protocol.ResultError, ErrorCode: protocol.CodeToolHTTP4xx, ErrorOrigin: protocol.OriginTool, Content: json.RawMessage(`{"failure":{"error_code":"ORDER_NOT_FOUND"}}`)}
			}
			return ok(fmt.Sprintf(`{"success":{"order_id":%q,"status":%q}}`, a.OrderID, status))
		case "logistics_urge":
			return ok(`{"success":{"ticket_id":"URG-1"}}`)
		}
		return fail(protocol.CodeNoRoute)
	})
}

// The seed's blueprint: a paid order is urged; a shipped one is not (skipped, the condition's
// value kept); an unknown one takes the fallback, transferred.
func TestSeedBlueprintPaths(t *testing.T) {
	b := compile(t, seed)
	for _, c := range []struct {
		status, order string
		want          Status
		urge          StepStatus
	}{
		{"paid", "ORD1", Succeeded, StepSucceeded},
		{"shipped", "ORD2", Succeeded, StepSkipped},
		{"paid", "missing", Transferred, StepNotRun},
	} {
		tools := orders(c.status)
		e, runs := begin(t, b, tools, "r-"+c.order, fmt.Sprintf(`{"order_id":%q}`, c.order))
		r := drive(t, e, runs, "r-"+c.order)
		if r.Status != c.want || r.Steps[1].Status != c.urge {
			t.Fatalf("%s: %s, urge %s: %+v", c.status, r.Status, r.Steps[1].Status, r)
		}
		switch c.urge {
		case StepSkipped:
			if cond := r.Steps[1].Condition; cond == nil || cond.Result || cond.Values["$.order_data.success.status"] != "shipped" || string(r.Steps[1].Output) != "null" {
				t.Fatalf("skipped: %+v", r.Steps[1])
			}
		case StepSucceeded:
			if !strings.Contains(string(r.Steps[1].Input), `"reason":"用户咨询发货进度"`) || r.Steps[1].RequestID != "bpr-r-ORD1-s1" {
				t.Fatalf("urged: %+v", r.Steps[1])
			}
		case StepNotRun:
			if r.Fallback == nil || r.Fallback.TransferTo != "human_agent" || r.Error == nil || r.Error.Step != "0" {
				t.Fatalf("transferred: %+v %+v", r.Fallback, r.Error)
			}
		}
		if r.Holder != "" {
			t.Fatalf("a finished run is still held by %s", r.Holder)
		}
	}
}

// A run resumed (its holder gone mid-run) asks for the steps it had asked for before, which
// the record answers: no call runs twice.
func TestResumedRunRunsNothingTwice(t *testing.T) {
	b := compile(t, seed)
	tools := orders("paid")
	e, runs := begin(t, b, tools, "r1", `{"order_id":"ORD1"}`)
	r := drive(t, e, runs, "r1")
	if r.Status != Succeeded {
		t.Fatal(r.Status)
	}
	// As if the runner died before keeping the second step's end: the run is back to running.
	r, rev, _ := runs.Get(t.Context(), "r1")
	r.Status, r.FinishedAt, r.Steps[1].Status, r.Steps[1].Output = Running, nil, StepRunning, nil
	r.Holder, r.LeaseUntil = "dead", time.Now().Add(-time.Second)
	if _, err := runs.Update(t.Context(), r, rev); err != nil {
		t.Fatal(err)
	}
	e2 := &Engine{Runs: runs, Source: source{b}, Submit: tools, Instance: "other", StepWait: 50 * time.Millisecond}
	r = drive(t, e2, runs, "r1")
	if r.Status != Succeeded || r.Steps[1].Status != StepSucceeded {
		t.Fatalf("resumed: %+v", r)
	}
	for key, n := range tools.ran {
		if n != 1 {
			t.Errorf("%s ran %d times", key, n)
		}
	}
	if tools.asked["bpr-r1-s0"] != 1 || tools.asked["bpr-r1-s1"] != 2 {
		t.Fatalf("asked: %v", tools.asked)
	}
}

// A run held by another runner under a live lease is left to it.
func TestLiveLeaseIsLeftToItsHolder(t *testing.T) {
	b := compile(t, seed)
	tools := orders("paid")
	e, runs := begin(t, b, tools, "r1", `{"order_id":"ORD1"}`)
	r, rev, _ := runs.Get(t.Context(), "r1")
	r.Holder, r.LeaseUntil = "other", time.Now().Add(time.Minute)
	if _, err := runs.Update(t.Context(), r, rev); err != nil {
		t.Fatal(err)
	}
	if r := drive(t, e, runs, "r1"); r.Status != Pending || len(tools.asked) != 0 {
		t.Fatalf("taken from a live holder: %+v %v", r, tools.asked)
	}
}

// A step's retry makes more attempts of a failed tool, each a request of its own; a refusal
// by policy is not tried again.
func TestStepRetry(t *testing.T) {
	b := compile(t, `{"name":"b","steps":[{"tool":"flaky","output_key":"x","retry":{"max_attempts":3}},
		{"tool":"denied","output_key":"y","retry":{"max_attempts":3}}]}`)
	tools := newFakeTools(func(c protocol.ToolCall, try int) protocol.ToolResult {
		if c.Name == "denied" {
			return fail(protocol.CodePolicyDenied)
		}
		return ok(`{"ok":true}`)
	})
	flakes := 0
	base := tools.answer
	tools.answer = func(c protocol.ToolCall, try int) protocol.ToolResult {
		if c.Name == "flaky" && flakes < 2 {
			flakes++
			return fail(protocol.CodeToolHTTP5xx)
		}
		return base(c, try)
	}
	e, runs := begin(t, b, tools, "r1", `{}`)
	r := drive(t, e, runs, "r1")
	if r.Steps[0].Status != StepSucceeded || r.Steps[0].Attempts != 3 || r.Steps[0].RequestID != "bpr-r1-s0-r3" {
		t.Fatalf("flaky: %+v", r.Steps[0])
	}
	if r.Steps[1].Status != StepFailed || r.Steps[1].Error.Code != protocol.CodePolicyDenied || tools.asked["bpr-r1-s1-r2"] != 0 {
		t.Fatalf("denied: %+v %v", r.Steps[1], tools.asked)
	}
	if r.Status != Failed || r.Error == nil || r.Error.Step != "1" {
		t.Fatalf("run: %+v", r)
	}
}

// A step past its timeout is cancelled and fails STEP_TIMEOUT, taking its fallback step,
// which stands in for it: the run goes on.
func TestStepTimeoutTakesItsFallbackStep(t *testing.T) {
	b := compile(t, `{"name":"b","steps":[
		{"tool":"slow","output_key":"x","timeout":"100ms","fallback":{"step":{"tool":"quick","output_key":"y"}}},
		{"tool":"quick","input_mapping":{"v":"$.y.v"},"output_key":"z"}]}`)
	tools := newFakeTools(func(c protocol.ToolCall, _ int) protocol.ToolResult { return ok(`{"v":1}`) })
	tools.pending["bpr-r1-s0"] = true
	e, runs := begin(t, b, tools, "r1", `{}`)
	r := drive(t, e, runs, "r1")
	if r.Status != Succeeded || r.Steps[0].Status != StepFailed || r.Steps[0].Error.Code != CodeStepTimeout || len(tools.cancels) != 1 {
		t.Fatalf("%+v cancels %v", r, tools.cancels)
	}
	fb := r.Step("0.fallback")
	if fb == nil || fb.Status != StepSucceeded || !fb.Fallback || r.Steps[len(r.Steps)-1].Status != StepSucceeded {
		t.Fatalf("fallback: %+v", r.Steps)
	}
}

// A parallel group is one request of its members' calls; a member's condition skips it alone.
func TestParallelGroupIsOneRequest(t *testing.T) {
	b := compile(t, `{"name":"b","steps":[{"parallel":[
		{"tool":"a","output_key":"a"},{"tool":"b","output_key":"b"},{"tool":"c","output_key":"c","condition":"$.user_input.c == true","default_value":{"none":1}}]},
		{"tool":"d","input_mapping":{"a":"$.a.v","b":"$.b.v","c":"$.c"},"output_key":"d"}]}`)
	tools := newFakeTools(func(c protocol.ToolCall, _ int) protocol.ToolResult { return ok(`{"v":"` + c.Name + `"}`) })
	e, runs := begin(t, b, tools, "r1", `{"c":false}`)
	r := drive(t, e, runs, "r1")
	if r.Status != Succeeded || tools.asked["bpr-r1-s0"] != 1 || len(tools.answers["bpr-r1-s0"].Results) != 2 {
		t.Fatalf("%+v %v", r, tools.asked)
	}
	if d := r.Step("1"); d == nil || string(d.Input) != `{"a":"a","b":"b","c":{"none":1}}` {
		t.Fatalf("the step after the group: %+v", d)
	}
}

// A step whose mapping finds nothing fails, naming the path, and takes the fallback.
func TestMissingValueTakesTheFallback(t *testing.T) {
	b := compile(t, `{"name":"b","steps":[{"tool":"a","output_key":"a"},{"tool":"b","input_mapping":{"x":"$.a.nothing"},"output_key":"b"}],
		"fallback":{"message":"sorry"}}`)
	tools := newFakeTools(func(c protocol.ToolCall, _ int) protocol.ToolResult { return ok(`{}`) })
	e, runs := begin(t, b, tools, "r1", `{}`)
	r := drive(t, e, runs, "r1")
	if r.Status != Failed || r.Fallback == nil || r.Fallback.Message != "sorry" || r.Steps[1].Error == nil ||
		r.Steps[1].Error.Code != CodeMissingValue || !strings.Contains(r.Steps[1].Error.Message, "$.a.nothing") {
		t.Fatalf("%+v %+v", r, r.Steps[1].Error)
	}
}

// approvalsOf answers approvals from a map, changed by the test.
type approvalsOf struct {
	mu sync.Mutex
	m  map[string]*approvals.Approval
}

func (a *approvalsOf) Get(_ context.Context, id string) (*approvals.Approval, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if x, ok := a.m[id]; ok {
		c := *x
		return &c, nil
	}
	return nil, approvals.ErrNotFound
}

// A step parked for approval parks the run (waiting_approval); approved, the run goes on with
// the approved call's result; denied, the step fails and the run takes its fallback.
func TestApprovalParksTheRun(t *testing.T) {
	b := compile(t, `{"name":"b","steps":[{"tool":"pay","output_key":"p"}],"fallback":{"message":"not paid"}}`)
	for _, approve := range []bool{true, false} {
		tools := newFakeTools(func(c protocol.ToolCall, _ int) protocol.ToolResult {
			if c.ToolCallID == "s0" {
				r := fail(protocol.CodeApprovalRequired)
				r.Policy = &protocol.PolicyDecision{Decision: protocol.PolicyParked, ApprovalID: "apr-1"}
				return r
			}
			return ok(`{"paid":true}`)
		})
		apr := &approvalsOf{m: map[string]*approvals.Approval{"apr-1": {ID: "apr-1", SessionID: "bpr-r1", ToolCallID: "c1", Tool: "pay",
			Arguments: json.RawMessage(`{}`), State: approvals.Pending}}}
		e, runs := begin(t, b, tools, "r1", `{}`)
		e.Approvals = apr
		done := make(chan *Run)
		go func() { done <- drive(t, e, runs, "r1") }()
		deadline := time.Now().Add(5 * time.Second)
		for {
			r, _, _ := runs.Get(context.Background(), "r1")
			if r.Status == Waiting && r.Steps[0].Status == StepParked && r.Steps[0].ApprovalID == "apr-1" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("never parked: %+v", r)
			}
			time.Sleep(5 * time.Millisecond)
		}
		apr.mu.Lock()
		if approve {
			apr.m["apr-1"].State = approvals.Approved
		} else {
			apr.m["apr-1"].State, apr.m["apr-1"].DecidedBy, apr.m["apr-1"].Reason = approvals.Denied, "bob", "no"
		}
		apr.mu.Unlock()
		r := <-done
		switch {
		case approve && (r.Status != Succeeded || string(r.Steps[0].Output) != `{"paid":true}` || tools.ran["apr-1/c1"] != 1):
			t.Fatalf("approved: %+v %v", r, tools.ran)
		case !approve && (r.Status != Failed || r.Steps[0].Error.Code != protocol.CodeApprovalDenied || r.Fallback.Message != "not paid"):
			t.Fatalf("denied: %+v", r)
		}
	}
}

// Every change of a step, and the run's end, is an event; a change kept again is not.
func TestChangesAreEvents(t *testing.T) {
	was := &Run{RunID: "r", Blueprint: "b", Version: 1, Status: Running, Steps: []StepRun{{ID: "0", Tool: "t", Status: StepRunning}, {ID: "1", Tool: "u", Status: StepPending}}}
	now := &Run{RunID: "r", Blueprint: "b", Version: 1, Status: Succeeded, Steps: []StepRun{{ID: "0", Tool: "t", Status: StepSucceeded}, {ID: "1", Tool: "u", Status: StepSkipped,
		Condition: &Condition{Expr: "$.a == 1", Values: map[string]any{"$.a": 2.0}}}}}
	ev := changes(was, now)
	if len(ev) != 3 || ev[0].Status != "succeeded" || ev[1].Status != "skipped" || string(ev[1].Condition.Values) != `{"$.a":2}` || ev[2].Step != "" || ev[2].Status != "succeeded" {
		t.Fatalf("%+v", ev)
	}
	if ev := changes(now, now); len(ev) != 0 {
		t.Fatalf("no change, yet %+v", ev)
	}
}

// resume rewinds run id as if its runner died before keeping what follows step ids' ends:
// those steps are running again, the run running, its holder gone.
func resume(t *testing.T, runs *Runs, id string, ids ...string) {
	t.Helper()
	r, rev, err := runs.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, sid := range ids {
		st := r.Step(sid)
		st.Status, st.Output, st.Error, st.EndedAt = StepRunning, nil, nil, nil
	}
	r.Status, r.FinishedAt, r.Error, r.Fallback = Running, nil, nil, nil
	r.Holder, r.LeaseUntil = "dead", time.Now().Add(-time.Second)
	if _, err := runs.Update(t.Context(), r, rev); err != nil {
		t.Fatal(err)
	}
}

// A parallel group resumed with one member ended and one not asks for the same request again
// (not one of the unfinished member alone, which its id would refuse): nothing runs twice.
func TestResumedGroupAsksTheSameRequest(t *testing.T) {
	b := compile(t, `{"name":"b","steps":[{"parallel":[{"tool":"a","output_key":"a"},{"tool":"b","output_key":"b"}]}]}`)
	tools := newFakeTools(func(c protocol.ToolCall, _ int) protocol.ToolResult { return ok(`{"v":1}`) })
	e, runs := begin(t, b, tools, "r1", `{}`)
	if r := drive(t, e, runs, "r1"); r.Status != Succeeded {
		t.Fatal(r.Status)
	}
	resume(t, runs, "r1", "0.1")
	r := drive(t, &Engine{Runs: runs, Source: source{b}, Submit: tools, Instance: "other", StepWait: 50 * time.Millisecond}, runs, "r1")
	if r.Status != Succeeded || r.Step("0.1").Status != StepSucceeded {
		t.Fatalf("resumed: %+v", r)
	}
	for key, n := range tools.ran {
		if n != 1 {
			t.Errorf("%s ran %d times", key, n)
		}
	}
}

// A step that timed out, and succeeded on its retry, resumed: its first attempt is read back
// as the timeout it was, and the retry's answer is the step's.
func TestResumedTimeoutTakesTheSameRetry(t *testing.T) {
	b := compile(t, `{"name":"b","steps":[{"tool":"slow","output_key":"x","timeout":"50ms","retry":{"max_attempts":2}}]}`)
	tools := newFakeTools(func(c protocol.ToolCall, _ int) protocol.ToolResult { return ok(`{"v":2}`) })
	tools.pending["bpr-r1-s0"] = true
	e, runs := begin(t, b, tools, "r1", `{}`)
	if r := drive(t, e, runs, "r1"); r.Status != Succeeded || r.Steps[0].RequestID != "bpr-r1-s0-r2" {
		t.Fatalf("first: %+v", r)
	}
	resume(t, runs, "r1", "0")
	r := drive(t, &Engine{Runs: runs, Source: source{b}, Submit: tools, Instance: "other", StepWait: 50 * time.Millisecond}, runs, "r1")
	if r.Status != Succeeded || string(r.Steps[0].Output) != `{"v":2}` || tools.ran["bpr-r1-s0-r2/s0"] != 1 {
		t.Fatalf("resumed: %+v %v", r, tools.ran)
	}
}

// A run that outgrows its record ends failed RUN_TOO_LARGE at once: no step after runs, and
// nothing changes it after.
func TestRunTooLargeEnds(t *testing.T) {
	b := compile(t, `{"name":"b","steps":[{"tool":"big","output_key":"x"},{"tool":"next","output_key":"y"}]}`)
	tools := newFakeTools(func(c protocol.ToolCall, _ int) protocol.ToolResult {
		return ok(`{"pad":"` + strings.Repeat("x", 20000) + `"}`)
	})
	e, runs := begin(t, b, tools, "r1", `{}`)
	runs.MaxBytes = 8000
	r := drive(t, e, runs, "r1")
	if r.Status != Failed || r.Error == nil || r.Error.Code != CodeRunTooLarge || r.Steps[0].Status != StepFailed || r.Steps[1].Status != StepNotRun {
		t.Fatalf("%+v %+v", r, r.Steps)
	}
	if n := tools.asked["bpr-r1-s1"]; n != 0 {
		t.Fatalf("the next step was asked for %d times", n)
	}
}

// An approved call whose request was answered without its result (dead-lettered) fails the
// step, instead of waiting for it forever; an approval no longer kept is expired.
func TestApprovedCallWithoutResultFails(t *testing.T) {
	b := compile(t, `{"name":"b","steps":[{"tool":"pay","output_key":"p"}]}`)
	tools := newFakeTools(func(c protocol.ToolCall, _ int) protocol.ToolResult {
		r := fail(protocol.CodeApprovalRequired)
		r.Policy = &protocol.PolicyDecision{Decision: protocol.PolicyParked, ApprovalID: "apr-1"}
		return r
	})
	tools.answers["apr-1"] = &protocol.Response{RequestID: "apr-1", Error: &protocol.ResponseError{Code: protocol.CodeDeadLettered, Message: "gave up"}}
	apr := &approvalsOf{m: map[string]*approvals.Approval{"apr-1": {ID: "apr-1", SessionID: "bpr-r1", ToolCallID: "c1", Tool: "pay",
		Arguments: json.RawMessage(`{}`), State: approvals.Approved}}}
	e, runs := begin(t, b, tools, "r1", `{}`)
	e.Approvals = apr
	if r := drive(t, e, runs, "r1"); r.Status != Failed || r.Steps[0].Error.Code != protocol.CodeInternal {
		t.Fatalf("%+v %+v", r, r.Steps[0].Error)
	}
	e2, runs2 := begin(t, b, newFakeTools(tools.answer), "r2", `{}`)
	e2.Approvals = &approvalsOf{m: map[string]*approvals.Approval{}}
	if r := drive(t, e2, runs2, "r2"); r.Status != Failed || r.Steps[0].Error.Code != protocol.CodeApprovalExpired {
		t.Fatalf("%+v %+v", r, r.Steps[0].Error)
	}
}

// Numbers pass from step to step as written: an id of 19 digits is not rounded, and a
// condition compares numbers from the context with literals.
func TestNumbersPassAsWritten(t *testing.T) {
	b := compile(t, `{"name":"b","steps":[{"tool":"a","input_mapping":{"id":"$.user_input.id"},"output_key":"a"},
		{"tool":"b","input_mapping":{"id":"$.a.id","n":"$.a.n"},"condition":"$.a.n >= 50 && $.a.id != null","output_key":"b"}]}`)
	tools := newFakeTools(func(c protocol.ToolCall, _ int) protocol.ToolResult {
		if c.Name == "a" {
			return ok(`{"id":1234567890123456789,"n":73}`)
		}
		return ok(string(c.Arguments))
	})
	e, runs := begin(t, b, tools, "r1", `{"id":1234567890123456789}`)
	r := drive(t, e, runs, "r1")
	if r.Status != Succeeded || string(r.Steps[0].Input) != `{"id":1234567890123456789}` || string(r.Steps[1].Input) != `{"id":1234567890123456789,"n":73}` {
		t.Fatalf("%+v", r.Steps)
	}
}

// A group resumed after a later round: a member that ended in round 2 is asked for again in
// round 2, as it was, so the round's request is the same.
func TestResumedGroupAsksTheSameRounds(t *testing.T) {
	b := compile(t, `{"name":"b","steps":[{"parallel":[{"tool":"a","output_key":"a","retry":{"max_attempts":3}},{"tool":"b","output_key":"b","retry":{"max_attempts":3}}]}]}`)
	tries := map[string]int{}
	tools := newFakeTools(func(c protocol.ToolCall, _ int) protocol.ToolResult {
		tries[c.Name]++
		switch {
		case tries[c.Name] == 1, c.Name == "b" && tries[c.Name] == 2:
			return fail(protocol.CodeToolHTTP5xx)
		}
		return ok(`{"v":1}`)
	})
	e, runs := begin(t, b, tools, "r1", `{}`)
	if r := drive(t, e, runs, "r1"); r.Status != Succeeded || r.Step("0.1").Attempts != 3 || r.Step("0.0").Attempts != 2 {
		t.Fatalf("first: %+v", r.Steps)
	}
	resume(t, runs, "r1", "0.1")
	r := drive(t, &Engine{Runs: runs, Source: source{b}, Submit: tools, Instance: "other", StepWait: 50 * time.Millisecond}, runs, "r1")
	if r.Status != Succeeded || r.Step("0.1").Status != StepSucceeded {
		t.Fatalf("resumed: %+v", r.Steps)
	}
	for key, n := range tools.ran {
		if n != 1 {
			t.Errorf("%s ran %d times", key, n)
		}
	}
}
