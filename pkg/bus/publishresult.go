package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/retry"
)

// PublishResult records m, the final result of a call, on its call's subject
// (protocol.SubjectResult) without reading the record: what a tool worker does, whose
// credential reads no message of the record. m must be a tool_result message of res with its
// MsgID set; it is sealed with the publisher's sender (SealResults), and its id made one that no
// one without the seal key can take first (resultMsgID). It is stored when nothing is
// recorded on the subject after sequence after — 0 for a call run the first time; for a call
// re-driven from the dead letters, the sequence of the answer it supersedes
// (HeaderRedriveAfter) — so the first result of a call stays its result.
//
// When something was recorded there first, settled (the call's ledger: bus does not read it)
// decides: a finished or cancelled call's first result stands, and m is not stored; otherwise
// what is there is no result of the call — bytes that no reader counts, which a holder of a
// worker's credential can put there — and m is stored after it, where readers find it (they
// look past what does not count).
//
// It reports whether m is recorded: true when stored now, or when the stream already holds a
// message under m's id (an earlier try of this write whose acknowledgement was lost, or, where
// ids are not made from a seal key, another writer's result under the same id: that one is the
// call's result then); false when a result recorded first stands.
func (b *Bus) PublishResult(ctx context.Context, p *Publisher, m *protocol.Message, res *protocol.ToolResult, after uint64, settled func(context.Context) (bool, error)) (bool, error) {
	if m.Type != protocol.TypeToolResult || m.MsgID == "" {
		return false, fmt.Errorf("bus: PublishResult needs a tool_result message with a msg_id, got %s", m.Type)
	}
	data, err := b.SealedResult(p, m)
	if err != nil {
		return false, err
	}
	subject := b.layout.SubjectResult(m.RequestID, res.ToolCallID, m.SessionID)
	for n := 1; ; n++ {
		msg := p.msg(subject, m, data)
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(after, 10))
		_, err := p.js.PublishMsg(ctx, msg)
		var last uint64
		var known bool
		switch {
		case err == nil:
			return true, nil // stored, or stored before under its id (Duplicate)
		case wrongLast(err, &last, &known):
			done, serr := settled(ctx)
			if serr != nil {
				return false, fmt.Errorf("bus: record %s on %s: %w", m.Type, subject, serr)
			}
			if done {
				return false, nil
			}
			if known {
				after = last // stored after what is there, unless more comes meanwhile
			}
			// Else a write to the subject is in flight (a clustered stream says so without a
			// sequence): what it stores decides, in a moment.
		case apiErrorCode(err, jsErrCodeMsgIDInProcess):
			// The same message id is being stored (a cluster's leader has not committed it
			// yet): its outcome decides, in a moment.
		default:
			return false, fmt.Errorf("bus: record %s on %s: %w", m.Type, subject, err)
		}
		if n == recordTries {
			return false, fmt.Errorf("bus: record %s on %s: still contended after %d tries", m.Type, subject, n)
		}
		if !retry.Sleep(ctx, time.Duration(n)*10*time.Millisecond) {
			return false, fmt.Errorf("bus: record %s on %s: %w", m.Type, subject, ctx.Err())
		}
	}
}

// SealedResult makes m, a tool_result message with its MsgID set, what PublishResult records:
// sent by p's sender, under the id only the seal key makes (when results are sealed), sealed,
// and encoded. A result larger than the bus carries in one message is ErrTooLarge. The fast
// lane's workers answer with it, and their router records it as it is.
func (b *Bus) SealedResult(p *Publisher, m *protocol.Message) ([]byte, error) {
	m.Sender = p.sender // sealed with the result
	m.MsgID = b.resultMsgID(m.MsgID)
	b.sealResult(m)
	data, err := protocol.Marshal(m)
	if err != nil {
		return nil, Permanent(err)
	}
	if limit := b.MaxMessageBytes() - headerAllowance; len(data) > limit {
		return nil, fmt.Errorf("%w: %s is %d bytes, the limit is %d", ErrTooLarge, m.Type, len(data), limit)
	}
	return data, nil
}

// SealedDecision makes m, the tool_result message of a result a router decided itself (NO_ROUTE,
// a policy's refusal…), what RecordResult records: sent by p's sender, sealed, encoded.
func (b *Bus) SealedDecision(p *Publisher, m *protocol.Message) ([]byte, error) {
	m.Sender = p.sender
	b.sealResult(m)
	data, err := protocol.Marshal(m)
	if err != nil {
		return nil, Permanent(err)
	}
	return data, nil
}

// RedriveAfter says after which sequence of the record the result of call callID (of tool
// tool, in requestID of session) re-driven from the dead letters is to be recorded: the last
// message on the call's subject, when the result that counts there is one the dead-letter
// processor gave (IsDeadAnswer) or there is none (0 when the subject is empty). A call whose
// tool's own result is recorded is not to be run again: ErrAnswered.
func (b *Bus) RedriveAfter(ctx context.Context, requestID, callID, session, tool string) (uint64, error) {
	rec, _, err := b.Result(ctx, requestID, callID, session, tool)
	switch {
	case err == nil && !IsDeadAnswer(rec.Msg):
		return 0, fmt.Errorf("%w: call %s of %s has its tool's result (record sequence %d)", ErrAnswered, callID, requestID, rec.Seq)
	case err != nil && !errors.Is(err, ErrNotFound):
		return 0, err
	}
	last, err := b.lastRecorded(ctx, b.layout.SubjectResult(requestID, callID, session))
	switch {
	case errors.Is(err, ErrNotFound):
		return 0, nil
	case err != nil:
		return 0, err
	}
	return last.Seq, nil
}

// ErrAnswered is returned by RedriveAfter for a call whose tool's result is recorded.
var ErrAnswered = errors.New("bus: call answered")

// wrongLast reports whether err is the stream's refusal of an expected last subject sequence,
// with the subject's actual last sequence in last when the server says it ("wrong last
// sequence: N", known); known false when it does not.
func wrongLast(err error, last *uint64, known *bool) bool {
	if !apiErrorCode(err, jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return false
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		if i := strings.LastIndex(apiErr.Description, ": "); i >= 0 {
			n, perr := strconv.ParseUint(strings.TrimSpace(apiErr.Description[i+2:]), 10, 64)
			*last, *known = n, perr == nil
		}
	}
	return true
}
