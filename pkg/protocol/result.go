package protocol

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// MaxHintBytes bounds a recovery hint: hints come from tools too, and are shown to people and
// LLMs, never executed.
const MaxHintBytes = 1024

// MaxErrorCodeBytes bounds an error code.
const MaxErrorCodeBytes = 64

// MaxErrorTextBytes bounds the content of a failed result when it is a text (a string given to
// ErrorResult): Hermes' description of what went wrong, which may quote what the caller sent
// (a contract's refusal names each value it refuses), or a tool's error message. Measured as
// the JSON string stored, so that escapes cannot multiply it. A tool's own JSON error body is
// kept as it came (bounded by the worker's --max-result-bytes).
const MaxErrorTextBytes = 4 << 10

// hermesCodes are the codes Hermes sets in error_code: those and only those (see codes.go).
var hermesCodes = map[string]bool{
	CodeNoRoute: true, CodeActionUnsupported: true, CodeToolTimeout: true, CodeToolUnreachable: true,
	CodeToolHTTP5xx: true, CodeToolHTTP4xx: true, CodeToolRateLimited: true, CodeToolRedirected: true,
	CodeToolBadResponse: true, CodeToolFailed: true, CodeResultTooLarge: true, CodeEnvNotAllowed: true,
	CodeEnvUnset: true, CodeBadArguments: true, CodeDeadlineExceeded: true, CodeDeadLettered: true,
	CodeCancelled: true, CodeDestinationRefused: true, CodeContractViolation: true, CodeContractUnavailable: true,
	CodeToolGRPCStatus: true, CodeRouteIncomplete: true, CodeGRPCMethodUnknown: true,
}

// IsHermesCode reports whether code is one of the codes Hermes sets in error_code.
func IsHermesCode(code string) bool { return hermesCodes[code] }

// ToolCode returns code when a tool may report it as its own (tool_error_code): 1 to
// MaxErrorCodeBytes upper-case letters, digits and '_', and not one of Hermes' codes (a tool
// must not pass for Hermes). Anything else is "".
func ToolCode(code string) string {
	if code == "" || len(code) > MaxErrorCodeBytes || IsHermesCode(code) {
		return ""
	}
	for i := 0; i < len(code); i++ {
		if c := code[i]; !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return ""
		}
	}
	return code
}

// ToolFailure is the failed result of a tool that answered an error: code is Hermes' word for
// it (TOOL_HTTP_4XX, TOOL_FAILED, …), toolCode the tool's own, kept in tool_error_code when
// ToolCode accepts it (dropped otherwise: what a tool says is data, never Hermes' verdict).
func ToolFailure(code, toolCode, hint string, content any) ToolResult {
	r := ErrorResult(code, OriginTool, hint, content)
	r.ToolErrorCode = ToolCode(toolCode)
	return r
}

// ErrorResult is the one constructor of failed results: status error, the code (cut to
// MaxErrorCodeBytes), who failed (OriginHermes or OriginTool), a recovery hint for the caller
// (cut to MaxHintBytes) and the content. content is kept as it is when it is a json.RawMessage
// holding valid JSON (a tool's own error body); a string is encoded as a JSON string of at most
// MaxErrorTextBytes (cut, marked "…"); any other value is encoded as JSON. The caller fills in
// the call's id, name, route and attempts.
func ErrorResult(code, origin, hint string, content any) ToolResult {
	if s, ok := content.(string); ok {
		content = errorText(s)
	}
	return ToolResult{Status: ResultError, ErrorCode: cut(code, MaxErrorCodeBytes), ErrorOrigin: origin, RecoveryHint: cut(hint, MaxHintBytes), Content: jsonContent(content)}
}

// errorText is s as a JSON string of at most MaxErrorTextBytes, cut on a character boundary
// and marked "…" when it was longer.
func errorText(s string) json.RawMessage {
	b, err := json.Marshal(s)
	if err != nil || len(b) <= MaxErrorTextBytes {
		return b
	}
	// Every byte cut takes at least one byte off the encoding (escapes take more), so one cut
	// by the excess fits, the mark's quotes and "…" allowed for.
	s = Shorten(s, max(len(s)-(len(b)-MaxErrorTextBytes)-len("…"), 0)) + "…"
	b, _ = json.Marshal(s)
	return b
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

// Cancelled reports whether r is the result a cancellation gave a call that had not finished
// (CANCELLED, from Hermes).
func (r *ToolResult) Cancelled() bool {
	return r.ErrorCode == CodeCancelled && r.ErrorOrigin == OriginHermes
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

// cut shortens s to at most n bytes (on a character boundary), marking a cut with "…".
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return Shorten(s, n) + "…"
}

// Shorten returns s cut to at most n bytes on a character boundary (no mark added).
func Shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
