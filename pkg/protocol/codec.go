package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Marshal encodes m as msgpack for the bus.
func Marshal(m *Message) ([]byte, error) {
	b, err := msgpack.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("protocol: encode message: %w", err)
	}
	return b, nil
}

// Unmarshal decodes and validates an envelope from the bus. Any error wraps ErrMalformed or is
// a FieldError (ErrInvalid); retrying such a message can never succeed.
func Unmarshal(data []byte) (*Message, error) {
	var m Message
	if err := decodeMsgpack(data, &m); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

func decodeMsgpack(data []byte, v any) error {
	if err := CheckMsgpack(data, MaxDepth); err != nil {
		return err
	}
	dec := msgpack.GetDecoder()
	defer msgpack.PutDecoder(dec)
	dec.Reset(bytes.NewReader(data)) // flags reset: unknown fields are skipped, for forward compatibility
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return nil
}

func (m *Message) decodePayload(want Type, v any) error {
	if m.Type != want {
		return fmt.Errorf("%w: payload of %s read as %s", ErrMalformed, m.Type, want)
	}
	return decodeMsgpack(m.Payload, v)
}

// DecodeRequest reads and validates the request payload of m. The request's ids must agree with
// the envelope's.
func (m *Message) DecodeRequest(lim Limits) (*Request, error) {
	var r Request
	if err := m.decodePayload(TypeRequest, &r); err != nil {
		return nil, err
	}
	if err := r.Validate(lim); err != nil {
		return nil, err
	}
	if r.RequestID != m.RequestID || r.Session() != m.SessionID {
		return nil, fieldErr("request_id", "of the payload does not match the envelope")
	}
	return &r, nil
}

// DecodeDispatch reads and validates the tool_call payload of m.
func (m *Message) DecodeDispatch() (*Dispatch, error) {
	var d Dispatch
	if err := m.decodePayload(TypeToolCall, &d); err != nil {
		return nil, err
	}
	if err := CheckID("call.tool_call_id", d.Call.ToolCallID); err != nil {
		return nil, err
	}
	if err := CheckToolName("call.name", d.Call.Name); err != nil {
		return nil, err
	}
	if d.Call.Arguments != nil && !json.Valid(d.Call.Arguments) {
		return nil, fieldErr("call.arguments", "is not valid JSON")
	}
	if err := d.Action.Check(); err != nil {
		return nil, err
	}
	if g := d.Grant; g != nil {
		if err := g.Check(); err != nil {
			return nil, err
		}
	}
	if c := d.Contract; c != nil {
		switch {
		case c.Name != d.Call.Name:
			return nil, fieldErr("contract.name", "is not the call's tool")
		case c.Version < 1 || c.Revision < 1:
			return nil, fieldErr("contract.version", "must be at least 1")
		case len(c.ResourceLevel) > 8 || len(c.Effects) > 32:
			return nil, fieldErr("contract", "resource_level or effects too long")
		}
	}
	if d.Policy != nil {
		if err := d.Policy.Check(); err != nil {
			return nil, err
		}
	}
	return &d, nil
}

// DecodeToolStarted reads the tool_started payload of m.
func (m *Message) DecodeToolStarted() (*ToolStarted, error) {
	var s ToolStarted
	if err := m.decodePayload(TypeToolStarted, &s); err != nil {
		return nil, err
	}
	if err := CheckID("tool_call_id", s.ToolCallID); err != nil {
		return nil, err
	}
	if len(s.Retrying) > MaxErrorCodeBytes || !Printable(s.Retrying) {
		return nil, fieldErr("retrying", fmt.Sprintf("an error code is at most %d printable bytes", MaxErrorCodeBytes))
	}
	return &s, nil
}

// DecodeCancel reads the cancel payload of m.
func (m *Message) DecodeCancel() (*Cancel, error) {
	var c Cancel
	if err := m.decodePayload(TypeCancel, &c); err != nil {
		return nil, err
	}
	if len(c.By) > MaxCancelTextBytes || len(c.Reason) > MaxCancelTextBytes {
		return nil, fieldErr("cancel", fmt.Sprintf("by and reason may hold at most %d bytes each", MaxCancelTextBytes))
	}
	return &c, nil
}

// MaxPolicyTextBytes bounds the words of a PolicyDecision (its reason, who decided).
const MaxPolicyTextBytes = 1024

// Check refuses a decision whose words are over their bounds or not printable.
func (d *PolicyDecision) Check() error {
	for _, f := range []struct{ name, v string }{{"decision", d.Decision}, {"rule", d.Rule}, {"source", d.Source}, {"reason", d.Reason}, {"approval_id", d.ApprovalID}, {"by", d.By}} {
		if len(f.v) > MaxPolicyTextBytes || !Printable(f.v) {
			return fieldErr("policy."+f.name, fmt.Sprintf("must be at most %d printable bytes", MaxPolicyTextBytes))
		}
	}
	if d.Version < 0 {
		return fieldErr("policy.version", "must not be negative")
	}
	return nil
}

// DecodeBlueprintStep reads the blueprint_step payload of m.
func (m *Message) DecodeBlueprintStep() (*BlueprintStep, error) {
	var e BlueprintStep
	if err := m.decodePayload(TypeBlueprintStep, &e); err != nil {
		return nil, err
	}
	if err := checkToken("run_id", e.RunID, MaxRunIDLen); err != nil {
		return nil, err
	}
	if err := CheckToolName("blueprint", e.Blueprint); err != nil {
		return nil, err
	}
	if e.Tool != "" {
		if err := CheckToolName("tool", e.Tool); err != nil {
			return nil, err
		}
	}
	for _, f := range []struct{ name, v string }{{"step", e.Step}, {"status", e.Status}, {"request_id", e.RequestID}, {"tool_call_id", e.ToolCallID},
		{"approval_id", e.ApprovalID}, {"error_code", e.ErrorCode}, {"error", e.Error}, {"message", e.Message}, {"transfer_to", e.TransferTo}} {
		if len(f.v) > MaxBlueprintTextBytes || !Printable(f.v) {
			return nil, fieldErr(f.name, fmt.Sprintf("must be at most %d printable bytes", MaxBlueprintTextBytes))
		}
	}
	if e.Status == "" || e.Version < 1 || e.DurationMS < 0 {
		return nil, fieldErr("status", "a blueprint step's event names its status, and the blueprint's version")
	}
	if c := e.Condition; c != nil {
		if len(c.Expr) > MaxBlueprintTextBytes || !Printable(c.Expr) {
			return nil, fieldErr("condition.expr", fmt.Sprintf("must be at most %d printable bytes", MaxBlueprintTextBytes))
		}
		if len(c.Values) > MaxConditionValuesBytes || len(c.Values) > 0 && !json.Valid(c.Values) {
			return nil, fieldErr("condition.values", fmt.Sprintf("must be JSON of at most %d bytes", MaxConditionValuesBytes))
		}
	}
	return &e, nil
}

// DecodePolicyEvent reads the policy_decision payload of m.
func (m *Message) DecodePolicyEvent() (*PolicyEvent, error) {
	var e PolicyEvent
	if err := m.decodePayload(TypePolicy, &e); err != nil {
		return nil, err
	}
	if err := CheckID("tool_call_id", e.ToolCallID); err != nil {
		return nil, err
	}
	if err := CheckToolName("tool", e.Tool); err != nil {
		return nil, err
	}
	if err := e.Decision.Check(); err != nil {
		return nil, err
	}
	return &e, nil
}

// MaxCancelTextBytes bounds Cancel.By and Cancel.Reason.
const MaxCancelTextBytes = 256

// DecodeToolResult reads and validates the tool_result payload of m.
func (m *Message) DecodeToolResult() (*ToolResult, error) {
	var r ToolResult
	if err := m.decodePayload(TypeToolResult, &r); err != nil {
		return nil, err
	}
	if err := r.Validate("result"); err != nil {
		return nil, err
	}
	return &r, nil
}

// DecodeResponse reads and validates the response payload of m.
func (m *Message) DecodeResponse() (*Response, error) {
	var r Response
	if err := m.decodePayload(TypeResponse, &r); err != nil {
		return nil, err
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// Validate checks a result's id, status and content; field prefixes the field names.
func (r *ToolResult) Validate(field string) error {
	if err := CheckID(joinField(field, "tool_call_id"), r.ToolCallID); err != nil {
		return err
	}
	if r.Status != ResultOK && r.Status != ResultError {
		return fieldErr(joinField(field, "status"), fmt.Sprintf("must be %q or %q", ResultOK, ResultError))
	}
	if r.Content != nil && !json.Valid(r.Content) {
		return fieldErr(joinField(field, "content"), "is not valid JSON")
	}
	if r.Grant != nil {
		if err := r.Grant.Check(); err != nil {
			return err
		}
	}
	if len(r.SuggestedOrder) > MaxCoordinationTextBytes {
		return fieldErr(joinField(field, "suggested_order"), fmt.Sprintf("at most %d tools", MaxCoordinationTextBytes))
	}
	for _, t := range r.SuggestedOrder {
		if err := CheckToolName(joinField(field, "suggested_order"), t); err != nil {
			return err
		}
	}
	if r.Policy != nil {
		if err := r.Policy.Check(); err != nil {
			return err
		}
	}
	if len(r.Retried) > MaxRetriedCodes {
		return fieldErr(joinField(field, "retried"), fmt.Sprintf("at most %d codes", MaxRetriedCodes))
	}
	for _, c := range r.Retried {
		if len(c) > MaxErrorCodeBytes || !Printable(c) {
			return fieldErr(joinField(field, "retried"), fmt.Sprintf("an error code is at most %d printable bytes", MaxErrorCodeBytes))
		}
	}
	return nil
}

// MaxRetriedCodes bounds ToolResult.Retried: a route tries a call at most 10 times.
const MaxRetriedCodes = 16

// RetriedBefore is the code try attempt retries, of codes, the codes the tries failed with in
// order (ToolResult.Retried): what the try before it failed with ("" for a first try, or one
// codes does not reach).
func RetriedBefore(codes []string, attempt int) string {
	if attempt < 2 || attempt-2 >= len(codes) {
		return ""
	}
	return codes[attempt-2]
}

// Validate checks a response's ids, status and results.
func (r *Response) Validate() error {
	if err := CheckID("request_id", r.RequestID); err != nil {
		return err
	}
	if err := CheckID("session_id", r.SessionID); err != nil {
		return err
	}
	switch r.Status {
	case StatusSuccess, StatusPartialSuccess, StatusFailed:
	default:
		return fieldErr("status", "must be success, partial_success or failed")
	}
	for i := range r.Results {
		if err := r.Results[i].Validate(fmt.Sprintf("results[%d]", i)); err != nil {
			return err
		}
	}
	return nil
}

// MaxSummaryBytes bounds the text of an LLMSummary as read back.
const MaxSummaryBytes = 256 << 10

// DecodeLLMSummary reads the llm_summary payload of m.
func (m *Message) DecodeLLMSummary() (*LLMSummary, error) {
	var s LLMSummary
	if err := m.decodePayload(TypeLLMSummary, &s); err != nil {
		return nil, err
	}
	switch {
	case s.Through == 0 || s.Since >= s.Through:
		return nil, fieldErr("through", "must be a stream sequence after since")
	case s.Tail > s.Through:
		return nil, fieldErr("tail", "must be a stream sequence it covers")
	case s.Messages < 0 || s.New < 0 || s.New > s.Messages:
		return nil, fieldErr("messages", "must count at least the new messages, none negative")
	case len(s.Text) > MaxSummaryBytes:
		return nil, fieldErr("text", fmt.Sprintf("holds %d bytes; a summary holds at most %d", len(s.Text), MaxSummaryBytes))
	}
	return &s, nil
}

// Bounds of an LLMDecision as read back: the message that holds one is bounded by the
// server's max_payload; these keep a hostile one from growing a reader's lists past reason.
const (
	MaxDecisionMessages = 4096
	MaxDecisionCalls    = 1024
	MaxDecisionOffered  = 16384
)

// DecodeLLMDecision reads the llm_decision payload of m.
func (m *Message) DecodeLLMDecision() (*LLMDecision, error) {
	var d LLMDecision
	if err := m.decodePayload(TypeLLMDecision, &d); err != nil {
		return nil, err
	}
	if err := CheckID("run", d.Run); err != nil {
		return nil, err
	}
	switch {
	case d.Turn < 1:
		return nil, fieldErr("turn", "must be 1 or more")
	case len(d.Messages) > MaxDecisionMessages:
		return nil, fieldErr("messages", fmt.Sprintf("holds %d messages; a decision holds at most %d", len(d.Messages), MaxDecisionMessages))
	case len(d.Chosen) > MaxDecisionCalls || len(d.Warnings) > 2*MaxDecisionCalls:
		return nil, fieldErr("chosen", fmt.Sprintf("a decision holds at most %d calls and %d warnings", MaxDecisionCalls, 2*MaxDecisionCalls))
	case len(d.Candidates) > MaxDecisionCalls:
		return nil, fieldErr("candidates", fmt.Sprintf("a decision holds at most %d candidates", MaxDecisionCalls))
	case len(d.Offered) > MaxDecisionOffered:
		return nil, fieldErr("offered", fmt.Sprintf("a decision names at most %d tools offered", MaxDecisionOffered))
	case len(d.Memory) > MaxDecisionMemory:
		return nil, fieldErr("memory", fmt.Sprintf("a decision names at most %d fragments", MaxDecisionMemory))
	case d.Intent != nil && (!(d.Intent.Confidence >= 0 && d.Intent.Confidence <= 1) || len(d.Intent.Domain) > 64 || !Printable(d.Intent.Domain) || d.Intent.LifetimeSeconds < 0):
		return nil, fieldErr("intent", "must have a confidence between 0 and 1 and a domain of at most 64 bytes")
	}
	for _, f := range d.Memory {
		if len(f.Key) > MaxMemoryKeyBytes || len(f.Type) > MaxMemoryKeyBytes || len(f.Session) > MaxIDLen || !Printable(f.Key) || !Printable(f.Type) {
			return nil, fieldErr("memory", "names a fragment out of bounds")
		}
	}
	for _, msg := range d.Messages {
		if len(msg.ToolCalls) > MaxDecisionCalls {
			return nil, fieldErr("messages.tool_calls", fmt.Sprintf("a message holds at most %d calls", MaxDecisionCalls))
		}
	}
	return &d, nil
}
