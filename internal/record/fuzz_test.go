package record

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// FuzzDecodeFormat: whatever bytes the record holds, Decode does not panic, Format writes one
// line without control characters, and JSON writes one valid JSON object.
func FuzzDecodeFormat(f *testing.F) {
	f.Add(encode(f, protocol.TypeRequest, sampleRequest(), "gateway-1"))
	f.Add(encode(f, protocol.TypeToolCall, sampleDispatch(), "router-1"))
	f.Add(encode(f, protocol.TypeToolStarted, &protocol.ToolStarted{ToolCallID: "c", Name: "echo", Attempt: 1}, "w\x1b"))
	f.Add(encode(f, protocol.TypeToolResult, &protocol.ToolResult{ToolCallID: "c", Status: "error", Content: json.RawMessage(`"a\nb"`)}, "w"))
	f.Add(encode(f, protocol.TypeResponse, &protocol.Response{RequestID: "req_abc", SessionID: "s1", Status: "failed",
		Error: &protocol.ResponseError{Code: "X\n", Message: "\u202e"}}, "r"))
	f.Add(encode(f, protocol.TypeLLMDecision, &protocol.LLMDecision{Run: "chat-1", Turn: 1, Input: "帮我\n定", Chosen: []protocol.LLMCall{{ID: "c\x1b", Name: "x", Arguments: "{"}},
		Warnings: []protocol.LLMWarning{{Kind: protocol.WarnMissingArgument, Field: "room\nid"}}}, "gw"))
	f.Add(encode(f, protocol.TypeBlueprintStep, &protocol.BlueprintStep{RunID: "r1", Blueprint: "b", Version: 1, Step: "1", Tool: "t", Status: "skipped",
		Condition: &protocol.StepCondition{Expr: "$.a.b == 'x\n'", Values: json.RawMessage(`{"$.a.b":"\u001b[31m"}`)}, Error: "e\u202e"}, "gw"))
	f.Add([]byte{})
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff, 0x01})
	fm := &Formatter{Location: time.UTC}
	f.Fuzz(func(t *testing.T, data []byte) {
		e := Decode(1, "hermes.request.s1", t0, data)
		if (e.Err == nil) == (e.Payload == nil) {
			t.Fatalf("Err %v with payload %T", e.Err, e.Payload)
		}
		line := fm.Format(e)
		if _, decision := e.Payload.(*protocol.LLMDecision); decision {
			line = strings.ReplaceAll(line, "\n", " ") // a line for each part; none within a part
		}
		if strings.ContainsAny(line, "\n\r\x1b\x00") {
			t.Fatalf("line %q", line)
		}
		j, err := JSON(e)
		if err != nil {
			t.Fatal(err)
		}
		if !json.Valid(j) || strings.Contains(string(j), "\n") {
			t.Fatalf("JSON %q", j)
		}
	})
}
