package protocol

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// MaxHintBytes bounds a recovery hint: hints come from tools too, and are shown to people and
// LLMs, never executed.
const MaxHintBytes = 1024

// ErrorResult is the one constructor of failed results: status error, the code, who failed
// (OriginHermes or OriginTool), a recovery hint for the caller (cut to MaxHintBytes) and the
// content. content is kept as it is when it is a json.RawMessage holding valid JSON (a tool's
// own error body); any other value is encoded as JSON, a string as a JSON string. The caller
// fills in the call's id, name, route and attempts.
func ErrorResult(code, origin, hint string, content any) ToolResult {
	return ToolResult{Status: ResultError, ErrorCode: code, ErrorOrigin: origin, RecoveryHint: cutHint(hint), Content: jsonContent(content)}
}

// For returns r as the result of call, routed by route: its id and name set.
func (r ToolResult) For(call *ToolCall, route string) ToolResult {
	r.ToolCallID, r.Name, r.Route = call.ToolCallID, call.Name, route
	return r
}

// CancelledResult is the result of a call whose request was cancelled before the call
// finished: route routed it, attempts tries were made, by names who cancelled (when known).
func CancelledResult(call *ToolCall, route string, attempts int, by string) ToolResult {
	detail := "the request was cancelled before this call finished"
	if by != "" {
		detail = "the request was cancelled (by " + by + ") before this call finished"
	}
	r := ErrorResult(CodeCancelled, OriginHermes, "the call was stopped or never started; send a new request if it is still wanted", detail).For(call, route)
	r.Attempts = attempts
	return r
}

func jsonContent(v any) json.RawMessage {
	if raw, ok := v.(json.RawMessage); ok && json.Valid(raw) {
		return raw
	}
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(fmt.Sprint(v))
	}
	return b
}

func cutHint(h string) string {
	if len(h) <= MaxHintBytes {
		return h
	}
	cut := MaxHintBytes
	for cut > 0 && !utf8.RuneStart(h[cut]) {
		cut--
	}
	return h[:cut] + "…"
}
