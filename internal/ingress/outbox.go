package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Owners names who a session belongs to (the gateway's admitter).
type Owners interface {
	OwnerOf(ctx context.Context, session string) (string, error)
}

// Responses reads a request's recorded response (the bus).
type Responses interface {
	Response(ctx context.Context, requestID, session string) (*bus.Recorded, *protocol.Response, error)
}

// Outbox sends each external client the responses of its requests, as JSON, on a subject of
// its own (protocol.SubjectClientResponse), which the clients' account imports and only that
// client may subscribe to: a client that published a request (fire and forget) hears its
// response as soon as it is recorded. Every gateway runs one, in one queue group, so each
// response is sent by one of them, each time it is announced (once, but for a responder that
// finds it recorded and announces it again): with no record of what was sent, so a client that
// was not listening reads it on the micro service's endpoint response.
type Outbox struct {
	Conn      *nats.Conn
	Owners    Owners
	Responses Responses
	Logger    *slog.Logger
}

// Name names the service.
func (o *Outbox) Name() string { return "outbox (clients' responses on their own subjects)" }

// Validate says what the outbox lacks to run.
func (o *Outbox) Validate() error {
	if o.Conn == nil || o.Owners == nil || o.Responses == nil {
		return errors.New("ingress: the outbox needs Conn, Owners and Responses")
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
	// As the submitter's: responses are up to a bus message each.
	_ = sub.SetPendingLimits(-1, 1<<30)
	<-ctx.Done()
	_ = sub.Drain()
	return nil
}

// send sends the response an announcement names, as the record holds it (never the
// announcement's bytes, which whoever may publish on its subject could forge), to the client
// whose session it is, if a client's.
func (o *Outbox) send(ctx context.Context, m *nats.Msg) {
	rest, ok := strings.CutPrefix(m.Subject, strings.TrimSuffix(protocol.SubjectLiveResponse("", ""), "."))
	requestID, session, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 || protocol.CheckID("session_id", session) != nil || protocol.CheckID("request_id", requestID) != nil {
		return
	}
	owner, err := o.Owners.OwnerOf(ctx, session)
	if err != nil {
		o.Logger.Warn("outbox: the session's owner", "session_id", session, "err", err)
		return
	}
	user, ok := strings.CutPrefix(owner, admission.ClientCallerPrefix)
	if !ok || protocol.CheckID("NATS user", user) != nil {
		return // not a client's
	}
	_, resp, err := o.Responses.Response(ctx, requestID, session)
	if err != nil {
		o.Logger.Warn("outbox: read the response", "client", user, "request_id", requestID, "err", err)
		return
	}
	if resp.Results == nil {
		resp.Results = []protocol.ToolResult{}
	}
	body, err := json.Marshal(resp)
	if err != nil {
		return
	}
	out := &nats.Msg{Subject: protocol.SubjectClientResponse(user, session, requestID), Data: body,
		Header: nats.Header{"Content-Type": {protocol.ContentTypeJSON}}}
	if err := o.Conn.PublishMsg(out); err != nil {
		o.Logger.Warn("outbox: send", "client", user, "request_id", requestID, "err", err)
	}
}
