package router

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// plan is what the router records about a request before dispatching its calls: enough for any
// router to assemble the response.
type plan struct {
	SessionID  string                `msgpack:"session_id"`
	CallIDs    []string              `msgpack:"call_ids"`
	Names      []string              `msgpack:"names"`
	Trace      protocol.TraceContext `msgpack:"trace"`
	RequestMsg string                `msgpack:"request_msg"`
	AcceptedAt time.Time             `msgpack:"accepted_at"`
	// Fingerprint identifies the request's content, so a reused request_id with other content
	// is recognised.
	Fingerprint string `msgpack:"fingerprint"`
	// Serial is the request's Serial: its response wakes the session's next serial request.
	Serial bool `msgpack:"serial,omitempty"`
}

func newPlan(m *protocol.Message, r *protocol.Request) *plan {
	sum := sha256.Sum256(m.Payload)
	p := &plan{SessionID: m.SessionID, Trace: m.Trace, RequestMsg: m.MsgID, AcceptedAt: time.Now().UTC(),
		Fingerprint: hex.EncodeToString(sum[:16]), Serial: r.Serial,
		CallIDs: make([]string, len(r.ToolCalls)), Names: make([]string, len(r.ToolCalls))}
	for i, c := range r.ToolCalls {
		p.CallIDs[i], p.Names[i] = c.ToolCallID, c.Name
	}
	return p
}

func (p *plan) encode() ([]byte, error) { return msgpack.Marshal(p) }

func decodePlan(b []byte) (*plan, error) {
	if err := protocol.CheckMsgpack(b, protocol.MaxDepth); err != nil {
		return nil, err
	}
	var p plan
	if err := msgpack.NewDecoder(bytes.NewReader(b)).Decode(&p); err != nil {
		return nil, fmt.Errorf("router: decode plan: %w", err)
	}
	return &p, nil
}
