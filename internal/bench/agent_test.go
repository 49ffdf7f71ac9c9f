package bench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/hermesbus/hermes/internal/agent"
	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/bench"
	"github.com/hermesbus/hermes/internal/chat"
	"github.com/hermesbus/hermes/internal/llm"
	"github.com/hermesbus/hermes/internal/scriptedllm"
	"github.com/hermesbus/hermes/internal/scriptedllm/scriptedllmtest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// The agent loop's own cost per model turn. Each op is one conversation of two turns, as the
// scripted model answers it: the model calls echo, then answers. The rows, set side by side in
// one run: the backend asked directly (two completions), the loop with its tool calls answered
// in memory, the whole front door (POST /v1/chat/completions: the echo call on the bus, every
// decision recorded), and one echo call through /v1/route (the bus's share of a turn with a
// call). Each reports its op's p50/p99 and, per model turn, half of it.

var echoTwice = &scriptedllm.Script{Conversations: []scriptedllm.Conversation{{Name: "echo", Turns: []scriptedllm.Turn{
	{ToolCalls: []scriptedllm.ToolCall{{ID: "call_1", Name: "echo", Arguments: map[string]any{"text": "hi"}}}},
	{Content: "done"},
}}}}

const echoResult = `{"text":"hi"}`

// timedTurns runs do b.N times and reports its p50 and p99, and its p50 per model turn when
// each op is turns of them.
func timedTurns(b *testing.B, turns int, do func(i int) error) {
	took := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if err := do(i); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(took)
	p50, p99 := float64(took[len(took)/2].Microseconds())/1000, float64(took[len(took)*99/100].Microseconds())/1000
	b.ReportMetric(p50, "p50-ms")
	b.ReportMetric(p99, "p99-ms")
	if turns > 0 {
		b.ReportMetric(p50/float64(turns), "p50-ms/turn")
	}
}

func scriptedBackend(b *testing.B) (string, *llm.Client) {
	_, base := scriptedllmtest.Start(b, echoTwice, "")
	c, err := llm.New(llm.Config{Backend: llm.Backend{Name: "scripted", BaseURL: base, Model: "scripted"}})
	if err != nil {
		b.Fatal(err)
	}
	return base, c
}

// The scripted backend called directly with the official client: the conversation's two
// completions, the second with the tool's result, as a loop would send them.
func BenchmarkAgentBackendDirect(b *testing.B) {
	base, _ := scriptedBackend(b)
	client := openai.NewClient(option.WithBaseURL(base+"/"), option.WithAPIKey(""), option.WithMaxRetries(0))
	tools := []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "echo",
		Parameters: openai.FunctionParameters{"type": "object"}})}
	ctx := context.Background()
	timedTurns(b, 2, func(int) error {
		p := openai.ChatCompletionNewParams{Model: "scripted", Tools: tools, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("echo hi")}}
		first, err := client.Chat.Completions.New(ctx, p)
		if err != nil {
			return err
		}
		msg := first.Choices[0].Message
		p.Messages = append(p.Messages, msg.ToParam(), openai.ToolMessage(echoResult, msg.ToolCalls[0].ID))
		second, err := client.Chat.Completions.New(ctx, p)
		if err == nil && second.Choices[0].Message.Content != "done" {
			err = fmt.Errorf("answered %q", second.Choices[0].Message.Content)
		}
		return err
	})
}

type memoryRunner struct{}

func (memoryRunner) Run(_ context.Context, _, _, _ string, calls []protocol.ToolCall) ([]protocol.ToolResult, error) {
	out := make([]protocol.ToolResult, len(calls))
	for i, c := range calls {
		out[i] = protocol.ToolResult{ToolCallID: c.ToolCallID, Name: c.Name, Status: protocol.ResultOK, Content: json.RawMessage(echoResult)}
	}
	return out, nil
}

type memoryRecorder struct{ n int }

func (r *memoryRecorder) Decided(context.Context, string, string, *protocol.LLMDecision) error {
	r.n++
	return nil
}

// The loop on the same backend, its tool calls answered in memory: what the loop adds to the
// backend (offering tools, checking the call against a contract, the decision as the record
// keeps it, the tool message).
func BenchmarkAgentLoopInMemory(b *testing.B) {
	_, c := scriptedBackend(b)
	l := &agent.Loop{LLM: c, Runner: memoryRunner{}, Record: &memoryRecorder{}}
	check := func(args json.RawMessage) error { return nil }
	tools := []agent.Tool{{Name: "echo", Parameters: map[string]any{"type": "object"}, Check: check}}
	ctx := context.Background()
	timedTurns(b, 2, func(i int) error {
		out, err := l.Run(ctx, agent.Run{Session: "s", RequestID: fmt.Sprint("r", i), Intent: "echo hi", Tools: tools,
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("echo hi")}})
		if err == nil && out.Answer.Content != "done" {
			err = fmt.Errorf("answered %q", out.Answer.Content)
		}
		return err
	})
}

func startAgentSystem(b *testing.B) *app.System {
	_, c := scriptedBackend(b)
	return runSystem(b, app.SystemConfig{Instance: "bench-agent", Contracts: "../../examples/contracts", Worker: app.WorkerConfig{Concurrency: 64},
		Chat: &app.ChatConfig{Config: chat.Config{LLM: c, Model: "scripted"}}}, "echo", "{}")
}

// The whole front door through the official client: each turn's decision recorded, the echo
// call one request on the bus, run by the demo tools; a session per conversation.
func BenchmarkAgentChatCompletions(b *testing.B) {
	sys := startAgentSystem(b)
	client := openai.NewClient(option.WithBaseURL(sys.GatewayURL+"/v1/"), option.WithAPIKey(sys.Key.Key), option.WithMaxRetries(0))
	ctx := context.Background()
	prefix := fmt.Sprintf("agent%d-%d", os.Getpid(), runs.Add(1))
	timedTurns(b, 2, func(i int) error {
		resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "scripted",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("echo hi")}},
			option.WithHeader("X-Hermes-Session-ID", fmt.Sprintf("%s-%d", prefix, i)))
		if err == nil && resp.Choices[0].Message.Content != "done" {
			err = fmt.Errorf("answered %q", resp.Choices[0].Message.Content)
		}
		return err
	})
}

// One echo call through /v1/route in the same kind of system: the bus's and the tool's share
// of the turn that calls it.
func BenchmarkAgentEchoRoute(b *testing.B) {
	sys := startAgentSystem(b)
	h := &bench.Hermes{Client: bench.NewClient(1), URL: sys.GatewayURL, Key: sys.Key.Key, Tool: "echo", Calls: 1,
		Args: `{"text":"hi"}`, RunID: fmt.Sprintf("agentroute%d-%d", os.Getpid(), runs.Add(1))}
	timedTurns(b, 1, func(i int) error { return h.Do(context.Background(), 0, i) })
}
