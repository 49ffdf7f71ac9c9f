package agent

import (
	"encoding/json"
	"fmt"

	"github.com/openai/openai-go/v3"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// MaxRecordedText bounds one message's text as a decision records it: a conversation may be
// long, and what the model reads in full is kept whole where it came from (the tool's result,
// the client's request); the record keeps its start and says how much was left out.
const MaxRecordedText = 16 << 10

// RecordMessages is msgs as the record keeps them: role, text, tool call ids and calls.
func RecordMessages(msgs []openai.ChatCompletionMessageParamUnion) []protocol.LLMMessage {
	if len(msgs) == 0 {
		return nil
	}
	out := make([]protocol.LLMMessage, 0, len(msgs))
	for _, m := range msgs {
		out = append(out, recordMessage(m))
	}
	return out
}

func recordMessage(m openai.ChatCompletionMessageParamUnion) protocol.LLMMessage {
	var r protocol.LLMMessage
	switch {
	case m.OfSystem != nil:
		r.Role, r.Content = "system", textOf(m.OfSystem.Content.OfString.Value, m.OfSystem.Content.OfArrayOfContentParts)
	case m.OfDeveloper != nil:
		r.Role, r.Content = "developer", textOf(m.OfDeveloper.Content.OfString.Value, m.OfDeveloper.Content.OfArrayOfContentParts)
	case m.OfUser != nil:
		r.Role = "user"
		r.Content = m.OfUser.Content.OfString.Value
		for _, p := range m.OfUser.Content.OfArrayOfContentParts {
			if p.OfText != nil {
				r.Content += p.OfText.Text
			}
		}
	case m.OfAssistant != nil:
		r.Role = "assistant"
		r.Content = m.OfAssistant.Content.OfString.Value
		for _, p := range m.OfAssistant.Content.OfArrayOfContentParts {
			if p.OfText != nil {
				r.Content += p.OfText.Text
			}
		}
		for _, c := range m.OfAssistant.ToolCalls {
			if f := c.OfFunction; f != nil {
				r.ToolCalls = append(r.ToolCalls, protocol.LLMCall{ID: f.ID, Name: f.Function.Name, Arguments: cutText(f.Function.Arguments)})
			}
		}
	case m.OfTool != nil:
		r.Role, r.ToolCallID = "tool", m.OfTool.ToolCallID
		r.Content = textOf(m.OfTool.Content.OfString.Value, m.OfTool.Content.OfArrayOfContentParts)
	default:
		b, _ := json.Marshal(m)
		r.Role, r.Content = "unknown", string(b)
	}
	r.Content = cutText(r.Content)
	return r
}

func textOf(s string, parts []openai.ChatCompletionContentPartTextParam) string {
	for _, p := range parts {
		s += p.Text
	}
	return s
}

// CutText is s cut as a decision records it: at most MaxRecordedText bytes, saying how much was left out.
func CutText(s string) string { return cutText(s) }

func cutText(s string) string {
	if len(s) <= MaxRecordedText {
		return s
	}
	cut := MaxRecordedText
	for cut > 0 && s[cut]&0xC0 == 0x80 { // not within a UTF-8 character
		cut--
	}
	return s[:cut] + fmt.Sprintf("… (%d bytes more)", len(s)-cut)
}

// NoCandidates is what the model is told when the prefilter finds none of the registered tools
// to be about a message: said of that message alone, so not replayed with the conversation.
const NoCandidates = "No tool of this system matches the request. Answer without calling a tool, or ask the person for what is missing."
