package blueprints

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// What the doors that run blueprints share: the run a door asks for (Ask), why one was refused
// (Refusal), and how a run is told to whoever ran it as a tool (Outcome).

// Ask is a run a door asks for.
type Ask struct {
	Name string
	// RunID makes it idempotent ("": a new run).
	RunID     string
	UserInput json.RawMessage
	Trace     protocol.TraceContext
	// Wait is how long to wait for the run to end (0: not at all).
	Wait time.Duration
}

// Refusal is why a run was not begun, as a door answers it: an HTTP status, Hermes' code and a
// message for the caller.
type Refusal struct {
	Status     int
	Code       string
	Message    string
	RetryAfter time.Duration
}

func (e *Refusal) Error() string { return e.Message }

// Outcome is a run as told to whoever ran it as a tool (MCP's tools/call, the chat loop's tool
// message): where it stands, each step's output by its output_key, and once a fallback ended
// it, the fallback's message and hand-off and the step whose failure took it; while it goes
// on, where to follow it.
type Outcome struct {
	RunID     string `json:"run_id"`
	Blueprint string `json:"blueprint"`
	Status    Status `json:"status"`
	// Outputs are the outputs of the steps that succeeded or were skipped (their
	// default_value, or null), by output_key.
	Outputs map[string]json.RawMessage `json:"outputs,omitempty"`
	// Message and TransferTo are the fallback's, once taken.
	Message    string `json:"message,omitempty"`
	TransferTo string `json:"transfer_to,omitempty"`
	// FailedStep names the step whose failure ended the run ("0 (order_query)"), and Error
	// says why.
	FailedStep string `json:"failed_step,omitempty"`
	Error      string `json:"error,omitempty"`
	// ApprovalID names the approval a step of a run waiting_approval waits on.
	ApprovalID string `json:"approval_id,omitempty"`
	// Follow is where a run that goes on is followed: GET /v1/runs/{run_id}.
	Follow string `json:"follow,omitempty"`
}

// Outcome is r as told to whoever ran it as a tool.
func (r *Run) Outcome() Outcome {
	o := Outcome{RunID: r.RunID, Blueprint: r.Blueprint, Status: r.Status}
	for i := range r.Steps {
		s := &r.Steps[i]
		switch {
		case s.OutputKey != "" && (s.Status == StepSucceeded || s.Status == StepSkipped):
			if o.Outputs == nil {
				o.Outputs = map[string]json.RawMessage{}
			}
			out := s.Output
			if len(out) == 0 {
				out = json.RawMessage("null")
			}
			o.Outputs[s.OutputKey] = out
		case s.Status == StepParked && o.ApprovalID == "":
			o.ApprovalID = s.ApprovalID
		}
	}
	if fb := r.Fallback; fb != nil {
		o.Message, o.TransferTo = fb.Message, fb.TransferTo
	}
	if e := r.Error; e != nil && r.Status != Succeeded {
		o.Error = e.Message
		if e.Step != "" {
			o.FailedStep = e.Step
			if s := r.Step(e.Step); s != nil {
				o.FailedStep = fmt.Sprintf("%s (%s)", e.Step, s.Tool)
			}
		}
	}
	if !r.Status.Final() {
		o.Follow = "GET /v1/runs/" + r.RunID
	}
	return o
}

// JSON is o as a JSON object.
func (o Outcome) JSON() json.RawMessage {
	data, _ := json.Marshal(o)
	return data
}

// Code is Hermes' code for a run that did not succeed: BLUEPRINT_TRANSFERRED, BLUEPRINT_FAILED,
// or BLUEPRINT_RUNNING while it goes on; "" once it succeeded.
func (o Outcome) Code() string {
	switch o.Status {
	case Succeeded:
		return ""
	case Transferred:
		return CodeTransferred
	case Failed:
		return CodeFailed
	}
	return CodeRunning
}

// Codes of a run told to whoever ran it as a tool (Outcome.Code).
const (
	CodeTransferred = "BLUEPRINT_TRANSFERRED"
	CodeFailed      = "BLUEPRINT_FAILED"
	CodeRunning     = "BLUEPRINT_RUNNING"
)

// Summary is o in a sentence, for a person or a model: what the run came to, and what to do
// next.
func (o Outcome) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "blueprint %s, run %s: %s", o.Blueprint, o.RunID, o.Status)
	switch {
	case o.Error != "": // it names the step
		fmt.Fprintf(&b, "; %s", o.Error)
	case o.FailedStep != "":
		fmt.Fprintf(&b, "; step %s failed", o.FailedStep)
	}
	if o.Message != "" {
		fmt.Fprintf(&b, "; %s", o.Message)
	}
	if o.TransferTo != "" {
		fmt.Fprintf(&b, "; handed to %s", o.TransferTo)
	}
	if o.ApprovalID != "" {
		fmt.Fprintf(&b, "; a step waits on approval %s", o.ApprovalID)
	}
	if o.Follow != "" {
		fmt.Fprintf(&b, "; it goes on: follow it at %s", o.Follow)
	}
	return b.String()
}
