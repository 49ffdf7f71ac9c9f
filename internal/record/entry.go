package record

import (
	"fmt"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Entry is one message of the record as read back: where it sits in the stream and what it
// says.
type Entry struct {
	// Seq is the message's stream sequence.
	Seq uint64
	// Subject is the subject it was published on.
	Subject string
	// Time is when the stream stored it, by the server's clock.
	Time time.Time
	// Msg is the decoded envelope; nil when the envelope itself could not be decoded.
	Msg *protocol.Message
	// Payload is the decoded payload, as Msg.Type says: *protocol.Request, *protocol.Dispatch,
	// *protocol.ToolStarted, *protocol.ToolResult, *protocol.Response, *protocol.Cancel,
	// *protocol.LLMDecision, *protocol.LLMSummary, *protocol.PolicyEvent, *protocol.BlueprintStep or
	// *protocol.CoordinationEvent. It is nil when Err
	// is set.
	Payload any
	// Err says why the message could not be read. Msg may still be set when only its payload
	// was unreadable.
	Err error
}

// readLimits bound what a recorded request may hold when it is read back. They are wider than
// protocol.DefaultLimits: the record holds what routers accepted, possibly under limits raised
// with flags, and one message cannot exceed the server's max_payload anyway.
var readLimits = protocol.Limits{MaxToolCalls: 1 << 20, MaxArgumentsBytes: 1 << 30, MaxIntentBytes: 1 << 30}

// Decode reads one stored message. It never fails: a message it cannot read comes back with Err
// set.
func Decode(seq uint64, subject string, stored time.Time, data []byte) *Entry {
	e := &Entry{Seq: seq, Subject: subject, Time: stored}
	m, err := protocol.Unmarshal(data)
	if err != nil {
		e.Err = err
		return e
	}
	e.Msg = m
	switch m.Type {
	case protocol.TypeRequest:
		e.Payload, e.Err = nonNil(m.DecodeRequest(readLimits))
	case protocol.TypeToolCall:
		e.Payload, e.Err = nonNil(m.DecodeDispatch())
	case protocol.TypeToolStarted:
		e.Payload, e.Err = nonNil(m.DecodeToolStarted())
	case protocol.TypeToolResult:
		e.Payload, e.Err = nonNil(m.DecodeToolResult())
	case protocol.TypeResponse:
		e.Payload, e.Err = nonNil(m.DecodeResponse())
	case protocol.TypeCancel:
		e.Payload, e.Err = nonNil(m.DecodeCancel())
	case protocol.TypeLLMDecision:
		e.Payload, e.Err = nonNil(m.DecodeLLMDecision())
	case protocol.TypeLLMSummary:
		e.Payload, e.Err = nonNil(m.DecodeLLMSummary())
	case protocol.TypePolicy:
		e.Payload, e.Err = nonNil(m.DecodePolicyEvent())
	case protocol.TypeBlueprintStep:
		e.Payload, e.Err = nonNil(m.DecodeBlueprintStep())
	case protocol.TypeCoordination:
		e.Payload, e.Err = nonNil(m.DecodeCoordination())
	case protocol.TypeMemory:
		e.Payload, e.Err = nonNil(m.DecodeMemory())
	default: // Unmarshal accepts only known types; this is a reader older than its writer.
		e.Err = fmt.Errorf("record: message type %s is not known to this reader", m.Type)
	}
	return e
}

// nonNil turns a decoder's typed nil pointer into a nil interface on error.
func nonNil[T any](v *T, err error) (any, error) {
	if err != nil {
		return nil, err
	}
	return v, nil
}
