package summarize

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/agent"
	"github.com/hermesbus/hermes/internal/record"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Latest is session's latest summary and the stream sequence it is stored at; nil and 0 when
// it has none (or the record no longer holds it).
func Latest(ctx context.Context, js jetstream.JetStream, session string) (*protocol.LLMSummary, uint64, error) {
	if err := protocol.CheckID("session_id", session); err != nil {
		return nil, 0, err
	}
	stream, err := js.Stream(ctx, protocol.StreamName)
	if err != nil {
		return nil, 0, fmt.Errorf("summaries: %w", err)
	}
	raw, err := stream.GetLastMsgForSubject(ctx, protocol.SubjectEvent(protocol.EventSummary, session))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("summaries: the latest of session %s: %w", session, err)
	}
	e := record.Decode(raw.Sequence, raw.Subject, raw.Time, raw.Data)
	s, ok := e.Payload.(*protocol.LLMSummary)
	if !ok || e.Msg.SessionID != session {
		// Unreadable: the session goes on without it (its messages are all still there).
		return nil, raw.Sequence, nil
	}
	return s, raw.Sequence, nil
}

// Since is session's conversation as the record holds it after sequence after, up to and
// including sequence until (0: to the end): the messages each decision of the model added,
// and its answers, in order — not the notes said to the model of one message alone. last is
// the sequence of the last decision read (after, when none).
func Since(ctx context.Context, js jetstream.JetStream, session string, after, until uint64) (msgs []protocol.LLMMessage, last uint64, err error) {
	if err := protocol.CheckID("session_id", session); err != nil {
		return nil, 0, err
	}
	last = after
	errEnough := errors.New("read enough")
	_, err = record.Read(ctx, js, []string{protocol.SubjectEvent(protocol.EventLLM, session)}, record.Start{Seq: after + 1}, func(e *record.Entry) error {
		if until != 0 && e.Seq > until {
			return errEnough
		}
		d, ok := e.Payload.(*protocol.LLMDecision)
		if !ok {
			return nil
		}
		last = e.Seq
		for _, m := range d.Messages {
			if m.Role == "system" && m.Content == agent.NoCandidates {
				continue
			}
			msgs = append(msgs, m)
		}
		if d.Error == "" && len(d.Chosen) == 0 {
			msgs = append(msgs, protocol.LLMMessage{Role: "assistant", Content: d.Answer})
		}
		return nil
	})
	if err != nil && !errors.Is(err, errEnough) && !errors.Is(err, record.ErrNoRecord) {
		return nil, 0, fmt.Errorf("read the session's decisions: %w", err)
	}
	return msgs, last, nil
}
