package protocol

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
)

// SchemaVersion is the envelope schema this package writes. Decoders accept versions up to it.
const SchemaVersion = 1

// Type is a versioned message type name. A breaking change to a payload gets a new version
// suffix; readers reject versions they do not know instead of misreading them.
type Type string

// Message types.
const (
	TypeRequest     Type = "request.v1"
	TypeToolCall    Type = "tool_call.v1"
	TypeToolStarted Type = "tool_started.v1"
	TypeToolResult  Type = "tool_result.v1"
	TypeResponse    Type = "response.v1"
	// TypeCancel records that a request was cancelled, by whom and why (payload Cancel).
	TypeCancel Type = "cancel.v1"
	// TypeLLMDecision records one turn of the agent loop: what the model read and was offered,
	// and what it chose (payload LLMDecision).
	TypeLLMDecision Type = "llm_decision.v1"
	// TypeLLMSummary records a summary of a session's conversation, which stands for the
	// messages it covers in the prompts after it (payload LLMSummary).
	TypeLLMSummary Type = "llm_summary.v1"
	// TypePolicy records what a tool's policy decided about a call between its request and
	// its result: a wait for the rate window, an approval asked for and decided (payload
	// PolicyEvent).
	TypePolicy Type = "policy_decision.v1"
	// TypeBlueprintStep records a step of a blueprint run as it starts, ends or is skipped,
	// and the run as it ends (payload BlueprintStep).
	TypeBlueprintStep Type = "blueprint_step.v1"
	// TypeCoordination records what state coordination did about a call that changes a
	// resource: proposed, waiting, granted, released, expired, conflict (payload
	// CoordinationEvent).
	TypeCoordination Type = "coordination.v1"
	// TypeMemory records a change of a fragment Hermes remembers about a user: written,
	// replaced, deleted, expired, evicted (payload MemoryEvent).
	TypeMemory Type = "memory.v1"
)

// Known reports whether t is a type this version of Hermes reads.
func (t Type) Known() bool {
	switch t {
	case TypeRequest, TypeToolCall, TypeToolStarted, TypeToolResult, TypeResponse, TypeCancel, TypeLLMDecision, TypeLLMSummary, TypePolicy, TypeBlueprintStep, TypeCoordination, TypeMemory:
		return true
	}
	return false
}

// Roles of senders.
const (
	RoleGateway    = "gateway"
	RoleRouter     = "router"
	RoleToolWorker = "toolworker"
	RoleClient     = "client"
	RoleDeadLetter = "deadletter"
	// RoleCLI is the hermes command line, acting on the bus directly.
	RoleCLI = "cli"
)

// Sender says which role and which process instance published a message.
type Sender struct {
	Role     string `msgpack:"role" json:"role"`
	Instance string `msgpack:"instance" json:"instance"`
}

// TraceContext carries the caller's correlation id and W3C trace context.
type TraceContext struct {
	TraceID     string `msgpack:"trace_id,omitempty" json:"trace_id,omitempty"`
	Traceparent string `msgpack:"traceparent,omitempty" json:"traceparent,omitempty"`
	Tracestate  string `msgpack:"tracestate,omitempty" json:"tracestate,omitempty"`
}

// Message is the HermesMessage envelope of every bus event. Payload holds the msgpack encoding
// of the payload type that Type names; use the Decode* functions to read it.
type Message struct {
	SchemaVersion int    `msgpack:"schema_version" json:"schema_version"`
	MsgID         string `msgpack:"msg_id" json:"msg_id"`
	Type          Type   `msgpack:"type" json:"type"`
	SessionID     string `msgpack:"session_id" json:"session_id"`
	RequestID     string `msgpack:"request_id" json:"request_id"`
	// CausationID is the MsgID of the message this one answers.
	CausationID string       `msgpack:"causation_id,omitempty" json:"causation_id,omitempty"`
	Sender      Sender       `msgpack:"sender" json:"sender"`
	Recipient   string       `msgpack:"recipient,omitempty" json:"recipient,omitempty"`
	CreatedAt   time.Time    `msgpack:"created_at" json:"created_at"`
	Attempt     int          `msgpack:"attempt,omitempty" json:"attempt,omitempty"`
	Deadline    time.Time    `msgpack:"deadline,omitempty" json:"deadline,omitempty"`
	Trace       TraceContext `msgpack:"trace" json:"trace"`
	// Correlation travels with a tool call and comes back with its result: what the router
	// needs to aggregate without reading the request's plan. Hermes' own services set it; it
	// is not part of any payload a caller sees.
	Correlation *Correlation `msgpack:"correlation,omitempty" json:"correlation,omitempty"`
	// Caller is who made the request this message belongs to, as the gateway authenticated
	// it: set by the gateway from a credential (never from what a client says) and carried
	// by every message that follows the request. Nil on requests submitted on the bus
	// directly.
	Caller *Caller `msgpack:"caller,omitempty" json:"caller,omitempty"`
	// Seal, on a tool call, is the signature of the router that dispatched it (see Seal).
	Seal    *Seal  `msgpack:"seal,omitempty" json:"-"`
	Payload []byte `msgpack:"payload" json:"-"`
}

// Caller is an authenticated caller, as the record keeps it.
type Caller struct {
	// ID names the caller: "key:<key id>" or "oidc:<issuer>#<subject>".
	ID string `msgpack:"id" json:"id"`
	// Name is a label for people: a key's name, a token's preferred name.
	Name string `msgpack:"name,omitempty" json:"name,omitempty"`
	Role string `msgpack:"role,omitempty" json:"role,omitempty"`
	// User is the end user an application caller made the request for; empty when it made
	// it for itself.
	User string `msgpack:"user,omitempty" json:"user,omitempty"`
}

// Caller bounds.
const (
	MaxCallerIDLen   = 512
	MaxCallerNameLen = 128
	MaxUserLen       = 128
)

// CheckUser returns a FieldError naming field when user is not an end user's id: 1 to
// MaxUserLen letters, digits and '.', '_', '-', '@', '+', ':', starting with a letter or digit.
func CheckUser(field, user string) error {
	if user == "" {
		return fieldErr(field, "is empty")
	}
	if len(user) > MaxUserLen {
		return fieldErr(field, fmt.Sprintf("is %d bytes long; the limit is %d", len(user), MaxUserLen))
	}
	for i := 0; i < len(user); i++ {
		c := user[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || !strings.ContainsRune("._-@+:", rune(c))) {
			return fieldErr(field, fmt.Sprintf("must hold only letters, digits, '.', '_', '-', '@', '+' and ':', starting with a letter or digit (got %s)", quoteShort(user)))
		}
	}
	return nil
}

// Validate checks c as the record keeps it: printable fields within their bounds.
func (c *Caller) Validate() error {
	switch {
	case c.ID == "" || len(c.ID) > MaxCallerIDLen || !Printable(c.ID):
		return fieldErr("caller.id", fmt.Sprintf("must be 1 to %d printable characters", MaxCallerIDLen))
	case len(c.Name) > MaxCallerNameLen || !Printable(c.Name):
		return fieldErr("caller.name", fmt.Sprintf("must be at most %d printable characters", MaxCallerNameLen))
	case len(c.Role) > MaxCallerNameLen || !Printable(c.Role):
		return fieldErr("caller.role", fmt.Sprintf("must be at most %d printable characters", MaxCallerNameLen))
	case c.User != "":
		return CheckUser("caller.user", c.User)
	}
	return nil
}

// Printable reports whether s is valid UTF-8 without control or format characters (bidi
// overrides and the like, which could make a name read as something else) or line breaks.
func Printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp) || r == utf8.RuneError {
			return false
		}
	}
	return true
}

// Correlation is the routing bookkeeping of a tool call and its result.
type Correlation struct {
	// CallIDs are every call id of the request, in order.
	CallIDs []string `msgpack:"call_ids,omitempty" json:"call_ids,omitempty"`
	// Serial is the request's Serial: its response lets the session's next serial request go.
	Serial bool `msgpack:"serial,omitempty" json:"serial,omitempty"`
	// Cancelled, on the CANCELLED results a cancellation records, is what the request's
	// response says as its error message (who cancelled, and why): whoever answers the request
	// from those results says the same.
	Cancelled string `msgpack:"cancelled,omitempty" json:"cancelled,omitempty"`
	// Grant, on the dispatch of a call that changes a resource and on whatever follows it
	// (its result, a dead letter's answer), is the call's turn on the resource: aggregation
	// gives the turn back when the call's result is recorded.
	Grant *Grant `msgpack:"grant,omitempty" json:"grant,omitempty"`
}

// NewMessage builds an envelope of type t for payload, stamped now (UTC). The caller sets the
// ids, sender and trace.
func NewMessage(t Type, payload any) (*Message, error) {
	p, err := msgpack.Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("protocol: encode %s payload: %w", t, err)
	}
	return &Message{SchemaVersion: SchemaVersion, Type: t, CreatedAt: time.Now().UTC(), Payload: p}, nil
}

// Validate checks the envelope: a known type and schema version, and ids safe for subjects.
func (m *Message) Validate() error {
	if m.SchemaVersion < 1 || m.SchemaVersion > SchemaVersion {
		return fieldErr("schema_version", fmt.Sprintf("%d is not supported (this reader knows 1..%d)", m.SchemaVersion, SchemaVersion))
	}
	if !m.Type.Known() {
		return fieldErr("type", fmt.Sprintf("%s is not a known message type", quoteShort(string(m.Type))))
	}
	if m.MsgID == "" {
		return fieldErr("msg_id", "is required")
	}
	if err := CheckID("session_id", m.SessionID); err != nil {
		return err
	}
	if m.Caller != nil {
		if err := m.Caller.Validate(); err != nil {
			return err
		}
	}
	return CheckID("request_id", m.RequestID)
}

// Follow makes m a consequence of cause: same request, session, trace, deadline, caller and
// correlation, caused by cause, identified by msgID.
func (m *Message) Follow(cause *Message, msgID string) {
	m.MsgID, m.RequestID, m.SessionID, m.Caller = msgID, cause.RequestID, cause.SessionID, cause.Caller
	m.CausationID, m.Trace, m.Deadline, m.Correlation = cause.MsgID, cause.Trace, cause.Deadline, cause.Correlation
}
