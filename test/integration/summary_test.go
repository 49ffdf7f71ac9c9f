package integration

import (
	"net/http"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/internal/gateway"
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
	script := scriptedllm.Meeting()
	// The summarizer's conversation comes first: it fails (the client's three tries), then
	// condenses.
	script.Conversations[0].Turns = []scriptedllm.Turn{{Status: 503, Times: 3}, {Step: new(0), Summarize: true}}
	cs := startChat(t, "chat-summary", script, func(c *gateway.ChatConfig) { c.SummarizeEvery = 3 })
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
	if len(next.Messages) != 2 || next.Messages[0].Role != "system" || !strings.HasPrefix(next.Messages[0].Text(), "Summary of the conversation's first 10 messages") ||
		!strings.Contains(next.Messages[0].Text(), latest.Text) {
		t.Errorf("the next prompt: %+v", next.Messages)
	}

	// A summary never parts a call from its result: whatever the summary covers, the messages
	// since begin with a person's message or a call, and each result follows its call.
	for _, e := range entries {
		s, ok := e.Payload.(*protocol.LLMSummary)
		if !ok {
			continue
		}
		msgs, _, err := summarize.Since(t.Context(), cs.js, session, s.Through, 0)
		if err != nil {
			t.Fatal(err)
		}
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
