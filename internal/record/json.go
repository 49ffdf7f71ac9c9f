package record

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// jsonEntry is the JSON form of an Entry: where it sits in the stream, its envelope, and its
// decoded payload.
type jsonEntry struct {
	Seq         uint64                 `json:"seq"`
	Subject     string                 `json:"subject"`
	Time        time.Time              `json:"time"`
	Type        protocol.Type          `json:"type,omitempty"`
	MsgID       string                 `json:"msg_id,omitempty"`
	SessionID   string                 `json:"session_id,omitempty"`
	RequestID   string                 `json:"request_id,omitempty"`
	CausationID string                 `json:"causation_id,omitempty"`
	Sender      *protocol.Sender       `json:"sender,omitempty"`
	Caller      *protocol.Caller       `json:"caller,omitempty"`
	Recipient   string                 `json:"recipient,omitempty"`
	CreatedAt   time.Time              `json:"created_at,omitzero"`
	Attempt     int                    `json:"attempt,omitempty"`
	Deadline    time.Time              `json:"deadline,omitzero"`
	Trace       *protocol.TraceContext `json:"trace,omitempty"`
	Payload     any                    `json:"payload,omitempty"`
	Error       string                 `json:"error,omitempty"`
}

// JSON returns e as one JSON object on one line, without a newline: seq, subject, time (when the
// stream stored it, UTC), the envelope's fields (type, msg_id, session_id, request_id,
// causation_id, sender, caller, recipient, created_at, attempt, deadline, trace), and payload, the
// decoded payload as the HTTP API writes it (a dispatch's header values hidden: HiddenHeaderValue).
// An unreadable message has error instead of payload.
func JSON(e *Entry) ([]byte, error) {
	j := jsonEntry{Seq: e.Seq, Subject: e.Subject, Time: e.Time.UTC(), Payload: hideHeaders(e.Payload)}
	if m := e.Msg; m != nil {
		j.Type, j.MsgID, j.SessionID, j.RequestID, j.CausationID = m.Type, m.MsgID, m.SessionID, m.RequestID, m.CausationID
		j.Recipient, j.CreatedAt, j.Attempt, j.Deadline, j.Caller = m.Recipient, m.CreatedAt, m.Attempt, m.Deadline, m.Caller
		if m.Sender != (protocol.Sender{}) {
			j.Sender = &m.Sender
		}
		if m.Trace != (protocol.TraceContext{}) {
			j.Trace = &m.Trace
		}
	}
	if e.Err != nil {
		j.Error = e.Err.Error()
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&j); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// HiddenHeaderValue stands for the value of a dispatched action's header wherever the record is
// shown: header values carry credentials (as ${env.NAME} placeholders, or literally in a message
// not written by Hermes), and only their names are anyone's business.
const HiddenHeaderValue = "(hidden)"

// hideHeaders returns p, a dispatch's copy with its action's header values hidden.
func hideHeaders(p any) any {
	d, ok := p.(*protocol.Dispatch)
	if !ok {
		return p
	}
	hide := func(h map[string]string) map[string]string {
		if len(h) == 0 {
			return h
		}
		out := make(map[string]string, len(h))
		for k := range h {
			out[k] = HiddenHeaderValue
		}
		return out
	}
	c := *d
	if a := c.Action.HTTP; a != nil {
		cp := *a
		cp.Headers = hide(a.Headers)
		c.Action.HTTP = &cp
	}
	if a := c.Action.GRPC; a != nil {
		cp := *a
		cp.Headers = hide(a.Headers)
		c.Action.GRPC = &cp
	}
	return &c
}

// Withheld stands for the answer a tool gave outside its contract (a result's rejected_content)
// wherever the record is shown to callers: the gateway's event streams and web view. The
// record keeps it; hermes tail and replay show it.
const Withheld = `"(withheld: the answer broke the tool's contract; hermes tail shows it)"`

// ForCallers returns e as callers may see it: a result's rejected answer replaced by Withheld.
func ForCallers(e *Entry) *Entry {
	r, ok := e.Payload.(*protocol.ToolResult)
	if !ok || r.Rejected == nil {
		return e
	}
	cp, rc := *e, *r
	rc.Rejected = json.RawMessage(Withheld)
	cp.Payload = &rc
	return &cp
}
