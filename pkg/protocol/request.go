package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Limits bound what one request may carry. The zero value means DefaultLimits.
type Limits struct {
	// MaxToolCalls bounds the calls in one request.
	MaxToolCalls int
	// MaxArgumentsBytes bounds the JSON arguments of one call.
	MaxArgumentsBytes int
	// MaxIntentBytes bounds the intent.
	MaxIntentBytes int
	// MaxNumberDigits bounds the significant digits of every number in a call's arguments
	// (from its first digit but 0 to its last, before its exponent).
	MaxNumberDigits int
	// MaxNumberExponent bounds the magnitude of every number in a call's arguments: written
	// d.ddd×10^e, |e| may be at most this (for zero, the exponent as written).
	MaxNumberExponent int
}

// DefaultLimits are the limits used where none are configured.
var DefaultLimits = Limits{MaxToolCalls: 64, MaxArgumentsBytes: 256 << 10, MaxIntentBytes: 16 << 10,
	MaxNumberDigits: DefaultMaxNumberDigits, MaxNumberExponent: DefaultMaxNumberExponent}

func (l Limits) orDefault() Limits {
	if l.MaxToolCalls <= 0 {
		l.MaxToolCalls = DefaultLimits.MaxToolCalls
	}
	l.MaxToolCalls = min(l.MaxToolCalls, MaxElements) // what one message may hold
	if l.MaxArgumentsBytes <= 0 {
		l.MaxArgumentsBytes = DefaultLimits.MaxArgumentsBytes
	}
	if l.MaxIntentBytes <= 0 {
		l.MaxIntentBytes = DefaultLimits.MaxIntentBytes
	}
	if l.MaxNumberDigits <= 0 {
		l.MaxNumberDigits = DefaultLimits.MaxNumberDigits
	}
	if l.MaxNumberExponent <= 0 {
		l.MaxNumberExponent = DefaultLimits.MaxNumberExponent
	}
	return l
}

// Validate checks r against lim (zero fields: defaults): ids are tokens, tool names are valid,
// tool_call_ids are unique within the request, arguments are JSON objects within bounds (their
// size, and the digits and exponent of each number in them: CheckArguments).
func (r *Request) Validate(lim Limits) error {
	lim = lim.orDefault()
	if err := CheckID("request_id", r.RequestID); err != nil {
		return err
	}
	if r.RequestID == ReservedRequestID {
		return fieldErr("request_id", fmt.Sprintf("%q is reserved (it marks \"no request\" in a session's serial order)", ReservedRequestID))
	}
	if r.SessionID != "" {
		if err := CheckID("session_id", r.SessionID); err != nil {
			return err
		}
	}
	if len(r.Intent) > lim.MaxIntentBytes {
		return fieldErr("intent", fmt.Sprintf("is %d bytes long; the limit is %d", len(r.Intent), lim.MaxIntentBytes))
	}
	if !utf8.ValidString(r.Intent) {
		return fieldErr("intent", "is not valid UTF-8")
	}
	if len(r.ToolCalls) == 0 {
		return fieldErr("tool_calls", "must hold at least one call")
	}
	if len(r.ToolCalls) > lim.MaxToolCalls {
		return fieldErr("tool_calls", fmt.Sprintf("holds %d calls; the limit is %d", len(r.ToolCalls), lim.MaxToolCalls))
	}
	seen := make(map[string]int, len(r.ToolCalls))
	for i := range r.ToolCalls {
		c := &r.ToolCalls[i]
		f := fmt.Sprintf("tool_calls[%d]", i)
		if err := CheckID(f+".tool_call_id", c.ToolCallID); err != nil {
			return err
		}
		if j, dup := seen[c.ToolCallID]; dup {
			return fieldErr(f+".tool_call_id", fmt.Sprintf("%q repeats tool_calls[%d].tool_call_id; ids must be unique within a request", c.ToolCallID, j))
		}
		seen[c.ToolCallID] = i
		if err := CheckToolName(f+".name", c.Name); err != nil {
			return err
		}
		if err := CheckArguments(f+".arguments", c.Arguments, lim); err != nil {
			return err
		}
	}
	if r.Sandbox == nil && (IsSandboxSession(r.SessionID) || IsSandboxSession(r.RequestID)) {
		field := "session_id"
		if IsSandboxSession(r.RequestID) {
			field = "request_id"
		}
		return fieldErr(field, fmt.Sprintf("may not start with %q: such ids are the contract sandbox's", SandboxSessionPrefix))
	}
	if IsMemorySession(r.SessionID) {
		return fieldErr("session_id", fmt.Sprintf("may not start with %q: such sessions hold what Hermes remembers about people", MemorySessionPrefix))
	}
	if r.Approval == "" && strings.HasPrefix(r.RequestID, ApprovalRequestPrefix) {
		return fieldErr("request_id", fmt.Sprintf("may not start with %q: such ids are the requests Hermes runs approved calls in", ApprovalRequestPrefix))
	}
	if r.Run == "" && r.Approval == "" && (strings.HasPrefix(r.RequestID, RunPrefix) || strings.HasPrefix(r.SessionID, RunPrefix)) {
		field := "request_id"
		if !strings.HasPrefix(r.RequestID, RunPrefix) {
			field = "session_id"
		}
		return fieldErr(field, fmt.Sprintf("may not start with %q: such ids are blueprint runs'", RunPrefix))
	}
	if r.Run != "" {
		if err := checkToken("run", r.Run, MaxRunIDLen); err != nil {
			return err
		}
		if r.SessionID != RunSession(r.Run) || !strings.HasPrefix(r.RequestID, RunSession(r.Run)+"-") || r.Sandbox != nil || r.Approval != "" {
			return fieldErr("run", "a step's request is its run's own: session "+RunSession(r.Run)+", request_id "+RunRequestID(r.Run, "<step>"))
		}
	}
	if r.Approval != "" {
		if err := CheckID("approval", r.Approval); err != nil {
			return err
		}
		if len(r.ToolCalls) != 1 || r.Sandbox != nil || r.RequestID != r.Approval {
			return fieldErr("approval", "a request run under an approval is the approval's own: request_id is its id, and it makes its one call")
		}
	}
	if sb := r.Sandbox; sb != nil {
		if err := CheckToolName("sandbox.tool", sb.Tool); err != nil {
			return err
		}
		if r.SessionID != SandboxSession(sb.Tool) {
			return fieldErr("session_id", "a sandbox request's session is "+SandboxSession(sb.Tool))
		}
		probe := sb.Probe == ""
		for i := range r.ToolCalls {
			if r.ToolCalls[i].Name != sb.Tool {
				return fieldErr(fmt.Sprintf("tool_calls[%d].name", i), "a sandbox request calls only the tool it tries, "+sb.Tool)
			}
			probe = probe || r.ToolCalls[i].ToolCallID == sb.Probe
		}
		if !probe {
			return fieldErr("sandbox.probe", "names no call of the request")
		}
	}
	return nil
}

func isJSONObject(b []byte) bool {
	b = bytes.TrimLeft(b, " \t\r\n")
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}

// Content types of what external clients publish (the Content-Type header): a request written
// as JSON, with the field names of the HTTP API (DecodeRequestJSON), or as the envelope Hermes'
// services write (msgpack; the default when none is named).
const (
	ContentTypeJSON    = "application/json"
	ContentTypeMsgpack = "application/msgpack"
)

// DecodeRequestJSON reads a HermesRequest from JSON as it arrives at the HTTP edge and
// validates it. Errors name the field: unknown fields, wrong types and missing values are all
// reported as FieldErrors; input that is not JSON wraps ErrMalformed. Missing or null arguments
// become {}; arguments are kept byte for byte (compacted).
func DecodeRequestJSON(data []byte, lim Limits) (*Request, error) {
	var top map[string]json.RawMessage
	if err := strictObject(data, "", &top); err != nil {
		return nil, err
	}
	var r Request
	for k, v := range top {
		var err error
		switch k {
		case "request_id":
			err = jsonString(v, k, &r.RequestID)
		case "session_id":
			if !isNull(v) {
				err = jsonString(v, k, &r.SessionID)
			}
		case "intent":
			if !isNull(v) {
				err = jsonString(v, k, &r.Intent)
			}
		case "tool_calls":
			err = decodeCallsJSON(v, &r.ToolCalls)
		case "user":
			if !isNull(v) {
				if err = jsonString(v, k, &r.User); err == nil {
					err = CheckUser(k, r.User)
				}
			}
		case "serial":
			if !isNull(v) {
				if err = json.Unmarshal(v, &r.Serial); err != nil {
					err = fieldErr(k, "must be true or false")
				}
			}
		default:
			err = fieldErr(k, "is not a known field (request_id, session_id, intent, tool_calls, serial, user)")
		}
		if err != nil {
			return nil, err
		}
	}
	if _, ok := top["tool_calls"]; !ok {
		return nil, fieldErr("tool_calls", "is required")
	}
	if err := r.Validate(lim); err != nil {
		return nil, err
	}
	return &r, nil
}

func decodeCallsJSON(v json.RawMessage, out *[]ToolCall) error {
	var items []json.RawMessage
	if err := json.Unmarshal(v, &items); err != nil || isNull(v) {
		return fieldErr("tool_calls", "must be an array of calls")
	}
	calls := make([]ToolCall, len(items))
	for i, item := range items {
		f := fmt.Sprintf("tool_calls[%d]", i)
		var obj map[string]json.RawMessage
		if err := strictObject(item, f, &obj); err != nil {
			return err
		}
		c := &calls[i]
		for k, fv := range obj {
			var err error
			switch k {
			case "tool_call_id":
				err = jsonString(fv, f+"."+k, &c.ToolCallID)
			case "name":
				err = jsonString(fv, f+"."+k, &c.Name)
			case "arguments":
				if !isNull(fv) {
					if !isJSONObject(fv) {
						err = fieldErr(f+".arguments", "must be a JSON object, got "+jsonKind(fv))
						break
					}
					var buf bytes.Buffer
					if cerr := json.Compact(&buf, fv); cerr != nil {
						err = fieldErr(f+".arguments", "is not valid JSON")
						break
					}
					c.Arguments = buf.Bytes()
				}
			default:
				err = fieldErr(f+"."+k, "is not a known field (tool_call_id, name, arguments)")
			}
			if err != nil {
				return err
			}
		}
		if c.Arguments == nil {
			c.Arguments = json.RawMessage("{}")
		}
	}
	*out = calls
	return nil
}

func strictObject(data []byte, field string, out *map[string]json.RawMessage) error {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		if field == "" {
			return fmt.Errorf("%w: the body is empty; send a JSON object", ErrMalformed)
		}
		return fieldErr(field, "is empty")
	}
	if trimmed[0] != '{' {
		if field == "" {
			if !json.Valid(trimmed) {
				return fmt.Errorf("%w: the body is not valid JSON", ErrMalformed)
			}
			return fmt.Errorf("%w: the body must be a JSON object, got %s", ErrMalformed, jsonKind(trimmed))
		}
		return fieldErr(field, "must be an object, got "+jsonKind(trimmed))
	}
	if err := json.Unmarshal(trimmed, out); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return fmt.Errorf("%w: invalid JSON at byte %d: %v", ErrMalformed, se.Offset, err)
		}
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return nil
}

func jsonString(v json.RawMessage, field string, out *string) error {
	if len(v) == 0 || v[0] != '"' {
		return fieldErr(field, "must be a string, got "+jsonKind(v))
	}
	if err := json.Unmarshal(v, out); err != nil {
		return fieldErr(field, "is not a valid JSON string")
	}
	return nil
}

func isNull(v json.RawMessage) bool { return string(bytes.TrimSpace(v)) == "null" }

func jsonKind(v []byte) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}
