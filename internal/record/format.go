package record

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Widths, in characters, beyond which values are cut with "…".
const (
	argsWidth    = 120
	contentWidth = 120
	intentWidth  = 80
	callsWidth   = 120
	errorWidth   = 200
)

// maxStarted bounds how many requests a Formatter remembers to time their responses.
const maxStarted = 10_000

// Formatter turns entries into lines for people, one line per message (a model's decision has
// one for each thing it holds: the input, the choice, each warning), in the spirit of the flow a
// Hermes session goes through:
//
//	12:00:01.123 [request]  req_abc (session s1) 2 calls: get_policy_status call_1, weather_search call_2  intent="查询王五的保单"
//	12:00:01.125 [route]    req_abc router-1 -> get_policy_status call_1 rule=policy_status args={"policy_id":"P1"}
//	12:00:01.126 [start]    req_abc get_policy_status call_1 on worker-1 (try 1)
//	12:00:01.138 [done]     req_abc get_policy_status call_1 12 ms ok content={"status":"active"}
//	12:00:01.139 [done]     req_abc weather_search call_2 error TOOL_TIMEOUT (hermes) after 3 tries: "no answer within 4000 ms"
//	12:00:01.140 [response] req_abc partial_success (2 results, 1 ok) 17 ms
//
// What a tool's policy decided shows on the call's route line ("policy: allowed (policy v2)"),
// on the result of a call it kept from running ("policy: denied: allowed_roles (policy v2)"),
// and as a line of its own for what happened in between (a wait, an approval):
//
//	12:00:01.127 [policy]   req_abc meeting_book call_3 waited: rate_limit (policy v2) "over 10/min for each caller" retry at 12:01:00.123
//	12:00:09.500 [policy]   req_abc meeting_book call_1 approved: confirm_required (policy v2) approval=appr_1 by key:admin
//
// A message it cannot read becomes one "[?]" line naming its sequence and subject. Values that
// come from outside (intents, arguments, contents, names) are cut to a readable width and have
// control characters escaped, so a line is always one line. The zero Formatter is ready to use.
// A Formatter remembers when requests arrived, to show how long each took; it is not safe for
// concurrent use.
type Formatter struct {
	// Location of the times shown; nil means time.Local.
	Location *time.Location
	// Date shows the date before each time.
	Date bool
	// Color marks errors and unreadable messages with ANSI colours.
	Color bool

	started map[string]time.Time // request_id → when its request was stored
}

// Format returns e as one line, without a newline; a model's decision as lines joined by
// newlines, each starting with the time.
func (f *Formatter) Format(e *Entry) string {
	var b strings.Builder
	b.WriteString(f.time(e.Time))
	b.WriteByte(' ')
	if e.Err != nil || e.Msg == nil {
		f.unreadable(&b, e)
		return b.String()
	}
	m := e.Msg
	if d, ok := e.Payload.(*protocol.LLMDecision); ok {
		// A model's decision in seed 001 §5.2's shape: a line for each thing it holds, each
		// with the time.
		stamp := b.String()
		for i, line := range f.decision(m, d) {
			if i > 0 {
				b.WriteString("\n")
				b.WriteString(stamp)
			}
			b.WriteString(line)
		}
		return b.String()
	}
	switch p := e.Payload.(type) {
	case *protocol.LLMSummary:
		b.WriteString(wideTag("摘要"))
		fmt.Fprintf(&b, "%s 会话摘要 (消息 %d–%d, %d 条新消息): %s  (%s at %s, %d ms, tokens %d+%d)", m.RequestID, p.Messages-p.New+1, p.Messages, p.New,
			clean(truncate(p.Text, contentWidth)), clean(truncate(p.Model, 64)), clean(truncate(p.Backend, 64)), p.LatencyMS, p.Usage.Prompt, p.Usage.Completion)
	case *protocol.Request:
		f.request(&b, e, m, p)
	case *protocol.Dispatch:
		tag(&b, "route")
		fmt.Fprintf(&b, "%s %s -> %s %s rule=%s", m.RequestID, senderName(m.Sender), p.Call.Name, p.Call.ToolCallID, clean(p.Route))
		if p.Contract != nil {
			fmt.Fprintf(&b, " contract=v%d", p.Contract.Version)
		}
		if len(p.Call.Arguments) > 0 {
			b.WriteString(" args=")
			b.WriteString(jsonValue(p.Call.Arguments, argsWidth))
		}
		if len(p.Params) > 0 {
			params, _ := json.Marshal(p.Params)
			b.WriteString(" params=")
			b.WriteString(jsonValue(params, argsWidth))
		}
		if p.Policy != nil {
			b.WriteString(" policy: ")
			b.WriteString(f.policy(p.Policy, true))
		}
		if g := p.Grant; g != nil {
			fmt.Fprintf(&b, " tx=%s fence=%d resource=%s", g.Tx, g.Fence, clean(truncate(g.Resource, 64)))
		}
	case *protocol.PolicyEvent:
		tag(&b, "policy")
		fmt.Fprintf(&b, "%s %s %s ", m.RequestID, clean(truncate(p.Tool, 64)), clean(truncate(p.ToolCallID, 64)))
		s := f.policy(&p.Decision, true)
		if p.Decision.Decision != protocol.PolicyAllowed && p.Decision.Decision != protocol.PolicyApproved {
			s = f.paint(yellow, s)
		}
		b.WriteString(s)
	case *protocol.BlueprintStep:
		f.blueprintStep(&b, p)
	case *protocol.CoordinationEvent:
		f.coordination(&b, m, p)
	case *protocol.MemoryEvent:
		f.memory(&b, m, p)
	case *protocol.ToolStarted:
		tag(&b, "start")
		fmt.Fprintf(&b, "%s %s %s on %s (try %d)", m.RequestID, p.Name, p.ToolCallID, senderName(m.Sender), p.Attempt)
	case *protocol.ToolResult:
		f.result(&b, m, p)
	case *protocol.Response:
		f.response(&b, e, p)
	case *protocol.Cancel:
		tag(&b, "cancel")
		fmt.Fprintf(&b, "%s cancelled by %s", m.RequestID, clean(truncate(p.By, 80)))
		if p.Reason != "" {
			b.WriteString(": ")
			b.WriteString(strconv.Quote(truncate(p.Reason, intentWidth)))
		}
	default:
		f.unreadable(&b, e)
	}
	return b.String()
}

func (f *Formatter) request(b *strings.Builder, e *Entry, m *protocol.Message, r *protocol.Request) {
	tag(b, "request")
	if f.started == nil || len(f.started) >= maxStarted {
		f.started = make(map[string]time.Time) // forget old requests rather than grow without bound
	}
	if _, seen := f.started[r.RequestID]; !seen {
		f.started[r.RequestID] = e.Time
	}
	calls := make([]string, len(r.ToolCalls))
	for i, c := range r.ToolCalls {
		calls[i] = c.Name + " " + c.ToolCallID
	}
	fmt.Fprintf(b, "%s (session %s) %s: %s", r.RequestID, m.SessionID, plural(len(r.ToolCalls), "call"),
		truncate(strings.Join(calls, ", "), callsWidth))
	if c := m.Caller; c != nil {
		b.WriteString(" by ")
		b.WriteString(callerName(c))
	}
	if r.Intent != "" {
		b.WriteString("  intent=")
		b.WriteString(strconv.Quote(truncate(r.Intent, intentWidth)))
	}
}

func (f *Formatter) result(b *strings.Builder, m *protocol.Message, r *protocol.ToolResult) {
	tag(b, "done")
	fmt.Fprintf(b, "%s %s %s", m.RequestID, r.Name, r.ToolCallID)
	if r.Attempts > 0 {
		fmt.Fprintf(b, " %d ms", r.ExecutionTimeMS)
	}
	if r.ContractVersion > 0 {
		fmt.Fprintf(b, " contract=v%d", r.ContractVersion)
	}
	if r.Status == protocol.ResultOK {
		b.WriteString(" ok")
		if r.Attempts > 1 {
			fmt.Fprintf(b, " after %d tries", r.Attempts)
		}
		if len(r.Content) > 0 {
			b.WriteString(" content=")
			b.WriteString(jsonValue(r.Content, contentWidth))
		}
		return
	}
	code := r.ErrorCode
	if code == "" {
		code = "(no error_code)"
	}
	msg := "error " + clean(code)
	switch {
	case r.ErrorOrigin != "" && r.ToolErrorCode != "":
		msg += " (" + clean(r.ErrorOrigin) + ": " + clean(truncate(r.ToolErrorCode, 64)) + ")"
	case r.ErrorOrigin != "":
		msg += " (" + clean(r.ErrorOrigin) + ")"
	}
	b.WriteString(" ")
	b.WriteString(f.paint(red, msg))
	switch {
	case r.Attempts == 1:
		b.WriteString(" after 1 try")
	case r.Attempts > 1:
		fmt.Fprintf(b, " after %d tries", r.Attempts)
	}
	if len(r.Content) > 0 {
		b.WriteString(": ")
		b.WriteString(jsonValue(r.Content, contentWidth))
	}
	if len(r.Rejected) > 0 {
		b.WriteString(" rejected=")
		b.WriteString(jsonValue(r.Rejected, contentWidth))
	}
	if r.Policy != nil {
		// The content says why already.
		b.WriteString(" policy: ")
		b.WriteString(f.policy(r.Policy, false))
	}
}

// policy renders what a tool's policy decided: the decision, the rule that decided, and
// where the policy is written ("denied: allowed_roles (policy v2)"), then — when set — the
// reason (with reason), the time to try again, the approval's id and who decided.
func (f *Formatter) policy(d *protocol.PolicyDecision, reason bool) string {
	var b strings.Builder
	b.WriteString(clean(truncate(d.Decision, 32)))
	if d.Rule != "" {
		b.WriteString(": ")
		b.WriteString(clean(truncate(d.Rule, 32)))
	}
	if d.Source != "" {
		fmt.Fprintf(&b, " (%s v%d)", clean(truncate(d.Source, 32)), d.Version)
	}
	if reason && d.Reason != "" {
		b.WriteString(" ")
		b.WriteString(strconv.Quote(truncate(d.Reason, errorWidth)))
	}
	if !d.RetryAt.IsZero() {
		b.WriteString(" retry at ")
		b.WriteString(f.time(d.RetryAt))
	}
	if d.ApprovalID != "" {
		b.WriteString(" approval=")
		b.WriteString(clean(truncate(d.ApprovalID, 64)))
	}
	if d.By != "" {
		b.WriteString(" by ")
		b.WriteString(clean(truncate(d.By, 80)))
	}
	return b.String()
}

// time renders t as the lines' times are.
func (f *Formatter) time(t time.Time) string {
	loc := f.Location
	if loc == nil {
		loc = time.Local
	}
	layout := "15:04:05.000"
	if f.Date {
		layout = "2006-01-02 15:04:05.000"
	}
	return t.In(loc).Format(layout)
}

func (f *Formatter) response(b *strings.Builder, e *Entry, r *protocol.Response) {
	tag(b, "response")
	ok := 0
	for i := range r.Results {
		if r.Results[i].Status == protocol.ResultOK {
			ok++
		}
	}
	status := clean(r.Status)
	if r.Status != protocol.StatusSuccess {
		status = f.paint(red, status)
	}
	fmt.Fprintf(b, "%s %s (%s", r.RequestID, status, plural(len(r.Results), "result"))
	if r.Status != protocol.StatusSuccess && len(r.Results) > 0 {
		fmt.Fprintf(b, ", %d ok", ok)
	}
	b.WriteString(")")
	if at, ok := f.started[r.RequestID]; ok {
		fmt.Fprintf(b, " %d ms", e.Time.Sub(at).Milliseconds())
		delete(f.started, r.RequestID)
	}
	if r.Error != nil {
		b.WriteString(": ")
		b.WriteString(f.paint(red, clean(r.Error.Code)))
		b.WriteString(" ")
		b.WriteString(truncate(clean(r.Error.Message), errorWidth))
	}
}

// decision renders one turn of the agent loop as the seed's decision log has it:
//
//	[路由] chat-1f3a-1 原始输入: 帮我定明天下午的会议室
//	[路由] chat-1f3a-1 LLM选择: meeting_book call_1 {"title":"…"}  (qwen2.5-14b at local, 412 ms, 1 try, tokens 812+40)
//	[警告] chat-1f3a-1 参数key缺失: room_id (meeting_book call_1)
//	[最终] chat-1f3a-4 回复用户: 会议已安排妥当……
func (f *Formatter) decision(m *protocol.Message, d *protocol.LLMDecision) []string {
	var lines []string
	line := func(tag, text string) {
		lines = append(lines, wideTag(tag)+clean(m.RequestID)+" "+text)
	}
	if d.Input != "" {
		line("路由", "原始输入: "+clean(truncate(d.Input, intentWidth)))
	}
	if d.Prefiltered {
		cands := make([]string, len(d.Candidates))
		for i, c := range d.Candidates {
			cands[i] = clean(truncate(c.Name, 64)) + " " + strconv.FormatFloat(c.Score, 'f', 2, 64)
			if c.Similarity != 0 {
				cands[i] += " (" + strconv.FormatFloat(c.Similarity, 'f', 2, 64) + ")"
			}
		}
		text := "粗筛候选: [" + truncate(strings.Join(cands, ", "), callsWidth) + "]"
		if len(cands) == 0 {
			text += " (无匹配的工具，已告知模型)"
		}
		line("路由", text)
	}
	who := clean(truncate(d.Model, 64)) + " at " + clean(truncate(d.Backend, 64))
	if d.FellBack {
		who += " (fallback)"
	}
	tries := fmt.Sprintf("%d tries", d.Tries)
	if d.Tries == 1 {
		tries = "1 try"
	}
	stats := fmt.Sprintf("  (%s, %d ms, %s, tokens %d+%d)", who, d.LatencyMS, tries, d.Usage.Prompt, d.Usage.Completion)
	switch {
	case d.Error != "":
		line("错误", f.paint(red, "LLM: "+clean(truncate(d.Error, errorWidth)))+stats)
	case len(d.Chosen) > 0:
		calls := make([]string, len(d.Chosen))
		for i, c := range d.Chosen {
			calls[i] = clean(truncate(c.Name, 64)) + " " + clean(truncate(c.ID, 64)) + " " + jsonValue([]byte(c.Arguments), argsWidth)
			if c.Client {
				calls[i] += " (the client's)"
			}
		}
		line("路由", "LLM选择: "+strings.Join(calls, "; ")+stats)
	default:
		line("最终", "回复用户: "+clean(truncate(d.Answer, contentWidth))+stats)
	}
	for _, w := range d.Warnings {
		what := clean(truncate(w.Message, errorWidth))
		where := clean(truncate(w.Tool, 64))
		if w.CallID != "" {
			where += " " + clean(truncate(w.CallID, 64))
		}
		switch w.Kind {
		case protocol.WarnMissingArgument:
			what = "参数key缺失: " + clean(truncate(w.Field, 64)) + " (" + where + ")"
		case protocol.WarnUnknownTool:
			what = "未知工具: " + where
		case protocol.WarnNotJSON:
			what = "参数不是JSON对象: " + where
		case protocol.WarnBadArguments:
			what = "参数不符合契约: " + where + ": " + what
		case protocol.WarnEmbeddings:
			what = "仅用词法粗筛: " + what
		}
		line("警告", f.paint(yellow, what))
	}
	return lines
}

// wideTag is "[name]" for a name in CJK characters (two columns each), padded as tag pads.
func wideTag(name string) string {
	cols := 2 + 2*utf8.RuneCountInString(name)
	return "[" + name + "]" + strings.Repeat(" ", max(len("[response]")-cols, 0)+1)
}

func (f *Formatter) unreadable(b *strings.Builder, e *Entry) {
	tag(b, "?")
	var s strings.Builder
	fmt.Fprintf(&s, "seq %d %s", e.Seq, clean(e.Subject))
	if e.Msg != nil {
		fmt.Fprintf(&s, " %s %s", clean(string(e.Msg.Type)), e.Msg.RequestID)
	}
	err := e.Err
	if err == nil {
		err = fmt.Errorf("record: no payload")
	}
	s.WriteString(": ")
	s.WriteString(truncate(clean(err.Error()), errorWidth))
	b.WriteString(f.paint(yellow, s.String()))
}

// tag writes "[name]" padded to the widest tag, "[response]", plus one space.
func tag(b *strings.Builder, name string) {
	t := "[" + name + "]"
	b.WriteString(t)
	b.WriteString(strings.Repeat(" ", max(len("[response]")-len(t), 0)+1))
}

// callerName names the caller of a request for people: "name (id, role)", and "for user".
func callerName(c *protocol.Caller) string {
	s := clean(truncate(c.Name, 64)) + " (" + clean(truncate(c.ID, 80))
	if c.Role != "" {
		s += ", " + clean(truncate(c.Role, 32))
	}
	s += ")"
	if c.User != "" {
		s += " for " + clean(truncate(c.User, 64))
	}
	return s
}

func senderName(s protocol.Sender) string {
	if s.Instance != "" {
		return clean(truncate(s.Instance, 64))
	}
	if s.Role != "" {
		return clean(truncate(s.Role, 64))
	}
	return "?"
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// jsonValue renders a JSON value on one line, cut to width.
func jsonValue(raw []byte, width int) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err == nil {
		raw = buf.Bytes()
	}
	return clean(truncate(string(raw), width))
}

// truncate cuts s to at most width characters, marking a cut with "…".
func truncate(s string, width int) string {
	if utf8.RuneCountInString(s) <= width {
		return s
	}
	n := 0
	for i := range s {
		if n == width-1 {
			return s[:i] + "…"
		}
		n++
	}
	return s
}

// clean escapes what could break a line or a terminal: control and format characters, and
// invalid UTF-8.
func clean(s string) string {
	ok := true
	for _, r := range s {
		if r == utf8.RuneError || !(unicode.IsPrint(r) || r == ' ') {
			ok = false
			break
		}
	}
	if ok {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError:
			if _, size := utf8.DecodeRuneInString(s[i:]); size <= 1 {
				b.WriteString(`\ufffd`)
				continue
			}
			b.WriteRune(r)
		case unicode.IsPrint(r) || r == ' ':
			b.WriteRune(r)
		case r < 0x10000:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	return b.String()
}

const (
	red    = "\x1b[31m"
	green  = "\x1b[32m"
	yellow = "\x1b[33m"
	reset  = "\x1b[0m"
)

func (f *Formatter) paint(color, s string) string {
	if !f.Color {
		return s
	}
	return color + s + reset
}

// blueprintStep writes a blueprint run's step (or the run's end): the seed's 蓝图 line.
func (f *Formatter) blueprintStep(b *strings.Builder, p *protocol.BlueprintStep) {
	b.WriteString(wideTag("蓝图"))
	if p.Step == "" {
		fmt.Fprintf(b, "%s run %s %s", clean(p.Blueprint), clean(truncate(p.RunID, 100)), f.runStatus(p.Status))
		if p.Message != "" {
			b.WriteString(": ")
			b.WriteString(strconv.Quote(truncate(p.Message, intentWidth)))
		}
		if p.TransferTo != "" {
			b.WriteString(" -> ")
			b.WriteString(clean(truncate(p.TransferTo, 64)))
		}
		if p.Error != "" {
			fmt.Fprintf(b, " (%s: %s)", clean(truncate(p.ErrorCode, 64)), clean(truncate(p.Error, intentWidth)))
		}
		return
	}
	fmt.Fprintf(b, "%s run %s step %s %s %s", clean(p.Blueprint), clean(truncate(p.RunID, 100)), clean(truncate(p.Step, 32)), clean(truncate(p.Tool, 64)), f.runStatus(p.Status))
	if c := p.Condition; c != nil {
		fmt.Fprintf(b, " when %s = %t", clean(truncate(c.Expr, intentWidth)), c.Result)
		if len(c.Values) > 0 && !c.Result {
			b.WriteString(" ")
			b.WriteString(jsonValue(c.Values, argsWidth))
		}
	}
	if p.RequestID != "" && p.Status == "running" {
		fmt.Fprintf(b, " request %s", clean(truncate(p.RequestID, 200)))
	}
	if p.ApprovalID != "" {
		fmt.Fprintf(b, " approval %s", clean(truncate(p.ApprovalID, 200)))
	}
	if p.DurationMS > 0 {
		fmt.Fprintf(b, " (%d ms)", p.DurationMS)
	}
	if p.Error != "" {
		fmt.Fprintf(b, " %s: %s", clean(truncate(p.ErrorCode, 64)), clean(truncate(p.Error, intentWidth)))
	}
}

// runStatus is a run's or a step's status, painted by how it went.
func (f *Formatter) runStatus(s string) string {
	s = clean(truncate(s, 32))
	switch s {
	case "succeeded":
		return f.paint(green, s)
	case "failed":
		return f.paint(red, s)
	case "skipped", "waiting_approval", "transferred", "not_run":
		return f.paint(yellow, s)
	}
	return s
}

// coordination writes a coordination event: what happened to a call's turn on a resource.
func (f *Formatter) coordination(b *strings.Builder, m *protocol.Message, p *protocol.CoordinationEvent) {
	tag(b, "coord")
	fmt.Fprintf(b, "%s %s %s %s %s %s", m.RequestID, clean(truncate(p.Tool, 64)), clean(truncate(p.ToolCallID, 64)), p.Op,
		clean(truncate(p.Resource, 64)), p.Tx)
	if p.Fence > 0 {
		fmt.Fprintf(b, " fence=%d", p.Fence)
	}
	switch p.Op {
	case protocol.CoordWaiting:
		s := fmt.Sprintf(" #%d", p.Position)
		if p.HeldBy != "" {
			s += " behind " + clean(truncate(p.HeldBy, 128))
		}
		b.WriteString(f.paint(yellow, s))
	case protocol.CoordConflict:
		b.WriteString(f.paint(yellow, " suggested order: "+clean(truncate(strings.Join(p.SuggestedOrder, " → "), 256))))
	case protocol.CoordExpired:
		b.WriteString(f.paint(yellow, " ("+clean(truncate(p.Reason, 128))+")"))
	case protocol.CoordReleased:
		if p.Reason != "" {
			b.WriteString(" (" + clean(truncate(p.Reason, 128)) + ")")
		}
	}
}

// memory writes a memory event: what happened to a fragment remembered about a user.
func (f *Formatter) memory(b *strings.Builder, m *protocol.Message, p *protocol.MemoryEvent) {
	tag(b, "memory")
	fmt.Fprintf(b, "%s %s %s/%s v%d", m.RequestID, p.Op, clean(truncate(p.Type, 64)), clean(truncate(p.Key, 64)), p.Version)
	if p.Session != "" {
		b.WriteString(" session=" + p.Session)
	}
	if p.Lifespan != "" {
		b.WriteString(" lifespan=" + clean(p.Lifespan))
	}
	if len(p.Value) > 0 {
		b.WriteString(" value=")
		b.WriteString(jsonValue(p.Value, argsWidth))
	}
	if len(p.Tags) > 0 {
		b.WriteString(" tags=" + clean(truncate(strings.Join(p.Tags, ","), 128)))
	}
	if by := m.Caller; by != nil {
		b.WriteString(" by " + clean(truncate(by.Name, 64)))
	}
	if p.Reason != "" {
		b.WriteString(f.paint(yellow, " ("+clean(truncate(p.Reason, 128))+")"))
	}
}
