// Package sandbox tries a tool against its contract before the contract is registered (seed
// 003 §3.2): it asks the tool's /health, generates arguments from the input schema (valid
// ones, boundary values and invalid ones, contract.Compiled.Cases) and sends them through the
// bus like real calls — one request, marked a sandbox request (protocol.Sandbox), under the
// session sandbox-<tool> with its own request_id — so a router routes them and a worker runs
// them and judges every answer under the candidate. The Report names each case and what broke.
//
// Guarantees: a tool with side effects is tried only where its contract's sandbox reach says,
// or with the registrar's leave (Options.AllowSideEffects); otherwise nothing is sent and the
// report says the sandbox was skipped. The sandbox takes at most its budget: what has not
// finished by then is cancelled and reported unfinished. The candidate is kept in the
// contracts' bucket under protocol.SandboxKey while it is tried, and deleted after.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Submitter is the part of submit.Submitter the sandbox uses.
type Submitter interface {
	Submit(ctx context.Context, sub submit.Submission) (*submit.Outcome, error)
	Cancel(ctx context.Context, requestID string, c submit.Cancellation) (*protocol.Response, bool, error)
}

// DefaultBudget is how long a sandbox may take when Options say nothing; MaxBudget bounds what
// they may say.
const (
	DefaultBudget = 30 * time.Second
	MaxBudget     = 5 * time.Minute
)

// Sandbox tries tools. It is safe for concurrent use.
type Sandbox struct {
	// KV is the contracts' bucket (bus.Bus.Contracts), where candidates are kept while tried.
	KV jetstream.KeyValue
	// Submit sends the sandbox's requests.
	Submit Submitter
	// Log; nil discards.
	Log *slog.Logger
}

// Options of one try.
type Options struct {
	// AllowSideEffects lets a tool with side effects be tried where real calls go.
	AllowSideEffects bool
	// Budget bounds the whole try (0: DefaultBudget; at most MaxBudget).
	Budget time.Duration
	// Caller is who asked, recorded in the sandbox request's envelope.
	Caller *protocol.Caller
	// Version is the version the candidate would be registered as (shown in the record).
	Version int
	// MaxCalls bounds the calls of the sandbox's request, /health included: the routers'
	// limit (0: protocol.DefaultLimits). Cases beyond it are not tried.
	MaxCalls int
}

// Verdicts of a Report.
const (
	Passed  = "passed"
	Refused = "refused"
	Skipped = "skipped"
)

// Outcomes of one case.
const (
	CasePassed     = "passed"
	CaseViolation  = "violation"
	CaseWarning    = "warning"
	CaseUnfinished = "unfinished"
)

// Report is what the sandbox found.
type Report struct {
	Tool string `json:"tool"`
	// Verdict is passed, refused or skipped; Reason says why it is not passed, in one line.
	Verdict string `json:"verdict"`
	Reason  string `json:"reason,omitempty"`
	// Health is what GET /health said: ok, none (the tool has none), not asked, or the fault.
	Health string `json:"health,omitempty"`
	// RequestID and SessionID find the sandbox's calls in the record (hermes tail, replay).
	RequestID  string       `json:"request_id,omitempty"`
	SessionID  string       `json:"session_id,omitempty"`
	Cases      []CaseResult `json:"cases,omitempty"`
	Passed     int          `json:"passed"`
	Violations int          `json:"violations"`
	Warnings   int          `json:"warnings"`
	Unfinished int          `json:"unfinished"`
	TookMS     int64        `json:"took_ms"`
	// Forced: registered although refused (set by whoever registers).
	Forced bool `json:"forced,omitempty"`
	// Notes say what the sandbox could not try.
	Notes []string `json:"notes,omitempty"`
	// Left is how many cases (passed ones) a report kept with a contract leaves out (Compact).
	Left int `json:"left_out,omitempty"`
}

// CaseResult is one case and what the tool made of it.
type CaseResult struct {
	ID        string            `json:"id"`
	Kind      contract.CaseKind `json:"kind"`
	Name      string            `json:"name"`
	Arguments json.RawMessage   `json:"arguments"`
	// Outcome is passed, violation, warning or unfinished.
	Outcome string `json:"outcome"`
	// Code is the result's error_code, when the call failed.
	Code string `json:"error_code,omitempty"`
	// Detail says what happened; for a violation, what the answer broke (the answer itself is
	// withheld from responses, kept in the record's result).
	Detail string `json:"detail,omitempty"`
}

// Failed reports whether the report refuses the tool.
func (r *Report) Failed() bool { return r.Verdict == Refused }

// probeID is the tool_call_id of the /health probe.
const probeID = "health"

// maxAnswerBytes bounds what a report quotes of a result's text.
const maxAnswerBytes = 300

// Try tries the tool of c against c. The error says the sandbox could not run (the bus out of
// reach); whatever the tool did is in the report.
func (s *Sandbox) Try(ctx context.Context, c *contract.Contract, opt Options) (*Report, error) {
	start := time.Now()
	rep := &Report{Tool: c.Name}
	if c.EffectsOrDefault() == contract.EffectsSideEffects && c.Sandbox == nil && !opt.AllowSideEffects {
		rep.Verdict = Skipped
		rep.Reason = "the tool has side effects and its contract names no sandbox reach: nothing was sent to it (declare a sandbox reach, or allow side effects to try it where real calls go)"
		s.log().Info("sandbox: skipped a tool with side effects", "tool", c.Name)
		return rep, nil
	}
	k, err := contract.Compile(c, max(opt.Version, 1), 0)
	if err != nil {
		return nil, err
	}
	budget := opt.Budget
	if budget <= 0 {
		budget = DefaultBudget
	}
	budget = min(budget, MaxBudget)
	cases := k.Cases()
	maxCalls := opt.MaxCalls
	if maxCalls <= 0 {
		maxCalls = protocol.DefaultLimits.MaxToolCalls
	}
	if len(cases) > maxCalls-1 {
		cases = cases[:max(maxCalls-1, 0)]
	}

	rec, err := json.Marshal(contract.Record{Contract: *c, Version: max(opt.Version, 1), RegisteredAt: time.Now().UTC(), By: "sandbox"})
	if err != nil {
		return nil, err
	}
	key := protocol.SandboxKey(c.Name)
	rev, err := s.KV.Put(ctx, key, rec)
	if err != nil {
		return nil, fmt.Errorf("sandbox: keep the candidate: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		// Only if it is still this try's: another try of the tool may have put its own since.
		if err := s.KV.Delete(dctx, key, jetstream.LastRevision(rev)); err != nil {
			s.log().Info("sandbox: candidate not deleted (another try of the tool kept its own since, or the bucket is out of reach)", "tool", c.Name, "err", err)
		}
	}()

	req := &protocol.Request{
		RequestID: fmt.Sprintf("%s-%d-%s", protocol.SandboxSession(c.Name), rev, randomHex(4)),
		SessionID: protocol.SandboxSession(c.Name),
		Intent:    "sandbox: try " + c.Name + " against its contract",
		Sandbox:   &protocol.Sandbox{Tool: c.Name, Revision: rev, Probe: probeID},
		ToolCalls: []protocol.ToolCall{{ToolCallID: probeID, Name: c.Name, Arguments: json.RawMessage(`{}`)}},
	}
	for i, cs := range cases {
		req.ToolCalls = append(req.ToolCalls, protocol.ToolCall{ToolCallID: fmt.Sprintf("case-%02d", i+1), Name: c.Name, Arguments: cs.Arguments})
	}
	if err := req.Validate(protocol.Limits{MaxToolCalls: len(req.ToolCalls)}); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	rep.RequestID, rep.SessionID = req.RequestID, req.SessionID
	log := s.log().With("tool", c.Name, "request_id", req.RequestID)
	log.Info("sandbox: trying a tool", "cases", len(cases), "budget", budget.String())

	// The try runs its course (within its budget) even if whoever asked goes away: its calls
	// are then finished or cancelled, never left running past the budget.
	ctx = context.WithoutCancel(ctx)
	out, err := s.Submit.Submit(ctx, submit.Submission{Request: req, Wait: budget, Caller: opt.Caller,
		Trace: protocol.TraceContext{TraceID: req.RequestID}})
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	resp := out.Response
	if out.Pending {
		// Over budget: what has not finished is cancelled, and reported so.
		resp, _, err = s.Submit.Cancel(ctx, req.RequestID, submit.Cancellation{By: "sandbox", Reason: fmt.Sprintf("the sandbox's budget of %s ran out", budget)})
		if err != nil && !errors.Is(err, submit.ErrFinished) {
			return nil, fmt.Errorf("sandbox: stop what did not finish within the budget: %w", err)
		}
		if resp == nil {
			return nil, fmt.Errorf("sandbox: no response to %s after its cancellation", req.RequestID)
		}
	}
	judge(rep, cases, resp, budget)
	if !slices.ContainsFunc(cases, func(c contract.Case) bool { return c.Kind != contract.CaseInvalid }) {
		rep.Notes = append(rep.Notes, "no valid arguments could be made from input_schema, so the tool's answers to good calls were not tried: give input_schema examples")
	}
	rep.TookMS = time.Since(start).Milliseconds()
	log.Info("sandbox: done", "verdict", rep.Verdict, "passed", rep.Passed, "violations", rep.Violations, "warnings", rep.Warnings, "unfinished", rep.Unfinished)
	return rep, nil
}

func (s *Sandbox) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

// judge fills rep from the sandbox request's response.
func judge(rep *Report, cases []contract.Case, resp *protocol.Response, budget time.Duration) {
	byID := map[string]*protocol.ToolResult{}
	for i := range resp.Results {
		byID[resp.Results[i].ToolCallID] = &resp.Results[i]
	}
	var unreachable, untried string
	unhealthy := false
	if h := byID[probeID]; h != nil {
		rep.Health, unhealthy = health(h)
	}
	for i, cs := range cases {
		cr := CaseResult{ID: fmt.Sprintf("case-%02d", i+1), Kind: cs.Kind, Name: cs.Name, Arguments: shortArgs(cs.Arguments)}
		r := byID[cr.ID]
		if r == nil {
			cr.Outcome, cr.Detail = CaseUnfinished, "no result"
			if resp.Error != nil {
				cr.Detail = resp.Error.Code + ": " + resp.Error.Message
			}
		} else {
			judgeCase(&cr, r)
			if r.ErrorCode == protocol.CodeToolUnreachable && unreachable == "" {
				unreachable = strings.TrimPrefix(text(r), "tool unreachable: ")
			}
			if strings.HasPrefix(cr.Detail, untriedPrefix) && untried == "" {
				untried = strings.TrimPrefix(cr.Detail, untriedPrefix)
			}
		}
		switch cr.Outcome {
		case CasePassed:
			rep.Passed++
		case CaseViolation:
			rep.Violations++
		case CaseWarning:
			rep.Warnings++
		default:
			rep.Unfinished++
		}
		rep.Cases = append(rep.Cases, cr)
	}
	rep.Verdict = Refused
	switch {
	case unreachable != "":
		rep.Reason = "the tool is unreachable: " + unreachable
	case untried != "":
		rep.Reason = "the tool could not be tried: " + untried
	case rep.Violations > 0:
		rep.Reason = fmt.Sprintf("%d of %d cases broke the contract", rep.Violations, len(cases))
	case rep.Unfinished > 0:
		rep.Reason = fmt.Sprintf("%d of %d cases did not finish within the sandbox's budget of %s", rep.Unfinished, len(cases), budget)
	case unhealthy:
		rep.Reason = "the tool's /health says it is " + rep.Health
	default:
		rep.Verdict = Passed
	}
}

// health reads the /health probe's result. Only a tool that says it is unhealthy (5xx) is
// refused for it; one whose /health cannot be had (none, a redirect, a timeout) is judged by
// its cases alone.
func health(r *protocol.ToolResult) (said string, unhealthy bool) {
	switch {
	case r.Status == protocol.ResultOK:
		var v struct {
			Health string `json:"health"`
		}
		if json.Unmarshal(r.Content, &v) == nil && strings.HasPrefix(v.Health, "not asked") {
			return v.Health, false
		}
		return "ok", false
	case r.ErrorCode == protocol.CodeToolHTTP5xx:
		return "unhealthy: " + firstLine(r.RecoveryHint), true
	case r.ErrorCode == protocol.CodeCancelled:
		return "not answered within the budget", false
	default:
		return "none (GET /health: " + r.ErrorCode + ": " + protocol.Shorten(firstLine(r.RecoveryHint), maxAnswerBytes) + ")", false
	}
}

// untriedPrefix starts the detail of a case Hermes could not try (no route, no candidate).
const untriedPrefix = "the tool could not be tried: "

// judgeCase says what one case's result means. Valid and boundary cases must get the success or
// a failure the contract declares; a 5xx, a timeout or an answer outside the contract breaks it,
// a refusal (4xx, 429) is a warning. Invalid cases should be refused: any refusal passes, one
// in the wrong shape or an acceptance is a warning (Hermes refuses such arguments itself
// before any real call).
func judgeCase(cr *CaseResult, r *protocol.ToolResult) {
	cr.Code = r.ErrorCode
	invalid := cr.Kind == contract.CaseInvalid
	hint := protocol.Shorten(firstLine(r.RecoveryHint), maxAnswerBytes)
	switch {
	case r.ErrorCode == protocol.CodeCancelled:
		cr.Outcome, cr.Detail = CaseUnfinished, "not finished within the sandbox's budget"
	case r.ErrorCode == protocol.CodeToolUnreachable:
		cr.Outcome, cr.Detail = CaseViolation, "the tool is unreachable: "+strings.TrimPrefix(text(r), "tool unreachable: ")
	case r.ErrorCode == protocol.CodeToolTimeout:
		cr.Outcome, cr.Detail = CaseViolation, "no answer within the contract's timeout: "+text(r)
	case invalid && r.Status == protocol.ResultOK:
		cr.Outcome, cr.Detail = CaseWarning, "the tool accepted arguments its input_schema refuses (Hermes refuses them before any real call reaches it)"
	case invalid && r.ErrorCode == protocol.CodeContractViolation:
		cr.Outcome, cr.Detail = CaseWarning, "refused, but not as its contract says: "+text(r)
	case invalid:
		cr.Outcome, cr.Detail = CasePassed, "refused: "+r.ErrorCode
	case r.Status == protocol.ResultOK:
		cr.Outcome = CasePassed
	case r.ErrorCode == protocol.CodeContractViolation:
		cr.Outcome, cr.Detail = CaseViolation, text(r)
	case r.ErrorOrigin == protocol.OriginHermes:
		// Hermes could not try the tool (no route, no candidate): not a pass.
		cr.Outcome, cr.Detail = CaseViolation, untriedPrefix+r.ErrorCode+": "+text(r)
	case declared(r):
		cr.Outcome, cr.Detail = CasePassed, "a failure its contract declares: "+r.ErrorCode
	case r.ErrorCode == protocol.CodeToolHTTP4xx, r.ErrorCode == protocol.CodeToolRateLimited:
		cr.Outcome, cr.Detail = CaseWarning, "refused arguments its contract accepts: "+r.ErrorCode+": "+hint
	default:
		cr.Outcome, cr.Detail = CaseViolation, "failed on arguments its contract accepts: "+r.ErrorCode+": "+hint
	}
}

// declared reports whether r is a failure the tool's contract declares (the worker's judge made
// its error_code the tool's own).
func declared(r *protocol.ToolResult) bool {
	return r.ContractVersion > 0 && r.ErrorOrigin == protocol.OriginTool && r.ToolErrorCode != "" && r.ToolErrorCode == r.ErrorCode
}

// randomHex is n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// maxArgsBytes bounds the arguments a report quotes per case, so that a report fits beside
// the contract it is kept with.
const maxArgsBytes = 512

// shortArgs is args as a report quotes them: as they are, or a JSON string of their start.
func shortArgs(args json.RawMessage) json.RawMessage {
	if len(args) <= maxArgsBytes {
		return args
	}
	cut, _ := json.Marshal(fmt.Sprintf("%d bytes: %s…", len(args), protocol.Shorten(string(args), maxArgsBytes)))
	return cut
}

// text is a result's description: its content as text, cut.
func text(r *protocol.ToolResult) string {
	var s string
	if json.Unmarshal(r.Content, &s) != nil {
		s = string(r.Content)
	}
	return protocol.Shorten(firstLine(s), maxAnswerBytes)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// MaxKeptBytes bounds a report as kept with a registered version (Kept), well within what the
// contracts' bucket keeps per registration.
const MaxKeptBytes = 32 << 10

// Kept is the report as kept with a registered version: whole when it fits MaxKeptBytes, else
// without its passed cases, then without the last cases that still do not fit (Left counts what
// is left out).
func (r *Report) Kept() json.RawMessage {
	out, _ := json.Marshal(r)
	if len(out) <= MaxKeptBytes {
		return out
	}
	cp := *r
	cp.Cases = slices.DeleteFunc(slices.Clone(r.Cases), func(c CaseResult) bool { return c.Outcome == CasePassed })
	cp.Left = len(r.Cases) - len(cp.Cases)
	for {
		out, _ = json.Marshal(&cp)
		if len(out) <= MaxKeptBytes || len(cp.Cases) == 0 {
			return out
		}
		cp.Cases = cp.Cases[:len(cp.Cases)-1]
		cp.Left++
	}
}

// Text writes the report for people: the verdict, then one line per case that did not pass.
func (r *Report) Text() string {
	var b strings.Builder
	switch r.Verdict {
	case Skipped:
		fmt.Fprintf(&b, "sandbox skipped for %s: %s\n", r.Tool, r.Reason)
		return b.String()
	case Passed:
		fmt.Fprintf(&b, "sandbox passed %s: %d cases", r.Tool, len(r.Cases))
	default:
		fmt.Fprintf(&b, "sandbox refused %s: %s", r.Tool, r.Reason)
	}
	if r.Forced {
		b.WriteString(" (registered anyway: --force)")
	}
	fmt.Fprintf(&b, "\n  health: %s; %d passed, %d violations, %d warnings, %d unfinished, %d ms; record: session %s, request %s\n",
		r.Health, r.Passed, r.Violations, r.Warnings, r.Unfinished, r.TookMS, r.SessionID, r.RequestID)
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	if r.Left > 0 {
		fmt.Fprintf(&b, "  (%d cases not kept with the contract)\n", r.Left)
	}
	for _, c := range r.Cases {
		if c.Outcome == CasePassed {
			continue
		}
		fmt.Fprintf(&b, "  %s %s [%s] %s %s: %s\n", c.ID, strings.ToUpper(c.Outcome), c.Kind, c.Name, c.Arguments, c.Detail)
	}
	return b.String()
}
