package bus

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/protocol"
)

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
	m.Sender = p.sender
	data, err := protocol.Marshal(m)
	if err != nil {
		return false, Permanent(err)
	}
	mine := true
	if _, err := b.Responses.Create(ctx, m.RequestID, data); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return false, fmt.Errorf("bus: record response: %w", err)
		}
		e, err := b.Responses.Get(ctx, m.RequestID)
		if err != nil {
			return false, fmt.Errorf("bus: read response: %w", err)
		}
		if m, err = protocol.Unmarshal(e.Value()); err != nil {
			return false, Permanent(err)
		}
		data, mine = e.Value(), false
	}
	_, err = p.publishEncoded(ctx, protocol.SubjectResponse(m.SessionID), m, data)
	return mine, err
}
