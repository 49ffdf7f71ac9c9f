package blueprints

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestOutcome(t *testing.T) {
	steps := func(ss ...StepRun) []StepRun { return ss }
	for _, c := range []struct {
		name    string
		run     Run
		want    string
		code    string
		summary []string
	}{
		{"succeeded: every output by its key, a skipped step's null",
			Run{RunID: "r1", Blueprint: "b", Status: Succeeded, Steps: steps(
				StepRun{ID: "0", Tool: "order_query", OutputKey: "order_data", Status: StepSucceeded, Output: json.RawMessage(`{"id":1}`)},
				StepRun{ID: "1", Tool: "logistics_urge", OutputKey: "urge_result", Status: StepSkipped},
				StepRun{ID: "2", Tool: "log", Status: StepSucceeded, Output: json.RawMessage(`1`)})},
			`{"run_id":"r1","blueprint":"b","status":"succeeded","outputs":{"order_data":{"id":1},"urge_result":null}}`, "",
			[]string{"run r1: succeeded"}},
		{"transferred: the fallback and the step that failed",
			Run{RunID: "r2", Blueprint: "b", Status: Transferred, Steps: steps(
				StepRun{ID: "0", Tool: "order_query", OutputKey: "order_data", Status: StepFailed},
				StepRun{ID: "1", Tool: "logistics_urge", OutputKey: "urge_result", Status: StepNotRun}),
				Fallback: &FallbackTaken{Step: "0", Message: "to a person", TransferTo: "human_agent"},
				Error:    &RunError{Step: "0", Code: "ORDER_NOT_FOUND", Message: "step 0 (order_query) failed: no such order"}},
			`{"run_id":"r2","blueprint":"b","status":"transferred","message":"to a person","transfer_to":"human_agent","failed_step":"0 (order_query)","error":"step 0 (order_query) failed: no such order"}`,
			CodeTransferred, []string{"step 0 (order_query) failed: no such order", "to a person", "handed to human_agent"}},
		{"waiting: its approval, and where to follow it",
			Run{RunID: "r3", Blueprint: "b", Status: Waiting, Steps: steps(
				StepRun{ID: "0", Tool: "pay", OutputKey: "paid", Status: StepParked, ApprovalID: "apr-1"})},
			`{"run_id":"r3","blueprint":"b","status":"waiting_approval","approval_id":"apr-1","follow":"GET /v1/runs/r3"}`,
			CodeRunning, []string{"approval apr-1", "GET /v1/runs/r3"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := c.run.Outcome()
			if got := string(o.JSON()); got != c.want {
				t.Errorf("\n got %s\nwant %s", got, c.want)
			}
			if o.Code() != c.code {
				t.Errorf("code %q, want %q", o.Code(), c.code)
			}
			for _, s := range c.summary {
				if !strings.Contains(o.Summary(), s) {
					t.Errorf("the summary %q does not say %q", o.Summary(), s)
				}
			}
		})
	}
}
