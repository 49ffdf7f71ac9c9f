package bus

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// ErrNotFound is returned when a request, call or response has no recorded state (yet, or any
// more: state lives for the state TTL).
var ErrNotFound = errors.New("bus: not recorded")

// Plan is what is recorded about a request before its calls are dispatched: enough for any
// router, the dead-letter processor or a cancellation to assemble its response. A plan is
// written once (create), by the first router to take the request, or by a cancellation that
// came first.
type Plan struct {
	SessionID  string                `msgpack:"session_id"`
	CallIDs    []string              `msgpack:"call_ids"`
	Names      []string              `msgpack:"names"`
	Trace      protocol.TraceContext `msgpack:"trace"`
	RequestMsg string                `msgpack:"request_msg"`
	AcceptedAt time.Time             `msgpack:"accepted_at"`
	// Fingerprint identifies the request's content, so a reused request_id with other content
	// is recognised; empty when the plan was written without the request (Cancelled).
	Fingerprint string `msgpack:"fingerprint"`
	// Serial is the request's Serial: its response wakes the session's next serial request.
	Serial bool `msgpack:"serial,omitempty"`
	// Cancelled marks a plan written by a cancellation before any router took the request.
	Cancelled bool `msgpack:"cancelled,omitempty"`
	// AtIntake marks a plan recorded as the request was accepted, before any router took it.
	// (Without it, the plan was recorded by a router: its request passed the serial stage.)
	AtIntake bool `msgpack:"at_intake,omitempty"`
	// Fast marks a plan a router recorded as it took the request on the fast lane: that
	// router answers it, or puts it on the durable path itself (package fastlane).
	Fast bool `msgpack:"fast,omitempty"`
}

// PlanOf is the plan of request r, carried by m (its request message), accepted at now. Its
// fingerprint is a hash of the request as the message carries it, so the same request gets the
// same fingerprint whoever makes the plan.
func PlanOf(m *protocol.Message, r *protocol.Request, now time.Time) *Plan {
	sum := sha256.Sum256(m.Payload)
	p := &Plan{SessionID: m.SessionID, Trace: m.Trace, RequestMsg: m.MsgID, AcceptedAt: now.UTC(),
		Fingerprint: hex.EncodeToString(sum[:16]), Serial: r.Serial,
		CallIDs: make([]string, len(r.ToolCalls)), Names: make([]string, len(r.ToolCalls))}
	for i, c := range r.ToolCalls {
		p.CallIDs[i], p.Names[i] = c.ToolCallID, c.Name
	}
	return p
}

// DecodePlan reads a recorded plan, whatever the bytes: hostile input gives an error, never a
// panic or a large allocation.
func DecodePlan(b []byte) (*Plan, error) {
	if err := protocol.CheckMsgpack(b, protocol.MaxDepth); err != nil {
		return nil, err
	}
	var p Plan
	if err := msgpack.NewDecoder(bytes.NewReader(b)).Decode(&p); err != nil {
		return nil, fmt.Errorf("bus: decode plan: %w", err)
	}
	if len(p.CallIDs) != len(p.Names) && len(p.Names) != 0 {
		return nil, fmt.Errorf("bus: decode plan: %d call ids but %d names", len(p.CallIDs), len(p.Names))
	}
	return &p, nil
}

// CreatePlan records p as requestID's plan unless one exists. It reports whether p is now the
// plan; when not, the existing one is returned.
func (b *Bus) CreatePlan(ctx context.Context, requestID string, p *Plan) (bool, *Plan, error) {
	enc, err := msgpack.Marshal(p)
	if err != nil {
		return false, nil, Permanent(fmt.Errorf("bus: encode plan: %w", err))
	}
	if _, err := b.Calls.Create(ctx, protocol.KeyPlan(requestID), enc); err == nil {
		return true, p, nil
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil, fmt.Errorf("bus: record plan: %w", err)
	}
	have, err := b.Plan(ctx, requestID)
	return false, have, err
}

// Plan returns requestID's plan, or an error wrapping ErrNotFound.
func (b *Bus) Plan(ctx context.Context, requestID string) (*Plan, error) {
	e, err := b.Calls.Get(ctx, protocol.KeyPlan(requestID))
	if err != nil {
		return nil, notFound("plan", err)
	}
	p, err := DecodePlan(e.Value())
	if err != nil {
		return nil, Permanent(err)
	}
	return p, nil
}

func notFound(what string, err error) error {
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("%w: %s", ErrNotFound, what)
	}
	return fmt.Errorf("bus: read %s: %w", what, err)
}
