package whatif

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/pkg/blueprint"
)

// checkAndUrge is the seed's blueprint; edit changes its text before it is compiled.
const checkAndUrge = `{
  "name": "check_and_urge",
  "steps": [
    {"tool": "order_query", "input_mapping": {"order_id": "$.user_input.order_id"}, "output_key": "order_data"},
    {"tool": "logistics_urge",
     "input_mapping": {"order_id": "$.order_data.success.order_id", "reason": "用户咨询发货进度"},
     "condition": "($.order_data.success.status == 'created' || $.order_data.success.status == 'paid')",
     "output_key": "urge_result"}
  ],
  "fallback": {"message": "订单状态异常，已转人工客服", "transfer_to": "human_agent"}
}`

func compiled(t *testing.T, doc string, edits ...string) *blueprint.Blueprint {
	t.Helper()
	for i := 0; i < len(edits); i += 2 {
		if !strings.Contains(doc, edits[i]) {
			t.Fatalf("the blueprint has no %q", edits[i])
		}
		doc = strings.Replace(doc, edits[i], edits[i+1], 1)
	}
	bp, err := blueprint.Load([]byte(doc), nil)
	if err != nil {
		t.Fatal(err)
	}
	return bp
}

const urgeCondition = "($.order_data.success.status == 'created' || $.order_data.success.status == 'paid')"

// orderRun is a recorded run of check_and_urge for an order of status: the urge step ran for
// a paid order and was skipped for a shipped one; an unknown order's query failed and the run
// was transferred.
func orderRun(id, order, status string) *blueprints.Run {
	r := &blueprints.Run{RunID: id, Blueprint: "check_and_urge", Version: 1, SessionID: "bpr-" + id,
		UserInput: json.RawMessage(`{"order_id":"` + order + `"}`), Status: blueprints.Succeeded}
	query := blueprints.StepRun{ID: "0", Tool: "order_query", OutputKey: "order_data", Status: blueprints.StepSucceeded,
		Input: json.RawMessage(`{"order_id":"` + order + `"}`), Output: json.RawMessage(`{"success":{"order_id":"` + order + `","status":"` + status + `"}}`)}
	urge := blueprints.StepRun{ID: "1", Tool: "logistics_urge", OutputKey: "urge_result"}
	cond := &blueprints.Condition{Expr: urgeCondition, Values: map[string]any{"$.order_data.success.status": status}}
	switch status {
	case "paid":
		cond.Result = true
		urge.Status, urge.Condition = blueprints.StepSucceeded, cond
		urge.Input = json.RawMessage(`{"order_id":"` + order + `","reason":"用户咨询发货进度"}`)
		urge.Output = json.RawMessage(`{"success":{"ticket":"URG-1"}}`)
	case "shipped":
		urge.Status, urge.Condition, urge.Output = blueprints.StepSkipped, cond, json.RawMessage("null")
	default:
		query.Status, query.Output = blueprints.StepFailed, nil
		query.Error = &blueprints.StepError{Code: "NOT_FOUND", Message: "no such order"}
		urge.Status = blueprints.StepNotRun
		r.Status = blueprints.Transferred
		r.Fallback = &blueprints.FallbackTaken{Step: "0", Message: "订单状态异常，已转人工客服", TransferTo: "human_agent"}
	}
	r.Steps = []blueprints.StepRun{query, urge}
	return r
}

func paths(rep *RunReport) []string {
	var out []string
	for _, p := range rep.Changed {
		s := "run " + p.RunID + ": "
		if p.Step != "" {
			s += "step " + p.Step + " " + p.Tool + ": "
		} else {
			s += "end: "
		}
		out = append(out, s+p.Reason)
	}
	return out
}

// Each recorded run is walked again along the new blueprint with its recorded answers: a
// condition that now holds for a skipped step, a changed mapping, a step the run never
// called, a step no longer there and a changed fallback part the paths, each where they
// first part; a run walked alike is not reported.
func TestCompareRuns(t *testing.T) {
	t.Parallel()
	runs := []*blueprints.Run{orderRun("cu-paid", "O1", "paid"), orderRun("cu-shipped", "O2", "shipped"), orderRun("cu-unknown", "O3", "unknown")}
	for _, c := range []struct {
		name  string
		edits []string
		want  []string
	}{
		{name: "the same blueprint"},
		{name: "shipped orders urged too", edits: []string{"== 'paid')", "== 'paid' || $.order_data.success.status == 'shipped')"},
			want: []string{`run cu-shipped: step 1 logistics_urge: recorded skipped (condition false: $.order_data.success.status = "shipped"), now runs (condition true)`}},
		{name: "no order urged", edits: []string{"'created' ||", "'none' &&"},
			want: []string{`run cu-paid: step 1 logistics_urge: recorded ran, now skipped (condition false: $.order_data.success.status = "paid")`}},
		{name: "another reason", edits: []string{"用户咨询发货进度", "催单"},
			want: []string{`run cu-paid: step 1 logistics_urge: recorded a call with {"order_id":"O1","reason":"用户咨询发货进度"}, now the call would get {"order_id":"O1","reason":"催单"}; its answer is unknown`}},
		{name: "a new step", edits: []string{`"output_key": "order_data"},`, `"output_key": "order_data"}, {"tool": "notify_send", "input_mapping": {"text": "$.order_data.success.status"}},`},
			want: []string{
				"run cu-paid: step 1 notify_send: would call notify_send, which the run did not; its answer is unknown",
				"run cu-shipped: step 1 notify_send: would call notify_send, which the run did not; its answer is unknown",
			}},
		{name: "another hand-off", edits: []string{`"transfer_to": "human_agent"`, `"transfer_to": "supervisor"`},
			want: []string{`run cu-unknown: end: recorded transferred to human_agent ("订单状态异常，已转人工客服"), now transferred to supervisor ("订单状态异常，已转人工客服")`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep := CompareRuns(compiled(t, checkAndUrge, c.edits...), runs)
			if rep.Runs != 3 || strings.Join(paths(rep), "\n") != strings.Join(c.want, "\n") {
				t.Fatalf("%d runs compared; changed:\n%s\nwant:\n%s", rep.Runs, strings.Join(paths(rep), "\n"), strings.Join(c.want, "\n"))
			}
		})
	}
}

// A step no longer in the blueprint parts the paths of the runs that ran it.
func TestCompareRunsStepRemoved(t *testing.T) {
	t.Parallel()
	bp := compiled(t, `{"name": "check_and_urge", "steps": [
  {"tool": "order_query", "input_mapping": {"order_id": "$.user_input.order_id"}, "output_key": "order_data"}],
  "fallback": {"message": "订单状态异常，已转人工客服", "transfer_to": "human_agent"}}`)
	rep := CompareRuns(bp, []*blueprints.Run{orderRun("cu-paid", "O1", "paid"), orderRun("cu-shipped", "O2", "shipped")})
	got := strings.Join(paths(rep), "\n")
	want := "run cu-paid: step 1 logistics_urge: recorded ran, now not run (the blueprint has no step of this tool and output_key)\n" +
		`run cu-shipped: step 1 logistics_urge: recorded skipped (condition false: $.order_data.success.status = "shipped"), now not run (the blueprint has no step of this tool and output_key)`
	if got != want {
		t.Fatalf("changed:\n%s", got)
	}
}

// A failed call takes the step's fallback step, which stands in for it, as the engine does;
// the same blueprint walks it alike, and a fallback step that now reads another value does
// not. Runs still going, runs of other blueprints and unreadable runs are not compared.
func TestCompareRunsFallbackStep(t *testing.T) {
	t.Parallel()
	doc := `{"name": "lookup", "steps": [
  {"tool": "order_query", "input_mapping": {"order_id": "$.user_input.order_id"}, "output_key": "order_data",
   "fallback": {"step": {"tool": "order_archive", "input_mapping": {"order_id": "$.user_input.order_id"}, "output_key": "archived"}}},
  {"tool": "notify_send", "input_mapping": {"text": "$.user_input.order_id"}, "output_key": "sent"}]}`
	run := &blueprints.Run{RunID: "lk-1", Blueprint: "lookup", Version: 1, UserInput: json.RawMessage(`{"order_id":"O9"}`), Status: blueprints.Succeeded,
		Steps: []blueprints.StepRun{
			{ID: "0", Tool: "order_query", OutputKey: "order_data", Status: blueprints.StepFailed, Input: json.RawMessage(`{"order_id":"O9"}`),
				Error: &blueprints.StepError{Code: "UPSTREAM_ERROR", Message: "down"}},
			{ID: "1", Tool: "notify_send", OutputKey: "sent", Status: blueprints.StepSucceeded, Input: json.RawMessage(`{"text":"O9"}`), Output: json.RawMessage(`true`)},
			{ID: "0.fallback", Tool: "order_archive", OutputKey: "archived", Status: blueprints.StepSucceeded, Fallback: true,
				Input: json.RawMessage(`{"order_id":"O9"}`), Output: json.RawMessage(`{"status":"old"}`)},
		}}
	going := &blueprints.Run{RunID: "lk-2", Blueprint: "lookup", Version: 1, UserInput: json.RawMessage(`{}`), Status: blueprints.Running}
	other := &blueprints.Run{RunID: "x-1", Blueprint: "other", Version: 1, UserInput: json.RawMessage(`{}`), Status: blueprints.Succeeded}
	bad := &blueprints.Run{RunID: "lk-3", Blueprint: "lookup", Version: 1, UserInput: json.RawMessage(`{`), Status: blueprints.Succeeded}
	runs := []*blueprints.Run{run, going, other, bad}

	rep := CompareRuns(compiled(t, doc), runs)
	if rep.Runs != 1 || len(rep.Changed) != 0 || len(rep.Unfinished) != 1 || rep.Unfinished[0] != "lk-2" || rep.Unreadable != 1 {
		t.Fatalf("the same blueprint: %+v", rep)
	}
	rep = CompareRuns(compiled(t, doc, `"order_archive", "input_mapping": {"order_id": "$.user_input.order_id"}`, `"order_archive", "input_mapping": {"id": "$.user_input.order_id"}`), runs)
	want := `run lk-1: step 0.fallback order_archive: recorded a call with {"order_id":"O9"}, now the call would get {"id":"O9"}; its answer is unknown`
	if got := strings.Join(paths(rep), "\n"); got != want {
		t.Fatalf("another mapping:\n%s", got)
	}
	// Without the fallback step, the failure ends the run.
	rep = CompareRuns(compiled(t, doc, `,
   "fallback": {"step": {"tool": "order_archive", "input_mapping": {"order_id": "$.user_input.order_id"}, "output_key": "archived"}}`, ""), runs)
	want = "run lk-1: step 1 notify_send: recorded ran, now not run (the run ends before it)"
	if got := strings.Join(paths(rep), "\n"); got != want {
		t.Fatalf("no fallback step:\n%s", got)
	}
}

// A parallel group whose condition is false skips its members with their defaults, which
// later steps read: a changed default_value changes what they would be called with.
func TestCompareRunsGroupDefaults(t *testing.T) {
	t.Parallel()
	doc := `{"name": "g", "steps": [
  {"condition": "$.user_input.deep == true", "parallel": [
    {"tool": "a_tool", "output_key": "a", "default_value": "none"},
    {"tool": "b_tool", "output_key": "b"}]},
  {"tool": "c_tool", "input_mapping": {"a": "$.a"}, "output_key": "c"}]}`
	cond := &blueprints.Condition{Expr: "$.user_input.deep == true", Values: map[string]any{"$.user_input.deep": false}}
	run := &blueprints.Run{RunID: "g-1", Blueprint: "g", Version: 1, UserInput: json.RawMessage(`{"deep":false}`), Status: blueprints.Succeeded,
		Steps: []blueprints.StepRun{
			{ID: "0.0", Tool: "a_tool", OutputKey: "a", Status: blueprints.StepSkipped, Condition: cond, Output: json.RawMessage(`"none"`)},
			{ID: "0.1", Tool: "b_tool", OutputKey: "b", Status: blueprints.StepSkipped, Condition: cond, Output: json.RawMessage(`null`)},
			{ID: "1", Tool: "c_tool", OutputKey: "c", Status: blueprints.StepSucceeded, Input: json.RawMessage(`{"a":"none"}`), Output: json.RawMessage(`1`)},
		}}
	if rep := CompareRuns(compiled(t, doc), []*blueprints.Run{run}); rep.Runs != 1 || len(rep.Changed) != 0 {
		t.Fatalf("the same blueprint: %v", paths(rep))
	}
	rep := CompareRuns(compiled(t, doc, `"default_value": "none"`, `"default_value": "-"`), []*blueprints.Run{run})
	want := `run g-1: step 1 c_tool: recorded a call with {"a":"none"}, now the call would get {"a":"-"}; its answer is unknown`
	if got := strings.Join(paths(rep), "\n"); got != want {
		t.Fatalf("another default:\n%s", got)
	}
}
