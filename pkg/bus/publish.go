package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Headers set on every Hermes message, besides Nats-Msg-Id.
const (
	HeaderType        = "Hermes-Type"
	HeaderRequestID   = "Hermes-Request-Id"
	HeaderSessionID   = "Hermes-Session-Id"
	HeaderTraceID     = "X-Trace-ID"
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
	// HeaderRedrive marks a message published again from the dead-letter stream; its value
	// identifies the re-drive.
	HeaderRedrive = "Hermes-Redrive"
	// HeaderContentType, on what an external client publishes, says how its body is written:
	// protocol.ContentTypeJSON, or msgpack (protocol.ContentTypeMsgpack, the default).
	HeaderContentType = "Content-Type"
	// HeaderRedriveAfter, on a tool call re-driven from the dead-letter stream, is the record
	// sequence its result is to be recorded after (Bus.RedriveAfter): the answer it supersedes.
	// Only routers (and an administrator re-driving) publish tool calls, so a worker may take
	// it as given.
	HeaderRedriveAfter = "Hermes-Redrive-After"
	// HeaderWoken marks a parked message published again when woken; its value is the wake
	// key that woke it.
	HeaderWoken = "Hermes-Woken"
	// HeaderPlanned marks a request whose plan was recorded when it was accepted, just
	// before this message was published for the first time: a router taking its first
	// delivery need not record or read the plan.
	HeaderPlanned = "Hermes-Planned"
	// HeaderOwner, on a request the gateway accepted, names who its session belongs to
	// (caller id, and "#" and the end user when there is one), so that listings can keep to
	// a caller's own sessions reading headers only.
	HeaderOwner = "Hermes-Owner"
	// HeaderFast marks what the fast lane records of a request it answered (package
	// fastlane): the request, its calls' results. Its value is the router that answered. The
	// routers' consumers leave such a message to the fast lane's writer while the request's
	// response is on its way to the record, and handle it as any other once it is overdue.
	HeaderFast = "Hermes-Fast"
	// HeaderFastWithin, on a call a router sends a worker on the fast lane, says how long the
	// router waits for the answer (a Go duration): the worker tries the call again only while
	// the answer can still arrive in time.
	HeaderFastWithin = "Hermes-Fast-Within"
)

// Publisher publishes HermesMessages to the record stream. It is safe for concurrent use.
type Publisher struct {
	js     jetstream.JetStream
	sender protocol.Sender
	// layout places each record subject in the stream of its session.
	layout protocol.Layout
}

// NewPublisher returns a Publisher that stamps every message it publishes with sender, for a
// record of one stream: Bus.NewPublisher publishes to the record as it is provisioned.
func NewPublisher(js jetstream.JetStream, sender protocol.Sender) *Publisher {
	return &Publisher{js: js, sender: sender}
}

// NewPublisher returns a Publisher that stamps every message it publishes with sender, and
// publishes each message of a session (a subject of the record, written as its first stream
// holds them: protocol's one-stream builders) to the record stream that keeps the session
// (protocol.Layout.Place). It is the one place that decides where a session's messages go.
func (b *Bus) NewPublisher(sender protocol.Sender) *Publisher {
	return &Publisher{js: b.JS, sender: sender, layout: b.layout}
}

// Sender is the role and instance stamped on published messages.
func (p *Publisher) Sender() protocol.Sender { return p.sender }

// Publish stamps m with the publisher's sender, encodes it and publishes it to subject, waiting
// for the stream's ack. m.MsgID becomes the Nats-Msg-Id, so publishing the same logical message
// again within the duplicate window stores it once; the returned ack then has Duplicate set.
func (p *Publisher) Publish(ctx context.Context, subject string, m *protocol.Message) (*jetstream.PubAck, error) {
	return p.PublishWith(ctx, subject, m, nil)
}

// PublishWith is Publish with extra headers.
func (p *Publisher) PublishWith(ctx context.Context, subject string, m *protocol.Message, extra nats.Header) (*jetstream.PubAck, error) {
	if m.MsgID == "" {
		return nil, fmt.Errorf("bus: publish to %s: message has no msg_id", subject)
	}
	m.Sender = p.sender
	data, err := protocol.Marshal(m)
	if err != nil {
		return nil, err
	}
	return p.publishEncoded(ctx, subject, m, data, m.MsgID, extra)
}

// PublishNoWait publishes m like Publish but does not wait for the stream's ack: for events
// whose loss is tolerable (tool_started). When too many publishes await their acks it waits,
// as Publish does, rather than fail.
func (p *Publisher) PublishNoWait(ctx context.Context, subject string, m *protocol.Message) error {
	m.Sender = p.sender
	data, err := protocol.Marshal(m)
	if err != nil {
		return err
	}
	msg := p.msg(subject, m, data)
	if _, err := p.js.PublishMsgAsync(msg); err != nil {
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			_, err = p.js.PublishMsg(ctx, msg)
		}
		if err != nil {
			return fmt.Errorf("bus: publish %s to %s: %w", m.Type, subject, err)
		}
	}
	return nil
}

// PublishAs publishes m, already encoded as data (its exact bytes, sender and all), under the
// stream message id msgID instead of m's own, with extra headers: a message published again
// as a new one, e.g. a parked message woken. It waits for the stream's ack.
func (p *Publisher) PublishAs(ctx context.Context, subject string, m *protocol.Message, data []byte, msgID string, extra nats.Header) (*jetstream.PubAck, error) {
	return p.publishEncoded(ctx, subject, m, data, msgID, extra)
}

// publishEncoded publishes data, the encoding of m, as it is, under message id msgID and with
// extra headers, and waits for the stream's ack.
func (p *Publisher) publishEncoded(ctx context.Context, subject string, m *protocol.Message, data []byte, msgID string, extra nats.Header) (*jetstream.PubAck, error) {
	msg := p.msg(subject, m, data)
	msg.Header.Set(jetstream.MsgIDHeader, msgID)
	for k, v := range extra {
		msg.Header[k] = v
	}
	ack, err := p.js.PublishMsg(ctx, msg)
	if err != nil {
		return nil, fmt.Errorf("bus: publish %s to %s: %w", m.Type, subject, err)
	}
	return ack, nil
}

func (p *Publisher) msg(subject string, m *protocol.Message, data []byte) *nats.Msg {
	if p.layout.Streams() > 1 {
		subject = p.layout.Place(subject, protocol.SessionOfSubject(subject))
	}
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, m.MsgID)
	msg.Header.Set(HeaderType, string(m.Type))
	if m.RequestID != "" {
		msg.Header.Set(HeaderRequestID, m.RequestID)
	}
	if m.SessionID != "" {
		msg.Header.Set(HeaderSessionID, m.SessionID)
	}
	if m.Trace.TraceID != "" {
		msg.Header.Set(HeaderTraceID, m.Trace.TraceID)
	}
	if m.Trace.Traceparent != "" {
		msg.Header.Set(HeaderTraceparent, m.Trace.Traceparent)
	}
	if m.Trace.Tracestate != "" {
		msg.Header.Set(HeaderTracestate, m.Trace.Tracestate)
	}
	return msg
}

// Outgoing is one message to publish, and where.
type Outgoing struct {
	Subject string
	Msg     *protocol.Message
}

// PublishBatch publishes every message without waiting between them, then waits until the
// stream has acked each, and returns the first error. Every message keeps its deterministic
// id, so publishing the batch again after an error is safe. Without a deadline on ctx it waits
// at most 30 s.
func (p *Publisher) PublishBatch(ctx context.Context, batch []Outgoing) error {
	if len(batch) == 1 {
		_, err := p.Publish(ctx, batch[0].Subject, batch[0].Msg)
		return err
	}
	enc := make([]Encoded, len(batch))
	for i, o := range batch {
		o.Msg.Sender = p.sender
		data, err := protocol.Marshal(o.Msg)
		if err != nil {
			return err
		}
		enc[i] = Encoded{Subject: o.Subject, Msg: o.Msg, Data: data}
	}
	return p.PublishEncoded(ctx, enc)
}

// Encoded is one message already encoded, to publish as it is.
type Encoded struct {
	Subject string
	// Msg is the message's envelope (its headers are made from it); Data its bytes.
	Msg  *protocol.Message
	Data []byte
	// Header holds extra headers.
	Header nats.Header
	// MsgID, when set, is the stream message id it is stored under instead of Msg's.
	MsgID string
	// Once stores it only while its subject holds nothing (an expected last subject sequence
	// of 0): the first message there stays the subject's one message.
	Once bool
}

// PublishEncoded publishes every message of batch as it is, in order, without waiting between
// them, then waits until the stream has acked each. A message published Once whose subject
// holds something already is not stored, and is no error: what is there stands. It returns the
// first other error; publishing the batch again is safe (every message keeps its id). Without a
// deadline on ctx it waits at most 30 s.
func (p *Publisher) PublishEncoded(ctx context.Context, batch []Encoded) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	type pending struct {
		f jetstream.PubAckFuture
		e *Encoded
	}
	waits := make([]pending, 0, len(batch))
	stored := func(e *Encoded, err error) error {
		var last uint64
		var known bool
		if err == nil || (e.Once && wrongLast(err, &last, &known)) {
			return nil
		}
		return fmt.Errorf("bus: publish %s to %s: %w", e.Msg.Type, e.Subject, err)
	}
	for i := range batch {
		e := &batch[i]
		msg := p.msg(e.Subject, e.Msg, e.Data)
		for k, v := range e.Header {
			msg.Header[k] = v
		}
		if e.MsgID != "" {
			msg.Header.Set(jetstream.MsgIDHeader, e.MsgID)
		}
		if e.Once {
			msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
		}
		f, err := p.js.PublishMsgAsync(msg)
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			_, err = p.js.PublishMsg(ctx, msg) // backpressure: this one waits
			if err = stored(e, err); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("bus: publish %s to %s: %w", e.Msg.Type, e.Subject, err)
		}
		waits = append(waits, pending{f: f, e: e})
	}
	for _, w := range waits {
		select {
		case <-w.f.Ok():
		case err := <-w.f.Err():
			if err = stored(w.e, err); err != nil {
				return err
			}
		case <-ctx.Done():
			return fmt.Errorf("bus: publish %s to %s: %w", w.e.Msg.Type, w.e.Subject, ctx.Err())
		}
	}
	return nil
}
