package memory

import (
	"context"
	"fmt"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Recorder is the History that records memory.v1 events on the record, on the owner's memory
// session (HistorySession): the request is the one that made the change (WithChange), the
// caller who made it.
type Recorder struct {
	Pub *bus.Publisher
}

// APIRequest is the request id of changes made through the memory API, not in a request.
const APIRequest = "memory-api"

type changeKey struct{}

type change struct {
	request string
	caller  *protocol.Caller
}

// WithChange names the request and the caller a change made with ctx belongs to.
func WithChange(ctx context.Context, requestID string, caller *protocol.Caller) context.Context {
	return context.WithValue(ctx, changeKey{}, change{request: requestID, caller: caller})
}

// Record records ev of owner's memory.
func (r *Recorder) Record(ctx context.Context, owner string, ev *protocol.MemoryEvent) error {
	m, err := protocol.NewMessage(protocol.TypeMemory, ev)
	if err != nil {
		return bus.Permanent(err)
	}
	c, _ := ctx.Value(changeKey{}).(change)
	if c.request == "" {
		c.request = APIRequest
	}
	m.MsgID, m.RequestID, m.SessionID, m.Caller = protocol.MsgIDMemory(Token(owner), ev), c.request, HistorySession(owner), c.caller
	if _, err := r.Pub.Publish(ctx, protocol.SubjectEvent(protocol.EventMemory, m.SessionID), m); err != nil {
		return fmt.Errorf("memory: record %s of %s: %w", ev.Op, ev.Key, err)
	}
	return nil
}
