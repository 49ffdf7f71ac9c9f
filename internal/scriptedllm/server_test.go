package scriptedllm_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/hermesbus/hermes/internal/scriptedllm"
	"github.com/hermesbus/hermes/internal/scriptedllm/scriptedllmtest"
)

func serve(t *testing.T, s *scriptedllm.Script, key string) (*scriptedllm.Server, openai.Client) {
	srv, client, _ := serveAt(t, s, key)
	return srv, client
}

func serveAt(t *testing.T, s *scriptedllm.Script, key string) (*scriptedllm.Server, openai.Client, string) {
	t.Helper()
	srv, base := scriptedllmtest.Start(t, s, key)
	return srv, openai.NewClient(option.WithBaseURL(base), option.WithAPIKey(key), option.WithMaxRetries(0)), base
}

// toolResults are what the meeting's tools answer, for driving the conversation by hand.
var toolResults = map[string]string{
	"calendar_free_slots": `{"slots":["09:00-10:00","14:00-15:00"]}`,
	"meeting_book":        `{"event_id":"evt_12345","status":"created"}`,
	"notify_send":         `{"status":"ok"}`,
}

// The seed's flow, through the official client, whole answers and streamed: the same tool
// calls in the same order, arguments that are JSON, then the answer with usage.
func TestTheMeetingFlowThroughTheOfficialClient(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "whole", true: "streamed"}[stream], func(t *testing.T) {
			srv, client := serve(t, scriptedllm.Meeting(), "sk-test-key")
			params := openai.ChatCompletionNewParams{
				Model:    "qwen2.5-14b",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("请帮我安排一个项目讨论会，时间定在明天上午，联系张伟和李娜")},
				Tools: []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
					Name: "calendar_free_slots", Parameters: openai.FunctionParameters{"type": "object"}})},
			}
			var called []string
			for turn := 0; ; turn++ {
				if turn > 10 {
					t.Fatal("the conversation does not end")
				}
				msg, usage := ask(t, client, params, stream)
				if len(msg.ToolCalls) == 0 {
					if !strings.Contains(msg.Content, "9点到10点") || usage.TotalTokens == 0 {
						t.Fatalf("answer %q, usage %+v", msg.Content, usage)
					}
					break
				}
				params.Messages = append(params.Messages, msg.ToParam())
				for _, c := range msg.ToolCalls {
					if !strings.HasPrefix(c.Function.Arguments, "{") || c.ID == "" {
						t.Fatalf("tool call %+v", c)
					}
					called = append(called, c.Function.Name)
					params.Messages = append(params.Messages, openai.ToolMessage(toolResults[c.Function.Name], c.ID))
				}
			}
			if got := strings.Join(called, ","); got != "calendar_free_slots,calendar_free_slots,meeting_book,notify_send" {
				t.Errorf("called %s", got)
			}
			reqs := srv.Requests()
			if len(reqs) != 5 || len(reqs[0].Tools) != 1 || reqs[4].Stream != stream {
				t.Errorf("%d requests", len(reqs))
			}
		})
	}
}

func ask(t *testing.T, client openai.Client, params openai.ChatCompletionNewParams, stream bool) (openai.ChatCompletionMessage, openai.CompletionUsage) {
	t.Helper()
	ctx := t.Context()
	if !stream {
		resp, err := client.Chat.Completions.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Choices[0].Message, resp.Usage
	}
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	s := client.Chat.Completions.NewStreaming(ctx, params)
	acc := openai.ChatCompletionAccumulator{}
	chunks := 0
	for s.Next() {
		acc.AddChunk(s.Current())
		chunks++
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks < 3 {
		t.Errorf("%d chunks: not streamed", chunks)
	}
	return acc.Choices[0].Message, acc.Usage
}

// A tool that fails: the recovery turn answers when the tool's result says so.
func TestTheRecoveryBranch(t *testing.T) {
	_, client := serve(t, scriptedllm.Meeting(), "")
	params := openai.ChatCompletionNewParams{Model: "scripted", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("订一个周会")}}
	msg, _ := ask(t, client, params, false)
	if len(msg.ToolCalls) != 1 || strings.Contains(msg.ToolCalls[0].Function.Arguments, `"attendees"`) {
		t.Fatalf("%+v", msg)
	}
	params.Messages = append(params.Messages, msg.ToParam(),
		openai.ToolMessage(`{"status":"error","error_code":"BAD_ARGUMENTS","recovery_hint":"attendees is required"}`, msg.ToolCalls[0].ID))
	msg, _ = ask(t, client, params, true)
	if len(msg.ToolCalls) != 1 || !strings.Contains(msg.ToolCalls[0].Function.Arguments, `"unknown_wangwu"`) {
		t.Fatalf("%+v", msg)
	}
	failed := append(slices.Clone(params.Messages), msg.ToParam(),
		openai.ToolMessage(`{"status":"error","error_code":"TOOL_ERROR","content":{"failure":{"code":"UNKNOWN_USER"}}}`, msg.ToolCalls[0].ID))
	params.Messages = failed
	msg, _ = ask(t, client, params, true)
	if len(msg.ToolCalls) != 1 || !strings.Contains(msg.ToolCalls[0].Function.Arguments, `"zhangwei"`) {
		t.Fatalf("no recovery: %+v", msg)
	}
	// Another failure: the model gives up.
	failed[len(failed)-1] = openai.ToolMessage(`{"status":"error","error_code":"TOOL_TIMEOUT"}`, msg.ToolCalls[0].ID)
	params.Messages = failed
	if msg, _ = ask(t, client, params, false); len(msg.ToolCalls) != 0 || !strings.Contains(msg.Content, "没有订上") {
		t.Fatalf("%+v", msg)
	}
}

// Faults on demand: an error status (retried by the client when it retries), a stall, broken
// JSON, arguments that are not JSON, an unknown model, a wrong key.
func TestFaults(t *testing.T) {
	step1 := 1
	script := &scriptedllm.Script{Models: []string{"scripted"}, Conversations: []scriptedllm.Conversation{
		{Name: "flaky", Match: "flaky", Turns: []scriptedllm.Turn{{Status: 503, Times: 1}, {Step: new(int), Content: "fine now"}}},
		{Name: "busy", Match: "busy", Turns: []scriptedllm.Turn{{Status: 429, Times: 1, RetryAfterMS: 1500}, {Step: new(int), Content: "later"}}},
		{Name: "slow", Match: "slow", Turns: []scriptedllm.Turn{{DelayMS: 2000, Content: "late"}}},
		{Name: "broken", Match: "broken", Turns: []scriptedllm.Turn{{Raw: `{"choices":[{"message":`}}},
		{Name: "not json", Match: "args", Turns: []scriptedllm.Turn{{ToolCalls: []scriptedllm.ToolCall{{Name: "meeting_book", ArgumentsRaw: "{title: 周会"}}}}},
		{Name: "two steps", Match: "steps", Turns: []scriptedllm.Turn{{Content: "one"}, {Step: &step1, Content: "two"}}},
	}}
	srv, client, base := serveAt(t, script, "sk-k")
	user := func(s string) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Model: "scripted", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(s)}}
	}
	var apiErr *openai.Error
	if _, err := client.Chat.Completions.New(t.Context(), user("flaky")); !errors.As(err, &apiErr) || apiErr.StatusCode != 503 {
		t.Fatalf("flaky: %v", err)
	}
	if resp, err := client.Chat.Completions.New(t.Context(), user("flaky")); err != nil || resp.Choices[0].Message.Content != "fine now" {
		t.Fatalf("flaky, again: %v", err)
	}
	var busy *http.Response
	if _, err := client.Chat.Completions.New(t.Context(), user("busy"), option.WithResponseInto(&busy)); !errors.As(err, &apiErr) ||
		apiErr.StatusCode != 429 || busy.Header.Get("Retry-After-Ms") != "1500" {
		t.Fatalf("busy: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := client.Chat.Completions.New(ctx, user("slow")); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("slow: %v", err)
	}
	if _, err := client.Chat.Completions.New(t.Context(), user("broken")); err == nil {
		t.Error("broken JSON decoded")
	}
	resp, err := client.Chat.Completions.New(t.Context(), user("args"))
	if err != nil || resp.Choices[0].Message.ToolCalls[0].Function.Arguments != "{title: 周会" {
		t.Errorf("arguments: %v %+v", err, resp)
	}
	if _, err := client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "gpt-x",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}}); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("unknown model: %v", err)
	}
	if _, err := client.Chat.Completions.New(t.Context(), user("nothing scripted")); !errors.As(err, &apiErr) || apiErr.StatusCode != 400 {
		t.Errorf("unscripted: %v", err)
	}
	wrong := openai.NewClient(option.WithBaseURL(base), option.WithAPIKey("nope"), option.WithMaxRetries(0))
	if _, err := wrong.Chat.Completions.New(t.Context(), user("steps")); !errors.As(err, &apiErr) || apiErr.StatusCode != 401 {
		t.Errorf("a wrong key: %v", err)
	}
	if n := len(srv.Requests()); n < 6 {
		t.Errorf("%d requests seen", n)
	}
}

// A script that cannot answer is refused when loaded, naming the turn.
func TestBadScripts(t *testing.T) {
	for _, text := range []string{
		"conversations: [{name: a, turns: [{}]}]",
		"conversations: [{name: a, turns: [{status: 200}]}]",
		"conversations: [{name: a, turns: [{content: hi, retry_after_ms: 10}]}]",
		"conversations: [{name: a, turns: [{status: 503, retry_after_ms: -1}]}]",
		"conversations: [{name: a, turns: [{tool_calls: [{arguments: {}}]}]}]",
		"conversations: [{name: a}]",
		"colour: red",
	} {
		if _, err := scriptedllm.Parse([]byte(text)); err == nil {
			t.Errorf("%s: loaded", text)
		}
	}
}

// Any bytes as a script: loaded or refused, never a panic.
func FuzzParse(f *testing.F) {
	f.Add([]byte("conversations: [{name: a, match: x, turns: [{content: hi}, {step: 0, status: 503, times: 1}]}]"))
	f.Add([]byte("otherwise: {tool_calls: [{name: t, arguments: {a: [1, {b: c}]}}]}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if s, err := scriptedllm.Parse(data); err == nil {
			if _, err := scriptedllm.New(s, ""); err != nil {
				t.Fatalf("parsed but refused: %v", err)
			}
		}
	})
}

// A long-running server keeps only its latest requests.
func TestRequestsKeptAreBounded(t *testing.T) {
	srv, client := serve(t, &scriptedllm.Script{Otherwise: &scriptedllm.Turn{Content: "ok"}}, "")
	for i := range 300 {
		if _, err := client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "m",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprint("n", i))}}); err != nil {
			t.Fatal(err)
		}
	}
	reqs := srv.Requests()
	if len(reqs) != 256 || reqs[255].Messages[0].Text() != "n299" || reqs[0].Messages[0].Text() != "n44" {
		t.Fatalf("%d kept, first %q", len(reqs), reqs[0].Messages[0].Text())
	}
}

// A conversation's Then answers the steps past its turns: the person's follow-ups.
func TestThenAnswersFollowUps(t *testing.T) {
	_, client := serve(t, scriptedllm.Meeting(), "")
	params := openai.ChatCompletionNewParams{Model: "scripted", Messages: []openai.ChatCompletionMessageParamUnion{
		openai.UserMessage("请帮我安排一个项目讨论会"), openai.AssistantMessage("会议已安排妥当"), openai.UserMessage("几点？"),
		openai.AssistantMessage("9点"), openai.AssistantMessage("…"), openai.AssistantMessage("…"), openai.AssistantMessage("…"), openai.UserMessage("谢谢")}}
	msg, _ := ask(t, client, params, false)
	if !strings.HasPrefix(msg.Content, "项目讨论会定在明天") {
		t.Errorf("%q", msg.Content)
	}
}
