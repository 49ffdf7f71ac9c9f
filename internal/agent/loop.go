// Package agent runs the agent loop (seed 001 §2, §4): the model chooses tools and fills their
// arguments, the calls run on the bus, their results go back to the model, until it answers.
// Hermes is the messenger: what the model says is data — a tool it names is run only when it
// was offered, arguments only when they fit the tool's contract, and a tool's answer goes back
// as a tool message that changes nothing about which tools may be called.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/openai/openai-go/v3"

	"github.com/hermesbus/hermes/internal/llm"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Tool is a tool the loop may offer the model.
type Tool struct {
	Name        string
	Description string
	// Parameters is its arguments' JSON Schema (an object schema); nil offers {"type":"object"}.
	Parameters map[string]any
	// Client marks a tool the client declared: its calls are returned to the client, never run
	// by Hermes.
	Client bool
	// Check, when set, says what is wrong with arguments before they are dispatched (the
	// contract's input check); a call it refuses goes back to the model as a tool error.
	Check func(args json.RawMessage) error
	// Local, when set, runs the tool's calls itself rather than in the turn's request (a
	// blueprint, whose steps are requests of their own): each call at once, beside the turn's
	// request, and the turn goes on once all have answered. It is given the turn's request id,
	// which with the call's id names the call in the run (the same when the run is repeated),
	// and returns the call's result; what went wrong is a failed result, never an error.
	Local func(ctx context.Context, requestID string, call protocol.ToolCall) protocol.ToolResult
}

// Runner runs one turn's calls on the bus as one request of the session.
type Runner interface {
	// Run runs calls as the request requestID of session, for intent (the person's message,
	// which routes may match), and returns their results, matched by tool_call_id. It returns
	// an error only when the request could not be had at all.
	Run(ctx context.Context, session, requestID, intent string, calls []protocol.ToolCall) ([]protocol.ToolResult, error)
}

// Recorder keeps each turn's decision on the record, under the turn's request id, before the
// turn's calls are dispatched. A decision that cannot be kept ends the run: nothing runs that
// the record would not explain.
type Recorder interface {
	Decided(ctx context.Context, session, requestID string, d *protocol.LLMDecision) error
}

// Loop runs conversations. It is safe for concurrent use.
type Loop struct {
	LLM    *llm.Client
	Runner Runner
	Record Recorder
	// MaxTurns bounds the model's turns in one run (default 8); MaxCorrections the calls fed
	// back as errors for the model to correct (default 3).
	MaxTurns       int
	MaxCorrections int
}

// Run is one conversation turn to complete.
type Run struct {
	Session string
	// RequestID names the run: turn n's calls go as request <RequestID>-<n>, so a run repeated
	// with the same id runs nothing twice.
	RequestID string
	Messages  []openai.ChatCompletionMessageParamUnion
	// Recorded is how many of Messages the session's record already holds (a client sending
	// the whole history again): the first decision records the rest.
	Recorded int
	// Intent is what the person asked (their last message): the requests' intent, and the
	// record's input.
	Intent string
	Tools  []Tool
	// Params are the caller's own settings for the model (temperature, max tokens, …);
	// Messages, Tools and Model are the loop's.
	Params openai.ChatCompletionNewParams
	// Prefiltered and Candidates say how Tools were narrowed, for the first decision.
	Prefiltered bool
	Candidates  []protocol.LLMCandidate
	// Context, when set, is what Hermes tells the model beside the conversation (what it
	// remembers about the user, delimited as data): a system message placed before the
	// person's last message in every prompt of the run, never kept in the conversation.
	// Memory names the fragments it carries, and Classified the turn's intent, for the first
	// decision.
	Context    string
	Memory     []protocol.LLMMemory
	Classified *protocol.LLMIntent
}

// Outcome is how a run ended: an answer, or calls for the client to run.
type Outcome struct {
	// Messages is the conversation as it ended, what the loop added included; a run that
	// ended in an error may end with a message whose calls have no results.
	Messages []openai.ChatCompletionMessageParamUnion
	// Answer is the model's last message: its text, or the client's tool calls.
	Answer openai.ChatCompletionMessage
	// ClientCalls are the calls of the client's own tools, for it to run.
	ClientCalls []openai.ChatCompletionMessageToolCallUnion
	Usage       openai.CompletionUsage
	Turns       int
	// Parked are the calls of the last turn their tools' policies parked for a person's
	// confirmation (APPROVAL_REQUIRED): the run ends there, and the door asks for it. Their
	// results (the approvals' ids) end Messages, as the model would read them.
	Parked []Parked
}

// Parked is a call a policy parked for confirmation: its approval, and exactly what would run.
type Parked struct {
	ApprovalID string
	CallID     string
	Tool       string
	Arguments  json.RawMessage
}

// ErrTooManyTurns ends a run whose model kept calling tools past MaxTurns.
var ErrTooManyTurns = errors.New("agent: the model did not answer within the turns allowed")

// Run runs r until the model answers or calls a client's tool. Each turn's decision is recorded
// before its calls run; whatever ends the run, Outcome.Messages is the conversation so far.
func (l *Loop) Run(ctx context.Context, r Run) (Outcome, error) {
	maxTurns, maxCorrections := l.MaxTurns, l.MaxCorrections
	if maxTurns <= 0 {
		maxTurns = 8
	}
	if maxCorrections <= 0 {
		maxCorrections = 3
	}
	byName := map[string]*Tool{}
	var offered []string
	params := r.Params
	params.Messages, params.Tools = slices.Clone(r.Messages), nil
	for i := range r.Tools {
		t := &r.Tools[i]
		byName[t.Name] = t
		offered = append(offered, t.Name)
		schema := openai.FunctionParameters(t.Parameters)
		if schema == nil {
			schema = openai.FunctionParameters{"type": "object"}
		}
		params.Tools = append(params.Tools, openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
			Name: t.Name, Description: openai.String(t.Description), Parameters: schema}))
	}
	recordedOffered := offered
	if len(recordedOffered) > protocol.MaxDecisionOffered {
		recordedOffered = recordedOffered[:protocol.MaxDecisionOffered]
	}
	out := Outcome{}
	corrections := 0
	recorded := min(max(r.Recorded, 0), len(params.Messages)) // messages the record holds
	contextAt := lastUser(params.Messages)
	for turn := 1; ; turn++ {
		out.Messages, out.Turns = params.Messages, turn
		last := turn == maxTurns
		if last && len(params.Tools) > 0 {
			// The last turn allowed: no turn is left to read Hermes' results, so only the
			// client's tools are offered (it runs them, and sends their results in a run of its
			// own); without any, the model is asked to answer with what it has.
			var theirs []openai.ChatCompletionToolUnionParam
			for i, t := range r.Tools {
				if t.Client {
					theirs = append(theirs, params.Tools[i])
				}
			}
			if len(theirs) > 0 {
				params.Tools = theirs
			} else {
				params.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("none")}
			}
		}
		requestID := fmt.Sprintf("%s-%d", r.RequestID, turn)
		d := &protocol.LLMDecision{Run: r.RequestID, Turn: turn, Offered: recordedOffered, Prompt: len(params.Messages),
			Messages: RecordMessages(params.Messages[recorded:])}
		if turn == 1 {
			d.Input, d.Prefiltered, d.Candidates, d.Memory, d.Intent = r.Intent, r.Prefiltered, r.Candidates, r.Memory, r.Classified
		}
		recorded = len(params.Messages)
		prompt := withContext(params, r.Context, contextAt)
		d.Prompt = len(prompt.Messages)
		resp, call, err := l.LLM.Complete(ctx, prompt, llm.Choose)
		if err == nil && len(resp.Choices[0].Message.ToolCalls) == 0 && l.LLM.HasSelector() {
			// The faster model chose to answer: the answer is the stronger model's (seed 001
			// §5.1), which may yet call a tool.
			addUsage(&out.Usage, resp.Usage)
			d.Usage = usageOf(resp.Usage)
			var more llm.Call
			resp, more, err = l.LLM.Complete(ctx, prompt, llm.Answer)
			more.Tries += call.Tries
			more.Latency += call.Latency
			call = more
		}
		d.Backend, d.Model, d.Tries, d.FellBack, d.LatencyMS = call.Backend, call.Model, call.Tries, call.FellBack, call.Latency.Milliseconds()
		if err != nil {
			d.Error = err.Error()
			if rerr := l.decided(ctx, r.Session, requestID, d); rerr != nil {
				return out, rerr
			}
			return out, err
		}
		addUsage(&out.Usage, resp.Usage)
		u := usageOf(resp.Usage)
		d.Usage.Prompt, d.Usage.Completion, d.Usage.Total = d.Usage.Prompt+u.Prompt, d.Usage.Completion+u.Completion, d.Usage.Total+u.Total
		msg := resp.Choices[0].Message
		if len(msg.ToolCalls) > MaxCallsPerTurn {
			// More than any request may hold: the model is not making sense; nothing runs.
			d.Error = fmt.Sprintf("the model made %d tool calls in one turn; at most %d are taken", len(msg.ToolCalls), MaxCallsPerTurn)
			for _, c := range msg.ToolCalls[:MaxCallsPerTurn] {
				d.Chosen = append(d.Chosen, protocol.LLMCall{ID: cutText(c.ID), Name: cutText(c.Function.Name), Arguments: cutText(c.Function.Arguments)})
			}
			if err := l.decided(ctx, r.Session, requestID, d); err != nil {
				return out, err
			}
			return out, &ModelError{Msg: d.Error}
		}
		d.Warnings = append(d.Warnings, nameCalls(turn, msg.ToolCalls)...)
		if last && slices.ContainsFunc(msg.ToolCalls, func(c openai.ChatCompletionMessageToolCallUnion) bool {
			t, ok := byName[c.Function.Name]
			return !ok || !t.Client
		}) {
			// Calls of Hermes' tools on the last turn would run with no turn left to read
			// their results: none runs, none goes to the client.
			for _, c := range msg.ToolCalls {
				t, ok := byName[c.Function.Name]
				d.Chosen = append(d.Chosen, protocol.LLMCall{ID: c.ID, Name: cutText(c.Function.Name), Arguments: cutText(c.Function.Arguments), Client: ok && t.Client})
			}
			d.Error = fmt.Sprintf("the model called tools on the last of its %d turns; nothing was run", maxTurns)
			if err := l.decided(ctx, r.Session, requestID, d); err != nil {
				return out, err
			}
			return out, ErrTooManyTurns
		}
		params.Messages = append(params.Messages, msg.ToParam())
		out.Messages = params.Messages
		if len(msg.ToolCalls) == 0 {
			d.Answer = cutText(msg.Content)
			if err := l.decided(ctx, r.Session, requestID, d); err != nil {
				return out, err
			}
			out.Answer = msg
			return out, nil
		}
		var (
			run      []protocol.ToolCall
			local    []protocol.ToolCall   // the calls of Local tools
			feedback = map[string]string{} // tool_call_id → what goes back to the model instead of a result
		)
		warn := func(w protocol.LLMWarning) {
			// What a refusal says may quote the arguments (a contract names each value it
			// refuses): kept within what a failed result's text may hold.
			if len(w.Message) > protocol.MaxErrorTextBytes {
				w.Message = protocol.Shorten(w.Message, protocol.MaxErrorTextBytes) + "…"
			}
			d.Warnings = append(d.Warnings, w)
			if feedback[w.CallID] == "" {
				feedback[w.CallID] = w.Message
			} else {
				feedback[w.CallID] += "; " + w.Message
			}
		}
		for _, c := range msg.ToolCalls {
			t, ok := byName[c.Function.Name]
			d.Chosen = append(d.Chosen, protocol.LLMCall{ID: c.ID, Name: cutText(c.Function.Name), Arguments: cutText(c.Function.Arguments), Client: ok && t.Client})
			switch {
			case !ok:
				warn(protocol.LLMWarning{Kind: protocol.WarnUnknownTool, Tool: protocol.Shorten(c.Function.Name, 128), CallID: c.ID,
					Message: fmt.Sprintf("unknown tool %q: it is not one of the %d tools offered", protocol.Shorten(c.Function.Name, 128), len(offered))})
			case t.Client:
				out.ClientCalls = append(out.ClientCalls, c)
			default:
				args := json.RawMessage(c.Function.Arguments)
				if strings.TrimSpace(c.Function.Arguments) == "" {
					args = json.RawMessage("{}")
				}
				var obj map[string]json.RawMessage
				if err := json.Unmarshal(args, &obj); err != nil || obj == nil {
					warn(protocol.LLMWarning{Kind: protocol.WarnNotJSON, Tool: c.Function.Name, CallID: c.ID,
						Message: fmt.Sprintf("%s: the arguments are not a JSON object", c.Function.Name)})
					continue
				}
				if t.Check != nil {
					if err := t.Check(args); err != nil {
						refused(c, err, warn)
						continue
					}
				}
				call := protocol.ToolCall{ToolCallID: c.ID, Name: c.Function.Name, Arguments: args}
				if t.Local != nil {
					local = append(local, call)
					continue
				}
				run = append(run, call)
			}
		}
		if err := l.decided(ctx, r.Session, requestID, d); err != nil {
			return out, err
		}
		if len(feedback) > 0 {
			// A correction is a turn in which calls were refused, however many.
			corrections++
			if corrections > maxCorrections {
				out.Answer = msg
				return out, fmt.Errorf("agent: the model's calls were refused %d times (the last: %s)", corrections, firstOf(feedback))
			}
		}
		results, err := l.runTurn(ctx, r, requestID, run, local, byName)
		if err != nil {
			return out, err
		}
		for _, c := range msg.ToolCalls {
			if t, ok := byName[c.Function.Name]; ok && t.Client {
				continue
			}
			var content string
			if w, refused := feedback[c.ID]; refused {
				content = ToolMessage(c.Function.Name, protocol.ToolResult{Status: protocol.ResultError,
					ErrorCode: protocol.CodeBadArguments, ErrorOrigin: protocol.OriginHermes, RecoveryHint: w})
			} else if res, ok := results[c.ID]; ok {
				content = ToolMessage(c.Function.Name, res)
			} else {
				content = ToolMessage(c.Function.Name, protocol.ToolResult{Status: protocol.ResultError,
					ErrorCode: protocol.CodeInternal, ErrorOrigin: protocol.OriginHermes, RecoveryHint: "no result came back for this call"})
			}
			params.Messages = append(params.Messages, openai.ToolMessage(content, c.ID))
		}
		out.Messages = params.Messages
		for _, c := range run {
			// Hermes' own answer only: what a tool says is data, never an approval to ask for.
			if res, ok := results[c.ToolCallID]; ok && res.ErrorCode == protocol.CodeApprovalRequired && res.ErrorOrigin == protocol.OriginHermes &&
				res.Policy != nil && res.Policy.ApprovalID != "" {
				out.Parked = append(out.Parked, Parked{ApprovalID: res.Policy.ApprovalID, CallID: c.ToolCallID, Tool: c.Name, Arguments: c.Arguments})
			}
		}
		if len(out.Parked) > 0 && len(out.ClientCalls) == 0 {
			// One more round with the person (seed 001 §5.3): the run ends, and the door asks
			// them to confirm exactly these calls; the model goes on once they answered.
			out.Answer = msg
			return out, nil
		}
		out.Parked = nil
		if len(out.ClientCalls) > 0 {
			// The client runs its own and sends their results; the loop continues then.
			out.Answer = msg
			return out, nil
		}
	}
}

// runTurn runs a turn's calls: those of Local tools each at once, beside the turn's request of
// the rest, and returns every result by tool_call_id once all have answered. It returns an
// error only when the request could not be had at all.
func (l *Loop) runTurn(ctx context.Context, r Run, requestID string, run, local []protocol.ToolCall, byName map[string]*Tool) (map[string]protocol.ToolResult, error) {
	results := map[string]protocol.ToolResult{}
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for _, c := range local {
		wg.Go(func() {
			res := byName[c.Name].Local(ctx, requestID, c)
			res.ToolCallID, res.Name = c.ToolCallID, c.Name
			mu.Lock()
			results[c.ToolCallID] = res
			mu.Unlock()
		})
	}
	var err error
	if len(run) > 0 {
		var rs []protocol.ToolResult
		if rs, err = l.Runner.Run(ctx, r.Session, requestID, r.Intent, run); err == nil {
			mu.Lock()
			for _, res := range rs {
				results[res.ToolCallID] = res
			}
			mu.Unlock()
		}
	}
	wg.Wait()
	return results, err
}

// MaxCallsPerTurn bounds the calls one model turn may make; a turn that makes more ends the run
// (ModelError) with nothing run.
const MaxCallsPerTurn = 128

// ModelError is a model's answer the loop cannot take (too many calls in one turn).
type ModelError struct{ Msg string }

func (e *ModelError) Error() string { return "agent: " + e.Msg }

// nameCalls gives each call an id the record and the bus can carry, once in the turn: a call
// whose id is empty, repeated or unusable as an id (some backends number calls "0", "1" in
// every turn, or send none — Ollama's calls come without ids) is named <turn>-<index>, and a
// warning says so. Calls without
// a type are taken as functions.
func nameCalls(turn int, calls []openai.ChatCompletionMessageToolCallUnion) []protocol.LLMWarning {
	taken := map[string]bool{}
	bad := make([]bool, len(calls))
	for i := range calls {
		c := &calls[i]
		if c.Type == "" {
			c.Type = "function"
		}
		if c.ID == "" || protocol.CheckID("tool_call_id", c.ID) != nil || taken[c.ID] {
			bad[i] = true
			continue
		}
		taken[c.ID] = true
	}
	var warnings []protocol.LLMWarning
	for i := range calls {
		if !bad[i] {
			continue
		}
		c := &calls[i]
		name := fmt.Sprintf("%d-%d", turn, i)
		for n := 2; taken[name]; n++ {
			name = fmt.Sprintf("%d-%d-%d", turn, i, n)
		}
		taken[name] = true
		warnings = append(warnings, protocol.LLMWarning{Kind: protocol.WarnCallID, Tool: protocol.Shorten(c.Function.Name, 128), CallID: name,
			Message: fmt.Sprintf("the model gave call %d the id %q (empty, repeated or not an id): Hermes named it %s", i, protocol.Shorten(c.ID, 64), name)})
		c.ID = name
	}
	return warnings
}

// refused turns a contract's refusal of a call's arguments into warnings: one per missing
// required argument (seed 001 §5.2's "参数key缺失"), one for the rest.
func refused(c openai.ChatCompletionMessageToolCallUnion, err error, warn func(protocol.LLMWarning)) {
	var ae *contract.ArgumentsError
	if !errors.As(err, &ae) {
		warn(protocol.LLMWarning{Kind: protocol.WarnBadArguments, Tool: c.Function.Name, CallID: c.ID, Message: fmt.Sprintf("%s: %v", c.Function.Name, err)})
		return
	}
	for _, f := range ae.Missing {
		warn(protocol.LLMWarning{Kind: protocol.WarnMissingArgument, Tool: c.Function.Name, CallID: c.ID, Field: f,
			Message: fmt.Sprintf("%s: %s is required", c.Function.Name, f)})
	}
	if len(ae.Problems) > len(ae.Missing) {
		msg := ae.Hint
		if msg == "" {
			msg = ae.Error()
		}
		warn(protocol.LLMWarning{Kind: protocol.WarnBadArguments, Tool: c.Function.Name, CallID: c.ID, Message: msg})
	}
}

// ToolMessage is a result as the model reads it: a JSON object that is data — the tool's
// status, its content or Hermes' word on its failure — never instructions. A failure carries
// the tool's own code (tool_error_code) beside Hermes' whenever the tool gave one, contract or
// not: the code is what the model recovers from.
func ToolMessage(name string, r protocol.ToolResult) string {
	m := map[string]any{"tool": name, "status": r.Status}
	if r.Status == protocol.ResultOK {
		m["content"] = json.RawMessage(r.Content)
	} else {
		m["error_code"], m["recovery_hint"] = r.ErrorCode, r.RecoveryHint
		if r.ToolErrorCode != "" && r.ToolErrorCode != r.ErrorCode {
			m["tool_error_code"] = r.ToolErrorCode
		}
		if len(r.Content) > 0 {
			m["content"] = json.RawMessage(r.Content)
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		b, _ = json.Marshal(map[string]any{"tool": name, "status": r.Status, "content": string(r.Content)})
	}
	return string(b)
}

func firstOf(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return m[keys[0]]
}

func addUsage(sum *openai.CompletionUsage, u openai.CompletionUsage) {
	sum.PromptTokens += u.PromptTokens
	sum.CompletionTokens += u.CompletionTokens
	sum.TotalTokens += u.TotalTokens
}

func usageOf(u openai.CompletionUsage) protocol.LLMUsage {
	return protocol.LLMUsage{Prompt: u.PromptTokens, Completion: u.CompletionTokens, Total: u.TotalTokens}
}

func (l *Loop) decided(ctx context.Context, session, requestID string, d *protocol.LLMDecision) error {
	if l.Record == nil {
		return nil
	}
	if err := l.Record.Decided(ctx, session, requestID, d); err != nil {
		return fmt.Errorf("agent: the decision of turn %d could not be recorded: %w", d.Turn, err)
	}
	return nil
}

// lastUser is the index of the last user message of msgs (len(msgs) when there is none).
func lastUser(msgs []openai.ChatCompletionMessageParamUnion) int {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].OfUser != nil {
			return i
		}
	}
	return len(msgs)
}

// withContext is params with a system message of text placed at index at of its messages; params
// itself when text is empty.
func withContext(params openai.ChatCompletionNewParams, text string, at int) openai.ChatCompletionNewParams {
	if text == "" {
		return params
	}
	at = min(at, len(params.Messages))
	msgs := make([]openai.ChatCompletionMessageParamUnion, 0, len(params.Messages)+1)
	msgs = append(msgs, params.Messages[:at]...)
	msgs = append(msgs, openai.SystemMessage(text))
	params.Messages = append(msgs, params.Messages[at:]...)
	return params
}
