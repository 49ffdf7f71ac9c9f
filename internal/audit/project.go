package audit

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Record is one message of the record as the audit reads it.
type Record struct {
	// Stream and Seq say where the record keeps it; Stored when it was stored.
	Stream  string
	Seq     uint64
	Subject string
	Data    []byte
	Stored  time.Time
}

// stmt is one statement of a projection.
type stmt struct {
	sql  string
	args []any
}

// projection is what one record becomes: statements, or why it cannot be projected (an
// audit_errors row).
type projection struct {
	rec   Record
	stmts []stmt
	// noIntent leaves requests' intents out (Service.NoIntents).
	noIntent bool
	// result is set for a tool_result, whose seal is checked before it counts.
	result *resultOf
}

// resultOf is a result waiting for its seal's check, which needs its call's tool.
type resultOf struct {
	msg *protocol.Message
	res *protocol.ToolResult
}

// decodeLimits are the limits a recorded request is read back with: what the record holds was
// accepted under the deployment's own limits, which the audit does not judge again (a message
// is bounded by the server's max_payload).
var decodeLimits = protocol.Limits{MaxToolCalls: protocol.MaxElements, MaxArgumentsBytes: 1 << 30, MaxIntentBytes: 1 << 30,
	MaxNumberDigits: 1 << 20, MaxNumberExponent: 1 << 30}

// project turns rec into statements. Messages the audit keeps nothing of (memory, summaries,
// a re-driven result, which repeats its call's) project to none; a message that cannot be
// read projects to an audit_errors row.
func project(rec Record, redriven func(session string) string, noIntent bool) projection {
	p := projection{rec: rec, noIntent: noIntent}
	m, err := protocol.Unmarshal(rec.Data)
	if err != nil {
		return p.failed("undecodable message: " + err.Error())
	}
	if err := p.message(m, redriven); err != nil {
		return p.failed(fmt.Sprintf("undecodable %s: %v", m.Type, err))
	}
	return p
}

// failed makes p the audit_errors row of its record.
func (p projection) failed(reason string) projection {
	p.stmts, p.result = []stmt{errorRow(p.rec, reason)}, nil
	return p
}

func errorRow(rec Record, reason string) stmt {
	return stmt{sqlError, []any{rec.Stream, clampU(rec.Seq), text(rec.Subject, 512), len(rec.Data), text(reason, 2048)}}
}

func (p *projection) add(sql string, args ...any) { p.stmts = append(p.stmts, stmt{sql, args}) }

func (p *projection) message(m *protocol.Message, redriven func(string) string) error {
	switch m.Type {
	case protocol.TypeRequest:
		r, err := m.DecodeRequest(decodeLimits)
		if err != nil {
			return err
		}
		p.request(m, r)
	case protocol.TypeToolCall:
		d, err := m.DecodeDispatch()
		if err != nil {
			return err
		}
		p.dispatch(m, d)
	case protocol.TypeToolStarted:
		s, err := m.DecodeToolStarted()
		if err != nil {
			return err
		}
		p.add(sqlStarted, m.RequestID, s.ToolCallID, toolName(s.Name), ts(s.StartedAt), s.Attempt, protocol.IsSandboxSession(m.SessionID))
		if s.Attempt > 1 {
			p.add(sqlRetry, m.RequestID, s.ToolCallID, s.Attempt, toolName(s.Name), text(s.Retrying, 128), ts(s.StartedAt), protocol.IsSandboxSession(m.SessionID))
		}
	case protocol.TypeToolResult:
		if redriven != nil && p.rec.Subject == redriven(m.SessionID) {
			return nil // given another round of aggregation: its call's subject holds it
		}
		res, err := m.DecodeToolResult()
		if err != nil {
			return err
		}
		p.result = &resultOf{msg: m, res: res}
	case protocol.TypeResponse:
		r, err := m.DecodeResponse()
		if err != nil {
			return err
		}
		var code any
		if r.Error != nil {
			code = text(r.Error.Code, 128)
		}
		c := callerOf(m)
		p.add(sqlResponse, m.RequestID, text(r.SessionID, 0), r.Status, code, ts(m.CreatedAt), c[0], c[1], c[2], c[3])
	case protocol.TypeCancel:
		c, err := m.DecodeCancel()
		if err != nil {
			return err
		}
		at := c.At
		if at.IsZero() {
			at = m.CreatedAt
		}
		p.add(sqlCancel, m.RequestID, text(m.SessionID, 0), text(c.By, 0), text(c.Reason, 0), ts(at))
	case protocol.TypePolicy:
		e, err := m.DecodePolicyEvent()
		if err != nil {
			return err
		}
		at := e.At
		if at.IsZero() {
			at = m.CreatedAt
		}
		p.policy(m.MsgID, m.RequestID, e.ToolCallID, e.Tool, &e.Decision, at)
	case protocol.TypeBlueprintStep:
		e, err := m.DecodeBlueprintStep()
		if err != nil {
			return err
		}
		if e.At.IsZero() {
			e.At = m.CreatedAt // a step's time orders its events: never none
		}
		p.blueprint(e)
	case protocol.TypeCoordination:
		e, err := m.DecodeCoordination()
		if err != nil {
			return err
		}
		var order any
		if len(e.SuggestedOrder) > 0 {
			order = e.SuggestedOrder
		}
		reason := text(e.Reason, 0)
		if e.Op == protocol.CoordConflict {
			reason = nil // it names the resource, whose key holds arguments' values
		}
		p.add(sqlCoordination, m.RequestID, e.ToolCallID, e.Op, clampU(e.Fence), e.Tool, e.Tx, e.Position, text(e.HeldBy, 0), order, reason, ts(e.At))
	case protocol.TypeLLMDecision:
		d, err := m.DecodeLLMDecision()
		if err != nil {
			return err
		}
		p.decision(m, d)
	case protocol.TypeLLMSummary, protocol.TypeMemory:
		// What was said and what is remembered: values, which the audit does not keep.
	default:
		return fmt.Errorf("type %q is not one this Hermes reads", protocol.Shorten(string(m.Type), 64))
	}
	return nil
}

// callerOf is the caller of m's request: id, name, role, end user (NULL when none).
func callerOf(m *protocol.Message) [4]any {
	if m.Caller == nil {
		return [4]any{}
	}
	c := m.Caller
	return [4]any{text(c.ID, 0), text(c.Name, 0), text(c.Role, 0), text(c.User, 0)}
}

func (p *projection) request(m *protocol.Message, r *protocol.Request) {
	c := callerOf(m)
	intent := text(r.Intent, MaxIntentBytes)
	if r.Recall || p.noIntent {
		// A door's request made for a conversation (the chat loop, MCP): its intent is the
		// person's own words, which the audit does not keep.
		intent = nil
	}
	p.add(sqlRequest, r.RequestID, r.Session(), intent, ts(m.CreatedAt), len(r.ToolCalls), r.Serial,
		c[0], c[1], c[2], c[3], text(r.Run, 0), text(r.Approval, 0), p.rec.Stream, clampU(p.rec.Seq), protocol.IsSandboxSession(m.SessionID))
	for _, call := range r.ToolCalls {
		p.add(sqlCall, r.RequestID, call.ToolCallID, call.Name, digestJSON(call.Arguments), protocol.IsSandboxSession(m.SessionID))
	}
}

func (p *projection) dispatch(m *protocol.Message, d *protocol.Dispatch) {
	var version, tx, fence any
	if d.Contract != nil {
		version = d.Contract.Version
	}
	if g := d.Grant; g != nil {
		tx, fence = g.Tx, clampU(g.Fence)
	}
	args := digestJSON(d.Call.Arguments)
	fast := strings.Contains(p.rec.Subject, ".event."+protocol.EventFastCall+".")
	p.add(sqlDispatch, m.RequestID, d.Call.ToolCallID, d.Call.Name, text(d.Route, 0), d.Action.Kind, fast, ts(m.CreatedAt), version, args, tx, fence,
		protocol.IsSandboxSession(m.SessionID))
	if d.Policy != nil {
		p.policy("dispatch:"+m.RequestID+":"+d.Call.ToolCallID, m.RequestID, d.Call.ToolCallID, d.Call.Name, d.Policy, m.CreatedAt)
	}
}

// counted adds the statements of a result whose seal counts; tool is its call's.
func (p *projection) counted(r *resultOf) {
	m, res := r.msg, r.res
	var version, tx, fence any
	if res.ContractVersion > 0 {
		version = res.ContractVersion
	}
	if g := res.Grant; g != nil {
		tx, fence = g.Tx, clampU(g.Fence)
	}
	dead := m.Sender.Role == protocol.RoleDeadLetter
	p.add(sqlResult, m.RequestID, res.ToolCallID, toolName(res.Name), text(res.Route, 256), ts(m.CreatedAt), res.Attempts, res.Status,
		text(res.ErrorCode, 128), text(res.ErrorOrigin, 32), text(res.ToolErrorCode, 128), res.ExecutionTimeMS, version,
		digestJSON(res.Content), tx, fence, dead, clampU(p.rec.Seq), protocol.IsSandboxSession(m.SessionID))
	if res.Policy != nil {
		p.policy("result:"+m.RequestID+":"+res.ToolCallID, m.RequestID, res.ToolCallID, clean(protocol.Shorten(res.Name, protocol.MaxToolNameLen)), res.Policy, m.CreatedAt)
	}
}

// policy adds a decision of a tool's policy, and the approval it asks for or decides.
func (p *projection) policy(key, requestID, callID, tool string, d *protocol.PolicyDecision, at time.Time) {
	// No reason: an approver's, or a person's answer to a chat's confirmation, is their words,
	// which may hold what the call was about; the rule, the decision and who made it stay.
	p.add(sqlPolicy, clean(protocol.Shorten(key, 512)), requestID, callID, toolName(tool), clean(protocol.Shorten(d.Decision, 64)), text(d.Rule, 256), text(d.Source, 64), d.Version,
		text(d.ApprovalID, 0), text(d.By, 0), ts(at))
	if d.ApprovalID == "" {
		return
	}
	switch d.Decision {
	case protocol.PolicyParked:
		p.add(sqlApprovalAsked, text(d.ApprovalID, 256), requestID, callID, toolName(tool), text(d.Rule, 0), ts(at))
	case protocol.PolicyApproved, protocol.PolicyRejected, protocol.PolicyExpired:
		p.add(sqlApprovalDecided, text(d.ApprovalID, 256), requestID, callID, toolName(tool), d.Decision, text(d.By, 0), ts(at))
	}
}

func (p *projection) blueprint(e *protocol.BlueprintStep) {
	if e.Step == "" { // the run as it ended
		p.add(sqlRunEnded, e.RunID, e.Blueprint, e.Version, text(e.Status, 64), ts(e.At), text(e.ErrorCode, 128), text(e.TransferTo, 0), e.DurationMS)
		return
	}
	p.add(sqlRunSeen, e.RunID, e.Blueprint, e.Version, ts(e.At))
	var cond, condResult any
	if c := e.Condition; c != nil {
		cond, condResult = text(c.Expr, 0), c.Result // the values its paths read are left out
	}
	var started any
	if e.Status == "running" {
		started = ts(e.At)
	}
	p.add(sqlStep, e.RunID, clean(protocol.Shorten(e.Step, 256)), text(e.Tool, 0), text(e.Status, 64), text(e.RequestID, 0), text(e.ToolCallID, 0),
		text(e.ApprovalID, 0), text(e.ErrorCode, 128), cond, condResult, started, ts(e.At), e.DurationMS)
}

// chosenCall is a call a model chose, as the audit keeps it: its arguments' digest only.
type chosenCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Client    bool   `json:"client,omitempty"`
	Arguments Digest `json:"arguments"`
}

// warning is what was wrong with a model's choice, without its words (which may quote the
// arguments).
type warning struct {
	Kind  string `json:"kind"`
	Tool  string `json:"tool,omitempty"`
	Field string `json:"field,omitempty"`
}

func (p *projection) decision(m *protocol.Message, d *protocol.LLMDecision) {
	// A name the model wrote is kept only when it names a tool it was offered: any other is its
	// words.
	offeredName := func(name string) string {
		if slices.Contains(d.Offered, name) {
			return clean(protocol.Shorten(name, protocol.MaxToolNameLen))
		}
		if name == "" {
			return ""
		}
		return notOffered
	}
	chosen := make([]chosenCall, 0, len(d.Chosen))
	for _, c := range d.Chosen {
		chosen = append(chosen, chosenCall{ID: clean(protocol.Shorten(c.ID, 128)), Name: offeredName(c.Name), Client: c.Client, Arguments: DigestOf([]byte(c.Arguments))})
	}
	warnings := make([]warning, 0, len(d.Warnings))
	for _, w := range d.Warnings {
		field := ""
		if w.Field != "" && isName(w.Field) {
			field = w.Field
		}
		warnings = append(warnings, warning{Kind: clean(protocol.Shorten(w.Kind, 64)), Tool: offeredName(w.Tool), Field: field})
	}
	candidates := d.Candidates
	if candidates == nil {
		candidates = []protocol.LLMCandidate{}
	}
	for i := range candidates {
		candidates[i].Name = clean(protocol.Shorten(candidates[i].Name, protocol.MaxToolNameLen))
	}
	offered := make([]string, 0, len(d.Offered))
	for _, o := range d.Offered {
		offered = append(offered, clean(protocol.Shorten(o, protocol.MaxToolNameLen)))
	}
	var domain, confidence, clarify any
	if in := d.Intent; in != nil {
		domain, confidence, clarify = text(in.Domain, 0), in.Confidence, in.Clarify
	}
	p.add(sqlDecision, d.Run, d.Turn, m.RequestID, m.SessionID, text(d.Backend, 0), text(d.Model, 0), d.FellBack, d.Tries, offered, d.Prefiltered,
		jsonOf(candidates), jsonOf(chosen), len(d.Chosen) == 0 && d.Answer != "", jsonOf(warnings), domain, confidence, clarify,
		d.Usage.Prompt, d.Usage.Completion, d.LatencyMS, llmFailure(d.Error), ts(m.CreatedAt))
}

// MaxIntentBytes bounds the intent kept of a request.
const MaxIntentBytes = 512

// notOffered stands for a tool name a model wrote that names no tool it was offered.
const notOffered = "(not offered)"

// httpStatus finds an HTTP error status in an error's words.
var httpStatus = regexp.MustCompile(`\b[45][0-9][0-9]\b`)

// llmFailure is what the audit keeps of why a model gave no choice: that it failed, and the
// HTTP status its backend answered when the error names one — not the error's words, which
// may quote the backend's answer (and so the conversation). NULL when it did not fail.
func llmFailure(err string) any {
	if err == "" {
		return nil
	}
	if code := httpStatus.FindString(err); code != "" {
		return "failed (HTTP " + code + ")"
	}
	return "failed"
}

// toolName is a tool's name as the audit keeps it: at most protocol.MaxToolNameLen bytes.
func toolName(s string) any { return text(s, protocol.MaxToolNameLen) }

// clampU is n as PostgreSQL's bigint holds it.
func clampU(n uint64) int64 { return int64(min(n, math.MaxInt64)) }

// digestJSON is the digest of a JSON value as JSON; NULL for none.
func digestJSON(v json.RawMessage) any {
	if v == nil {
		return nil
	}
	return jsonOf(DigestOf(v))
}

func jsonOf(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return "null"
	}
	return string(b)
}

// ts is t for PostgreSQL, NULL when zero.
func ts(t time.Time) any {
	if t.IsZero() || t.Year() < 1 || t.Year() > 294275 { // beyond what timestamptz holds
		return nil
	}
	return t.UTC()
}

// text is s as PostgreSQL keeps text — valid UTF-8 without NUL — cut to at most n bytes (0:
// as long as it is); NULL when empty.
func text(s string, n int) any {
	if s == "" {
		return nil
	}
	s = clean(s)
	if n > 0 && len(s) > n {
		s = protocol.Shorten(s, n)
	}
	return s
}

// clean is s as valid UTF-8 without NUL, which PostgreSQL's text refuses.
func clean(s string) string {
	if utf8.ValidString(s) && !strings.ContainsRune(s, 0) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
