package whatif

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/pkg/blueprint"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Codes a step fails with before its call, as the engine gives them.
const (
	codeMissing   = blueprints.CodeMissingValue
	codeCondition = blueprints.CodeCondition
)

// RunPath is a recorded run that would take another path under a new blueprint: where the
// paths part first, and why.
type RunPath struct {
	RunID     string
	Version   int // the blueprint's version the run ran
	CreatedAt time.Time
	// Step is the id of the step where the paths part (the new blueprint's; the recorded
	// run's for a step the new path does not reach), empty when they part only at the run's
	// end; Tool is its tool.
	Step, Tool string
	// Reason says how the paths part, naming what was recorded and what would be now.
	Reason string
}

// RunReport is the outcome of [CompareRuns].
type RunReport struct {
	// Runs counts the finished runs compared.
	Runs int
	// Changed are the runs that would take another path, in the order given.
	Changed []RunPath
	// Unfinished are the ids of runs still going (pending, running or waiting for an
	// approval): they are not compared.
	Unfinished []string
	// Unreadable counts runs whose user_input or a step's output could not be read; they are
	// not compared.
	Unreadable int
}

// CompareRuns walks bp (compiled) again for each recorded run of the blueprint bp names (runs
// of other blueprints are ignored) and reports the runs that would take another path. It
// calls no tool: a step that would run takes the answer the recorded run got from a step of
// the same tool and output_key, when that step was called with the same arguments.
//
// The walk is the engine's: the run context starts as the run's user_input; a step whose
// condition is false is skipped and its output_key holds its default_value; a step whose
// condition cannot be evaluated, or whose mapping finds nothing, fails before its call; a
// step's failure takes its fallback (its group's, or the blueprint's), as the engine would.
// Steps are matched with the recorded ones by tool and output_key, not by place, so a step
// moved or renumbered is the same step. The paths part at the first step whose fate differs
// (ran, skipped, failed, or not run at all), at a step that would call its tool with other
// arguments than recorded (its answer is unknown, so the walk stops there), at a step that
// would call a tool the run did not call, at a recorded step the new path never reaches, or,
// when every step agrees, at the run's end (succeeded, failed or transferred, and the
// fallback's message and transfer_to).
func CompareRuns(bp *blueprint.Blueprint, runs []*blueprints.Run) *RunReport {
	rep := &RunReport{}
	for _, r := range runs {
		if r.Blueprint != bp.Name {
			continue
		}
		if !r.Status.Final() {
			rep.Unfinished = append(rep.Unfinished, r.RunID)
			continue
		}
		p, err := walkRun(bp, r)
		if err != nil {
			rep.Unreadable++
			continue
		}
		rep.Runs++
		if p != nil {
			rep.Changed = append(rep.Changed, *p)
		}
	}
	return rep
}

// recStep is one step of a recorded run that ran, was skipped or failed.
type recStep struct {
	*blueprints.StepRun
	used bool
}

// called reports whether the step's tool was called (its result, good or bad, is known).
func (s *recStep) called() bool {
	return len(s.Input) > 0 && (s.Status == blueprints.StepSucceeded || s.Status == blueprints.StepFailed)
}

// outcome is what becomes of a step on the new path.
type outcome struct {
	skipped bool
	cond    *blueprint.Eval // nil: the step has no condition
	// code and msg are set when the step fails (before its call, or as recorded).
	code, msg string
	in        json.RawMessage
}

// failure is a step that failed for good on the new path.
type failure struct {
	step *blueprint.Step
	// via is the group whose fallback the step takes.
	via *blueprint.Step
}

// walk is one recorded run walked along the new blueprint.
type walk struct {
	bp    *blueprint.Blueprint
	run   *blueprints.Run
	steps []*recStep
	ctx   map[string]any
	// lastUsed is the recorded step compare matched last (nil: none).
	lastUsed *recStep
	// parted is set where the paths part; the walk stops there.
	parted *RunPath
	// status, message and transfer are the new path's end.
	status            blueprints.Status
	message, transfer string
}

// errUnreadable: the run's record cannot be read back into a context.
var errUnreadable = errors.New("unreadable run")

// walkRun walks bp for r: nil when r would take the same path.
func walkRun(bp *blueprint.Blueprint, r *blueprints.Run) (*RunPath, error) {
	w := &walk{bp: bp, run: r, ctx: map[string]any{}}
	var in any
	if err := json.Unmarshal(r.UserInput, &in); err != nil {
		return nil, errUnreadable
	}
	w.ctx[blueprint.UserInput] = in
	for i := range r.Steps {
		s := &r.Steps[i]
		switch s.Status {
		case blueprints.StepSucceeded, blueprints.StepFailed, blueprints.StepSkipped:
			w.steps = append(w.steps, &recStep{StepRun: s})
		}
	}
	if err := w.walk(); err != nil {
		return nil, err
	}
	if w.parted != nil {
		return w.parted, nil
	}
	for _, s := range w.steps {
		if !s.used {
			why := "the run ends before it"
			if !hasStep(bp, s.Tool, s.OutputKey) {
				why = "the blueprint has no step of this tool and output_key"
			}
			return w.part(s.ID, s.Tool, "recorded %s, now not run (%s)", was(s), why), nil
		}
	}
	if r.Status != w.status || r.Status != blueprints.Succeeded && (fallbackMessage(r) != w.message || fallbackTransfer(r) != w.transfer) {
		return w.part("", "", "recorded %s, now %s", ending(r.Status, fallbackMessage(r), fallbackTransfer(r)), ending(w.status, w.message, w.transfer)), nil
	}
	return nil, nil
}

func fallbackMessage(r *blueprints.Run) string {
	if r.Fallback == nil {
		return ""
	}
	return r.Fallback.Message
}

func fallbackTransfer(r *blueprints.Run) string {
	if r.Fallback == nil {
		return ""
	}
	return r.Fallback.TransferTo
}

// part notes where the paths part and returns it.
func (w *walk) part(step, tool, format string, a ...any) *RunPath {
	w.parted = &RunPath{RunID: w.run.RunID, Version: w.run.Version, CreatedAt: w.run.CreatedAt, Step: step, Tool: tool, Reason: fmt.Sprintf(format, a...)}
	return w.parted
}

// walk runs the new blueprint's nodes, as the engine's run does, until its end or until the
// paths part.
func (w *walk) walk() error {
	for _, n := range w.bp.Nodes() {
		var failed []failure
		var err error
		if len(n.Group) > 0 {
			failed, err = w.group(n.Step, n.Group)
		} else {
			failed, err = w.run1([]*blueprint.Step{n.Step})
		}
		if err != nil || w.parted != nil {
			return err
		}
		for _, f := range failed {
			done, err := w.fallback(w.bp.Fallback, f)
			if err != nil || done || w.parted != nil {
				return err
			}
		}
	}
	w.status = blueprints.Succeeded
	return nil
}

// group walks a parallel group: its condition false skips every member.
func (w *walk) group(g *blueprint.Step, members []*blueprint.Step) ([]failure, error) {
	if g.Condition != "" {
		ev, err := g.Allowed(w.ctx)
		if err != nil {
			// The group fails before any member runs: its members were not run.
			for _, m := range members {
				if s := w.match(m); s != nil {
					w.part(m.ID(), m.Tool, "recorded %s, now not run (its group's condition cannot be evaluated: %v)", was(s), err)
					return nil, nil
				}
			}
			return []failure{{step: g}}, nil
		}
		if !ev.Result {
			for _, m := range members {
				if !w.compare(m, outcome{skipped: true, cond: &ev}) {
					return nil, nil
				}
				w.set(m.OutputKey, m.Default())
			}
			return nil, nil
		}
	}
	failed, err := w.run1(members)
	for i := range failed {
		if failed[i].step.Fallback == nil && g.Fallback != nil {
			failed[i].via = g
		}
	}
	return failed, err
}

// run1 walks steps (one, or a group's members) together: every condition and mapping reads
// the context as it was before them.
func (w *walk) run1(steps []*blueprint.Step) ([]failure, error) {
	var failed []failure
	outputs := map[string]any{}
	for _, s := range steps {
		o := outcome{}
		ev, err := s.Allowed(w.ctx)
		switch {
		case err != nil:
			o.code, o.msg = codeCondition, err.Error()
		case s.Condition != "":
			o.cond = &ev
		}
		if err == nil && !ev.Result {
			o.skipped = true
		}
		if o.code == "" && !o.skipped {
			in, err := s.Inputs(w.ctx)
			if err != nil {
				o.code, o.msg = codeMissing, err.Error()
			}
			o.in = in
		}
		if !w.compare(s, o) {
			return nil, nil
		}
		switch {
		case o.skipped:
			if s.OutputKey != "" {
				outputs[s.OutputKey] = s.Default()
			}
		case o.code != "":
			failed = append(failed, failure{step: s})
		default:
			// The recorded call, with the same arguments: its answer is the new path's.
			st := w.lastUsed
			if st.Status == blueprints.StepFailed {
				failed = append(failed, failure{step: s})
				continue
			}
			if s.OutputKey != "" {
				var v any
				if len(st.Output) > 0 {
					if err := json.Unmarshal(st.Output, &v); err != nil {
						return nil, errUnreadable
					}
				}
				outputs[s.OutputKey] = v
			}
		}
	}
	for k, v := range outputs {
		w.set(k, v)
	}
	return failed, nil
}

func (w *walk) set(key string, v any) {
	if key != "" {
		w.ctx[key] = v
	}
}

// match is the first recorded step not matched yet of s's tool and output_key, nil when none.
func (w *walk) match(s *blueprint.Step) *recStep {
	for _, r := range w.steps {
		if !r.used && r.Tool == s.Tool && r.OutputKey == s.OutputKey {
			return r
		}
	}
	return nil
}

// compare matches s's new outcome o with the recorded step of its tool and output_key (used
// from then on, and kept in lastUsed), and notes where the paths part: false when they do.
func (w *walk) compare(s *blueprint.Step, o outcome) bool {
	r := w.match(s)
	w.lastUsed = r
	if r != nil {
		r.used = true
	}
	id, tool := s.ID(), s.Tool
	switch {
	case o.skipped:
		if r != nil && r.Status == blueprints.StepSkipped {
			return true
		}
		w.part(id, tool, "recorded %s, now skipped (%s)", was(r), condition(o.cond))
	case o.code != "":
		if r != nil && r.Status == blueprints.StepFailed && !r.called() && r.Error != nil && r.Error.Code == o.code {
			return true
		}
		w.part(id, tool, "recorded %s, now fails before its call (%s: %s)", was(r), o.code, o.msg)
	case r == nil:
		call := tool
		if s.OutputKey != "" {
			call += " for " + s.OutputKey
		}
		w.part(id, tool, "would call %s, which the run did not; its answer is unknown", call)
	case !r.called():
		w.part(id, tool, "recorded %s, now runs (%s)", was(r), condition(o.cond))
	case !sameJSON(r.Input, o.in):
		w.part(id, tool, "recorded a call with %s, now the call would get %s; its answer is unknown", shortJSON(r.Input), shortJSON(o.in))
	default:
		return true
	}
	return false
}

// fallback takes the fallback of a step that failed for good, as the engine does: the step's
// own (or its group's), else the blueprint's (bpFallback). done is set when the run ends.
func (w *walk) fallback(bpFallback *blueprint.Fallback, f failure) (done bool, err error) {
	fb := f.step.Fallback
	if f.via != nil {
		fb = f.via.Fallback
	}
	own := fb != nil
	if !own {
		fb = bpFallback
	}
	if fb == nil {
		w.status = blueprints.Failed
		return true, nil
	}
	if fb.Step != nil {
		failed, err := w.run1([]*blueprint.Step{fb.Step})
		if err != nil || w.parted != nil {
			return true, err
		}
		if own && len(failed) == 0 && fb.Message == "" && fb.TransferTo == "" {
			return false, nil // the fallback step stood in for the step
		}
		if len(failed) > 0 && own {
			return w.fallback(bpFallback, failed[0])
		}
	}
	w.status, w.message, w.transfer = blueprints.Failed, fb.Message, fb.TransferTo
	if fb.TransferTo != "" {
		w.status = blueprints.Transferred
	}
	return true, nil
}

// was says what became of a recorded step.
func was(r *recStep) string {
	switch {
	case r == nil:
		return "not run"
	case r.Status == blueprints.StepSkipped:
		if r.Condition != nil {
			return fmt.Sprintf("skipped (condition false: %s)", values(r.Condition.Values))
		}
		return "skipped"
	case r.Status == blueprints.StepSucceeded:
		return "ran"
	}
	code := ""
	if r.Error != nil {
		code = r.Error.Code
	}
	if r.called() {
		return "ran and failed (" + code + ")"
	}
	return "failed before its call (" + code + ")"
}

// condition says a condition's result on the new path.
func condition(ev *blueprint.Eval) string {
	switch {
	case ev == nil:
		return "no condition"
	case ev.Result:
		return "condition true"
	}
	return "condition false: " + values(ev.Values)
}

// values says the values a condition read: `$.a.b = "x", $.c = 2`, by path.
func values(v map[string]any) string {
	var parts []string
	for _, p := range slices.Sorted(maps.Keys(v)) {
		b, err := json.Marshal(v[p])
		if err != nil {
			b = []byte("?")
		}
		parts = append(parts, p+" = "+shorten(string(b), 80))
	}
	if len(parts) == 0 {
		return "no value read"
	}
	return strings.Join(parts, ", ")
}

// ending says how a run ends.
func ending(status blueprints.Status, message, transfer string) string {
	s := string(status)
	if transfer != "" {
		s += " to " + transfer
	}
	if message != "" {
		s += fmt.Sprintf(" (%q)", shorten(message, 120))
	}
	return s
}

// hasStep reports whether bp has a step, anywhere, of tool and output_key.
func hasStep(bp *blueprint.Blueprint, tool, key string) bool {
	var in func(s *blueprint.Step) bool
	in = func(s *blueprint.Step) bool {
		if s == nil {
			return false
		}
		if !s.IsGroup() && s.Tool == tool && s.OutputKey == key {
			return true
		}
		for i := range s.Parallel {
			if in(&s.Parallel[i]) {
				return true
			}
		}
		return s.Fallback != nil && in(s.Fallback.Step)
	}
	for i := range bp.Steps {
		if in(&bp.Steps[i]) {
			return true
		}
	}
	return bp.Fallback != nil && in(bp.Fallback.Step)
}

// sameJSON reports whether a and b are the same JSON value.
func sameJSON(a, b json.RawMessage) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func shortJSON(b json.RawMessage) string { return shorten(string(b), 200) }

// shorten cuts s to at most n bytes, marking the cut.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return protocol.Shorten(s, n) + "…"
}
