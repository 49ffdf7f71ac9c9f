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

// RecordResult makes m the one result of its call and publishes it. m must be a tool_result
// message with its MsgID set. It is first written with Create to hermes-calls under
// protocol.KeyResult; if the call has a recorded result already (a worker presumed dead finished first,
// or the dead-letter processor answered), that one is published instead, unchanged. It returns
// the recorded message and whether it was m.
func (b *Bus) RecordResult(ctx context.Context, p *Publisher, m *protocol.Message, res *protocol.ToolResult) (*protocol.Message, bool, error) {
	if m.Type != protocol.TypeToolResult || m.MsgID == "" {
		return nil, false, fmt.Errorf("bus: RecordResult needs a tool_result message with a msg_id, got %s", m.Type)
	}
	return b.recordAndPublish(ctx, p, b.Calls, protocol.KeyResult(m.RequestID, res.ToolCallID), protocol.SubjectToolResult(m.SessionID), m)
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
	_, mine, err := b.recordAndPublish(ctx, p, b.Responses, protocol.KeyResponse(m.RequestID), protocol.SubjectResponse(m.SessionID), m)
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

// StoreResult records m as the one result of its call, like RecordResult, without publishing
// it: it returns the recorded message and its bytes (m's, or those of a result recorded
// before), to publish later with Republish.
func (b *Bus) StoreResult(ctx context.Context, p *Publisher, m *protocol.Message) (*protocol.Message, []byte, error) {
	if m.Type != protocol.TypeToolResult || m.MsgID == "" {
		return nil, nil, fmt.Errorf("bus: StoreResult needs a tool_result message with a msg_id, got %s", m.Type)
	}
	res, err := m.DecodeToolResult()
	if err != nil {
		return nil, nil, Permanent(err)
	}
	recorded, data, _, err := b.record(ctx, p, b.Calls, protocol.KeyResult(m.RequestID, res.ToolCallID), m)
	return recorded, data, err
}

func (b *Bus) recordAndPublish(ctx context.Context, p *Publisher, kv jetstream.KeyValue, key, subject string, m *protocol.Message) (*protocol.Message, bool, error) {
	m, data, mine, err := b.record(ctx, p, kv, key, m)
	if err != nil {
		return nil, false, err
	}
	if _, err := p.publishEncoded(ctx, subject, m, data, true); err != nil {
		return nil, false, err
	}
	return m, mine, nil
}

// record writes m under key with Create, stamped with p's sender; if a value was recorded
// before, that one is returned instead. mine reports whether m was recorded.
func (b *Bus) record(ctx context.Context, p *Publisher, kv jetstream.KeyValue, key string, m *protocol.Message) (*protocol.Message, []byte, bool, error) {
	m.Sender = p.sender
	data, err := protocol.Marshal(m)
	if err != nil {
		return nil, nil, false, Permanent(err)
	}
	// The server counts headers too (ids, trace context: well under headerAllowance).
	if limit := b.MaxMessageBytes() - headerAllowance; len(data) > limit {
		return nil, nil, false, fmt.Errorf("%w: %s is %d bytes, the limit is %d", ErrTooLarge, m.Type, len(data), limit)
	}
	if _, err := kv.Create(ctx, key, data); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, nil, false, fmt.Errorf("bus: record %s: %w", m.Type, err)
		}
		e, err := kv.Get(ctx, key)
		if err != nil {
			return nil, nil, false, fmt.Errorf("bus: read recorded %s: %w", m.Type, err)
		}
		if m, err = protocol.Unmarshal(e.Value()); err != nil {
			return nil, nil, false, Permanent(err)
		}
		return m, e.Value(), false, nil
	}
	return m, data, true, nil
}
