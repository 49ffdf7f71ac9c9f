package chat

import (
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// A history a model takes: a result with no call before it is left out, a call with no
// result is answered with what is known, and results answer only the calls just before them.
func TestWellFormed(t *testing.T) {
	call := func(ids ...string) protocol.LLMMessage {
		m := protocol.LLMMessage{Role: "assistant"}
		for _, id := range ids {
			m.ToolCalls = append(m.ToolCalls, protocol.LLMCall{ID: id, Name: "echo", Arguments: "{}"})
		}
		return m
	}
	result := func(id string) protocol.LLMMessage {
		return protocol.LLMMessage{Role: "tool", ToolCallID: id, Content: "ok " + id}
	}
	user := protocol.LLMMessage{Role: "user", Content: "hi"}
	got := wellFormed([]protocol.LLMMessage{
		result("stray"), user, call("a", "b"), result("b"), result("a"), result("a"), // a repeated: left out
		call("c"), user, // c unanswered before the person speaks
		call("d"), // d unanswered at the end
	})
	var shape []string
	for _, m := range got {
		s := m.Role
		if m.Role == "tool" {
			s += ":" + m.ToolCallID
			if strings.Contains(m.Content, "no result of this call was recorded") {
				s += "(none)"
			}
		}
		shape = append(shape, s)
	}
	want := "user assistant tool:b tool:a assistant tool:c(none) user assistant tool:d(none)"
	if strings.Join(shape, " ") != want {
		t.Errorf("got  %s\nwant %s", strings.Join(shape, " "), want)
	}
}
