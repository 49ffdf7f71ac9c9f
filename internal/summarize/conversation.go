package summarize

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/agent"
	"github.com/hermesbus/hermes/internal/record"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Latest is session's latest summary and the stream sequence it is stored at; nil and 0 when
// it has none (or the record no longer holds it). A summary that cannot be read, that claims
// to cover what was stored after it, or that was moved from another stream, is taken as none
// (its sequence is still returned: the next summary is written on it).
func Latest(ctx context.Context, js jetstream.JetStream, session string) (*protocol.LLMSummary, uint64, error) {
	if err := protocol.CheckID("session_id", session); err != nil {
		return nil, 0, err
	}
	stream, l, err := record.SessionStream(ctx, js, session)
	if err != nil {
		return nil, 0, fmt.Errorf("summarize: %w", err)
	}
	raw, err := stream.GetLastMsgForSubject(ctx, l.SubjectEvent(protocol.EventSummary, session))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("summarize: the latest summary of session %s: %w", session, err)
	}
	e := record.Decode(raw.Sequence, raw.Subject, raw.Time, raw.Data)
	s, ok := e.Payload.(*protocol.LLMSummary)
	// A summary moved to another stream of the record (bus.Restream) names sequences of the
	// stream it was in: it covers nothing here, and the session is summarized afresh.
	moved := raw.Header.Get(bus.HeaderRestreamed) != ""
	if !ok || moved || e.Msg.SessionID != session || s.Through >= raw.Sequence {
		return nil, raw.Sequence, nil
	}
	return s, raw.Sequence, nil
}

// Turn is what one decision of the model added to a session's conversation.
type Turn struct {
	// Seq is the decision's stream sequence; Run the run it is a turn of.
	Seq uint64
	Run string
	// Messages are the messages it added: those the model read that no decision before held,
	// and its answer — or, when its run ended after it made calls, its calls and their
	// results as the record holds them.
	Messages []protocol.LLMMessage
	// Open marks a run's last turn that made calls while the run may still be running: what
	// its calls came to is not known yet, and its Messages leave them out.
	Open bool
}

// Running says whether a run, whose last decision was stored at last, may still be running.
type Running func(run string, last time.Time) bool

// RunningFor is Running for runs bounded by timeout: one whose last decision is younger may
// still be running.
func RunningFor(timeout time.Duration) Running {
	return func(_ string, last time.Time) bool { return time.Since(last) < timeout }
}

// Since is session's conversation as the record holds it after sequence after, up to and
// including sequence until (0: to the end), a Turn for each decision, in stream order. Not in
// it: the notes said to the model of one message alone, and the first turns that failed (the
// person was told so; a retry sends the message again). A run's last turn that made calls has
// them added with their results as the record holds them (or the refusal that kept one from
// running), so that the conversation says what was done — unless running says the run may
// still be running: then the turn is Open.
func Since(ctx context.Context, js jetstream.JetStream, session string, after, until uint64, running Running) ([]Turn, error) {
	if err := protocol.CheckID("session_id", session); err != nil {
		return nil, err
	}
	type read struct {
		turn      Turn
		requestID string
		d         *protocol.LLMDecision
		stored    time.Time
	}
	var all []read
	goesOn := map[string]bool{} // runs with a turn after until: none of theirs up to it is their last
	_, err := record.Read(ctx, js, []string{protocol.SubjectEvent(protocol.EventLLM, session)}, record.Start{Seq: after + 1}, func(e *record.Entry) error {
		d, ok := e.Payload.(*protocol.LLMDecision)
		switch {
		case !ok:
		case until != 0 && e.Seq > until:
			goesOn[d.Run] = true
		default:
			all = append(all, read{turn: Turn{Seq: e.Seq, Run: d.Run}, requestID: e.Msg.RequestID, d: d, stored: e.Time})
		}
		return nil
	})
	if err != nil && !errors.Is(err, record.ErrNoRecord) {
		return nil, fmt.Errorf("summarize: read the session's decisions: %w", err)
	}
	// The last turn of each run.
	last := map[string]int{}
	for i, r := range all {
		last[r.d.Run] = i
	}
	out := make([]Turn, 0, len(all))
	for i, r := range all {
		d := r.d
		if d.Error != "" && d.Turn == 1 {
			continue
		}
		for _, m := range d.Messages {
			if m.Role == "system" && m.Content == agent.NoCandidates {
				continue
			}
			r.turn.Messages = append(r.turn.Messages, m)
		}
		switch {
		case d.Error == "" && len(d.Chosen) == 0:
			r.turn.Messages = append(r.turn.Messages, protocol.LLMMessage{Role: "assistant", Content: d.Answer})
		case last[d.Run] == i && !goesOn[d.Run] && (d.Error == "" || len(d.Chosen) > 0):
			// A turn that failed ended its run; another may be waiting for its calls' results.
			if d.Error == "" && running != nil && running(d.Run, r.stored) {
				r.turn.Open = true
				break
			}
			done, err := ended(ctx, js, session, r.requestID, d)
			if err != nil {
				return nil, err
			}
			r.turn.Messages = append(r.turn.Messages, done...)
		}
		out = append(out, r.turn)
	}
	return out, nil
}

// ended is the calls a run's last turn made for Hermes to run, and what they came to: the
// results the record holds, the refusal that kept one from running, or what is known when
// the record holds neither. The turn after them never came.
func ended(ctx context.Context, js jetstream.JetStream, session, requestID string, d *protocol.LLMDecision) ([]protocol.LLMMessage, error) {
	if !slices.ContainsFunc(d.Chosen, func(c protocol.LLMCall) bool { return !c.Client }) {
		return nil, nil // the client's calls: its results come from it, if ever
	}
	refused := map[string]string{}
	for _, w := range d.Warnings {
		switch w.Kind {
		case protocol.WarnUnknownTool, protocol.WarnMissingArgument, protocol.WarnBadArguments, protocol.WarnNotJSON:
			if _, ok := refused[w.CallID]; !ok {
				refused[w.CallID] = w.Message
			}
		}
	}
	stream, l, err := record.SessionStream(ctx, js, session)
	if err != nil {
		return nil, fmt.Errorf("summarize: %w", err)
	}
	// Every call, the client's too (its results, when it sent them, answer them); Hermes'
	// with what they came to.
	out := []protocol.LLMMessage{{Role: "assistant", ToolCalls: d.Chosen}}
	var plans jetstream.KeyValue
	for _, c := range d.Chosen {
		if c.Client {
			continue
		}
		res := protocol.ToolResult{Status: protocol.ResultError, ErrorCode: protocol.CodeInternal, ErrorOrigin: protocol.OriginHermes,
			RecoveryHint: "the run ended before this call's result was read: it may have run (the record says)"}
		if why, ok := refused[c.ID]; ok || d.Error != "" {
			if !ok {
				why = "not run: " + d.Error
			}
			res.ErrorCode, res.RecoveryHint = protocol.CodeBadArguments, why
		} else {
			raw, err := stream.GetLastMsgForSubject(ctx, l.SubjectResult(requestID, c.ID, session))
			switch {
			case err == nil:
				if r, ok := record.Decode(raw.Sequence, raw.Subject, raw.Time, raw.Data).Payload.(*protocol.ToolResult); ok {
					res = *r
				}
			case !errors.Is(err, jetstream.ErrMsgNotFound):
				return nil, fmt.Errorf("summarize: the result of %s: %w", c.ID, err)
			default:
				// No result: was the turn's request ever accepted (its plan written)?
				if plans == nil {
					if plans, err = js.KeyValue(ctx, bus.BucketCalls); err != nil {
						return nil, fmt.Errorf("summarize: %w", err)
					}
				}
				if _, err := plans.Get(ctx, requestID); errors.Is(err, jetstream.ErrKeyNotFound) {
					res.RecoveryHint = "not run: the run ended before this call was dispatched"
				} else if err != nil {
					return nil, fmt.Errorf("summarize: the plan of %s: %w", requestID, err)
				}
			}
		}
		out = append(out, protocol.LLMMessage{Role: "tool", ToolCallID: c.ID, Content: agent.CutText(agent.ToolMessage(c.Name, res))})
	}
	return out, nil
}

// Conversation is turns' messages, each run's together: a run whose turns interleave in the
// record with another's (two at once in one session) comes whole, where it began.
func Conversation(turns []Turn) []protocol.LLMMessage {
	order := []string{}
	byRun := map[string][]Turn{}
	for _, t := range turns {
		if _, ok := byRun[t.Run]; !ok {
			order = append(order, t.Run)
		}
		byRun[t.Run] = append(byRun[t.Run], t)
	}
	var out []protocol.LLMMessage
	for _, run := range order {
		for _, t := range byRun[run] {
			out = append(out, t.Messages...)
		}
	}
	return out
}
