package bus

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
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
	// Seq is its sequence in the record stream.
	Seq uint64
}

// RecordResult makes m the one result of its call: it is stored on the record under
// protocol.SubjectResult with an expected last subject sequence, so the first result of a call
// wins — a worker presumed dead that finished first, the dead-letter processor, a
// cancellation. m must be a tool_result message for res with its MsgID set. It returns the
// recorded result and whether it is m. Anything on the call's subject that is not a result of
// this call (bytes no reader decodes, another request's message) does not count: it is
// superseded.
func (b *Bus) RecordResult(ctx context.Context, p *Publisher, m *protocol.Message, res *protocol.ToolResult) (*Recorded, bool, error) {
	return b.recordResult(ctx, p, m, res, "RecordResult", nil)
}

// RecordRedrivenResult is RecordResult for the result of a call re-driven from the dead
// letters: a result the dead-letter processor recorded for the call when it gave it up (an
// answer of its own, not the tool's) is superseded — the record keeps both, and the call's
// result is the last one. A real result recorded before stands.
func (b *Bus) RecordRedrivenResult(ctx context.Context, p *Publisher, m *protocol.Message, res *protocol.ToolResult) (*Recorded, bool, error) {
	return b.recordResult(ctx, p, m, res, "RecordRedrivenResult", func(r *Recorded) bool { return IsDeadAnswer(r.Msg) })
}

// recordResult seals m (with its sender, as recorded) and records it on its call's subject,
// superseding what supersede names; what (the caller's name) is for the error of a message
// that is no result.
func (b *Bus) recordResult(ctx context.Context, p *Publisher, m *protocol.Message, res *protocol.ToolResult, what string, supersede counts) (*Recorded, bool, error) {
	if m.Type != protocol.TypeToolResult || m.MsgID == "" {
		return nil, false, fmt.Errorf("bus: %s needs a tool_result message with a msg_id, got %s", what, m.Type)
	}
	m.Sender = p.sender // sealed with the result
	b.sealResult(m)
	tools := b.namesOf(m.RequestID, []string{res.ToolCallID}, []string{res.Name})
	earlier := func() (*Recorded, error) {
		return b.trustedResult(ctx, m.RequestID, res.ToolCallID, m.SessionID, tools)
	}
	r, mine, err := b.recordOnce(ctx, p, b.layout.SubjectResult(m.RequestID, res.ToolCallID, m.SessionID), m,
		b.resultOf(ctx, m.RequestID, res.ToolCallID, tools), supersede, earlier)
	if err == nil && tools.err != nil {
		return nil, false, tools.err
	}
	return r, mine, err
}

// IsDeadAnswer reports whether m is a result the dead-letter processor recorded for a call it
// gave up, rather than the tool's own.
func IsDeadAnswer(m *protocol.Message) bool {
	return m.Type == protocol.TypeToolResult && m.Sender.Role == protocol.RoleDeadLetter
}

// Respond makes m the one response to its request: it is stored on the record under
// protocol.SubjectResponse with an expected last subject sequence, so however many processes
// respond to a request, and however often, the first response is the only one recorded, and
// the only one callers see: the stream announces what it stores (protocol.LiveResponseRepublish),
// and a responder that finds a response recorded before announces that one again. m must be a
// response message with its MsgID set (protocol.MsgIDResponse). It reports whether m was the
// one recorded.
func (b *Bus) Respond(ctx context.Context, p *Publisher, m *protocol.Message) (bool, error) {
	if m.Type != protocol.TypeResponse || m.MsgID == "" {
		return false, fmt.Errorf("bus: Respond needs a response message with a msg_id, got %s", m.Type)
	}
	have, mine, err := b.recordOnce(ctx, p, b.layout.SubjectResponse(m.RequestID, m.SessionID), m, responseOf(m.RequestID), nil, nil)
	if err == nil && !mine {
		// Whoever waits for it may have missed the stream's announcement (the caller of a
		// request posted again, a gateway reconnecting): this costs one message nobody stores.
		_ = b.Announce(ctx, have)
	}
	return mine, err
}

// Announce publishes a recorded response again to those awaiting it (outside the stream), as
// the stream did when it stored it: for a caller that began waiting after that.
func (b *Bus) Announce(ctx context.Context, r *Recorded) error {
	if r.Msg == nil || r.Msg.Type != protocol.TypeResponse {
		return errors.New("bus: Announce takes a recorded response")
	}
	msg := &nats.Msg{Subject: protocol.SubjectLiveResponse(r.Msg.RequestID, r.Msg.SessionID), Data: r.Data, Header: nats.Header{}}
	if err := b.JS.Conn().PublishMsg(msg); err != nil {
		return fmt.Errorf("bus: announce the response of %s: %w", r.Msg.RequestID, err)
	}
	return nil
}

// counts reports whether a message on a subject of the record counts as what the subject is
// for; anything else there is as good as nothing.
type counts func(*Recorded) bool

// resultOf counts a result of call callID of requestID: with trusted result keys, only one
// sealed by a key trusted for the call's tool (which tools tells, reading the request's plan
// only for a key trusted with some tools). A plan that cannot be read is an error kept in
// tools, which the caller reports.
func (b *Bus) resultOf(ctx context.Context, requestID, callID string, tools *toolsOf) counts {
	return func(r *Recorded) bool {
		if r.Msg == nil || r.Msg.Type != protocol.TypeToolResult || r.Msg.RequestID != requestID {
			return false
		}
		res, err := r.Msg.DecodeToolResult()
		if err != nil || res.ToolCallID != callID {
			return false
		}
		keys := b.auth.keys
		if keys == nil {
			return true
		}
		signer, ok := keys.Signer(r.Msg)
		if !ok {
			return false
		}
		tool := res.Name
		if !signer.AnyTool() {
			if tool, err = tools.tool(ctx, callID); err != nil {
				return false
			}
		}
		return keys.VerifyResult(r.Msg, res, tool) == nil
	}
}

// responseOf counts a response of requestID.
func responseOf(requestID string) counts {
	return func(r *Recorded) bool {
		if r.Msg == nil || r.Msg.Type != protocol.TypeResponse || r.Msg.RequestID != requestID {
			return false
		}
		_, err := r.Msg.DecodeResponse()
		return err == nil
	}
}

// recordTries bounds the rounds of recordOnce: each is a write that lost to another in flight,
// or that superseded something.
const recordTries = 20

// recordOnce stores m, stamped with p's sender, as what subject holds: if the subject holds no
// message, or its last one does not count as such (valid), or may be superseded (supersede),
// m is stored after it, conditionally on it still being the last. Otherwise the message that
// counts is returned, and mine is false; mine is also true when what counts is m's own bytes
// (an earlier try of this very write).
//
// earlier, when set, finds what counts before the subject's last message: when the last does
// not count (something put there after the subject's genuine message), m is stored only if
// nothing before it counts either.
func (b *Bus) recordOnce(ctx context.Context, p *Publisher, subject string, m *protocol.Message, valid counts, supersede counts,
	earlier func() (*Recorded, error)) (*Recorded, bool, error) {
	m.Sender = p.sender
	data, err := protocol.Marshal(m)
	if err != nil {
		return nil, false, Permanent(err)
	}
	// The server counts headers too (ids, trace context: well under headerAllowance).
	if limit := b.MaxMessageBytes() - headerAllowance; len(data) > limit {
		return nil, false, fmt.Errorf("%w: %s is %d bytes, the limit is %d", ErrTooLarge, m.Type, len(data), limit)
	}
	var after uint64
	for n := 1; ; n++ {
		msg := p.msg(subject, m, data)
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(after, 10))
		ack, err := p.js.PublishMsg(ctx, msg)
		var have *Recorded
		switch {
		case err == nil && !ack.Duplicate:
			return &Recorded{Msg: m, Data: data, Seq: ack.Sequence}, true, nil
		case err == nil:
			// The same message id was stored within the duplicate window: this write's own
			// earlier try, or another message under the same id.
			if have, err = b.recordedAt(ctx, ack.Stream, ack.Sequence); err != nil {
				return nil, false, err
			}
			if bytes.Equal(have.Data, data) {
				return have, true, nil
			}
			if have.Seq != 0 && valid(have) {
				return have, false, nil
			}
			// Another message under this id that does not count (put there by someone
			// else): m takes an id of its own, derived from its bytes so that a retry of
			// this write is still stored once, and what the subject holds decides.
			if data, err = b.reidentify(m, data); err != nil {
				return nil, false, err
			}
			if have, err = b.lastRecorded(ctx, subject); err != nil && !errors.Is(err, ErrNotFound) {
				return nil, false, err
			}
		case apiErrorCode(err, jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant):
			// Something was stored on subject first, or a write to it is in flight.
			if have, err = b.lastRecorded(ctx, subject); err != nil && !errors.Is(err, ErrNotFound) {
				return nil, false, fmt.Errorf("bus: read the %s recorded before: %w", m.Type, err)
			}
		case apiErrorCode(err, jsErrCodeMsgIDInProcess):
			// The same message id is being stored (a cluster's leader has not committed it
			// yet): its outcome decides, in a moment.
		default:
			return nil, false, fmt.Errorf("bus: record %s on %s: %w", m.Type, subject, err)
		}
		switch {
		case have == nil:
			// Nothing visible yet: a write in flight; try again.
		case bytes.Equal(have.Data, data):
			return have, true, nil
		case valid(have) && (supersede == nil || !supersede(have)):
			return have, false, nil
		case !valid(have) && earlier != nil:
			// The last does not count: what counts, if anything, is before it.
			prior, err := earlier()
			if err != nil && !errors.Is(err, ErrNotFound) {
				return nil, false, fmt.Errorf("bus: read the %s recorded before: %w", m.Type, err)
			}
			if prior != nil && bytes.Equal(prior.Data, data) {
				return prior, true, nil
			}
			if prior != nil && (supersede == nil || !supersede(prior)) {
				return prior, false, nil
			}
			after = have.Seq
		default:
			after = have.Seq // superseded: stored after it, if it is still the last
		}
		if n == recordTries {
			return nil, false, fmt.Errorf("bus: record %s on %s: still contended after %d tries", m.Type, subject, n)
		}
		if !retry.Sleep(ctx, time.Duration(n)*10*time.Millisecond) {
			return nil, false, fmt.Errorf("bus: record %s on %s: %w", m.Type, subject, ctx.Err())
		}
	}
}

// reidentify gives m, whose message id another message took, an id of its own: the first
// id with a digest of m's bytes (so the same write gets the same one), sealed again when m is
// a sealed result. It returns m's new bytes.
func (b *Bus) reidentify(m *protocol.Message, data []byte) ([]byte, error) {
	sum := sha256.Sum256(data)
	m.MsgID = protocol.Shorten(m.MsgID, 200) + "~" + hex.EncodeToString(sum[:8])
	if m.Type == protocol.TypeToolResult && m.Seal != nil {
		b.sealResult(m)
	}
	out, err := protocol.Marshal(m)
	if err != nil {
		return nil, Permanent(err)
	}
	return out, nil
}

// jsErrCodeClusterNotAvailable: a replicated stream has no leader (an election is under way).
const jsErrCodeClusterNotAvailable = 10008

// jsErrCodeMsgIDInProcess: a message with the same id is being stored (clustered streams).
const jsErrCodeMsgIDInProcess jetstream.ErrorCode = 10158

func apiErrorCode(err error, codes ...jetstream.ErrorCode) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	for _, c := range codes {
		if apiErr.ErrorCode == c {
			return true
		}
	}
	return false
}

// msgGetRequest and msgGetResponse are the stream leader's message get API
// ($JS.API.STREAM.MSG.GET.<stream>), which only the leader answers.
type msgGetRequest struct {
	Seq     uint64 `json:"seq,omitempty"`
	LastFor string `json:"last_by_subj,omitempty"`
	// NextFor, with Seq, asks for the first message on the subject at Seq or after.
	NextFor string `json:"next_by_subj,omitempty"`
}

// maxSkipped bounds the messages on a response's subject that are no response of its request
// a read looks past: a response is recorded once, first; anything after it on its subject was
// put there otherwise (a stream's acknowledgement sent to a reply subject a user named).
const maxSkipped = 8

// firstRecorded reads from the stream leader the first message on subject that counts,
// looking past at most maxSkipped that do not.
func (b *Bus) firstRecorded(ctx context.Context, subject string, valid counts) (*Recorded, error) {
	return b.scanRecorded(ctx, subject, valid, maxSkipped+1)
}

// scanRecorded reads the messages on subject in order, up to limit of them, for the first that
// counts, or returns an error wrapping ErrNotFound.
func (b *Bus) scanRecorded(ctx context.Context, subject string, valid counts, limit int) (*Recorded, error) {
	seq := uint64(1)
	for range limit {
		raw, err := b.leaderGet(ctx, subjectStream(subject), msgGetRequest{Seq: seq, NextFor: subject})
		if err != nil {
			return nil, err
		}
		if r := recordedOf(raw); valid(r) {
			return r, nil
		}
		seq = raw.Sequence + 1
	}
	return nil, fmt.Errorf("%w: nothing on %s counts among its first %d messages", ErrNotFound, subject, limit)
}

type msgGetResponse struct {
	Error *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
	Message *struct {
		Subject string    `json:"subject"`
		Seq     uint64    `json:"seq"`
		Header  []byte    `json:"hdrs"`
		Data    []byte    `json:"data"`
		Time    time.Time `json:"time"`
	} `json:"message"`
}

// lastRecorded reads the last message on subject (which may hold wildcards) from the stream
// leader, or returns an error wrapping ErrNotFound. Its Msg is nil when its bytes are no
// HermesMessage.
func (b *Bus) lastRecorded(ctx context.Context, subject string) (*Recorded, error) {
	raw, err := b.leaderGet(ctx, subjectStream(subject), msgGetRequest{LastFor: subject})
	if err != nil {
		return nil, err
	}
	return recordedOf(raw), nil
}

// subjectStream is the record stream that holds subject (stream 0 for any subject of none).
func subjectStream(subject string) string {
	k, _ := protocol.StreamOfSubject(subject)
	return protocol.RecordStream(k)
}

// recordedAt reads the message at seq of the record stream named stream from its leader; its
// Msg is nil when its bytes are no HermesMessage.
func (b *Bus) recordedAt(ctx context.Context, stream string, seq uint64) (*Recorded, error) {
	raw, err := b.leaderGet(ctx, stream, msgGetRequest{Seq: seq})
	if err != nil {
		return nil, err
	}
	return recordedOf(raw), nil
}

func recordedOf(raw *jetstream.RawStreamMsg) *Recorded {
	m, err := protocol.Unmarshal(raw.Data)
	if err != nil {
		m = nil
	}
	return &Recorded{Msg: m, Data: raw.Data, Seq: raw.Sequence}
}

// RecordAt reads the message stored at seq in the record stream named stream from the stream
// leader — never from a replica that has not stored it yet — or returns an error wrapping
// ErrNotFound. A stream that is none of the record's holds nothing of it (one a change of the
// record's streams deleted, an advisory from before): ErrNotFound too, never to be retried.
func (b *Bus) RecordAt(ctx context.Context, stream string, seq uint64) (*jetstream.RawStreamMsg, error) {
	if k, ok := protocol.RecordStreamIndex(stream); !ok || k >= len(b.Streams) {
		return nil, fmt.Errorf("%w: %q is none of the record's %d streams", ErrNotFound, stream, len(b.Streams))
	}
	return b.leaderGet(ctx, stream, msgGetRequest{Seq: seq})
}

// leaderGet reads one message of the record stream named stream from its leader: unlike a
// direct get, never from a replica that has not caught up, so what was stored before is always
// seen.
func (b *Bus) leaderGet(ctx context.Context, stream string, req msgGetRequest) (*jetstream.RawStreamMsg, error) {
	body, _ := json.Marshal(req)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	var resp msgGetResponse
	// The leader may be changing: no one answers then, or the answer is "not available".
	err := retry.Do(ctx, leaderRetry, time.Time{}, func() error {
		reply, err := b.JS.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, body)
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			return err
		case err != nil:
			return retry.Stop(err)
		}
		resp = msgGetResponse{}
		if err := json.Unmarshal(reply.Data, &resp); err != nil {
			return retry.Stop(err)
		}
		if resp.Error != nil && resp.Error.ErrCode == jsErrCodeClusterNotAvailable {
			return fmt.Errorf("%s (%d)", resp.Error.Description, resp.Error.ErrCode)
		}
		return nil
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("bus: read the record: %w", err)
	}
	if resp.Error != nil {
		if resp.Error.ErrCode == int(jetstream.JSErrCodeMessageNotFound) {
			return nil, fmt.Errorf("%w: nothing at %d %s", ErrNotFound, req.Seq, req.LastFor)
		}
		return nil, fmt.Errorf("bus: read the record: %s (%d)", resp.Error.Description, resp.Error.ErrCode)
	}
	if resp.Message == nil {
		return nil, errors.New("bus: read the record: empty answer")
	}
	raw := &jetstream.RawStreamMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Seq, Data: resp.Message.Data, Time: resp.Message.Time}
	if len(resp.Message.Header) > 0 {
		if raw.Header, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
			return nil, fmt.Errorf("bus: read the record: headers of %d: %w", raw.Sequence, err)
		}
	}
	return raw, nil
}

// leaderRetry spaces out reads while a stream has no leader.
var leaderRetry = retry.Policy{Initial: 20 * time.Millisecond, Factor: 2, Max: 500 * time.Millisecond}

// Results returns the recorded results of the calls callIDs of requestID (of session), those it
// found, by call id. With atLeast, the sequence of a recorded result the caller holds, they
// are read in one batch (a direct get of the last message of each call's subject) that is
// taken only if it includes that result: a replica that has stored it has stored every result
// before it, and a batch cut short before it is read again. (One cut short after it misses
// only results recorded later, whose own aggregation sees this one.) Without atLeast, each call's
// result is read from the stream leader. A message on a call's subject that is not a result of
// that call is as good as none.
func (b *Bus) Results(ctx context.Context, requestID, session string, callIDs, names []string, atLeast uint64) (map[string]*Recorded, error) {
	out := map[string]*Recorded{}
	tools := b.namesOf(requestID, callIDs, names)
	if atLeast == 0 {
		for _, id := range callIDs {
			r, _, err := b.result(ctx, requestID, id, session, tools)
			switch {
			case err == nil:
				out[id] = r
			case !errors.Is(err, ErrNotFound):
				return nil, err
			}
		}
		return out, nil
	}
	subjects := make([]string, len(callIDs))
	callOf := make(map[string]string, len(callIDs))
	for i, id := range callIDs {
		subjects[i] = b.layout.SubjectResult(requestID, id, session)
		callOf[subjects[i]] = id
	}
	err := retry.Do(ctx, leaderRetry, time.Now().Add(5*time.Second), func() error {
		clear(out)
		var top uint64
		msgs, err := jetstreamext.GetLastMsgsFor(ctx, b.JS, b.layout.StreamNameOf(session), subjects)
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
			id, ok := callOf[raw.Subject]
			if !ok {
				continue
			}
			valid := b.resultOf(ctx, requestID, id, tools)
			if r := recordedOf(raw); valid(r) {
				out[id] = r
			} else if tools.err != nil {
				return retry.Stop(tools.err)
			} else {
				// The last on the subject does not count (put there after the call's own
				// result): the call's own, if any, is before it.
				if r, err := b.trustedResult(ctx, requestID, id, session, tools); err == nil {
					out[id] = r
				} else if !errors.Is(err, ErrNotFound) {
					return retry.Stop(err)
				}
			}
		}
		if top < atLeast {
			return fmt.Errorf("a replica of the record answered without result %d", atLeast)
		}
		return nil
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("bus: read the results of %s: %w", requestID, err)
	}
	return out, nil
}

// Result returns the recorded result of one call, read from the stream leader, or an error
// wrapping ErrNotFound. A message on the call's subject that is not a result of that call is as
// good as none.
//
// tool is the call's tool ("" when the caller does not know it: the request's plan says, when a
// result must be checked against it).
func (b *Bus) Result(ctx context.Context, requestID, callID, session, tool string) (*Recorded, *protocol.ToolResult, error) {
	var names []string
	if tool != "" {
		names = []string{tool}
	}
	return b.result(ctx, requestID, callID, session, b.namesOf(requestID, []string{callID}, names))
}

func (b *Bus) result(ctx context.Context, requestID, callID, session string, tools *toolsOf) (*Recorded, *protocol.ToolResult, error) {
	subject := b.layout.SubjectResult(requestID, callID, session)
	valid := b.resultOf(ctx, requestID, callID, tools)
	r, err := b.lastRecorded(ctx, subject)
	switch {
	case err == nil && valid(r):
	case err == nil && tools.err != nil:
		err = tools.err
	case err == nil:
		// The last on the subject does not count (put there after the call's own result):
		// the call's own, if any, is before it.
		r, err = b.trustedResult(ctx, requestID, callID, session, tools)
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

// maxResultScan bounds the messages on a call's subject read to find its result, when its last
// message does not count: a call has a handful that count (its result, a re-drive's after the
// dead-letter processor's); the rest were put there by someone else.
const maxResultScan = 1024

// trustedResult reads the messages on a call's subject, oldest first, for the call's result:
// the first that counts, or a later one that counts after a dead-letter processor's answer (a
// re-drive's), looking at most at maxResultScan of them.
func (b *Bus) trustedResult(ctx context.Context, requestID, callID, session string, tools *toolsOf) (*Recorded, error) {
	subject := b.layout.SubjectResult(requestID, callID, session)
	valid := b.resultOf(ctx, requestID, callID, tools)
	var found *Recorded
	seq := uint64(1)
	for range maxResultScan {
		raw, err := b.leaderGet(ctx, subjectStream(subject), msgGetRequest{Seq: seq, NextFor: subject})
		if errors.Is(err, ErrNotFound) {
			break
		}
		if err != nil {
			return nil, err
		}
		if r := recordedOf(raw); valid(r) && (found == nil || IsDeadAnswer(found.Msg) && !IsDeadAnswer(r.Msg)) {
			found = r
		} else if tools.err != nil {
			return nil, tools.err
		}
		seq = raw.Sequence + 1
	}
	if found == nil {
		return nil, fmt.Errorf("%w: no trusted result of %s/%s", ErrNotFound, requestID, callID)
	}
	return found, nil
}

// Response returns requestID's recorded response, read from the stream leader, or an error
// wrapping ErrNotFound. session may be empty when the caller does not know it. A message on
// the response's subject that is not a response of requestID is as good as none.
func (b *Bus) Response(ctx context.Context, requestID, session string) (*Recorded, *protocol.Response, error) {
	subjects := []string{b.layout.SubjectResponse(requestID, session)}
	if session == "" { // in whichever stream holds it
		subjects = subjects[:0]
		for k := range b.layout.Streams() {
			subjects = append(subjects, protocol.FilterResponseOfIn(k, requestID))
		}
	}
	// The first response on the subject is the one: it is recorded first, once; what may
	// follow it there is not a response of this request.
	var r *Recorded
	var err error
	for _, subject := range subjects {
		if r, err = b.firstRecorded(ctx, subject, responseOf(requestID)); !errors.Is(err, ErrNotFound) {
			break
		}
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

// directGetTimeout bounds the direct get of an announced response, leaving the rest of the
// caller's time to the leader's read.
const directGetTimeout = 300 * time.Millisecond

// AnnouncedResponse reads requestID's response in session, just announced as recorded: the
// first message on its subject, first by a direct get, which any replica answers without going through the stream's API (the
// announcement comes after the store, so on one server it is always there), then, if that
// replica has not stored it yet, as Response does, from the leader.
func (b *Bus) AnnouncedResponse(ctx context.Context, requestID, session string) (*protocol.Response, error) {
	dctx, cancel := context.WithTimeout(ctx, directGetTimeout) // the rest is the leader's
	raw, err := b.StreamOf(session).GetMsg(dctx, 1, jetstream.WithGetMsgSubject(b.layout.SubjectResponse(requestID, session)))
	cancel()
	if err == nil {
		if r := recordedOf(raw); responseOf(requestID)(r) {
			if resp, err := r.Msg.DecodeResponse(); err == nil {
				return resp, nil
			}
		}
	}
	_, resp, err := b.Response(ctx, requestID, session)
	return resp, err
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
