package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/retry"
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

// Recorded is a message as the record holds it.
type Recorded struct {
	Msg *protocol.Message
	// Data is the message's exact bytes.
	Data []byte
	// Seq is its sequence in the record stream; 0 when it was read from a bucket of Hermes
	// before results and responses were recorded on the stream alone.
	Seq uint64
}

// RecordResult makes m the one result of its call: it is stored on the record under
// protocol.SubjectResult with an expected last subject sequence of 0, so the first result of a
// call wins — a worker presumed dead that finished first, the dead-letter processor, a
// cancellation. m must be a tool_result message for res with its MsgID set. It returns the
// recorded result and whether it is m.
func (b *Bus) RecordResult(ctx context.Context, p *Publisher, m *protocol.Message, res *protocol.ToolResult) (*Recorded, bool, error) {
	if m.Type != protocol.TypeToolResult || m.MsgID == "" {
		return nil, false, fmt.Errorf("bus: RecordResult needs a tool_result message with a msg_id, got %s", m.Type)
	}
	return b.recordOnce(ctx, p, protocol.SubjectResult(m.RequestID, res.ToolCallID, m.SessionID), m, 0)
}

// RecordRedrivenResult is RecordResult for the result of a call re-driven from the dead
// letters: a result the dead-letter processor recorded for the call when it gave it up (an
// answer of its own, not the tool's) is superseded — the record keeps both, and the call's
// result is the last one. A real result recorded before stands.
func (b *Bus) RecordRedrivenResult(ctx context.Context, p *Publisher, m *protocol.Message, res *protocol.ToolResult) (*Recorded, bool, error) {
	if m.Type != protocol.TypeToolResult || m.MsgID == "" {
		return nil, false, fmt.Errorf("bus: RecordRedrivenResult needs a tool_result message with a msg_id, got %s", m.Type)
	}
	subject := protocol.SubjectResult(m.RequestID, res.ToolCallID, m.SessionID)
	have, err := b.lastRecorded(ctx, subject)
	switch {
	case errors.Is(err, ErrNotFound):
		return b.recordOnce(ctx, p, subject, m, 0)
	case err != nil:
		return nil, false, err
	case IsDeadAnswer(have.Msg):
		return b.recordOnce(ctx, p, subject, m, have.Seq)
	default:
		return have, false, nil
	}
}

// IsDeadAnswer reports whether m is a result the dead-letter processor recorded for a call it
// gave up, rather than the tool's own.
func IsDeadAnswer(m *protocol.Message) bool {
	return m.Type == protocol.TypeToolResult && m.Sender.Role == protocol.RoleDeadLetter
}

// Respond makes m the one response to its request: it is stored on the record under
// protocol.SubjectResponse with an expected last subject sequence of 0, so however many
// processes respond to a request, and however often, the first response is the only one
// recorded, and the only one callers see (the stream announces what it stored, see
// protocol.LiveResponseRepublish). m must be a response message with its MsgID set
// (protocol.MsgIDResponse). It reports whether m was the one recorded.
func (b *Bus) Respond(ctx context.Context, p *Publisher, m *protocol.Message) (bool, error) {
	if m.Type != protocol.TypeResponse || m.MsgID == "" {
		return false, fmt.Errorf("bus: Respond needs a response message with a msg_id, got %s", m.Type)
	}
	_, mine, err := b.recordOnce(ctx, p, protocol.SubjectResponse(m.RequestID, m.SessionID), m, 0)
	return mine, err
}

// Announce publishes a recorded response again to those awaiting it (outside the stream), as
// the stream did when it stored it: for a caller that began waiting after that.
func (b *Bus) Announce(ctx context.Context, r *Recorded) error {
	if r.Msg.Type != protocol.TypeResponse {
		return fmt.Errorf("bus: Announce takes a response, got %s", r.Msg.Type)
	}
	msg := &nats.Msg{Subject: protocol.SubjectLiveResponse(r.Msg.RequestID, r.Msg.SessionID), Data: r.Data, Header: nats.Header{}}
	if err := b.JS.Conn().PublishMsg(msg); err != nil {
		return fmt.Errorf("bus: announce the response of %s: %w", r.Msg.RequestID, err)
	}
	return nil
}

// recordOnce stores m, stamped with p's sender, on subject if the last message there is still
// the one at sequence after (0: none) — the first message on subject, or the one superseding
// that message. Otherwise the message recorded there is returned, and mine is false.
func (b *Bus) recordOnce(ctx context.Context, p *Publisher, subject string, m *protocol.Message, after uint64) (*Recorded, bool, error) {
	m.Sender = p.sender
	data, err := protocol.Marshal(m)
	if err != nil {
		return nil, false, Permanent(err)
	}
	// The server counts headers too (ids, trace context: well under headerAllowance).
	if limit := b.MaxMessageBytes() - headerAllowance; len(data) > limit {
		return nil, false, fmt.Errorf("%w: %s is %d bytes, the limit is %d", ErrTooLarge, m.Type, len(data), limit)
	}
	msg := p.msg(subject, m, data)
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(after, 10))
	ack, err := p.js.PublishMsg(ctx, msg)
	switch {
	case err == nil && !ack.Duplicate:
		return &Recorded{Msg: m, Data: data, Seq: ack.Sequence}, true, nil
	case err == nil:
		// The same message id was stored within the duplicate window: this process's own
		// earlier try, or another's message under the same id.
		have, err := b.recordedAt(ctx, ack.Sequence)
		if err != nil {
			return nil, false, err
		}
		return have, bytes.Equal(have.Data, data), nil
	case wrongLastSequence(err):
		// Recorded before: by another, or by this process's own earlier try (its bytes).
		have, err := b.lastRecorded(ctx, subject)
		if err != nil {
			return nil, false, fmt.Errorf("bus: read the %s recorded before: %w", m.Type, err)
		}
		return have, bytes.Equal(have.Data, data), nil
	default:
		return nil, false, fmt.Errorf("bus: record %s on %s: %w", m.Type, subject, err)
	}
}

func wrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// msgGetRequest and msgGetResponse are the stream leader's message get API
// ($JS.API.STREAM.MSG.GET.<stream>), which only the leader answers.
type msgGetRequest struct {
	Seq     uint64 `json:"seq,omitempty"`
	LastFor string `json:"last_by_subj,omitempty"`
}

type msgGetResponse struct {
	Error *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
	Message *struct {
		Subject string `json:"subject"`
		Seq     uint64 `json:"seq"`
		Data    []byte `json:"data"`
	} `json:"message"`
}

// lastRecorded reads the last message on subject (which may hold wildcards) from the stream
// leader, or returns an error wrapping ErrNotFound.
func (b *Bus) lastRecorded(ctx context.Context, subject string) (*Recorded, error) {
	return b.leaderGet(ctx, msgGetRequest{LastFor: subject})
}

// recordedAt reads the message at seq from the stream leader.
func (b *Bus) recordedAt(ctx context.Context, seq uint64) (*Recorded, error) {
	return b.leaderGet(ctx, msgGetRequest{Seq: seq})
}

// leaderGet reads one message of the record from its stream leader: unlike a direct get,
// never from a replica that has not caught up, so what was stored before is always seen.
func (b *Bus) leaderGet(ctx context.Context, req msgGetRequest) (*Recorded, error) {
	body, _ := json.Marshal(req)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	var reply *nats.Msg
	// The leader may be changing: no one answers then, or the answer is "not available".
	err := retry.Do(ctx, leaderRetry, time.Time{}, func() (err error) {
		reply, err = b.JS.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+protocol.StreamName, body)
		if errors.Is(err, nats.ErrNoResponders) {
			return err
		}
		return retry.Stop(err)
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("bus: read the record: %w", err)
	}
	var resp msgGetResponse
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return nil, fmt.Errorf("bus: read the record: %w", err)
	}
	if resp.Error != nil {
		if resp.Error.ErrCode == int(jetstream.JSErrCodeMessageNotFound) {
			return nil, fmt.Errorf("%w: nothing on %s", ErrNotFound, req.LastFor)
		}
		return nil, fmt.Errorf("bus: read the record: %s (%d)", resp.Error.Description, resp.Error.ErrCode)
	}
	if resp.Message == nil {
		return nil, errors.New("bus: read the record: empty answer")
	}
	m, err := protocol.Unmarshal(resp.Message.Data)
	if err != nil {
		return nil, Permanent(fmt.Errorf("bus: recorded message %d on %s: %w", resp.Message.Seq, resp.Message.Subject, err))
	}
	return &Recorded{Msg: m, Data: resp.Message.Data, Seq: resp.Message.Seq}, nil
}

// leaderRetry spaces out reads while a stream has no leader.
var leaderRetry = retry.Policy{Initial: 20 * time.Millisecond, Factor: 2, Max: 500 * time.Millisecond}

// Results reads the recorded results of the calls callIDs of requestID (of session) in one
// batch, and returns those it found by call id. atLeast, when not 0, is the sequence of a result
// the caller holds: a batch from a replica that has not stored it yet is not used (the read is
// tried again), so every result recorded before that one is seen. Results recorded by Hermes
// before they were kept on the stream alone are looked up in their bucket while it exists.
func (b *Bus) Results(ctx context.Context, requestID, session string, callIDs []string, atLeast uint64) (map[string]*Recorded, error) {
	subjects := make([]string, len(callIDs))
	for i, id := range callIDs {
		subjects[i] = protocol.SubjectResult(requestID, id, session)
	}
	out := map[string]*Recorded{}
	err := retry.Do(ctx, leaderRetry, time.Now().Add(5*time.Second), func() error {
		clear(out)
		var top uint64
		msgs, err := jetstreamext.GetLastMsgsFor(ctx, b.JS, protocol.StreamName, subjects)
		if err != nil {
			return err
		}
		for raw, err := range msgs {
			if errors.Is(err, jetstreamext.ErrNoMessages) {
				break
			}
			if err != nil {
				return err
			}
			top = max(top, raw.Sequence)
			m, err := protocol.Unmarshal(raw.Data)
			if err != nil {
				return retry.Stop(Permanent(fmt.Errorf("bus: recorded result %d on %s: %w", raw.Sequence, raw.Subject, err)))
			}
			res, err := m.DecodeToolResult()
			if err != nil {
				return retry.Stop(Permanent(fmt.Errorf("bus: recorded result %d on %s: %w", raw.Sequence, raw.Subject, err)))
			}
			out[res.ToolCallID] = &Recorded{Msg: m, Data: raw.Data, Seq: raw.Sequence}
		}
		if top < atLeast {
			return fmt.Errorf("a replica of the record answered without result %d", atLeast)
		}
		return nil
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("bus: read the results of %s: %w", requestID, err)
	}
	if b.legacyResults {
		for _, id := range callIDs {
			if out[id] != nil {
				continue
			}
			if r, err := b.legacyResult(ctx, requestID, id); err == nil {
				out[id] = r
			} else if !errors.Is(err, ErrNotFound) {
				return nil, err
			}
		}
	}
	return out, nil
}

// Result returns the recorded result of one call, read from the stream leader, or an error
// wrapping ErrNotFound.
func (b *Bus) Result(ctx context.Context, requestID, callID, session string) (*Recorded, *protocol.ToolResult, error) {
	r, err := b.lastRecorded(ctx, protocol.SubjectResult(requestID, callID, session))
	if errors.Is(err, ErrNotFound) && b.legacyResults {
		r, err = b.legacyResult(ctx, requestID, callID)
	}
	if err != nil {
		return nil, nil, err
	}
	res, err := r.Msg.DecodeToolResult()
	if err != nil {
		return nil, nil, Permanent(fmt.Errorf("bus: recorded result of %s/%s: %w", requestID, callID, err))
	}
	return r, res, nil
}

// Response returns requestID's recorded response, read from the stream leader, or an error
// wrapping ErrNotFound. session may be empty when the caller does not know it.
func (b *Bus) Response(ctx context.Context, requestID, session string) (*Recorded, *protocol.Response, error) {
	subject := protocol.FilterResponseOf(requestID)
	if session != "" {
		subject = protocol.SubjectResponse(requestID, session)
	}
	r, err := b.lastRecorded(ctx, subject)
	if errors.Is(err, ErrNotFound) && b.legacyResponses != nil {
		r, err = b.legacyResponse(ctx, requestID)
	}
	if err != nil {
		return nil, nil, err
	}
	resp, err := r.Msg.DecodeResponse()
	if err != nil {
		return nil, nil, Permanent(fmt.Errorf("bus: recorded response of %s: %w", requestID, err))
	}
	return r, resp, nil
}

// Answered reports whether requestID has its response recorded. session may be empty when the
// caller does not know it.
func (b *Bus) Answered(ctx context.Context, requestID, session string) (bool, error) {
	_, _, err := b.Response(ctx, requestID, session)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ErrNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("bus: read the response of %s: %w", requestID, err)
	}
}

// legacyResult reads a result recorded in hermes-calls by Hermes before results were kept on
// the stream alone.
func (b *Bus) legacyResult(ctx context.Context, requestID, callID string) (*Recorded, error) {
	return legacyGet(ctx, b.Calls, protocol.KeyResult(requestID, callID), "result")
}

// legacyResponse reads a response recorded in hermes-responses by Hermes before responses
// were kept on the stream alone.
func (b *Bus) legacyResponse(ctx context.Context, requestID string) (*Recorded, error) {
	return legacyGet(ctx, b.legacyResponses, protocol.KeyResponse(requestID), "response")
}

func legacyGet(ctx context.Context, kv jetstream.KeyValue, key, what string) (*Recorded, error) {
	e, err := kv.Get(ctx, key)
	if err != nil {
		return nil, notFound(what, err)
	}
	m, err := protocol.Unmarshal(e.Value())
	if err != nil {
		return nil, Permanent(fmt.Errorf("bus: recorded %s %s: %w", what, key, err))
	}
	return &Recorded{Msg: m, Data: e.Value()}, nil
}
