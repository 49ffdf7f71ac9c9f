package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Owners names who a session belongs to (the gateway's admitter).
type Owners interface {
	OwnerOf(ctx context.Context, session string) (string, error)
}

// Outbox sends each external client the responses of its requests, as JSON, on a subject of
// its own (protocol.SubjectClientResponse), which the clients' account imports and only that
// client may subscribe to: a client that published a request (fire and forget) hears its
// response as soon as it is recorded. Every gateway runs one, in one queue group, so each
// response is sent by one of them, each time it is announced (once, but for a responder that
// finds it recorded and announces it again): with no record of what was sent, so a client that
// was not listening reads it on the micro service's endpoint response.
type Outbox struct {
	Conn   *nats.Conn
	Owners Owners
	Logger *slog.Logger
}

// Name names the service.
func (o *Outbox) Name() string { return "outbox (clients' responses on their own subjects)" }

// Validate says what the outbox lacks to run.
func (o *Outbox) Validate() error {
	if o.Conn == nil || o.Owners == nil {
		return errors.New("ingress: the outbox needs Conn and Owners")
	}
	return nil
}

// outboxGroup is the queue group of the gateways' outboxes.
const outboxGroup = "hermes-outbox"

// Run sends clients their responses until ctx ends.
func (o *Outbox) Run(ctx context.Context) error {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	sub, err := o.Conn.QueueSubscribe(protocol.FilterLiveResponses, outboxGroup, func(m *nats.Msg) { o.send(ctx, m) })
	if err != nil {
		return err
	}
	<-ctx.Done()
	return sub.Drain()
}

// send sends a recorded response to the client whose session it is, if a client's.
func (o *Outbox) send(ctx context.Context, m *nats.Msg) {
	msg, err := protocol.Unmarshal(m.Data)
	if err != nil || msg.Type != protocol.TypeResponse {
		return
	}
	if protocol.CheckID("session_id", msg.SessionID) != nil || protocol.CheckID("request_id", msg.RequestID) != nil {
		return
	}
	owner, err := o.Owners.OwnerOf(ctx, msg.SessionID)
	if err != nil {
		o.Logger.Warn("outbox: the session's owner", "session_id", msg.SessionID, "err", err)
		return
	}
	user, ok := strings.CutPrefix(owner, admission.ClientCallerPrefix)
	if !ok || protocol.CheckID("NATS user", user) != nil {
		return // not a client's
	}
	resp, err := msg.DecodeResponse()
	if err != nil {
		return
	}
	if resp.Results == nil {
		resp.Results = []protocol.ToolResult{}
	}
	body, err := json.Marshal(resp)
	if err != nil {
		return
	}
	out := &nats.Msg{Subject: protocol.SubjectClientResponse(user, msg.SessionID, msg.RequestID), Data: body,
		Header: nats.Header{"Content-Type": {protocol.ContentTypeJSON}}}
	if err := o.Conn.PublishMsg(out); err != nil {
		o.Logger.Warn("outbox: send", "client", user, "request_id", msg.RequestID, "err", err)
	}
}
