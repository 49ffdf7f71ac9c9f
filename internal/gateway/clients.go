package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// callerOfClient is the caller an external NATS client's requests are recorded under: its NATS
// user, named by the subject it published on (which its permissions allow it alone).
func callerOfClient(user string) *protocol.Caller {
	return &protocol.Caller{ID: clientCallerPrefix + user, Name: user, Role: clientRole}
}

const (
	clientCallerPrefix = "nats:"
	clientRole         = "nats-client"
	// clientRetry is how long a client's request waits before it is tried again when the
	// store is near full.
	clientRetry = 30 * time.Second
)

// takeClientRequests submits the requests external NATS clients publish
// (protocol.SubjectClientRequest), which wait in a stream of their own, shared with every other
// gateway through their consumer, one at a time, until ctx is done. Each is submitted as the
// NATS user the subject names — whatever caller the message itself claims — into a session
// that user owns; it is accepted once per request_id like any other, and its answer is recorded
// for it (clients read it through a gateway). What can never be submitted (not a request, a
// session not the subject's, one owned by another caller, a request_id used for another
// request) is dropped and logged: nothing of it reaches the record. While the store is near
// full, requests wait. If the consumer cannot be read, it is looked for again.
func (g *Gateway) takeClientRequests(ctx context.Context) error {
	h := bus.Messages(bus.HandlerFunc(g.takeClientRequest), g.log, "client request")
	warned := false
	for ctx.Err() == nil {
		c, err := g.cfg.Bus.ClientConsumer(ctx)
		if err == nil {
			warned = false
			err = (&bus.Subscriber{Consumer: c, Handler: h, Concurrency: 1, Logger: g.log}).Run(ctx)
		}
		if ctx.Err() != nil {
			break
		}
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound) && !warned:
			g.log.Warn("requests of external NATS clients are not taken: the bus was set up by an earlier Hermes; run hermes provision")
			warned = true
		case err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound):
			g.log.Error("external NATS clients' requests cannot be read; trying again", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(clientsLookAgain):
		}
	}
	return nil
}

// clientsLookAgain is how soon a gateway looks again for the consumer of clients' requests.
var clientsLookAgain = 5 * time.Second

// takeClientRequest submits one client's request; its error decides the message's fate.
func (g *Gateway) takeClientRequest(ctx context.Context, d *bus.Delivery) error {
	user, session, ok := protocol.ClientOfSubject(d.Subject)
	if !ok || protocol.CheckID("NATS user", user) != nil || protocol.CheckID("session_id", session) != nil {
		return bus.Permanent(fmt.Errorf("not a client's request subject: %q", d.Subject))
	}
	m := d.Msg
	if m.Type != protocol.TypeRequest {
		return bus.Permanent(fmt.Errorf("client %s published a %s, not a request", user, m.Type))
	}
	req, err := m.DecodeRequest(g.cfg.Limits)
	if err != nil {
		return bus.Permanent(fmt.Errorf("client %s: %w", user, err))
	}
	if req.Sandbox != nil {
		// Only the gateway's own sandbox makes sandbox requests (their calls skip the input check).
		return bus.Permanent(fmt.Errorf("client %s published a sandbox request; only Hermes makes those", user))
	}
	if req.Session() != session {
		return bus.Permanent(fmt.Errorf("client %s published a request of session %q on the subject of session %q", user, req.Session(), session))
	}
	adm, why := g.store.admit(len(d.Data))
	defer adm.close()
	if why != nil {
		if g.store.never(len(d.Data)) {
			// Waiting would hold every client's requests behind it for nothing.
			return bus.Permanent(fmt.Errorf("client %s: %s", user, *why))
		}
		return bus.RetryAfter(errors.New(*why), clientRetry)
	}
	caller := callerOfClient(user)
	sub := submit.Submission{Request: req, Trace: clientTrace(m.Trace), Size: len(d.Data), Caller: caller, NoWait: true}
	owner, err := g.clientOwners.claim(ctx, session, caller.ID, func(ctx context.Context) (bool, error) { return g.recorded(ctx, session) })
	if err != nil {
		return fmt.Errorf("claim session %s: %w", session, err)
	}
	if owner != caller.ID {
		return bus.Permanent(fmt.Errorf("client %s published into session %s, which is not its own", user, session))
	}
	sub.Owner = owner
	out, err := g.submit.Submit(ctx, sub)
	adm.settle(out, err)
	switch {
	case err == nil:
		d.Log.Info("external client's request accepted", "client", user, "trace_id", out.TraceID)
		return nil
	case errors.Is(err, submit.ErrOverBudget):
		// Dropped, not put off: the clients' requests are taken one at a time, so waiting
		// for this client's budget would hold every other client's behind it.
		d.Log.Warn("external client's request dropped: the client is over its budget", "client", user, "err", err)
		return bus.Permanent(fmt.Errorf("client %s: %w", user, err))
	case errors.Is(err, submit.ErrConflict), errors.Is(err, submit.ErrTooLarge), errors.Is(err, protocol.ErrInvalid):
		return bus.Permanent(fmt.Errorf("client %s: %w", user, err))
	default:
		return err // not connected, the bus not answering: tried again
	}
}

// clientTrace keeps of a client's trace context what a gateway takes from HTTP callers
// (traceOf); a trace id it would refuse is replaced with a new one.
func clientTrace(t protocol.TraceContext) protocol.TraceContext {
	out := protocol.TraceContext{TraceID: t.TraceID}
	if !printableASCII(out.TraceID, 128) {
		var b [16]byte
		_, _ = rand.Read(b[:])
		out.TraceID = hex.EncodeToString(b[:])
	}
	if printableASCII(t.Traceparent, 128) {
		out.Traceparent = t.Traceparent
		if printableASCIIOrSpace(t.Tracestate, 512) {
			out.Tracestate = t.Tracestate
		}
	}
	return out
}
