package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"

	"github.com/hermesbus/hermes/internal/agent"
	"github.com/hermesbus/hermes/internal/approvals"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// The confirmation round (seed 001 §5.3): a turn whose calls a policy parked for confirmation
// ends with Hermes' own message saying exactly what would run, and the session keeps the turn
// (chatconfirm.<session>). The person's next message decides: a confirmation approves the
// approvals as their requester, runs the calls — the same tools with the same arguments, so
// the router runs them under the approvals, once — and the model goes on from the turn with
// their results; anything else denies them, and the message is taken as it is. An approval
// that needs someone else (approvers) is not decided here: it waits, and its call runs when
// the person confirms after it was approved.

// Approvals decide the approvals of the confirmation round (approvals.Decisions).
type Approvals interface {
	Get(ctx context.Context, id string) (*approvals.Approval, error)
	Decide(ctx context.Context, id string, who approvals.Decider, approve bool, reason string) (*approvals.Approval, error)
}

// confirmTurn is a turn that ended in calls waiting for confirmation.
type confirmTurn struct {
	// Intent is the person's message the turn's run answered (what its tools were chosen for).
	Intent   string            `json:"intent"`
	Parked   []parkedCall      `json:"parked"`
	Messages []json.RawMessage `json:"messages"`
	Recorded int               `json:"recorded"`
}

type parkedCall struct {
	ApprovalID string          `json:"approval_id"`
	CallID     string          `json:"tool_call_id"`
	Tool       string          `json:"tool"`
	Arguments  json.RawMessage `json:"arguments"`
}

func confirmKey(session string) string { return "chatconfirm." + session }

// confirmWords are the answers that confirm (compared without case, spaces or punctuation).
var confirmWords = map[string]bool{"确认": true, "确定": true, "是": true, "是的": true, "好": true, "好的": true, "可以": true,
	"同意": true, "执行": true, "确认执行": true, "yes": true, "y": true, "ok": true, "okay": true, "confirm": true, "confirmed": true, "sure": true}

// confirms reports whether text confirms.
func confirms(text string) bool {
	t := strings.Map(func(r rune) rune {
		if unicode.IsSpace(r) || unicode.IsPunct(r) || unicode.IsSymbol(r) {
			return -1
		}
		return unicode.ToLower(r)
	}, text)
	return confirmWords[t]
}

// confirmText is Hermes' message asking to confirm parked; in a session that keeps no turn
// (named false), it points at the approvals' API instead.
func confirmText(parked []agent.Parked, named bool) string {
	var b strings.Builder
	b.WriteString("以下操作需要您确认后才会执行 (these calls run only once you confirm them):\n")
	for _, p := range parked {
		fmt.Fprintf(&b, "- %s %s (approval %s)\n", p.Tool, protocol.Shorten(string(p.Arguments), 2000), p.ApprovalID)
	}
	if !named {
		b.WriteString("请通过 POST /v1/approvals/{id}/approve 批准后再次调用。(Approve them through POST /v1/approvals/{id}/approve, then make the same calls again.)")
		return b.String()
	}
	b.WriteString("回复“确认”执行；回复其他内容则取消。(Reply \"confirm\" to run them; anything else cancels them.)")
	return b.String()
}

// keepConfirm keeps the turn that ended in out's parked calls for the session's next message.
func (c *chatRun) keepConfirm(ctx context.Context, intent string, out agent.Outcome) {
	if !c.named {
		return
	}
	t := confirmTurn{Intent: intent}
	for i, m := range out.Messages {
		if m.OfAssistant != nil {
			t.Recorded = i
		}
		b, err := json.Marshal(m)
		if err != nil {
			return
		}
		t.Messages = append(t.Messages, b)
	}
	for _, p := range out.Parked {
		t.Parked = append(t.Parked, parkedCall{ApprovalID: p.ApprovalID, CallID: p.CallID, Tool: p.Tool, Arguments: p.Arguments})
	}
	data, err := json.Marshal(t)
	if err != nil || len(data) > maxPendingBytes {
		c.s.log.Info("a chat turn waiting for confirmation is too large to keep; its calls stay parked", "session_id", c.session, "bytes", len(data))
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := c.s.env.Sessions.Put(ctx, confirmKey(c.session), data); err != nil {
		c.s.log.Warn("keep a chat turn waiting for confirmation", "session_id", c.session, "err", err)
	}
}

// confirmation decides the turn the session's last run left waiting, with the person's
// message intent (a confirmation only when last, the message just received, is theirs): it returns the conversation to go on with (msgs when there was none, or
// the person did not confirm), how many of its messages the record holds, and what the tools
// to offer are chosen for (the waiting turn's intent when it goes on).
func (c *chatRun) confirmation(ctx context.Context, intent string, last chatMessage,
	msgs []openai.ChatCompletionMessageParamUnion, recorded int) ([]openai.ChatCompletionMessageParamUnion, int, string, error) {
	out, rec, goOn, err := c.confirm(ctx, intent, last.Role == "user", last.param(), msgs, recorded)
	if goOn != "" {
		return out, rec, goOn, err
	}
	return out, rec, intent, err
}

func (c *chatRun) confirm(ctx context.Context, intent string, userSaid bool, last openai.ChatCompletionMessageParamUnion,
	msgs []openai.ChatCompletionMessageParamUnion, recorded int) ([]openai.ChatCompletionMessageParamUnion, int, string, error) {
	if !c.named || c.s.env.Approvals == nil {
		return msgs, recorded, "", nil
	}
	kv := c.s.env.Sessions
	e, err := kv.Get(ctx, confirmKey(c.session))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return msgs, recorded, "", nil
	case err != nil:
		return nil, 0, "", err
	}
	var t confirmTurn
	if json.Unmarshal(e.Value(), &t) != nil || len(t.Parked) == 0 {
		return msgs, recorded, "", nil
	}
	// Taken by this run only: another run of the session that took it first decides it.
	rev, err := kv.Update(ctx, confirmKey(c.session), []byte("{}"), e.Revision())
	if err != nil {
		return msgs, recorded, "", nil
	}
	who := approvals.Decider{Caller: c.a.Record()}
	// Only the approvals this turn opened for exactly these calls, by this caller, are
	// decided here: an id is never taken on trust.
	kept := t.Parked[:0]
	for _, p := range t.Parked {
		a, err := c.s.env.Approvals.Get(ctx, p.ApprovalID)
		if err != nil {
			if !errors.Is(err, approvals.ErrNotFound) {
				_, _ = kv.Update(ctx, confirmKey(c.session), e.Value(), rev) // decided next time
				return nil, 0, "", err
			}
			continue
		}
		if a.SessionID == c.session && a.Tool == p.Tool && a.Recall && a.Hash == approvals.Hash(p.Tool, p.Arguments, who.Caller) {
			kept = append(kept, p)
		} else {
			c.s.log.Warn("a waiting chat turn names an approval not of its calls; left undecided", "approval_id", p.ApprovalID, "session_id", c.session)
		}
	}
	t.Parked = kept
	if len(t.Parked) == 0 {
		return msgs, recorded, "", nil
	}
	if !userSaid || !confirms(intent) {
		for _, p := range t.Parked {
			_, err := c.s.env.Approvals.Decide(ctx, p.ApprovalID, who, false, "the person answered something else: "+protocol.Shorten(intent, 200))
			if err != nil && !errors.Is(err, approvals.ErrDecided) && !errors.Is(err, approvals.ErrExpired) && !errors.Is(err, approvals.ErrForbidden) {
				c.s.log.Warn("deny an approval the person did not confirm", "approval_id", p.ApprovalID, "err", err)
			}
		}
		return msgs, recorded, "", nil
	}
	var run []protocol.ToolCall
	for _, p := range t.Parked {
		a, err := c.s.env.Approvals.Decide(ctx, p.ApprovalID, who, true, "confirmed in the chat")
		if err != nil && !(errors.Is(err, approvals.ErrDecided) && a != nil && a.State == approvals.Approved) && !errors.Is(err, approvals.ErrUnrecorded) {
			// Someone else's to approve, or no longer pending: the call runs only if it was
			// approved; the router says why not.
			c.s.log.Info("an approval the person confirmed was not approved by them", "approval_id", p.ApprovalID, "err", err)
		}
		run = append(run, protocol.ToolCall{ToolCallID: p.CallID, Name: p.Tool, Arguments: p.Arguments})
	}
	results, err := c.Run(ctx, c.session, c.run+"-confirmed", intent, run)
	if err != nil {
		// The turn waits again: confirming once more runs the calls (their approvals stand).
		_, _ = kv.Update(context.WithoutCancel(ctx), confirmKey(c.session), e.Value(), rev)
		return nil, 0, "", err
	}
	byID := map[string]protocol.ToolResult{}
	for _, r := range results {
		byID[r.ToolCallID] = r
	}
	out := make([]openai.ChatCompletionMessageParamUnion, 0, len(t.Messages)+1)
	for _, raw := range t.Messages {
		var m openai.ChatCompletionMessageParamUnion
		if json.Unmarshal(raw, &m) != nil {
			return msgs, recorded, "", nil
		}
		if m.OfTool != nil {
			for _, p := range t.Parked {
				if r, ok := byID[p.CallID]; ok && m.OfTool.ToolCallID == p.CallID {
					m = openai.ToolMessage(agent.ToolMessage(p.Tool, r), p.CallID)
				}
			}
		}
		out = append(out, m)
	}
	return append(out, last), min(max(t.Recorded, 0), len(out)), t.Intent, nil
}
