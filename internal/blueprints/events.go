package blueprints

import (
	"context"
	"encoding/json"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Publisher publishes a run's events on the record.
type Publisher interface {
	Publish(ctx context.Context, subject string, m *protocol.Message) error
}

// changes are the events of a run's change from was to now: each step whose status changed,
// and the run once it ends. A step's event id names its status, so that a change published
// again (a run resumed) is recorded once.
func changes(was, now *Run) []*protocol.BlueprintStep {
	var out []*protocol.BlueprintStep
	for i := range now.Steps {
		s := &now.Steps[i]
		if s.Status == StepPending || s.Status == StepNotRun {
			continue
		}
		if old := was.Step(s.ID); old != nil && old.Status == s.Status {
			continue
		}
		ev := &protocol.BlueprintStep{RunID: now.RunID, Blueprint: now.Blueprint, Version: now.Version, Step: s.ID, Tool: s.Tool,
			Status: string(s.Status), RequestID: s.RequestID, ToolCallID: s.ToolCallID, ApprovalID: s.ApprovalID, DurationMS: s.DurationMS, At: now.UpdatedAt}
		if c := s.Condition; c != nil {
			values, _ := json.Marshal(c.Values)
			if len(values) > protocol.MaxConditionValuesBytes {
				values = nil
			}
			ev.Condition = &protocol.StepCondition{Expr: protocol.Shorten(c.Expr, protocol.MaxBlueprintTextBytes), Result: c.Result, Values: values}
		}
		if s.Error != nil {
			ev.ErrorCode, ev.Error = protocol.Shorten(s.Error.Code, 64), protocol.Shorten(s.Error.Message, protocol.MaxBlueprintTextBytes)
		}
		out = append(out, ev)
	}
	if now.Status.Final() && !was.Status.Final() {
		ev := &protocol.BlueprintStep{RunID: now.RunID, Blueprint: now.Blueprint, Version: now.Version, Status: string(now.Status), At: now.UpdatedAt}
		if fb := now.Fallback; fb != nil {
			ev.Message, ev.TransferTo = protocol.Shorten(fb.Message, protocol.MaxBlueprintTextBytes), fb.TransferTo
		}
		if re := now.Error; re != nil {
			ev.ErrorCode, ev.Error = protocol.Shorten(re.Code, 64), protocol.Shorten(re.Message, protocol.MaxBlueprintTextBytes)
		}
		out = append(out, ev)
	}
	return out
}

// publish records the events of r's change from was.
func (e *Engine) publish(ctx context.Context, was, r *Run) {
	if e.Events == nil {
		return
	}
	for _, ev := range changes(was, r) {
		m, err := protocol.NewMessage(protocol.TypeBlueprintStep, ev)
		if err != nil {
			e.log().Warn("a blueprint step's event", "run_id", r.RunID, "err", err)
			continue
		}
		step := "run"
		if ev.Step != "" {
			step = RequestStep(ev.Step)
		}
		m.MsgID = protocol.MsgIDBlueprintStep(r.RunID, ev.Step, ev.Status)
		m.RequestID, m.SessionID, m.Caller, m.Trace = protocol.RunRequestID(r.RunID, step), r.SessionID, r.Caller, r.Trace
		if ev.RequestID != "" {
			m.RequestID = ev.RequestID
		}
		if err := e.Events.Publish(ctx, protocol.SubjectEvent(protocol.EventBlueprint, r.SessionID), m); err != nil {
			e.log().Warn("record a blueprint step's event", "run_id", r.RunID, "step", ev.Step, "status", ev.Status, "err", err)
		}
	}
}
