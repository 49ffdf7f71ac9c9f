package bus

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// ErrTooLarge is returned when a message would not fit in one NATS message (the server's
// max_payload).
var ErrTooLarge = errors.New("bus: message larger than the server's max_payload")

// MaxMessageBytes is the largest message the connected server accepts (its max_payload).
func (b *Bus) MaxMessageBytes() int {
	if b.JS == nil {
		return 1 << 20
	}
	if nc := b.JS.Conn(); nc != nil && nc.MaxPayload() > 0 {
		return int(nc.MaxPayload())
	}
	return 1 << 20
}

// headerAllowance is room kept for a message's headers within the server's max_payload.
const headerAllowance = 2 << 10

// ResultKey is the hermes-calls key of one call's result.
func ResultKey(requestID, callID string) string { return requestID + "." + callID }

// RecordResult makes m the one result of its call and publishes it. m must be a tool_result
// message with its MsgID set. It is first written with Create to hermes-calls under
// ResultKey; if the call has a recorded result already (a worker presumed dead finished first,
// or the dead-letter processor answered), that one is published instead, unchanged. It returns
// the recorded message and whether it was m.
func (b *Bus) RecordResult(ctx context.Context, p *Publisher, m *protocol.Message, res *protocol.ToolResult) (*protocol.Message, bool, error) {
	if m.Type != protocol.TypeToolResult || m.MsgID == "" {
		return nil, false, fmt.Errorf("bus: RecordResult needs a tool_result message with a msg_id, got %s", m.Type)
	}
	return b.recordAndPublish(ctx, p, b.Calls, ResultKey(m.RequestID, res.ToolCallID), protocol.SubjectToolResult(m.SessionID), m)
}

// Respond makes m the one response to its request and publishes it. m must be a response
// message with its MsgID set (protocol.MsgIDResponse). It is first written with Create to
// hermes-responses; if a response was recorded before (by another router, or by the
// dead-letter processor), that one is published again instead, unchanged. So however many
// processes respond to a request, and however often, callers see one response, and the stream
// keeps one within its duplicate window. It reports whether m was the one recorded.
func (b *Bus) Respond(ctx context.Context, p *Publisher, m *protocol.Message) (bool, error) {
	if m.Type != protocol.TypeResponse || m.MsgID == "" {
		return false, fmt.Errorf("bus: Respond needs a response message with a msg_id, got %s", m.Type)
	}
	_, mine, err := b.recordAndPublish(ctx, p, b.Responses, m.RequestID, protocol.SubjectResponse(m.SessionID), m)
	return mine, err
}

// Republish publishes a recorded message (its exact bytes) again to subject; the stream drops
// it within the duplicate window, and anyone still waiting for it receives it.
func (b *Bus) Republish(ctx context.Context, p *Publisher, subject string, recorded []byte) error {
	m, err := protocol.Unmarshal(recorded)
	if err != nil {
		return Permanent(err)
	}
	_, err = p.publishEncoded(ctx, subject, m, recorded, true)
	return err
}

func (b *Bus) recordAndPublish(ctx context.Context, p *Publisher, kv jetstream.KeyValue, key, subject string, m *protocol.Message) (*protocol.Message, bool, error) {
	m.Sender = p.sender
	data, err := protocol.Marshal(m)
	if err != nil {
		return nil, false, Permanent(err)
	}
	// The server counts headers too (ids, trace context: well under headerAllowance).
	if limit := b.MaxMessageBytes() - headerAllowance; len(data) > limit {
		return nil, false, fmt.Errorf("%w: %s is %d bytes, the limit is %d", ErrTooLarge, m.Type, len(data), limit)
	}
	mine := true
	if _, err := kv.Create(ctx, key, data); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, false, fmt.Errorf("bus: record %s: %w", m.Type, err)
		}
		e, err := kv.Get(ctx, key)
		if err != nil {
			return nil, false, fmt.Errorf("bus: read recorded %s: %w", m.Type, err)
		}
		if m, err = protocol.Unmarshal(e.Value()); err != nil {
			return nil, false, Permanent(err)
		}
		data, mine = e.Value(), false
	}
	if _, err := p.publishEncoded(ctx, subject, m, data, true); err != nil {
		return nil, false, err
	}
	return m, mine, nil
}
