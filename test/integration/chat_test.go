package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/chat"
	"github.com/hermesbus/hermes/internal/llm"
	"github.com/hermesbus/hermes/internal/record"
	"github.com/hermesbus/hermes/internal/scriptedllm"
	"github.com/hermesbus/hermes/internal/scriptedllm/scriptedllmtest"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// chatSystem is Hermes as hermes up runs it, its agent loop asking a scripted model.
type chatSystem struct {
	sys    *app.System
	model  *scriptedllm.Server
	client openai.Client // the official SDK, pointed at Hermes' front door
	js     jetstream.JetStream
}

func startChat(t *testing.T, instance string, script *scriptedllm.Script, tweak func(*app.ChatConfig)) *chatSystem {
	t.Helper()
	return startChatWith(t, instance, script, tweak, nil)
}

// startChatWith is startChat with the policy file policyFile applied at start (nil: none).
func startChatWith(t *testing.T, instance string, script *scriptedllm.Script, tweak func(*app.ChatConfig), policyFile []byte) *chatSystem {
	t.Helper()
	srv, base := scriptedllmtest.Start(t, script, "")
	cfg := llm.Config{Backend: llm.Backend{Name: "scripted", BaseURL: base, Model: "scripted"}}
	if script.Embeddings != nil {
		// A minute, not the default 10 s: a script may hold the tools' vectors back for seconds,
		// and a loaded machine adds to that.
		cfg.Embeddings = &llm.Backend{Name: "scripted", Model: "scripted-embed", MaxRetries: new(0), Timeout: time.Minute}
	}
	c, err := llm.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cc := &app.ChatConfig{Config: chat.Config{LLM: c, Model: "scripted"}}
	if tweak != nil {
		tweak(cc)
	}
	table := exampleRoutes(t)
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	sys, err := app.StartSystem(ctx, app.SystemConfig{DataDir: dir, HTTPAddr: "127.0.0.1:0", DemoAddr: "127.0.0.1:0", DemoGRPCAddr: "127.0.0.1:0",
		NATSListen: "127.0.0.1:0", Routes: table, ToolWorkers: 1, Worker: app.WorkerConfig{Concurrency: 8}, Instance: instance,
		KeyFile: filepath.Join(dir, "admin.key"), Contracts: "../../examples/contracts", Chat: cc, Policies: policyFile})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = sys.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	seed, err := nats.NkeyOptionFromSeed(sys.Seeds[bus.RoleAdmin])
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(sys.ClientURL, seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	// A connection the client opened and never used holds the gateway's shutdown for 5 s
	// (net/http counts it as busy): the clients let theirs go first.
	hc := &http.Client{}
	t.Cleanup(func() { hc.CloseIdleConnections(); http.DefaultClient.CloseIdleConnections() })
	cs := &chatSystem{sys: sys, model: srv, js: js, client: openai.NewClient(option.WithBaseURL(sys.GatewayURL+"/v1/"),
		option.WithAPIKey(sys.Key.Key), option.WithMaxRetries(0), option.WithHTTPClient(hc))}
	// The meeting tools register their contracts through the gateway once it is up; the model
	// is offered registered tools only.
	waitFor(t, "the meeting tools' contracts registered", func() bool {
		req, _ := http.NewRequest("GET", sys.GatewayURL+"/api/v1/tools/notify_send", nil)
		req.Header.Set("Authorization", "Bearer "+sys.Key.Key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	// The gateway's view of the contracts is not the router's: until the router's follows the
	// registration (milliseconds, longer on a loaded machine) it routes the tools unchecked. A
	// probe whose arguments break each tool's types shows when it knows them all (BAD_ARGUMENTS
	// from Hermes); before that, each tool refuses the probe itself, and nothing happens.
	probe := 0
	waitFor(t, "the router following the meeting tools' contracts", func() bool {
		probe++
		code, out := cs.postJSON(t, "/v1/route", fmt.Sprintf(`{"request_id":"contracts_probe_%d","session_id":"contracts_probe","tool_calls":[`+
			`{"tool_call_id":"c1","name":"calendar_free_slots","arguments":{"user_id":5}},`+
			`{"tool_call_id":"c2","name":"meeting_book","arguments":{"attendees":5}},`+
			`{"tool_call_id":"c3","name":"notify_send","arguments":{"user_ids":5}}]}`, probe))
		results, _ := out["results"].([]any)
		if code != http.StatusOK || len(results) != 3 {
			return false
		}
		for _, r := range results {
			if m, _ := r.(map[string]any); m["error_code"] != "BAD_ARGUMENTS" || m["error_origin"] != "hermes" {
				return false
			}
		}
		return true
	})
	return cs
}

// transcript is the session's record as hermes replay prints it, and its entries.
func (cs *chatSystem) transcript(t *testing.T, session string) (string, []*record.Entry) {
	t.Helper()
	var (
		lines   []string
		entries []*record.Entry
	)
	// What the fast lane answered is recorded right after the answer: read once it is.
	waitFor(t, "the fast lane's record written", func() bool {
		for _, l := range cs.sys.Lanes() {
			if l.Writer().Waiting() > 0 {
				return false
			}
		}
		return true
	})
	f := &record.Formatter{Location: time.UTC}
	if _, err := record.ReadSession(t.Context(), cs.js, session, record.Start{}, func(e *record.Entry) error {
		entries = append(entries, e)
		lines = append(lines, f.Format(e))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n"), entries
}

func decisionsOf(entries []*record.Entry) []*protocol.LLMDecision {
	var out []*protocol.LLMDecision
	for _, e := range entries {
		if d, ok := e.Payload.(*protocol.LLMDecision); ok {
			out = append(out, d)
		}
	}
	return out
}

func count(entries []*record.Entry, typ protocol.Type) int {
	n := 0
	for _, e := range entries {
		if e.Msg != nil && e.Msg.Type == typ {
			n++
		}
	}
	return n
}

const meetingAsk = "请帮我安排一个项目讨论会，时间定在明天上午，联系张伟和李娜"

// The seed's meeting assistant, end to end through the official OpenAI SDK: the model chooses
// calendar_free_slots twice, meeting_book, notify_send, then answers; each of its turns is one
// request on the bus, run by the demo tools, and each decision is on the record in the seed's
// shape.
func TestChatTheMeetingAssistant(t *testing.T) {
	t.Parallel()
	cs := startChat(t, "chat-meeting", scriptedllm.Meeting(), nil)
	resp, err := cs.client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "scripted",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(meetingAsk)}},
		option.WithHeader("X-Hermes-Session-ID", "sess_chat_meeting"))
	if err != nil {
		t.Fatal(err)
	}
	answer := resp.Choices[0].Message
	if !strings.Contains(answer.Content, "9点到10点") || resp.Choices[0].FinishReason != "stop" || len(answer.ToolCalls) != 0 ||
		resp.Usage.TotalTokens == 0 || resp.Usage.PromptTokens == 0 {
		t.Fatalf("%+v", resp)
	}
	t.Logf("openai-go: %s (finish %s, usage %d+%d tokens, id %s)", answer.Content, resp.Choices[0].FinishReason,
		resp.Usage.PromptTokens, resp.Usage.CompletionTokens, resp.ID)
	text, entries := cs.transcript(t, "sess_chat_meeting")
	t.Logf("the record of sess_chat_meeting:\n%s", text)
	ds := decisionsOf(entries)
	var chosen []string
	for _, d := range ds {
		for _, c := range d.Chosen {
			chosen = append(chosen, c.Name)
		}
	}
	if got := strings.Join(chosen, ","); got != "calendar_free_slots,calendar_free_slots,meeting_book,notify_send" || len(ds) != 5 || ds[4].Answer != answer.Content {
		t.Errorf("decisions: %s, %d", got, len(ds))
	}
	if n := count(entries, protocol.TypeResponse); n != 4 {
		t.Errorf("%d responses, want 4 (one request per turn that called tools)", n)
	}
	for _, want := range []string{"[路由]     " + resp.ID + "-1 原始输入: " + meetingAsk, "LLM选择: calendar_free_slots call_0_0 {\"date\":\"2025-01-15\",\"user_id\":\"zhangwei\"}",
		"LLM选择: meeting_book", "[最终]     " + resp.ID + "-5 回复用户: 会议已安排妥当"} {
		if !strings.Contains(text, want) {
			t.Errorf("the record lacks %q", want)
		}
	}
	// The decision is on the record before its turn's request. (What the fast lane answered in
	// the turn before is recorded right after its answer, so it may come between them.)
	decided := map[string]bool{}
	for _, e := range entries {
		if d, ok := e.Payload.(*protocol.LLMDecision); ok && len(d.Chosen) > 0 {
			decided[e.Msg.RequestID] = true
		}
		if e.Msg.Type == protocol.TypeRequest && !decided[e.Msg.RequestID] {
			t.Errorf("request %s is not preceded by its decision", e.Msg.RequestID)
		}
	}
	// Every message the model read is on the record once: the decisions' messages in turn.
	var roles []string
	for _, d := range ds {
		for _, m := range d.Messages {
			roles = append(roles, m.Role)
		}
	}
	if got := strings.Join(roles, ","); got != "user,assistant,tool,assistant,tool,assistant,tool,assistant,tool" {
		t.Errorf("recorded messages %s", got)
	}
	// No secret reaches the record: the model's requests carried none, and Hermes' key is not in it.
	if strings.Contains(text, cs.sys.Key.Key) {
		t.Error("the record holds the caller's key")
	}
}

// Streamed, the answer comes as content deltas; Hermes' own calls never as tool_calls deltas
// (a client would run them) but as progress in the "hermes" field of chunks with an empty
// delta; the last chunk carries the usage. The variant in which a call is refused (a required
// argument missing: checked against the contract before dispatch) and a tool fails
// (UNKNOWN_USER), and the model recovers.
func TestChatStreamsAndTheModelRecovers(t *testing.T) {
	t.Parallel()
	cs := startChat(t, "chat-recover", scriptedllm.Meeting(), nil)
	stream := cs.client.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{Model: "scripted",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("帮我订一个明天上午的周会")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}},
		option.WithHeader("X-Hermes-Session-ID", "sess_chat_weekly"))
	acc := openai.ChatCompletionAccumulator{}
	var progress []string
	chunks := 0
	for stream.Next() {
		chunk := stream.Current()
		chunks++
		acc.AddChunk(chunk)
		for _, c := range chunk.Choices {
			if len(c.Delta.ToolCalls) > 0 {
				t.Errorf("a tool_calls delta for a call Hermes runs: %s", chunk.RawJSON())
			}
		}
		if f, ok := chunk.JSON.ExtraFields["hermes"]; ok {
			progress = append(progress, f.Raw())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	got := acc.Choices[0].Message
	if !strings.Contains(got.Content, "周会已订好") || acc.Choices[0].FinishReason != "stop" || acc.Usage.TotalTokens == 0 {
		t.Fatalf("%+v usage %+v", got, acc.Usage)
	}
	t.Logf("openai-go stream: %d chunks, answer %q, usage %d+%d tokens; progress:\n%s", chunks, got.Content,
		acc.Usage.PromptTokens, acc.Usage.CompletionTokens, strings.Join(progress, "\n"))
	all := strings.Join(progress, "\n")
	if !strings.Contains(all, `"event":"decided"`) || !strings.Contains(all, `"error_code":"UNKNOWN_USER"`) {
		t.Errorf("progress %s", all)
	}
	text, entries := cs.transcript(t, "sess_chat_weekly")
	t.Logf("the record of sess_chat_weekly:\n%s", text)
	for _, want := range []string{"[警告]     " + acc.ID + "-1 参数key缺失: attendees (meeting_book call_0_0)",
		"[最终]     " + acc.ID + "-4 回复用户: 周会已订好"} {
		if !strings.Contains(text, want) {
			t.Errorf("the record lacks %q", want)
		}
	}
	// The tool's time is whatever it took (0 ms, or 1 on a busy machine).
	if !regexp.MustCompile(`meeting_book call_1_0 \d+ ms contract=v1 error UNKNOWN_USER`).MatchString(text) {
		t.Error("the record lacks meeting_book call_1_0's UNKNOWN_USER")
	}
	// The refused call was not dispatched: turn 1 has a decision and no request.
	for _, e := range entries {
		if e.Msg.Type == protocol.TypeRequest && e.Msg.RequestID == acc.ID+"-1" {
			t.Error("the refused call was dispatched")
		}
	}
}

// A conversation over several POSTs: the client sends the whole history each time, and the
// record keeps each message once; a retried POST with the same Idempotency-Key runs nothing
// twice and gets the first answer.
func TestChatHistoryAndIdempotency(t *testing.T) {
	t.Parallel()
	// The model counts its turns by the assistant messages it reads: the client's history
	// holds its answers, not the tool calls before them.
	one, two := 1, 2
	script := &scriptedllm.Script{Conversations: []scriptedllm.Conversation{{Name: "echo twice", Turns: []scriptedllm.Turn{
		{ToolCalls: []scriptedllm.ToolCall{{Name: "echo", Arguments: map[string]any{"text": "one"}}}},
		{Step: &one, IfLastToolContains: "one", Content: "first answer"},
		{Step: &one, ToolCalls: []scriptedllm.ToolCall{{Name: "echo", Arguments: map[string]any{"text": "two"}}}},
		{Step: &two, Content: "second answer"},
	}}}}
	cs := startChat(t, "chat-history", script, nil)
	session := option.WithHeader("X-Hermes-Session-ID", "sess_chat_history")
	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("echo one")}
	first, err := cs.client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "hermes", Messages: msgs}, session)
	if err != nil || first.Choices[0].Message.Content != "first answer" {
		t.Fatalf("%v %+v", err, first)
	}
	msgs = append(msgs, first.Choices[0].Message.ToParam(), openai.UserMessage("echo two"))
	var raw *http.Response
	params := openai.ChatCompletionNewParams{Model: "hermes", Messages: msgs}
	second, err := cs.client.Chat.Completions.New(t.Context(), params, session, option.WithHeader("Idempotency-Key", "k-2"), option.WithResponseInto(&raw))
	if err != nil || second.Choices[0].Message.Content != "second answer" || raw.Header.Get("X-Hermes-Replayed") != "" {
		t.Fatalf("%v %+v", err, second)
	}
	asked := len(cs.model.Requests())
	again, err := cs.client.Chat.Completions.New(t.Context(), params, session, option.WithHeader("Idempotency-Key", "k-2"), option.WithResponseInto(&raw))
	if err != nil || again.ID != second.ID || again.Choices[0].Message.Content != "second answer" || raw.Header.Get("X-Hermes-Replayed") != "true" {
		t.Fatalf("the retry: %v %+v %v", err, again, raw.Header)
	}
	if n := len(cs.model.Requests()); n != asked {
		t.Errorf("the retry asked the model %d more times", n-asked)
	}
	_, entries := cs.transcript(t, "sess_chat_history")
	if n := count(entries, protocol.TypeRequest); n != 2 {
		t.Errorf("%d requests ran, want 2", n)
	}
	var roles []string
	for _, d := range decisionsOf(entries) {
		for _, m := range d.Messages {
			roles = append(roles, m.Role+":"+m.Content)
		}
		for _, w := range d.Warnings {
			t.Errorf("warning %+v", w)
		}
	}
	// system and the first user message once; the first answer is the decision's; the second
	// user message once.
	if got := strings.Join(roles, "|"); !strings.HasPrefix(got, "system:be brief|user:echo one|assistant:|tool:") ||
		strings.Count(got, "user:echo one") != 1 || strings.Count(got, "user:echo two") != 1 || strings.Contains(got, "assistant:first answer") {
		t.Errorf("recorded messages %s", got)
	}
	// A history that differs from the record is recorded again, with a warning.
	edited := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be verbose"), openai.UserMessage("echo one")}
	if _, err := cs.client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "hermes", Messages: edited}, session); err != nil {
		t.Fatal(err)
	}
	_, entries = cs.transcript(t, "sess_chat_history")
	ds := decisionsOf(entries)
	if w := ds[len(ds)-2].Warnings; len(w) == 0 || w[0].Kind != protocol.WarnHistory {
		t.Errorf("no history warning: %+v", ds[len(ds)-2])
	}
}

// In a turn that calls both, Hermes runs its own tool on the bus and returns the client's to it
// as an ordinary tool call, never running it; the run goes on when the client sends its result,
// the model then reading both results.
func TestChatClientToolsGoBackToTheClient(t *testing.T) {
	t.Parallel()
	script := &scriptedllm.Script{Conversations: []scriptedllm.Conversation{{Name: "mixed", Turns: []scriptedllm.Turn{
		{ToolCalls: []scriptedllm.ToolCall{{ID: "call_first", Name: "echo", Arguments: map[string]any{"text": "from the first turn"}}}},
		{ToolCalls: []scriptedllm.ToolCall{{ID: "call_h", Name: "echo", Arguments: map[string]any{"text": "hermes runs me"}},
			{ID: "call_c", Name: "open_editor", Arguments: map[string]any{"path": "notes.md"}}}},
		{Content: "both done"},
	}}}}
	cs := startChat(t, "chat-client-tools", script, nil)
	session := option.WithHeader("X-Hermes-Session-ID", "sess_chat_client")
	tool := openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "open_editor",
		Parameters: openai.FunctionParameters{"type": "object", "properties": map[string]any{"path": map[string]any{"type": "string"}}}})
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("open my notes")}
	resp, err := cs.client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "scripted", Messages: msgs,
		Tools: []openai.ChatCompletionToolUnionParam{tool}}, session)
	if err != nil {
		t.Fatal(err)
	}
	msg := resp.Choices[0].Message
	if resp.Choices[0].FinishReason != "tool_calls" || len(msg.ToolCalls) != 1 || msg.ToolCalls[0].ID != "call_c" || msg.ToolCalls[0].Function.Name != "open_editor" {
		t.Fatalf("%+v", resp)
	}
	_, entries := cs.transcript(t, "sess_chat_client")
	if n := count(entries, protocol.TypeToolResult); n != 2 {
		t.Fatalf("%d tool results on the record, want 2 (echo, twice)", n)
	}
	msgs = append(msgs, msg.ToParam(), openai.ToolMessage(`{"opened":true}`, "call_c"))
	resp, err = cs.client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "scripted", Messages: msgs,
		Tools: []openai.ChatCompletionToolUnionParam{tool}}, session)
	if err != nil || resp.Choices[0].Message.Content != "both done" {
		t.Fatalf("%v %+v", err, resp)
	}
	reqs := cs.model.Requests()
	last := reqs[len(reqs)-1].Messages
	var seen []string
	for _, m := range last {
		seen = append(seen, m.Role+":"+m.ToolCallID)
	}
	// The model read the whole run: its first turn, its message with both calls, both results.
	if got := strings.Join(seen, ","); got != "user:,assistant:,tool:call_first,assistant:,tool:call_h,tool:call_c" || len(last[3].ToolCalls) != 2 ||
		!strings.Contains(last[2].Text(), "from the first turn") || !strings.Contains(last[4].Text(), "hermes runs me") {
		t.Errorf("the model read %s", got)
	}
	// Each message is on the record once.
	_, entries = cs.transcript(t, "sess_chat_client")
	var roles []string
	for _, d := range decisionsOf(entries) {
		for _, m := range d.Messages {
			roles = append(roles, m.Role+":"+m.ToolCallID)
		}
	}
	if got := strings.Join(roles, ","); got != "user:,assistant:,tool:call_first,assistant:,tool:call_h,tool:call_c" {
		t.Errorf("recorded %s", got)
	}
}

// Bad input gets OpenAI-style errors naming the field; an unknown model 404; a backend that
// is down, or answers what is not JSON, 502 — its error recorded, the conversation kept.
func TestChatBadInput(t *testing.T) {
	t.Parallel()
	script := &scriptedllm.Script{Models: []string{"scripted"}, Conversations: []scriptedllm.Conversation{
		{Name: "down", Match: "down", Turns: []scriptedllm.Turn{{Status: 503, Message: "overloaded"}}},
		{Name: "broken", Match: "broken", Turns: []scriptedllm.Turn{{Raw: `{"choices":[{"message":`}}},
	}}
	cs := startChat(t, "chat-bad", script, nil)
	post := func(body string, headers ...string) (int, map[string]any) {
		return cs.postJSON(t, "/v1/chat/completions", body, headers...)
	}
	errOf := func(out map[string]any) map[string]any { e, _ := out["error"].(map[string]any); return e }
	for _, tc := range []struct{ body, param string }{
		{`{"messages":[{"role":"user","content":"x"}]}`, "model"},
		{`{"model":"scripted"}`, "messages"},
		{`{"model":"scripted","messages":[{"role":"robot","content":"x"}]}`, "messages[0].role"},
		{`{"model":"scripted","messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, "messages[0].content[0].type"},
		{`{"model":"scripted","messages":[{"role":"user","content":"x"},{"role":"tool","content":"r","tool_call_id":"nope"}]}`, "messages[1].tool_call_id"},
		{`{"model":"scripted","messages":"hi"}`, "messages"},
		{`{"model":"scripted","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"has space"}}]}`, "tools[0].function.name"},
		{`{"model":"scripted","messages":[{"role":"user","content":"x"}],"max_turns":0}`, "max_turns"},
		{`{"model":"scripted","messages":[{"role":"user","content":"x"}],"temperature":"hot"}`, "temperature"},
		{`{"model":"scripted","messages":[{"role":"user","content":"x"}],"n":2}`, "n"},
	} {
		code, out := post(tc.body)
		if e := errOf(out); code != 400 || e["param"] != tc.param || e["type"] != "invalid_request_error" || !strings.Contains(fmt.Sprint(e["message"]), tc.param) {
			t.Errorf("%s: %d %v", tc.body, code, out)
		}
	}
	if code, out := post(`{"model":"scripted","messages":[{"role":"user","content":"x"}]}`, "X-Hermes-Session-ID", "bad.session"); code != 400 || errOf(out)["param"] != "X-Hermes-Session-ID" {
		t.Errorf("bad session: %d %v", code, out)
	}
	_, err := cs.client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "gpt-9",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Errorf("unknown model: %v", err)
	}
	for _, ask := range []string{"down", "broken"} {
		session := "sess_chat_" + ask
		code, out := post(`{"model":"scripted","messages":[{"role":"user","content":"`+ask+`"}]}`, "X-Hermes-Session-ID", session)
		if e := errOf(out); code != http.StatusBadGateway || e["code"] != "llm_unavailable" || !strings.Contains(fmt.Sprint(e["message"]), session) {
			t.Errorf("%s: %d %v", ask, code, out)
		}
		_, entries := cs.transcript(t, session)
		ds := decisionsOf(entries)
		if len(ds) != 1 || ds[0].Error == "" || len(ds[0].Messages) != 1 || ds[0].Messages[0].Content != ask {
			t.Errorf("%s: the record %+v", ask, ds)
		}
	}
}

// A client that goes away cancels its run: the request's cancel reaches the call running on the
// bus, which the record shows cancelled.
func TestChatCancellationReachesRunningCalls(t *testing.T) {
	t.Parallel()
	script := &scriptedllm.Script{Conversations: []scriptedllm.Conversation{{Name: "slow", Turns: []scriptedllm.Turn{
		{ToolCalls: []scriptedllm.ToolCall{{Name: "echo", Arguments: map[string]any{"text": "slow", "delay_ms": 20000}}}},
		{Content: "never"},
	}}}}
	cs := startChat(t, "chat-cancel", script, nil)
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		waitFor(t, "the slow call to start", func() bool {
			_, entries := cs.transcript(t, "sess_chat_cancel")
			return count(entries, protocol.TypeToolStarted) > 0
		})
		cancel()
	}()
	_, err := cs.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "scripted",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("go slow")}}, option.WithHeader("X-Hermes-Session-ID", "sess_chat_cancel"))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("%v", err)
	}
	waitFor(t, "the running call cancelled", func() bool {
		_, entries := cs.transcript(t, "sess_chat_cancel")
		for _, e := range entries {
			if r, ok := e.Payload.(*protocol.Response); ok && r.Error != nil && r.Error.Code == protocol.CodeCancelled {
				return true
			}
		}
		return false
	})
}

// The web view shows each decision at the top of its turn, in the seed's shape: what the model
// chose, the argument it left out, its answer.
func TestBrowserShowsTheModelsDecisions(t *testing.T) {
	long(t, "browser")
	chromium := chromiumPath(t)
	cs := startChat(t, "chat-ui", scriptedllm.Meeting(), func(c *app.ChatConfig) { c.SummarizeEvery = 3 })
	resp, err := cs.client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "scripted",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("帮我订一个明天上午的周会 <img src=x onerror=alert(1)>")}},
		option.WithHeader("X-Hermes-Session-ID", "sess_chat_ui"))
	if err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, chromium, cs.sys.GatewayURL)
	b.do("sign in", chromedp.Navigate(b.base+"/"))
	b.waitJS("the sign-in form", `!document.getElementById('signin').hidden`)
	b.do("send the key", chromedp.SetValue(chromedp.CSS("#signin-key"), cs.sys.Key.Key), chromedp.Click(chromedp.CSS("#signin-submit")))
	b.waitJS("signed in", `document.getElementById('signin').hidden`)
	b.do("open the session", chromedp.Navigate(b.base+"/#session=sess_chat_ui"))
	decision := func(turn int) string {
		return fmt.Sprintf(`(document.querySelector('.req[data-request="%s-%d"] .decision') || {textContent: ''}).textContent`, resp.ID, turn)
	}
	b.waitJS("turn 1's input, choice and warning", decision(1)+`.includes('[路由] 原始输入: 帮我订一个明天上午的周会') && `+
		decision(1)+`.includes('[路由] LLM选择: meeting_book') && `+decision(1)+`.includes('[警告] 参数key缺失: attendees (meeting_book call_0_0)')`)
	b.waitJS("turn 1 not dispatched", jsReqStatus(resp.ID+"-1")+` === 'refused'`)
	b.waitJS("turn 2's failed call", jsCallError(resp.ID+"-2", "call_1_0")+`.includes('UNKNOWN_USER')`)
	b.waitJS("the answer", decision(4)+`.includes('[最终] 回复用户: 周会已订好') && `+jsReqStatus(resp.ID+"-4")+` === 'answered'`)
	if n := evalJS[int](b, `document.querySelectorAll('.decision img').length`); n != 0 {
		t.Error("the person's message was taken as HTML")
	}
	b.screenshot("decisions")

	// A /v1/chat session's summaries, in the card of the turn that made them due, as text.
	if code, out := cs.postJSON(t, "/v1/chat", `{"session_id":"sess_chat_ui_summary","message":"<img src=x onerror=alert(2)> `+meetingAsk+`"}`); code != http.StatusOK {
		t.Fatalf("%d %v", code, out)
	}
	b.do("open the summarized session", chromedp.Navigate(b.base+"/#session=sess_chat_ui_summary"))
	b.waitJS("the summaries", `[...document.querySelectorAll('.decision.summary')].some((e) => e.textContent.includes('[摘要] 会话摘要 (消息 ') && e.textContent.includes('–10, '))`)
	if n := evalJS[int](b, `document.querySelectorAll('.decision img').length`); n != 0 {
		t.Error("a summary was taken as HTML")
	}
}

// A keyed run that ended having run nothing (its client went away while the model thought) is
// not kept as the key's answer: the retry, what the key is for, runs. The same key with another
// body is refused.
func TestChatIdempotencyAfterADisconnect(t *testing.T) {
	t.Parallel()
	script := &scriptedllm.Script{Conversations: []scriptedllm.Conversation{{Name: "slow", Turns: []scriptedllm.Turn{
		{Content: "done", DelayMS: 1500}}}}}
	cs := startChat(t, "chat-idem-drop", script, nil)
	params := openai.ChatCompletionNewParams{Model: "hermes", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	key, session := option.WithHeader("Idempotency-Key", "k-drop"), option.WithHeader("X-Hermes-Session-ID", "sess_chat_idem")
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	_, err := cs.client.Chat.Completions.New(ctx, params, key, session)
	cancel()
	if err == nil {
		t.Fatal("the first POST was not cut")
	}
	var resp *openai.ChatCompletion
	waitFor(t, "the retry answered", func() bool { // once the first run has ended
		resp, err = cs.client.Chat.Completions.New(t.Context(), params, key, session)
		return err == nil
	})
	if resp.Choices[0].Message.Content != "done" {
		t.Fatalf("%+v", resp)
	}
	other := openai.ChatCompletionNewParams{Model: "hermes", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("something else")}}
	_, err = cs.client.Chat.Completions.New(t.Context(), other, key, session)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnprocessableEntity || apiErr.Code != "idempotency_key_reused" {
		t.Errorf("another body under the key: %v", err)
	}
}

// The model's ids are data too: calls numbered "0" twice (as some servers do), or with no id,
// are named by Hermes, each run once, and the record says so; a session Hermes made for one
// POST keeps no state.
func TestChatNamesTheModelsCalls(t *testing.T) {
	t.Parallel()
	script := &scriptedllm.Script{Conversations: []scriptedllm.Conversation{{Name: "dup", Turns: []scriptedllm.Turn{
		{ToolCalls: []scriptedllm.ToolCall{{ID: "0", Name: "echo", Arguments: map[string]any{"text": "a"}}, {ID: "0", Name: "echo", Arguments: map[string]any{"text": "b"}},
			{ID: "a.b", Name: "echo", Arguments: map[string]any{"text": "c"}}, {NoID: true, Name: "echo", Arguments: map[string]any{"text": "d"}}}},
		{Content: "ok"}}}}}
	cs := startChat(t, "chat-ids", script, nil)
	var raw *http.Response
	resp, err := cs.client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "hermes",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("echo thrice")}}, option.WithResponseInto(&raw))
	if err != nil || resp.Choices[0].Message.Content != "ok" {
		t.Fatalf("%v %+v", err, resp)
	}
	session := raw.Header.Get("X-Hermes-Session-ID")
	_, entries := cs.transcript(t, session)
	if n := count(entries, protocol.TypeToolResult); n != 4 {
		t.Errorf("%d results, want 4", n)
	}
	ds := decisionsOf(entries)
	var ids []string
	for _, w := range ds[0].Warnings {
		if w.Kind == protocol.WarnCallID {
			ids = append(ids, w.CallID)
		}
	}
	if fmt.Sprint(ids) != "[1-1 1-2 1-3]" || ds[0].Chosen[0].ID != "0" || ds[0].Chosen[1].ID != "1-1" || ds[0].Chosen[3].ID != "1-3" {
		t.Errorf("renamed %v, chosen %+v", ids, ds[0].Chosen)
	}
	// The model read the names it was given back: each tool message answers one of them.
	reqs := cs.model.Requests()
	var answered []string
	for _, m := range reqs[len(reqs)-1].Messages {
		if m.Role == "tool" {
			answered = append(answered, m.ToolCallID)
		}
	}
	if fmt.Sprint(answered) != "[0 1-1 1-2 1-3]" {
		t.Errorf("tool messages answer %v", answered)
	}
	kv, err := cs.js.KeyValue(t.Context(), bus.BucketSessions)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(t.Context(), "chat."+session); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("an unnamed session kept state: %v", err)
	}
}

// The whole run has a deadline: a turn still running when it passes is cancelled on the bus,
// and the client is told (504), the conversation so far on the record.
func TestChatRunDeadline(t *testing.T) {
	t.Parallel()
	script := &scriptedllm.Script{Conversations: []scriptedllm.Conversation{{Name: "slow", Turns: []scriptedllm.Turn{
		{ToolCalls: []scriptedllm.ToolCall{{Name: "echo", Arguments: map[string]any{"text": "slow", "delay_ms": 20000}}}},
		{Content: "never"},
	}}}}
	cs := startChat(t, "chat-deadline", script, func(c *app.ChatConfig) { c.RunTimeout = 1500 * time.Millisecond })
	_, err := cs.client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "scripted",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("go slow")}}, option.WithHeader("X-Hermes-Session-ID", "sess_chat_deadline"))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusGatewayTimeout || !strings.Contains(apiErr.Message, "1.5s") {
		t.Fatalf("%v", err)
	}
	waitFor(t, "the running call cancelled", func() bool {
		_, entries := cs.transcript(t, "sess_chat_deadline")
		for _, e := range entries {
			if r, ok := e.Payload.(*protocol.Response); ok && r.Error != nil && r.Error.Code == protocol.CodeCancelled &&
				strings.Contains(r.Error.Message, "deadline") {
				return true
			}
		}
		return false
	})
}

// A keyed run that ran nothing is retried as the key's next attempt, under a run id of its own:
// the record keeps both attempts' decisions, and the retry's calls are explained by its own.
func TestChatRetryOfARunThatRanNothing(t *testing.T) {
	t.Parallel()
	zero := 0
	script := &scriptedllm.Script{Conversations: []scriptedllm.Conversation{{Name: "refused once", Turns: []scriptedllm.Turn{
		{Status: 400, Message: "not now", Times: 1},
		{Step: &zero, ToolCalls: []scriptedllm.ToolCall{{Name: "echo", Arguments: map[string]any{"text": "once"}}}},
		{Content: "done"},
	}}}}
	cs := startChat(t, "chat-retry", script, nil)
	params := openai.ChatCompletionNewParams{Model: "hermes", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("echo once")}}
	key, session := option.WithHeader("Idempotency-Key", "k-retry"), option.WithHeader("X-Hermes-Session-ID", "sess_chat_retry")
	_, err := cs.client.Chat.Completions.New(t.Context(), params, key, session)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Code != "llm_refused" {
		t.Fatalf("the first attempt: %v", err)
	}
	resp, err := cs.client.Chat.Completions.New(t.Context(), params, key, session)
	if err != nil || resp.Choices[0].Message.Content != "done" || !strings.HasSuffix(resp.ID, "-a2") {
		t.Fatalf("the retry: %v %+v", err, resp)
	}
	_, entries := cs.transcript(t, "sess_chat_retry")
	if n := count(entries, protocol.TypeToolResult); n != 1 {
		t.Errorf("%d results", n)
	}
	for _, e := range entries {
		if e.Msg.Type == protocol.TypeRequest {
			var explained bool
			for _, d := range decisionsOf(entries) {
				explained = explained || (d.Run == resp.ID && d.Turn == 1 && len(d.Chosen) == 1 && d.Chosen[0].Name == "echo")
			}
			if !explained || e.Msg.RequestID != resp.ID+"-1" {
				t.Errorf("request %s is not explained by its decision", e.Msg.RequestID)
			}
		}
	}
	again, err := cs.client.Chat.Completions.New(t.Context(), params, key, session)
	if err != nil || again.ID != resp.ID {
		t.Errorf("a third POST: %v %+v", err, again)
	}
}

// A continuation is matched to the turn that returned exactly the calls the client sends back:
// another run of the session that returned a call of the same id is not taken for it.
func TestChatContinuesOnlyItsOwnTurn(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 300<<10)
	script := &scriptedllm.Script{Conversations: []scriptedllm.Conversation{
		{Name: "A", Match: "first", Turns: []scriptedllm.Turn{
			{ToolCalls: []scriptedllm.ToolCall{{ID: "call_x", Name: "open_editor", Arguments: map[string]any{"path": "a"}},
				{Name: "echo", Arguments: map[string]any{"text": "RESULT-FROM-RUN-A"}}}},
			{Content: "A done"}}},
		{Name: "B", Match: "second", Turns: []scriptedllm.Turn{
			{ToolCalls: []scriptedllm.ToolCall{{ID: "call_x", Name: "open_editor", Arguments: map[string]any{"path": big}},
				{Name: "echo", Arguments: map[string]any{"text": "b"}}}},
			{Content: "B done"}}},
	}}
	cs := startChat(t, "chat-own-turn", script, nil)
	session := option.WithHeader("X-Hermes-Session-ID", "sess_chat_own")
	tool := openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "open_editor", Parameters: openai.FunctionParameters{"type": "object"}})
	ask := func(msgs []openai.ChatCompletionMessageParamUnion) *openai.ChatCompletion {
		resp, err := cs.client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "hermes", Messages: msgs,
			Tools: []openai.ChatCompletionToolUnionParam{tool}}, session)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	ask([]openai.ChatCompletionMessageParamUnion{openai.UserMessage("first")})
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("second")}
	b := ask(msgs)
	msgs = append(msgs, b.Choices[0].Message.ToParam(), openai.ToolMessage("opened", "call_x"))
	if got := ask(msgs).Choices[0].Message.Content; got != "B done" {
		t.Fatalf("answered %q", got)
	}
	reqs := cs.model.Requests()
	for _, m := range reqs[len(reqs)-1].Messages {
		if strings.Contains(m.Text(), "RESULT-FROM-RUN-A") {
			t.Fatal("run A's result was spliced into run B's continuation")
		}
	}
}

// Coarse, then fine: with a prefilter, the model is offered only the registered tools the
// message is about, and the decision records them with their scores; when none is, the model
// is told so and offered none of Hermes' tools (never all of them).
func TestChatPrefiltersTheTools(t *testing.T) {
	t.Parallel()
	script := &scriptedllm.Script{Conversations: []scriptedllm.Conversation{{Name: "weather", Match: "天气", Turns: []scriptedllm.Turn{
		{ToolCalls: []scriptedllm.ToolCall{{Name: "weather_search", Arguments: map[string]any{"city": "上海"}}}},
		{Content: "上海明天晴"},
	}}}, Otherwise: &scriptedllm.Turn{Content: "I can't help with that"}}
	cs := startChat(t, "chat-prefilter", script, func(c *app.ChatConfig) { c.Prefilter = chat.PrefilterConfig{TopK: 2} })
	ask := func(session, text string) {
		if _, err := cs.client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "hermes",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(text)}}, option.WithHeader("X-Hermes-Session-ID", session)); err != nil {
			t.Fatal(err)
		}
	}
	ask("sess_chat_pf", "上海明天的天气怎么样")
	first := cs.model.Requests()[0]
	if len(first.Tools) == 0 || len(first.Tools) > 2 || first.Tools[0].Function.Name != "weather_search" {
		t.Errorf("offered %+v", first.Tools)
	}
	text, entries := cs.transcript(t, "sess_chat_pf")
	d := decisionsOf(entries)[0]
	if !d.Prefiltered || len(d.Candidates) == 0 || d.Candidates[0].Name != "weather_search" || d.Candidates[0].Score <= 0 || len(d.Offered) != len(d.Candidates) {
		t.Errorf("decision %+v", d)
	}
	if !strings.Contains(text, "[路由]     "+d.Run+"-1 粗筛候选: [weather_search ") {
		t.Errorf("the record:\n%s", text)
	}
	t.Logf("the record:\n%s", text)
	asked := len(cs.model.Requests())
	ask("sess_chat_pf_none", "zzz qqq")
	none := cs.model.Requests()[asked]
	if len(none.Tools) != 0 || !strings.Contains(none.Messages[len(none.Messages)-1].Text(), "No tool of this system matches") {
		t.Errorf("nothing qualified, yet: %+v", none)
	}
	text, _ = cs.transcript(t, "sess_chat_pf_none")
	if !strings.Contains(text, "粗筛候选: [] (无匹配的工具，已告知模型)") {
		t.Errorf("the record:\n%s", text)
	}
	// Through /v1/chat the session goes on from its record: what the model was told of the
	// first message is not said again of the next.
	for _, msg := range []string{"zzz qqq", "上海明天的天气怎么样"} {
		if code, out := cs.postJSON(t, "/v1/chat", `{"session_id":"sess_chat_pf_hermes","message":"`+msg+`"}`); code != http.StatusOK {
			t.Fatalf("%d %v", code, out)
		}
	}
	for _, r := range cs.model.Requests()[asked+1:] {
		if r.Messages[len(r.Messages)-1].Text() == "上海明天的天气怎么样" {
			for _, m := range r.Messages {
				if strings.Contains(m.Text(), "No tool of this system matches") {
					t.Error("the note of the first message was said again")
				}
			}
		}
	}
}

// By meaning too: with an embedding model, a message none of whose words names a tool still
// finds it ("会下雨吗" → weather_search), the candidate recorded with its similarity, the tools'
// and the message's vectors kept. An embedding model that is down leaves the lexical ranking,
// and the decision says so; it is not asked again for every message meanwhile.
func TestChatPrefiltersByMeaning(t *testing.T) {
	t.Parallel()
	weather := []scriptedllm.Turn{{ToolCalls: []scriptedllm.ToolCall{{Name: "weather_search", Arguments: map[string]any{"city": "上海"}}}}, {Content: "上海明天晴"}}
	script := func(status, batchDelayMS int) *scriptedllm.Script {
		return &scriptedllm.Script{Conversations: []scriptedllm.Conversation{{Name: "words", Match: "天气", Turns: weather}, {Name: "meaning", Match: "下雨", Turns: weather}},
			Embeddings: &scriptedllm.Embeddings{Concepts: [][]string{{"天气", "下雨", "带伞"}}, Status: status, BatchDelayMS: batchDelayMS}}
	}
	semantic := func(c *app.ChatConfig) {
		c.Prefilter = chat.PrefilterConfig{TopK: 2, Embedder: c.LLM, MinSimilarity: 0.5}
	}
	ask := func(cs *chatSystem, session, text string) (*protocol.LLMDecision, string) {
		t.Helper()
		if code, out := cs.postJSON(t, "/v1/chat", `{"session_id":"`+session+`","message":"`+text+`"}`); code != http.StatusOK {
			t.Fatalf("%d %v", code, out)
		}
		text, entries := cs.transcript(t, session)
		t.Logf("the record:\n%s", text)
		return decisionsOf(entries)[0], text
	}

	// The tools' vectors take 8 s to come (asked for ahead, or by the first message): long
	// enough that the first message comes before them on a loaded machine too.
	up := startChat(t, "chat-prefilter-meaning", script(0, 8000), semantic)
	// The first message builds the tools' index, whose vectors are asked for meanwhile: it is
	// ranked by words, and says why.
	d, text := ask(up, "sess_pf_first", "明天出门要带伞吗，会下雨吗")
	if len(d.Warnings) == 0 || d.Warnings[0].Kind != protocol.WarnEmbeddings || !strings.Contains(d.Warnings[0].Message, "the tools' vectors were still being asked for") ||
		!strings.Contains(text, "[警告]     "+d.Run+"-1 仅用词法粗筛: ") {
		t.Errorf("while the vectors come: %+v", d)
	}
	waitForWithin(t, "the tools' vectors", time.Minute, func() bool {
		n, _ := up.model.Embedded()
		return n >= 13 // the examples' 10 contracts and the 3 meeting tools
	})
	d, text = ask(up, "sess_pf_meaning", "明天出门要带伞吗，会下雨吗")
	if len(d.Candidates) == 0 || d.Candidates[0].Name != "weather_search" || d.Candidates[0].Similarity < 0.5 || len(d.Warnings) != 0 ||
		!strings.Contains(text, "粗筛候选: [weather_search ") {
		t.Errorf("by meaning: %+v", d)
	}
	// The tools' vectors and the message's are kept: the same message again asks for none.
	embedded, _ := up.model.Embedded()
	ask(up, "sess_pf_again", "明天出门要带伞吗，会下雨吗")
	if n, _ := up.model.Embedded(); n != embedded || embedded == 0 {
		t.Errorf("embedded %d texts, then %d", embedded, n)
	}

	down := startChat(t, "chat-prefilter-down", script(503, 0), semantic)
	for i, session := range []string{"sess_pf_down1", "sess_pf_down2"} {
		d, text := ask(down, session, "上海明天的天气怎么样")
		if len(d.Candidates) == 0 || d.Candidates[0].Name != "weather_search" || d.Candidates[0].Similarity != 0 ||
			len(d.Warnings) != 1 || d.Warnings[0].Kind != protocol.WarnEmbeddings || !strings.Contains(text, "[警告]     "+d.Run+"-1 仅用词法粗筛: ") {
			t.Errorf("message %d, the embedding model down: %+v", i+1, d)
		}
	}
	// Asked by the message that found it down (and perhaps ahead of it), then left to rest.
	if _, failed := down.model.Embedded(); failed == 0 || failed > 2 {
		t.Errorf("the embedding model was asked %d times", failed)
	}
}

// post posts the JSON body to path with the admin key (and headers, name then value).
func (cs *chatSystem) post(t *testing.T, path, body string, headers ...string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", cs.sys.GatewayURL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+cs.sys.Key.Key)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// postJSON posts body to path with the admin key (and headers, name then value) and decodes
// the JSON answer.
func (cs *chatSystem) postJSON(t *testing.T, path, body string, headers ...string) (int, map[string]any) {
	t.Helper()
	resp := cs.post(t, path, body, headers...)
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// ollamaPost sends body to /api/chat and returns the status and each JSON object of the answer
// (one for a whole answer, one a line for a stream).
func (cs *chatSystem) ollamaPost(t *testing.T, body string, headers ...string) (int, []map[string]any) {
	t.Helper()
	resp := cs.post(t, "/api/chat", body, headers...)
	defer resp.Body.Close()
	var out []map[string]any
	dec := json.NewDecoder(resp.Body)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if err != io.EOF {
				t.Fatalf("an answer line that is not JSON: %v", err)
			}
			break
		}
		out = append(out, m)
	}
	return resp.StatusCode, out
}

// Ollama's /api/chat runs the same loop: the meeting assistant whole, the recovery variant
// streamed (a JSON object a line, Ollama's default), bad input in Ollama's error shape.
func TestOllamaFrontDoor(t *testing.T) {
	t.Parallel()
	cs := startChat(t, "chat-ollama", scriptedllm.Meeting(), nil)
	code, out := cs.ollamaPost(t, `{"model":"hermes","stream":false,"messages":[{"role":"user","content":"`+meetingAsk+`"}]}`, "X-Hermes-Session-ID", "sess_ollama_meeting")
	if code != http.StatusOK || len(out) != 1 || out[0]["done"] != true || out[0]["done_reason"] != "stop" {
		t.Fatalf("%d %v", code, out)
	}
	msg := out[0]["message"].(map[string]any)
	if !strings.Contains(fmt.Sprint(msg["content"]), "9点到10点") || out[0]["prompt_eval_count"].(float64) == 0 {
		t.Errorf("%v", out[0])
	}
	_, entries := cs.transcript(t, "sess_ollama_meeting")
	if n := count(entries, protocol.TypeResponse); n != 4 {
		t.Errorf("%d requests answered, want 4", n)
	}
	code, out = cs.ollamaPost(t, `{"model":"hermes","messages":[{"role":"user","content":"帮我订一个明天上午的周会"}]}`)
	if code != http.StatusOK || len(out) < 3 {
		t.Fatalf("%d %v", code, out)
	}
	var text strings.Builder
	progress := 0
	for i, line := range out {
		if line["hermes"] != nil && line["done"] == false {
			progress++
		}
		if m, ok := line["message"].(map[string]any); ok {
			if m["tool_calls"] != nil {
				t.Errorf("a tool call of Hermes' in the stream: %v", line)
			}
			text.WriteString(fmt.Sprint(m["content"]))
		}
		if (line["done"] == true) != (i == len(out)-1) {
			t.Errorf("line %d done=%v of %d", i, line["done"], len(out))
		}
	}
	if !strings.Contains(text.String(), "周会已订好") || progress < 4 {
		t.Errorf("streamed %q with %d progress lines", text.String(), progress)
	}
	for _, tc := range []struct {
		body string
		code int
		want string
	}{
		{`{"messages":[{"role":"user","content":"x"}]}`, 400, "model: is required"},
		{`{"model":"llama3","messages":[{"role":"user","content":"x"}]}`, 404, `model "llama3" not found`},
		{`{"model":"hermes","messages":[{"role":"user","content":"x","images":["aGk="]}]}`, 400, "messages[0].images"},
		{`{"model":"hermes","messages":"x"}`, 400, "messages"},
	} {
		code, out := cs.ollamaPost(t, tc.body)
		if code != tc.code || len(out) != 1 || !strings.Contains(fmt.Sprint(out[0]["error"]), tc.want) {
			t.Errorf("%s: %d %v", tc.body, code, out)
		}
	}
}

// An Ollama client's own tools: its calls come back as Ollama tool calls; a tool message
// without an id answers the call of its tool_name, and the run goes on.
func TestOllamaClientTools(t *testing.T) {
	t.Parallel()
	script := &scriptedllm.Script{Conversations: []scriptedllm.Conversation{{Name: "mixed", Turns: []scriptedllm.Turn{
		{ToolCalls: []scriptedllm.ToolCall{{Name: "echo", Arguments: map[string]any{"text": "hermes runs me"}},
			{Name: "open_editor", Arguments: map[string]any{"path": "notes.md"}}}},
		{Content: "both done"},
	}}}}
	cs := startChat(t, "chat-ollama-client", script, nil)
	tools := `[{"type":"function","function":{"name":"open_editor","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}}]`
	code, out := cs.ollamaPost(t, `{"model":"hermes","stream":false,"tools":`+tools+`,"messages":[{"role":"user","content":"open my notes"}]}`, "X-Hermes-Session-ID", "sess_ollama_client")
	if code != http.StatusOK {
		t.Fatalf("%d %v", code, out)
	}
	msg := out[0]["message"].(map[string]any)
	calls, _ := msg["tool_calls"].([]any)
	if len(calls) != 1 || calls[0].(map[string]any)["function"].(map[string]any)["name"] != "open_editor" {
		t.Fatalf("%v", msg)
	}
	// The client sends the message back as Ollama's clients keep it (the arguments an object),
	// and its tool's result without an id.
	fn := calls[0].(map[string]any)["function"]
	back, _ := json.Marshal(map[string]any{"role": "assistant", "content": "", "tool_calls": []any{map[string]any{"id": calls[0].(map[string]any)["id"], "function": fn}}})
	code, out = cs.ollamaPost(t, `{"model":"hermes","stream":false,"tools":`+tools+`,"messages":[{"role":"user","content":"open my notes"},`+string(back)+
		`,{"role":"tool","tool_name":"open_editor","content":"opened"}]}`, "X-Hermes-Session-ID", "sess_ollama_client")
	if code != http.StatusOK || out[0]["message"].(map[string]any)["content"] != "both done" {
		t.Fatalf("%d %v", code, out)
	}
	reqs := cs.model.Requests()
	last := reqs[len(reqs)-1].Messages
	var seen []string
	for _, m := range last {
		seen = append(seen, m.Role)
	}
	if got := strings.Join(seen, ","); got != "user,assistant,tool,tool" || !strings.Contains(last[2].Text()+last[3].Text(), "hermes runs me") {
		t.Errorf("the model read %s", got)
	}
}

// Hermes' own form, POST /v1/chat: only the new message goes in, the conversation before it is
// the session's record; the answer is seed 003 §2.1's package.
func TestHermesChat(t *testing.T) {
	t.Parallel()
	one, two := 1, 2
	script := &scriptedllm.Script{Conversations: []scriptedllm.Conversation{{Name: "weather twice", Turns: []scriptedllm.Turn{
		{ToolCalls: []scriptedllm.ToolCall{{Name: "weather_search", Arguments: map[string]any{"city": "上海"}}}},
		{Step: &one, Content: "上海明天中雨"},
		{Step: &two, Content: "北京也是"},
	}}}}
	cs := startChat(t, "chat-hermes", script, nil)
	post := func(body string) (int, map[string]any) { return cs.postJSON(t, "/v1/chat", body) }
	code, out := post(`{"session_id":"sess_hermes_chat","message":"上海明天的天气怎么样"}`)
	if code != http.StatusOK || out["text"] != "上海明天中雨" || out["session_id"] != "sess_hermes_chat" {
		t.Fatalf("%d %v", code, out)
	}
	calls, _ := out["tool_calls"].([]any)
	if len(calls) != 1 || calls[0].(map[string]any)["name"] != "weather_search" || calls[0].(map[string]any)["status"] != "ok" {
		t.Errorf("tool_calls %v", out["tool_calls"])
	}
	if p, ok := out["pending"].([]any); !ok || len(p) != 0 || out["intent"] == nil {
		t.Errorf("package %v", out)
	}
	// The next message alone: the model reads the conversation the record holds, then it.
	code, out = post(`{"session_id":"sess_hermes_chat","message":"北京呢"}`)
	if code != http.StatusOK || out["text"] != "北京也是" {
		t.Fatalf("%d %v", code, out)
	}
	reqs := cs.model.Requests()
	var seen []string
	for _, m := range reqs[len(reqs)-1].Messages {
		seen = append(seen, m.Role+":"+m.Text())
	}
	if got := strings.Join(seen, "|"); !strings.HasPrefix(got, "user:上海明天的天气怎么样|assistant:|tool:") || !strings.HasSuffix(got, "|assistant:上海明天中雨|user:北京呢") {
		t.Errorf("the model read %s", got)
	}
	_, entries := cs.transcript(t, "sess_hermes_chat")
	ds := decisionsOf(entries)
	if last := ds[len(ds)-1]; len(last.Messages) != 1 || last.Messages[0].Content != "北京呢" {
		t.Errorf("the second run recorded %+v", last.Messages)
	}
	for _, tc := range []struct{ body, field string }{
		{`{"message":"x"}`, "session_id"},
		{`{"session_id":"s"}`, "message"},
		{`{"session_id":"s","message":"x","model":"gpt"}`, "model"},
		{`{"session_id":"bad.id","message":"x"}`, "session_id"},
		{`{"session_id":"s","message":"x","user":"a b"}`, "user"},
		{`{"session_id":"s","message":"x","user":7}`, "user"},
	} {
		code, out := post(tc.body)
		e, _ := out["error"].(map[string]any)
		if code != http.StatusBadRequest || e["field"] != tc.field {
			t.Errorf("%s: %d %v", tc.body, code, out)
		}
	}
	// The end user it is made for, as /v1/route names one: on the record with the caller.
	if code, out := post(`{"session_id":"sess_hermes_chat_alice","message":"上海明天的天气怎么样","user":"alice"}`); code != http.StatusOK {
		t.Fatalf("%d %v", code, out)
	}
	_, entries = cs.transcript(t, "sess_hermes_chat_alice")
	if ds := decisionsOf(entries); len(ds) == 0 || entries[0].Msg.Caller == nil || entries[0].Msg.Caller.User != "alice" {
		t.Errorf("the record's caller: %+v", entries[0].Msg.Caller)
	}
}
