package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/ledger"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Letter is one dead letter, as listed by hermes dlq ls.
type Letter struct {
	// Seq identifies the letter (its sequence in HERMES_DLQ); hermes dlq retry takes it.
	Seq      uint64    `json:"seq"`
	At       time.Time `json:"at"`
	Consumer string    `json:"consumer"`
	// Stream is the stream the message was given up in (empty on letters written before it
	// was said: the record's first).
	Stream     string `json:"stream,omitempty"`
	Subject    string `json:"subject"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
	Reason     string `json:"reason"`
	// Type, MsgID, RequestID and SessionID are set when the original message decodes.
	Type      protocol.Type `json:"type,omitempty"`
	MsgID     string        `json:"msg_id,omitempty"`
	RequestID string        `json:"request_id,omitempty"`
	SessionID string        `json:"session_id,omitempty"`
	Size      int           `json:"size"`
	// Truncated: the letter keeps only the first bytes of the message (of Size).
	Truncated bool `json:"truncated,omitempty"`
}

func letterOf(seq uint64, h nats.Header, data []byte) Letter {
	l := Letter{Seq: seq, Consumer: h.Get(HeaderConsumer), Stream: h.Get(HeaderStream), Subject: h.Get(HeaderSubject), Reason: h.Get(HeaderReason), Size: len(data)}
	l.At, _ = time.Parse(time.RFC3339Nano, h.Get(HeaderAt))
	l.StreamSeq, _ = strconv.ParseUint(h.Get(HeaderStreamSeq), 10, 64)
	l.Deliveries, _ = strconv.ParseUint(h.Get(HeaderDeliveries), 10, 64)
	if n, err := strconv.Atoi(h.Get(HeaderSize)); err == nil && n > l.Size {
		l.Size, l.Truncated = n, true
	}
	if m, err := protocol.Unmarshal(data); err == nil {
		l.Type, l.MsgID, l.RequestID, l.SessionID = m.Type, m.MsgID, m.RequestID, m.SessionID
	} else if isJSON(h) {
		var ids struct {
			RequestID string `json:"request_id"`
			SessionID string `json:"session_id"`
		}
		if json.Unmarshal(data, &ids) == nil && protocol.CheckID("request_id", ids.RequestID) == nil {
			l.Type, l.RequestID = protocol.TypeRequest, ids.RequestID
			if protocol.CheckID("session_id", ids.SessionID) == nil {
				l.SessionID = ids.SessionID
			}
		}
	}
	return l
}

// isJSON reports whether a message with headers h says it is JSON (an external client's).
func isJSON(h nats.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get(bus.HeaderContentType))
	return err == nil && mt == protocol.ContentTypeJSON
}

// List returns up to limit dead letters, oldest first.
func List(ctx context.Context, b *bus.Bus, limit int) ([]Letter, error) {
	cons, err := b.DLQ.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{protocol.FilterDeadLetters}})
	if err != nil {
		return nil, fmt.Errorf("deadletter: read %s: %w", protocol.DLQStreamName, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("deadletter: read %s: %w", protocol.DLQStreamName, err)
	}
	want := min(int(info.NumPending), limit)
	var out []Letter
	for len(out) < want {
		batch, err := cons.Fetch(min(want-len(out), 256), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return out, fmt.Errorf("deadletter: read %s: %w", protocol.DLQStreamName, err)
		}
		n := 0
		for msg := range batch.Messages() {
			md, err := msg.Metadata()
			if err != nil {
				continue
			}
			out = append(out, letterOf(md.Sequence.Stream, msg.Headers(), msg.Data()))
			n++
		}
		if err := batch.Error(); err != nil {
			return out, fmt.Errorf("deadletter: read %s: %w", protocol.DLQStreamName, err)
		}
		if n == 0 {
			break
		}
	}
	return out, nil
}

// ErrNotRedrivable is returned by Retry for a letter that cannot or need not be re-driven.
var ErrNotRedrivable = errors.New("deadletter: not re-drivable")

// Retry re-drives dead letter seq: it publishes the original message again to its original
// subject, as a new message with a fresh delivery count. A tool call answered only by the
// dead-letter processor runs again, its new result recorded after that answer
// (HeaderRedriveAfter), which it supersedes; the request's response, already sent, stays as it
// was. A tool call with its tool's own result, and a request that has its response, are not
// re-driven (send it again with a new request_id).
func Retry(ctx context.Context, b *bus.Bus, seq uint64) (Letter, error) {
	raw, err := b.DLQ.GetMsg(ctx, seq)
	if err != nil {
		return Letter{}, fmt.Errorf("deadletter: letter %d: %w", seq, err)
	}
	if !protocol.IsDeadLetter(raw.Subject) {
		return Letter{}, fmt.Errorf("%w: %d is not a dead letter (subject %s)", ErrNotRedrivable, seq, raw.Subject)
	}
	l := letterOf(seq, raw.Header, raw.Data)
	if raw.Subject == protocol.SubjectDeadLetter(bus.ConsumerClients) {
		// Published again, it would skip the admission that names its client.
		return l, fmt.Errorf("%w: letter %d is an external client's request, which only the client sends again", ErrNotRedrivable, seq)
	}
	if len(raw.Data) == 0 || l.Subject == "" {
		return l, fmt.Errorf("%w: the original of letter %d is gone from the record", ErrNotRedrivable, seq)
	}
	if l.Type == "" {
		return l, fmt.Errorf("%w: letter %d holds bytes no Hermes worker can decode (%s)", ErrNotRedrivable, seq, l.Reason)
	}
	m, err := protocol.Unmarshal(raw.Data)
	if err != nil {
		return l, fmt.Errorf("%w: letter %d holds bytes no Hermes worker can decode (%s)", ErrNotRedrivable, seq, l.Reason)
	}
	after := uint64(0)
	switch m.Type {
	case protocol.TypeRequest:
		if answered, err := b.Answered(ctx, m.RequestID, m.SessionID); err != nil {
			return l, fmt.Errorf("deadletter: letter %d: %w", seq, err)
		} else if answered {
			return l, fmt.Errorf("%w: request %s already has its response; send it again with a new request_id", ErrNotRedrivable, m.RequestID)
		}
	case protocol.TypeToolCall:
		// The re-driven call runs over the answer given when it was dead-lettered (its result
		// is recorded after it), but not over the tool's own result.
		disp, err := m.DecodeDispatch()
		if err != nil {
			return l, fmt.Errorf("%w: letter %d: %v", ErrNotRedrivable, seq, err)
		}
		if after, err = b.RedriveAfter(ctx, m.RequestID, disp.Call.ToolCallID, m.SessionID, disp.Call.Name); errors.Is(err, bus.ErrAnswered) {
			return l, fmt.Errorf("%w: letter %d: %v", ErrNotRedrivable, seq, err)
		} else if err != nil {
			return l, fmt.Errorf("deadletter: letter %d: %w", seq, err)
		}
		// The dead-letter processor marked the call finished when it answered it.
		if err := ledger.Reopen(ctx, b.Claims, ledger.Key(m.RequestID, disp.Call.ToolCallID)); err != nil {
			return l, fmt.Errorf("deadletter: letter %d: %w", seq, err)
		}
	}
	// In the stream that keeps the session now (the record may have been given more streams).
	subject := b.Layout().Place(l.Subject, m.SessionID)
	switch m.Type {
	case protocol.TypeRequest:
		subject = b.Layout().SubjectRequest(m.SessionID) // the stored subject carries the partition, which the stream adds
	case protocol.TypeToolResult:
		subject = b.Layout().SubjectRedrivenResult(m.SessionID) // its call's subject keeps one result
	}
	msg := &nats.Msg{Subject: subject, Data: raw.Data, Header: nats.Header{}}
	redrive := protocol.RedriveID(seq, time.Now().UnixNano())
	msg.Header.Set(jetstream.MsgIDHeader, protocol.MsgIDRedrive(redrive))
	msg.Header.Set(bus.HeaderRedrive, redrive)
	if m.Type == protocol.TypeToolCall {
		msg.Header.Set(bus.HeaderRedriveAfter, strconv.FormatUint(after, 10))
	}
	msg.Header.Set(bus.HeaderType, string(m.Type))
	if _, err := b.JS.PublishMsg(ctx, msg); err != nil {
		return l, fmt.Errorf("deadletter: re-drive %d: %w", seq, err)
	}
	return l, nil
}
