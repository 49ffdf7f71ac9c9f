package blueprints

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/hermesbus/hermes/internal/answer"
	"github.com/hermesbus/hermes/internal/approvals"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/internal/versioned"
	"github.com/hermesbus/hermes/pkg/blueprint"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Submitter is what the engine needs of a submit.Submitter: each step is a request.
type Submitter interface {
	Submit(ctx context.Context, sub submit.Submission) (*submit.Outcome, error)
	Cancel(ctx context.Context, requestID string, c submit.Cancellation) (*protocol.Response, bool, error)
}

// ApprovalReader reads the approvals a step's call opens.
type ApprovalReader interface {
	Get(ctx context.Context, id string) (*approvals.Approval, error)
}

// Source gives a blueprint's version, compiled.
type Source interface {
	Compiled(ctx context.Context, name string, version int) (*blueprint.Blueprint, error)
}

// Codes a run's steps fail with besides the results' own.
const (
	// CodeMissingValue: a step's mapping (or condition) found nothing where it needed a value.
	CodeMissingValue = "MISSING_VALUE"
	// CodeCondition: a step's condition could not be evaluated.
	CodeCondition = "CONDITION_ERROR"
	// CodeStepTimeout: the step did not finish within its timeout.
	CodeStepTimeout = "STEP_TIMEOUT"
	// CodeRunTooLarge: the run's context outgrew its bound.
	CodeRunTooLarge = "RUN_TOO_LARGE"
	// CodeBlueprintGone: the run's version of its blueprint is no longer kept.
	CodeBlueprintGone = "BLUEPRINT_UNAVAILABLE"
	// CodeStepConflict: a step's request id was taken by another request.
	CodeStepConflict = "STEP_CONFLICT"
)

// Engine runs blueprint runs durably: each step is a request with an id derived from the run
// id and the step's place, so a run resumed after a crash joins (or reads from the record)
// every step request made before, and a finished step never runs again. A run is held by one
// engine at a time, under a lease it renews; a run whose lease lapses is taken over by any
// engine (Resumer).
type Engine struct {
	Runs      *Runs
	Source    Source
	Submit    Submitter
	Approvals ApprovalReader // nil: a step parked for approval fails
	// Instance names this engine in leases.
	Instance string
	// Lease is how long a run is held without renewal (default 15 s).
	Lease time.Duration
	// StepWait is how long one submission waits for a step's response before it is asked
	// again (default 20 s); Poll how often an approval is looked at (default 1 s).
	StepWait time.Duration
	Poll     time.Duration
	// Events, when set, records each step's change and each run's end on the record
	// (protocol.TypeBlueprintStep).
	Events Publisher
	// Observe, when set, is told each change of a run as it is kept.
	Observe func(r *Run)
	Log     *slog.Logger
	Now     func() time.Time

	mu      sync.Mutex
	active  map[string]bool // runs this engine drives now
	stopped bool            // Wait was called: no run starts
	wg      sync.WaitGroup
}

func (e *Engine) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

// LeaseFor is how long the engine holds a run without renewing it.
func (e *Engine) LeaseFor() time.Duration { return e.lease() }

func (e *Engine) lease() time.Duration {
	if e.Lease > 0 {
		return e.Lease
	}
	return 15 * time.Second
}

func (e *Engine) log() *slog.Logger {
	if e.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return e.Log
}

// Start drives run id in the background unless this engine drives it already; Wait waits for
// every run Start began.
func (e *Engine) Start(ctx context.Context, id string) {
	e.mu.Lock()
	if e.active == nil {
		e.active = map[string]bool{}
	}
	if e.active[id] || e.stopped {
		e.mu.Unlock()
		return
	}
	e.active[id] = true
	e.wg.Add(1) // under mu: never after Wait began
	e.mu.Unlock()
	go func() {
		defer e.wg.Done()
		defer func() {
			e.mu.Lock()
			delete(e.active, id)
			e.mu.Unlock()
		}()
		if err := e.Drive(ctx, id); err != nil && ctx.Err() == nil {
			e.log().Warn("drive a blueprint run", "run_id", id, "err", err)
		}
	}()
}

// Wait waits for the runs Start began to stop (their ctx ended or they finished); Start
// begins none after it.
func (e *Engine) Wait() {
	e.mu.Lock()
	e.stopped = true
	e.mu.Unlock()
	e.wg.Wait()
}

// Active is how many runs this engine drives now.
func (e *Engine) Active() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.active)
}

// held is a run as its holder keeps it: every change written over the last revision.
type held struct {
	e   *Engine
	mu  sync.Mutex
	run *Run
	rev uint64
	// lost is closed when another engine took the run over (or it could not be kept).
	lost   chan struct{}
	lostAt sync.Once
}

// errLost: the run was taken over by another engine.
var errLost = errors.New("the run was taken over by another runner")

// errEnded: the run ended while a change was being kept (it outgrew its record): nothing more
// is done for it.
var errEnded = errors.New("the run has ended")

// change applies f to the run and keeps it (with the lease renewed). A run already ended is
// not changed (errEnded); a change that would outgrow the run's record ends the run instead,
// failed RUN_TOO_LARGE (errEnded). Its events are published once the change is kept, outside
// the lock, so that a slow record never holds the lease's renewal.
func (h *held) change(ctx context.Context, f func(r *Run)) error {
	h.mu.Lock()
	select {
	case <-h.lost:
		h.mu.Unlock()
		return errLost
	default:
	}
	if h.run.Status.Final() {
		h.mu.Unlock()
		return errEnded
	}
	next := *h.run
	next.Steps = append([]StepRun(nil), h.run.Steps...)
	if f != nil {
		f(&next)
	}
	now := h.e.now()
	next.UpdatedAt, next.Holder, next.LeaseUntil = now.UTC(), h.e.Instance, now.Add(h.e.lease()).UTC()
	if next.Status.Final() {
		next.Holder, next.LeaseUntil = "", time.Time{}
	}
	var result error
	for shrunk := 0; ; shrunk++ {
		rev, err := h.e.Runs.Update(ctx, &next, h.rev)
		if errors.Is(err, errRunChanged) {
			h.lostAt.Do(func() { close(h.lost) })
			h.mu.Unlock()
			return errLost
		}
		var big *BoundError
		if errors.As(err, &big) && shrunk < 2 {
			// The run outgrew its record: it fails, without what made it too large (and, if
			// even that does not fit, without its steps' inputs and outputs).
			next = tooLarge(h.run, big, now, shrunk > 0)
			result = errEnded
			continue
		}
		if err != nil {
			h.mu.Unlock()
			return err
		}
		was := h.run
		h.run, h.rev = &next, rev
		h.mu.Unlock()
		h.e.publish(ctx, was, &next)
		if h.e.Observe != nil {
			h.e.Observe(&next)
		}
		return result
	}
}

// tooLarge is run r ended failed RUN_TOO_LARGE: its step in progress failed with it, the steps
// it did not reach not run; bare drops every step's input and output too.
func tooLarge(r *Run, big *BoundError, now time.Time, bare bool) Run {
	next := *r
	next.Steps = append([]StepRun(nil), r.Steps...)
	t := now.UTC()
	next.Status, next.Error = Failed, &RunError{Code: CodeRunTooLarge, Message: big.Error()}
	next.FinishedAt, next.UpdatedAt, next.Holder, next.LeaseUntil = &t, t, "", time.Time{}
	for i := range next.Steps {
		st := &next.Steps[i]
		switch st.Status {
		case StepPending:
			st.Status = StepNotRun
		case StepRunning, StepParked:
			st.Status, st.EndedAt = StepFailed, &t
			st.Error = &StepError{Code: CodeRunTooLarge, Origin: protocol.OriginHermes, Message: big.Error()}
		}
		if bare {
			st.Input, st.Output = nil, nil
			if st.Condition != nil {
				c := *st.Condition
				c.Values = nil
				st.Condition = &c
			}
		}
	}
	if bare {
		next.UserInput = json.RawMessage(`{}`)
	}
	return next
}

// snapshot is the run as last kept.
func (h *held) snapshot() *Run {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.run
}

// Drive takes run id (unless another engine holds it under a live lease) and runs it to its
// end, or until ctx ends or another engine takes it over.
func (e *Engine) Drive(ctx context.Context, id string) error {
	r, rev, err := e.Runs.Get(ctx, id)
	if err != nil {
		return err
	}
	if r.Status.Final() || r.Holder != "" && r.Holder != e.Instance && e.now().Before(r.LeaseUntil) {
		return nil
	}
	h := &held{e: e, run: r, rev: rev, lost: make(chan struct{})}
	if err := h.change(ctx, func(r *Run) {
		if r.Status == Pending {
			r.Status = Running
		}
	}); err != nil {
		if errors.Is(err, errLost) || errors.Is(err, errEnded) {
			return nil // another engine took it first, or it ended
		}
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		t := time.NewTicker(e.lease() / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-h.lost:
				cancel()
				return
			case <-t.C:
				if err := h.change(ctx, nil); err != nil && ctx.Err() == nil {
					if errors.Is(err, errLost) || errors.Is(err, errEnded) {
						cancel()
						return
					}
					e.log().Warn("renew a blueprint run's lease", "run_id", id, "err", err)
				}
			}
		}
	}()
	err = e.run(ctx, h)
	cancel()
	<-renewed
	if errors.Is(err, errLost) || errors.Is(err, errEnded) || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// run runs h's run from where it stands.
func (e *Engine) run(ctx context.Context, h *held) error {
	r := h.snapshot()
	bp, err := e.Source.Compiled(ctx, r.Blueprint, r.Version)
	if err != nil {
		if ctx.Err() != nil || !errors.Is(err, versioned.ErrNotFound) {
			// The bus cannot tell now: the lease lapses and the run is tried again.
			return fmt.Errorf("read blueprint %s version %d: %w", r.Blueprint, r.Version, err)
		}
		return e.finish(ctx, h, Failed, &RunError{Code: CodeBlueprintGone, Message: fmt.Sprintf("blueprint %s version %d: %v", r.Blueprint, r.Version, err)}, nil)
	}
	for _, n := range bp.Nodes() {
		var failed []failure
		if len(n.Group) > 0 {
			failed, err = e.group(ctx, h, n.Step, n.Group)
		} else {
			failed, err = e.steps(ctx, h, []*blueprint.Step{n.Step}, RequestStep(n.Step.ID()))
		}
		if err != nil {
			return err
		}
		for _, f := range failed {
			done, err := e.fallback(ctx, h, bp, f)
			if err != nil || done {
				return err
			}
		}
	}
	return e.finish(ctx, h, Succeeded, nil, nil)
}

// RequestStep is the token a step's place gives its request id ("2.0" → "2_0").
func RequestStep(id string) string { return "s" + strings.ReplaceAll(id, ".", "_") }

// failure is a step that failed for good.
type failure struct {
	step *blueprint.Step
	err  *StepError
	// via is the group whose fallback the step takes (it has none of its own).
	via *blueprint.Step
}

// group runs a parallel group: one request whose calls are the members that run. A group
// whose own condition is false skips every member; a member that fails without a fallback of
// its own takes the group's, if it has one.
func (e *Engine) group(ctx context.Context, h *held, g *blueprint.Step, members []*blueprint.Step) ([]failure, error) {
	if g.Condition != "" {
		rctx, err := h.snapshot().Context()
		if err != nil {
			return nil, err
		}
		ev, err := g.Allowed(rctx)
		if err != nil {
			return []failure{{step: g, err: errorOf(err)}}, nil
		}
		if !ev.Result {
			cond := conditionOf(g, ev)
			for _, m := range members {
				if err := e.skip(ctx, h, m, cond); err != nil {
					return nil, err
				}
			}
			return nil, nil
		}
	}
	failed, err := e.steps(ctx, h, members, RequestStep(g.ID()))
	for i := range failed {
		if failed[i].step.Fallback == nil && g.Fallback != nil {
			failed[i].via = g
		}
	}
	return failed, err
}

// skip records step s skipped (its condition, or its group's, false): its output_key holds
// its default_value.
func (e *Engine) skip(ctx context.Context, h *held, s *blueprint.Step, cond *Condition) error {
	if st := h.snapshot().Step(s.ID()); st != nil && st.Status == StepSkipped {
		return nil
	}
	out := json.RawMessage("null")
	if len(s.DefaultValue) > 0 {
		out = s.DefaultValue // as written: its numbers not rounded
	}
	now := e.now().UTC()
	return h.change(ctx, func(r *Run) {
		st := r.Step(s.ID())
		st.Status, st.Condition, st.Output, st.StartedAt, st.EndedAt = StepSkipped, cond, out, &now, &now
	})
}

// steps runs steps (one, or a group's members) in one request, reqStep naming it: each step
// already finished is left as it is; each whose condition is false is skipped; the others are
// called together and wait for their results (and for approvals their calls open).
func (e *Engine) steps(ctx context.Context, h *held, steps []*blueprint.Step, reqStep string) ([]failure, error) {
	for _, s := range steps {
		if h.snapshot().Step(s.ID()) != nil {
			continue
		}
		// A fallback step joins the run's steps when it is taken.
		if err := h.change(ctx, func(r *Run) {
			r.Steps = append(r.Steps, StepRun{ID: s.ID(), Tool: s.Tool, OutputKey: s.OutputKey, Status: StepPending, Fallback: true})
		}); err != nil {
			return nil, err
		}
	}
	r := h.snapshot()
	if failed, done := ended(r, steps); done {
		return failed, nil // all of them ended before: nothing to ask again
	}
	rctx, err := r.Context()
	if err != nil {
		return nil, err
	}
	// The first round's request holds every step that runs, finished or not: a run resumed
	// makes the same request again (its id is taken by it), answered from the record, and
	// only what is unfinished changes. A step's condition and arguments read only the steps
	// before it (never a sibling), so they come out as the first time.
	var failed []failure
	var calls []protocol.ToolCall
	var waiting []*blueprint.Step
	for _, s := range steps {
		sr := r.Step(s.ID())
		if sr == nil {
			return nil, fmt.Errorf("the run has no step %s", s.ID())
		}
		ev, err := s.Allowed(rctx)
		if err != nil {
			f, err := e.stepFailed(ctx, h, s, errorOf(err), nil)
			if err != nil {
				return nil, err
			}
			failed = append(failed, f)
			continue
		}
		cond := conditionOf(s, ev)
		if !ev.Result {
			if err := e.skip(ctx, h, s, cond); err != nil {
				return nil, err
			}
			continue
		}
		in, err := s.Inputs(rctx)
		if err != nil {
			f, err := e.stepFailed(ctx, h, s, errorOf(err), cond)
			if err != nil {
				return nil, err
			}
			failed = append(failed, f)
			continue
		}
		calls = append(calls, protocol.ToolCall{ToolCallID: callID(s), Name: s.Tool, Arguments: in})
		waiting = append(waiting, s)
		if sr.Status != StepPending {
			continue
		}
		reqID := protocol.RunRequestID(r.RunID, reqStep)
		now := e.now().UTC()
		if err := h.change(ctx, func(r *Run) {
			st := r.Step(s.ID())
			if st.StartedAt == nil {
				st.StartedAt = &now
			}
			st.Status, st.Condition, st.Input, st.RequestID, st.ToolCallID = StepRunning, cond, in, reqID, callID(s)
		}); err != nil {
			return nil, err
		}
	}
	if len(calls) == 0 {
		return failed, nil
	}
	// Each round is one request of the calls still to make: the first under the step's own
	// id, each retry under the id and its round. A run resumed makes the same rounds again,
	// each answered from the record as it was.
	for round := 1; len(waiting) > 0; round++ {
		reqID := protocol.RunRequestID(r.RunID, reqStep)
		if round > 1 {
			reqID = protocol.RunRequestID(r.RunID, fmt.Sprintf("%s-r%d", reqStep, round))
			if err := h.change(ctx, func(r *Run) {
				for _, s := range waiting {
					if st := r.Step(s.ID()); !st.Status.done() {
						st.RequestID, st.Attempts = reqID, round
					}
				}
			}); err != nil {
				return nil, err
			}
		}
		results, timedOut, err := e.call(ctx, h, reqID, calls, timeoutOf(waiting))
		if err != nil {
			return nil, err
		}
		var again []*blueprint.Step
		var retry []protocol.ToolCall
		for i, s := range waiting {
			kept := h.snapshot().Step(s.ID())
			res, ok := results[callID(s)]
			if !ok {
				res = protocol.ToolResult{ToolCallID: callID(s), Name: s.Tool, Status: protocol.ResultError, ErrorCode: protocol.CodeInternal,
					ErrorOrigin: protocol.OriginHermes, Content: jsonString("the step's request answered without its call")}
			}
			if res.ErrorCode == protocol.CodeCancelled && timedOut {
				res.ErrorCode, res.Content = CodeStepTimeout, jsonString(fmt.Sprintf("the step did not finish within its timeout, %s", s.TimeoutDuration()))
			}
			if res.ErrorCode == protocol.CodeApprovalRequired && res.Policy != nil && res.Policy.ApprovalID != "" && !kept.Status.done() {
				res, err = e.approved(ctx, h, s, res.Policy.ApprovalID)
				if err != nil {
					return nil, err
				}
			}
			switch {
			case kept.Status.done() && kept.Attempts > round:
				// It ended in a later round, which it was part of: asked for again as it was.
				again, retry = append(again, s), append(retry, calls[i])
				continue
			case kept.Status == StepSucceeded:
				continue // kept before: its result is the record's
			case kept.Status == StepFailed:
				failed = append(failed, failure{step: s, err: kept.Error})
				continue
			case res.Status != protocol.ResultOK && round < s.Attempts() && retryable(res):
				again, retry = append(again, s), append(retry, calls[i])
				continue
			case res.Status != protocol.ResultOK:
				f, err := e.stepFailed(ctx, h, s, resultError(res), nil)
				if err != nil {
					return nil, err
				}
				failed = append(failed, f)
				continue
			}
			now := e.now().UTC()
			if err := h.change(ctx, func(r *Run) {
				st := r.Step(s.ID())
				st.Status, st.Output, st.Error, st.EndedAt = StepSucceeded, res.Content, nil, &now
				if st.StartedAt != nil {
					st.DurationMS = now.Sub(*st.StartedAt).Milliseconds()
				}
				if r.Status == Waiting {
					r.Status = Running
				}
			}); err != nil {
				return nil, err
			}
		}
		waiting, calls = again, retry
	}
	return failed, nil
}

// ended reports whether every one of steps has ended in r, and which of them failed.
func ended(r *Run, steps []*blueprint.Step) ([]failure, bool) {
	var failed []failure
	for _, s := range steps {
		st := r.Step(s.ID())
		if st == nil || !st.Status.done() {
			return nil, false
		}
		if st.Status == StepFailed {
			failed = append(failed, failure{step: s, err: st.Error})
		}
	}
	return failed, true
}

// retryable reports whether a step's failed result is worth another attempt (its retry): the
// tool failed, timed out or could not be reached; never a policy's, an approval's or a
// contract's refusal, nor arguments the tool cannot take.
func retryable(res protocol.ToolResult) bool {
	switch res.ErrorCode {
	case protocol.CodeToolTimeout, protocol.CodeToolUnreachable, protocol.CodeToolHTTP5xx, protocol.CodeToolRateLimited,
		protocol.CodeToolFailed, protocol.CodeDeadLettered, CodeStepTimeout:
		return true
	}
	return false
}

// timeoutReason is why the engine cancels a step's request; cancelledBy names the run that
// does.
const timeoutReason = "the step's timeout passed"

func cancelledBy(runID string) string { return "blueprint run " + runID }

// callID is the tool_call_id of step s in its request.
func callID(s *blueprint.Step) string { return RequestStep(s.ID()) }

// timeoutOf is the longest timeout of steps (0: none sets one).
func timeoutOf(steps []*blueprint.Step) time.Duration {
	var d time.Duration
	for _, s := range steps {
		t := s.TimeoutDuration()
		if t == 0 {
			return 0
		}
		d = max(d, t)
	}
	return d
}

// call makes the request reqID of calls (made once, however often the run resumes) and
// waits for its results, by tool_call_id. A timeout (when not 0) cancels the request once
// it passed, the calls still running answered CANCELLED.
func (e *Engine) call(ctx context.Context, h *held, reqID string, calls []protocol.ToolCall, timeout time.Duration) (results map[string]protocol.ToolResult, timedOut bool, err error) {
	r := h.snapshot()
	req := &protocol.Request{RequestID: reqID, SessionID: r.SessionID, Run: r.RunID,
		Intent: "blueprint " + r.Blueprint + " run " + r.RunID, ToolCalls: calls}
	wait := e.StepWait
	if wait <= 0 {
		wait = 20 * time.Second
	}
	// A step's timeout bounds each attempt, from when this runner asks for it.
	var deadline time.Time
	if timeout > 0 {
		deadline = e.now().Add(timeout)
	}
	for delay := 200 * time.Millisecond; ; {
		w := wait
		if !deadline.IsZero() {
			w = min(w, max(time.Until(deadline), time.Millisecond))
		}
		out, err := e.Submit.Submit(ctx, submit.Submission{Request: req, Trace: r.Trace, Wait: w, Caller: r.Caller, Owner: r.Owner})
		switch {
		case err == nil && !out.Pending:
			res := map[string]protocol.ToolResult{}
			for _, x := range out.Response.Results {
				res[x.ToolCallID] = x
			}
			// Cancelled by this run past the step's timeout (now, or before a resume: the
			// response keeps who cancelled it, and why).
			re := out.Response.Error
			mine := re != nil && re.Code == protocol.CodeCancelled && re.Message == answer.CancelledMessage(cancelledBy(r.RunID), timeoutReason)
			return res, mine, nil
		case err == nil:
			if !deadline.IsZero() && !e.now().Before(deadline) {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				_, _, cerr := e.Submit.Cancel(cctx, reqID, submit.Cancellation{By: cancelledBy(r.RunID), Reason: timeoutReason})
				cancel()
				if cerr != nil && !errors.Is(cerr, submit.ErrFinished) {
					e.log().Warn("cancel a step past its timeout", "run_id", r.RunID, "request_id", reqID, "err", cerr)
				}
				deadline = time.Time{} // its response, cancelled calls included, comes next
			}
			continue
		case errors.Is(err, submit.ErrConflict) || errors.Is(err, submit.ErrTooLarge):
			res := map[string]protocol.ToolResult{}
			for _, c := range calls {
				res[c.ToolCallID] = protocol.ToolResult{ToolCallID: c.ToolCallID, Name: c.Name, Status: protocol.ResultError,
					ErrorCode: CodeStepConflict, ErrorOrigin: protocol.OriginHermes, Content: jsonString(err.Error())}
			}
			return res, false, nil
		case ctx.Err() != nil:
			return nil, false, ctx.Err()
		}
		// The bus, or the caller's budget, refused for now: the run waits and asks again.
		e.log().Warn("submit a blueprint step; trying again", "run_id", r.RunID, "request_id", reqID, "err", err)
		select {
		case <-ctx.Done():
			return nil, false, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// approved waits for the approval a step's call opened: the run waits (waiting_approval)
// until a person decides it; approved, the call runs in the request Hermes makes for it
// (request_id the approval's id), whose result is the step's; denied or expired, the step
// fails with that.
func (e *Engine) approved(ctx context.Context, h *held, s *blueprint.Step, id string) (protocol.ToolResult, error) {
	if err := h.change(ctx, func(r *Run) {
		st := r.Step(s.ID())
		st.Status, st.ApprovalID = StepParked, id
		r.Status = Waiting
	}); err != nil {
		return protocol.ToolResult{}, err
	}
	refused := func(code, msg string) protocol.ToolResult {
		return protocol.ToolResult{ToolCallID: callID(s), Name: s.Tool, Status: protocol.ResultError, ErrorCode: code,
			ErrorOrigin: protocol.OriginHermes, Content: jsonString(msg)}
	}
	if e.Approvals == nil {
		return refused(protocol.CodeApprovalRequired, "the step's call needs an approval, and this runner cannot follow approvals"), nil
	}
	poll := e.Poll
	if poll <= 0 {
		poll = time.Second
	}
	for {
		a, err := e.Approvals.Get(ctx, id)
		switch {
		case err != nil && ctx.Err() != nil:
			return protocol.ToolResult{}, ctx.Err()
		case errors.Is(err, approvals.ErrNotFound):
			// Gone from the bucket (kept a week): it can no longer be decided.
			return refused(protocol.CodeApprovalExpired, fmt.Sprintf("approval %s is no longer kept", id)), nil
		case err != nil:
			e.log().Warn("read a step's approval", "approval_id", id, "err", err)
		case a.State == approvals.Denied:
			return refused(protocol.CodeApprovalDenied, fmt.Sprintf("approval %s was denied by %s: %s", id, a.DecidedBy, a.Reason)), nil
		case a.State == approvals.Expired:
			return refused(protocol.CodeApprovalExpired, fmt.Sprintf("approval %s expired undecided", id)), nil
		case a.State == approvals.Approved || a.State == approvals.Used:
			// The approved call's own request: joined, or read from the record.
			r := h.snapshot()
			out, err := e.Submit.Submit(ctx, submit.Submission{NoWait: false, Wait: poll,
				Request: &protocol.Request{RequestID: a.ID, SessionID: a.SessionID, Intent: "the call approved as " + a.ID,
					ToolCalls: []protocol.ToolCall{{ToolCallID: a.ToolCallID, Name: a.Tool, Arguments: a.Arguments}}, Approval: a.ID},
				Trace: a.Trace, Caller: a.Requester, Owner: r.Owner})
			if err == nil && !out.Pending {
				for _, x := range out.Response.Results {
					if x.ToolCallID == a.ToolCallID {
						x.ToolCallID = callID(s)
						return x, nil
					}
				}
				// Answered without the call (dead-lettered, say): it will not run now.
				msg := "the approved call's request was answered without its result"
				if re := out.Response.Error; re != nil {
					msg += ": " + re.Code + " " + re.Message
				}
				return refused(protocol.CodeInternal, msg), nil
			}
			if errors.Is(err, submit.ErrConflict) {
				return refused(CodeStepConflict, err.Error()), nil
			}
			if err != nil && ctx.Err() == nil {
				e.log().Warn("wait for an approved step's call", "approval_id", id, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return protocol.ToolResult{}, ctx.Err()
		case <-time.After(poll):
		}
	}
}

// stepFailed records step s failed with se (its condition, when evaluated, cond); an error
// when the run cannot go on (it ended, or another runner took it).
func (e *Engine) stepFailed(ctx context.Context, h *held, s *blueprint.Step, se *StepError, cond *Condition) (failure, error) {
	now := e.now().UTC()
	if err := h.change(ctx, func(r *Run) {
		st := r.Step(s.ID())
		if st.StartedAt == nil {
			st.StartedAt = &now
		}
		if cond != nil {
			st.Condition = cond
		}
		st.Status, st.Error, st.EndedAt = StepFailed, se, &now
		st.DurationMS = now.Sub(*st.StartedAt).Milliseconds()
		if r.Status == Waiting {
			r.Status = Running
		}
	}); err != nil {
		return failure{}, err
	}
	return failure{step: s, err: se}, nil
}

// fallback takes the fallback of a step that failed for good: the step's own, else the
// blueprint's. A step's fallback step stands in for it, and the run goes on (done false)
// once it succeeds; a message or a transfer ends the run (failed, or transferred), as does
// the blueprint's fallback step once it has run. Without any fallback the run fails.
func (e *Engine) fallback(ctx context.Context, h *held, bp *blueprint.Blueprint, f failure) (done bool, err error) {
	fb := f.step.Fallback
	if f.via != nil {
		fb = f.via.Fallback
	}
	own := fb != nil
	if !own {
		fb = bp.Fallback
	}
	runErr := &RunError{Step: f.step.ID(), Code: f.err.Code, Message: fmt.Sprintf("step %s (%s) failed: %s", f.step.ID(), f.step.Tool, f.err.Message)}
	if fb == nil {
		return true, e.finish(ctx, h, Failed, runErr, nil)
	}
	if fb.Step != nil {
		failed, err := e.steps(ctx, h, []*blueprint.Step{fb.Step}, RequestStep(fb.Step.ID()))
		if err != nil {
			return true, err
		}
		if own && len(failed) == 0 && fb.Message == "" && fb.TransferTo == "" {
			return false, nil // the fallback step stood in for the step
		}
		if len(failed) > 0 && own {
			// The step's own fallback failed as well: the blueprint's is taken.
			return e.fallback(ctx, h, &blueprint.Blueprint{Fallback: bp.Fallback}, failure{step: fb.Step, err: failed[0].err})
		}
	}
	taken := &FallbackTaken{Step: f.step.ID(), Message: fb.Message, TransferTo: fb.TransferTo, At: e.now().UTC()}
	status := Failed
	if fb.TransferTo != "" {
		status = Transferred
	}
	return true, e.finish(ctx, h, status, runErr, taken)
}

// finish ends the run.
func (e *Engine) finish(ctx context.Context, h *held, status Status, re *RunError, fb *FallbackTaken) error {
	now := e.now().UTC()
	err := h.change(ctx, func(r *Run) {
		r.Status, r.Error, r.Fallback, r.FinishedAt = status, re, fb, &now
		for i := range r.Steps {
			if r.Steps[i].Status == StepPending {
				r.Steps[i].Status = StepNotRun // the run ended before it
			}
		}
	})
	if err == nil {
		e.log().Info("blueprint run finished", "run_id", h.run.RunID, "blueprint", h.run.Blueprint, "status", status)
	}
	return err
}

// conditionOf is s's condition as evaluated (nil when it has none).
func conditionOf(s *blueprint.Step, ev blueprint.Eval) *Condition {
	if s.Condition == "" {
		return nil
	}
	return &Condition{Expr: s.Condition, Result: ev.Result, Values: ev.Values}
}

// errorOf is a step's error from evaluating it.
func errorOf(err error) *StepError {
	var missing *blueprint.MissingError
	if errors.As(err, &missing) {
		return &StepError{Code: CodeMissingValue, Origin: protocol.OriginHermes, Message: err.Error()}
	}
	return &StepError{Code: CodeCondition, Origin: protocol.OriginHermes, Message: err.Error()}
}

// resultError is a failed call's result as a step's error.
func resultError(res protocol.ToolResult) *StepError {
	msg := string(res.Content)
	var s string
	if json.Unmarshal(res.Content, &s) == nil {
		msg = s
	}
	code := res.ErrorCode
	if code == "" {
		code = protocol.CodeInternal
	}
	return &StepError{Code: code, Origin: res.ErrorOrigin, Message: protocol.Shorten(msg, 1000)}
}

func jsonString(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}
