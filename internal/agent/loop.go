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

	"github.com/openai/openai-go/v3"

	"github.com/hermesbus/hermes/internal/llm"
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
}

// Runner runs one turn's calls on the bus as one request of the session.
type Runner interface {
	// Run runs calls as the request requestID of session and returns their results, matched
	// by tool_call_id. It returns an error only when the request could not be had at all.
	Run(ctx context.Context, session, requestID string, calls []protocol.ToolCall) ([]protocol.ToolResult, error)
}

// Decision is what one turn decided, for the record (seed 001 §5.2's log).
type Decision struct {
	Turn     int
	Backend  string
	Model    string
	Offered  []string
	Messages int
	// Chosen are the tools the model called, with their arguments as it wrote them.
	Chosen []Chosen
	// Warnings say what was wrong: an unknown tool, arguments that are not JSON or break the
	// contract (a missing key…).
	Warnings []string
	// Answer is set when the model answered instead.
	Answer string
	Usage  openai.CompletionUsage
	Err    string
}

// Chosen is one call the model made.
type Chosen struct {
	ID, Name  string
	Arguments string
}

// Recorder keeps each turn's decision.
type Recorder interface {
	Decided(ctx context.Context, session string, d Decision)
}

// Loop runs conversations.
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
	Tools     []Tool
}

// Outcome is how a run ended: an answer, or calls for the client to run.
type Outcome struct {
	// Messages is the conversation as it ended, what the loop added included.
	Messages []openai.ChatCompletionMessageParamUnion
	// Answer is the model's last message: its text, or the client's tool calls.
	Answer openai.ChatCompletionMessage
	// ClientCalls are the calls of the client's own tools, for it to run.
	ClientCalls []openai.ChatCompletionMessageToolCallUnion
	Usage       openai.CompletionUsage
	Turns       int
}

// ErrTooManyTurns ends a run whose model kept calling tools past MaxTurns.
var ErrTooManyTurns = errors.New("agent: the model did not answer within the turns allowed")

// Run runs r until the model answers or calls a client's tool.
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
	params := openai.ChatCompletionNewParams{Messages: slices.Clone(r.Messages)}
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
	out := Outcome{}
	corrections := 0
	for turn := 1; ; turn++ {
		if turn > maxTurns {
			out.Messages = params.Messages
			return out, ErrTooManyTurns
		}
		resp, call, err := l.LLM.Complete(ctx, params, llm.Choose)
		d := Decision{Turn: turn, Backend: call.Backend, Model: call.Model, Offered: offered, Messages: len(params.Messages)}
		if err != nil {
			d.Err = err.Error()
			l.decided(ctx, r.Session, d)
			out.Messages, out.Turns = params.Messages, turn
			return out, err
		}
		out.Turns = turn
		addUsage(&out.Usage, resp.Usage)
		d.Usage = resp.Usage
		msg := resp.Choices[0].Message
		if len(msg.ToolCalls) == 0 && l.LLM.HasSelector() {
			// The faster model chose to answer: the answer is the stronger model's (seed 001
			// §5.1), which may yet call a tool.
			resp, call, err = l.LLM.Complete(ctx, params, llm.Answer)
			if err != nil {
				d.Err = err.Error()
				l.decided(ctx, r.Session, d)
				out.Messages = params.Messages
				return out, err
			}
			d.Backend, d.Model = call.Backend, call.Model
			addUsage(&out.Usage, resp.Usage)
			addUsage(&d.Usage, resp.Usage)
			msg = resp.Choices[0].Message
		}
		params.Messages = append(params.Messages, msg.ToParam())
		if len(msg.ToolCalls) == 0 {
			d.Answer = msg.Content
			l.decided(ctx, r.Session, d)
			out.Messages, out.Answer = params.Messages, msg
			return out, nil
		}
		var (
			run      []protocol.ToolCall
			feedback = map[string]string{} // tool_call_id → what goes back to the model instead of a result
		)
		for _, c := range msg.ToolCalls {
			d.Chosen = append(d.Chosen, Chosen{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
			t, ok := byName[c.Function.Name]
			switch {
			case !ok:
				w := fmt.Sprintf("unknown tool %q: the tools offered are %s", c.Function.Name, strings.Join(offered, ", "))
				d.Warnings, feedback[c.ID] = append(d.Warnings, w), w
			case t.Client:
				out.ClientCalls = append(out.ClientCalls, c)
			default:
				args := json.RawMessage(c.Function.Arguments)
				if strings.TrimSpace(c.Function.Arguments) == "" {
					args = json.RawMessage("{}")
				}
				var obj map[string]json.RawMessage
				if err := json.Unmarshal(args, &obj); err != nil || obj == nil {
					w := fmt.Sprintf("%s: the arguments are not a JSON object", c.Function.Name)
					d.Warnings, feedback[c.ID] = append(d.Warnings, w), w
					continue
				}
				if t.Check != nil {
					if err := t.Check(args); err != nil {
						w := fmt.Sprintf("%s: %v", c.Function.Name, err)
						d.Warnings, feedback[c.ID] = append(d.Warnings, w), w
						continue
					}
				}
				run = append(run, protocol.ToolCall{ToolCallID: c.ID, Name: c.Function.Name, Arguments: args})
			}
		}
		l.decided(ctx, r.Session, d)
		if len(feedback) > 0 {
			corrections += len(feedback)
			if corrections > maxCorrections {
				out.Messages, out.Answer = params.Messages, msg
				return out, fmt.Errorf("agent: the model's calls were refused %d times (the last: %s)", corrections, firstOf(feedback))
			}
		}
		results := map[string]protocol.ToolResult{}
		if len(run) > 0 {
			rs, err := l.Runner.Run(ctx, r.Session, fmt.Sprintf("%s-%d", r.RequestID, turn), run)
			if err != nil {
				out.Messages = params.Messages
				return out, err
			}
			for _, res := range rs {
				results[res.ToolCallID] = res
			}
		}
		for _, c := range msg.ToolCalls {
			if t, ok := byName[c.Function.Name]; ok && t.Client {
				continue
			}
			var content string
			if w, refused := feedback[c.ID]; refused {
				content = toolMessage(c.Function.Name, protocol.ToolResult{Status: protocol.ResultError,
					ErrorCode: protocol.CodeBadArguments, ErrorOrigin: protocol.OriginHermes, RecoveryHint: w})
			} else if res, ok := results[c.ID]; ok {
				content = toolMessage(c.Function.Name, res)
			} else {
				content = toolMessage(c.Function.Name, protocol.ToolResult{Status: protocol.ResultError,
					ErrorCode: protocol.CodeInternal, ErrorOrigin: protocol.OriginHermes, RecoveryHint: "no result came back for this call"})
			}
			params.Messages = append(params.Messages, openai.ToolMessage(content, c.ID))
		}
		if len(out.ClientCalls) > 0 {
			// The client runs its own and sends their results; the loop continues then.
			out.Messages, out.Answer = params.Messages, msg
			return out, nil
		}
	}
}

// toolMessage is a result as the model reads it: a JSON object that is data — the tool's
// status, its content or Hermes' word on its failure — never instructions.
func toolMessage(name string, r protocol.ToolResult) string {
	m := map[string]any{"tool": name, "status": r.Status}
	if r.Status == protocol.ResultOK {
		m["content"] = json.RawMessage(r.Content)
	} else {
		m["error_code"], m["recovery_hint"] = r.ErrorCode, r.RecoveryHint
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

func (l *Loop) decided(ctx context.Context, session string, d Decision) {
	if l.Record != nil {
		l.Record.Decided(ctx, session, d)
	}
}
