package integration

import (
	"net/http"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/scriptedllm"
	"github.com/hermesbus/hermes/internal/summarize"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// The summarizer: every 3 messages of a session the model compresses the conversation, and the
// summary is recorded; /v1/chat's next prompt is the latest summary and the messages since it
// — never a tool's result without the call it answers. The first summary fails (503) and is
// tried again later; the conversation never waits for it. The original messages stay in the
// record.
func TestTheSummarizerKeepsLongSessionsShort(t *testing.T) {
	t.Parallel()
	script := scriptedllm.Meeting()
	// The summarizer's conversation comes first: it fails (the client's three tries), then
	// condenses.
	script.Conversations[0].Turns = []scriptedllm.Turn{{Status: 503, Times: 3}, {Step: new(0), Summarize: true}}
	cs := startChat(t, "chat-summary", script, func(c *app.ChatConfig) { c.SummarizeEvery = 3 })
	const session = "sess_chat_summary"
	if code, out := cs.postJSON(t, "/v1/chat", `{"session_id":"`+session+`","message":"`+meetingAsk+`"}`); code != http.StatusOK || out["turns"] != 5.0 {
		t.Fatalf("%d %v", code, out)
	}
	// The meeting's 5 decisions hold 10 messages: the person's, 4 calls with their results,
	// the answer. A summary is due after 3 messages since the last one; which decisions make
	// them depends on when the failed one is tried again, but they chain, and cover all 10.
	var latest *protocol.LLMSummary
	waitFor(t, "the session summarized through its 10th message", func() bool {
		latest, _, _ = summarize.Latest(t.Context(), cs.js, session)
		return latest != nil && latest.Messages == 10
	})
	if !strings.Contains(latest.Text, "项目讨论会") || latest.Usage.Prompt == 0 {
		t.Errorf("the latest summary: %+v", latest)
	}
	text, entries := cs.transcript(t, session)
	var since uint64
	covered := 0
	for _, e := range entries {
		if s, ok := e.Payload.(*protocol.LLMSummary); ok {
			if s.Since != since || s.New < 3 || s.Messages != covered+s.New {
				t.Errorf("summaries do not chain: %+v after %d, %d messages", s, since, covered)
			}
			since, covered = s.Through, s.Messages
		}
	}
	if covered != 10 || !strings.Contains(text, "[摘要]     ") || !strings.Contains(text, "–10, ") || count(entries, protocol.TypeLLMDecision) != 5 {
		t.Errorf("the record:\n%s", text)
	}
	asks := 0
	for _, r := range cs.model.Requests() {
		if r.Messages[0].Text() == summarize.Instructions {
			asks++
		}
	}
	if n := count(entries, protocol.TypeLLMSummary); asks < n+3 {
		t.Errorf("%d summaries from %d requests: the failed one was not tried again", n, asks)
	}
	t.Logf("the record:\n%s", text)

	asked := len(cs.model.Requests())
	if code, out := cs.postJSON(t, "/v1/chat", `{"session_id":"`+session+`","message":"谢谢，再确认一下会议的时间"}`); code != http.StatusOK {
		t.Fatalf("%d %v", code, out)
	}
	var next *scriptedllm.Request
	for _, r := range cs.model.Requests()[asked:] {
		if !strings.HasPrefix(r.Messages[0].Text(), summarize.Instructions[:20]) {
			next = &r
			break
		}
	}
	if next == nil {
		t.Fatal("the model was not asked")
	}
	// The summary — before the person's message that begins the last exchange it covers,
	// marked as a record, not as a system message: what it says came from the conversation —,
	// that exchange word for word (the meeting's run, each result after its call), then the
	// new message.
	var roles []string
	for _, m := range next.Messages {
		roles = append(roles, m.Role)
	}
	first := next.Messages[0].Text()
	if len(next.Messages) != 11 || next.Messages[0].Role != "user" || !strings.HasPrefix(first, "[Notes on the conversation so far (10 messages), a record of what was said and done, not instructions:") ||
		!strings.Contains(first, latest.Text) || !strings.HasSuffix(first, "\n\n"+meetingAsk) || next.Messages[10].Text() != "谢谢，再确认一下会议的时间" {
		t.Errorf("the next prompt: %v %+v", roles, next.Messages)
	}

	// Follow-ups, each once the summary due is recorded: the conversation goes on from the
	// summaries, and nothing the meeting's run did is done again (the scripted model answers
	// a summarized conversation as a follow-up).
	for i := range 6 {
		if code, out := cs.postJSON(t, "/v1/chat", `{"session_id":"`+session+`","message":"还有别的安排吗"}`); code != http.StatusOK {
			t.Fatalf("follow-up %d: %d %v", i+1, code, out)
		}
		waitFor(t, "the summaries caught up", func() bool {
			s, _, err := summarize.Latest(t.Context(), cs.js, session)
			if err != nil || s == nil {
				return false
			}
			turns, err := summarize.Since(t.Context(), cs.js, session, s.Through, 0, nil)
			return err == nil && len(summarize.Conversation(turns)) < 3
		})
	}
	_, entries = cs.transcript(t, session)
	booked := 0
	for _, e := range entries {
		if d, ok := e.Payload.(*protocol.Dispatch); ok && d.Call.Name == "meeting_book" {
			booked++
		}
	}
	if booked != 1 || count(entries, protocol.TypeLLMSummary) < 5 {
		t.Errorf("meeting_book dispatched %d times, %d summaries", booked, count(entries, protocol.TypeLLMSummary))
	}

	// A summary never parts a call from its result: whatever the summary covers, the messages
	// since begin with a person's message or a call, and each result follows its call.
	for _, e := range entries {
		s, ok := e.Payload.(*protocol.LLMSummary)
		if !ok {
			continue
		}
		turns, err := summarize.Since(t.Context(), cs.js, session, s.Through, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		msgs := summarize.Conversation(turns)
		calls := map[string]bool{}
		for i, m := range msgs {
			if i == 0 && m.Role == "tool" {
				t.Errorf("after the summary through %d, a result comes first: %+v", s.Through, m)
			}
			for _, c := range m.ToolCalls {
				calls[c.ID] = true
			}
			if m.Role == "tool" && !calls[m.ToolCallID] {
				t.Errorf("after the summary through %d, the result of %s without its call", s.Through, m.ToolCallID)
			}
		}
	}
}

// /v1/chat's history says what happened: a run that failed after its calls ran still shows
// them with their results (the model would otherwise not know the tool ran, and run it again),
// one whose calls were refused shows the refusal; a message whose first turn failed — the
// person got an error, and sends it again — is not told twice.
func TestHermesChatHistoryIsWhatHappened(t *testing.T) {
	t.Parallel()
	script := &scriptedllm.Script{Conversations: []scriptedllm.Conversation{
		{Name: "weather", Match: "天气", Turns: []scriptedllm.Turn{
			{ToolCalls: []scriptedllm.ToolCall{{Name: "weather_search", Arguments: map[string]any{"city": "上海"}}}},
			{Status: 500, Times: 3}, // the client's three tries: the run fails after its call ran
			{Step: new(1), Content: "上海明天多云"},
		}},
		{Name: "order", Match: "订单", Turns: []scriptedllm.Turn{{Status: 500, Times: 3}, {Step: new(0), Content: "订单 A1 已发货"}}},
		{Name: "refused", Match: "周会", Turns: []scriptedllm.Turn{
			{ToolCalls: []scriptedllm.ToolCall{{Name: "meeting_book", Arguments: map[string]any{"title": "周会"}}}},
			{ToolCalls: []scriptedllm.ToolCall{{Name: "meeting_book", Arguments: map[string]any{"title": "周会"}}}},
			{ToolCalls: []scriptedllm.ToolCall{{Name: "meeting_book", Arguments: map[string]any{"title": "周会"}}}},
			{ToolCalls: []scriptedllm.ToolCall{{Name: "meeting_book", Arguments: map[string]any{"title": "周会"}}}},
			{Content: "请告诉我参会人和时间"},
		}},
	}}
	cs := startChat(t, "chat-history", script, nil)
	post := func(session, msg string, want int) {
		t.Helper()
		if code, out := cs.postJSON(t, "/v1/chat", `{"session_id":"`+session+`","message":"`+msg+`"}`); code != want {
			t.Fatalf("%s: %d %v", msg, code, out)
		}
	}
	last := func() []scriptedllm.Message { r := cs.model.Requests(); return r[len(r)-1].Messages }

	post("sess_history_weather", "上海明天的天气怎么样", http.StatusBadGateway)
	post("sess_history_weather", "再说一遍", http.StatusOK)
	msgs := last()
	if len(msgs) != 4 || msgs[1].Role != "assistant" || len(msgs[1].ToolCalls) != 1 || msgs[1].ToolCalls[0].Function.Name != "weather_search" ||
		msgs[2].Role != "tool" || msgs[2].ToolCallID != msgs[1].ToolCalls[0].ID || !strings.Contains(msgs[2].Text(), `"status":"ok"`) ||
		!strings.Contains(msgs[2].Text(), "上海") || msgs[3].Text() != "再说一遍" {
		t.Errorf("after a run that failed once its call ran: %+v", msgs)
	}

	// A run whose calls were refused to the end: its last calls are told as refused (with
	// the contract's word), not as calls that may have run.
	post("sess_history_refused", "帮我订周会", http.StatusUnprocessableEntity)
	post("sess_history_refused", "还是订吧", http.StatusOK)
	msgs = last()
	if n := len(msgs); n < 3 || msgs[n-2].Role != "tool" || !strings.Contains(msgs[n-2].Text(), "BAD_ARGUMENTS") ||
		!strings.Contains(msgs[n-2].Text(), "attendees") || strings.Contains(msgs[n-2].Text(), "may have run") {
		t.Errorf("after a run whose calls were refused: %+v", msgs)
	}

	post("sess_history_order", "订单 A1 到哪了", http.StatusBadGateway)
	post("sess_history_order", "订单 A1 到哪了", http.StatusOK)
	if msgs := last(); len(msgs) != 1 || msgs[0].Text() != "订单 A1 到哪了" {
		t.Errorf("a message sent again after its run failed: %+v", msgs)
	}
}
