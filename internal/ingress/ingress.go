// Package ingress is the bus's front door for external NATS clients: the requests they publish
// (protocol.SubjectClientRequest), which wait in a stream of their own shared by every gateway
// through one consumer, are admitted (package admission) as the NATS user the subject names
// and submitted like any other.
package ingress

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/httpapi"
	"github.com/hermesbus/hermes/internal/service"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Submitter submits a request (submit.Submitter).
type Submitter interface {
	Submit(ctx context.Context, sub submit.Submission) (*submit.Outcome, error)
}

// Admitter admits a request (admission.Admitter).
type Admitter interface {
	Admit(ctx context.Context, ask admission.Ask) (*admission.Ticket, error)
}

// Ingress takes external NATS clients' requests.
type Ingress struct {
	Bus    *bus.Bus
	Submit Submitter
	Admit  Admitter
	// Limits bound each request; zero fields take protocol.DefaultLimits.
	Limits protocol.Limits
	Logger *slog.Logger
}

// Name names the service.
func (g *Ingress) Name() string { return "bus ingress (external NATS clients' requests)" }

// Validate says what the ingress lacks to run.
func (g *Ingress) Validate() error {
	if g.Bus == nil || g.Submit == nil || g.Admit == nil {
		return errors.New("ingress: Bus, Submit and Admit are required")
	}
	return nil
}

// Run submits the requests external NATS clients publish
// (protocol.SubjectClientRequest), which wait in a stream of their own, shared with every other
// gateway through their consumer, one at a time, until ctx is done. Each is submitted as the
// NATS user the subject names — whatever caller the message itself claims — into a session
// that user owns; it is accepted once per request_id like any other, and its answer is recorded
// for it (clients read it through a gateway). What can never be submitted (not a request, a
// session not the subject's, one owned by another caller, a request_id used for another
// request) is dropped and logged: nothing of it reaches the record. While the store is near
// full, requests wait. If the consumer cannot be read, it is looked for again.
func (g *Ingress) Run(ctx context.Context) error {
	if g.Logger == nil {
		g.Logger = slog.New(slog.DiscardHandler)
	}
	h := bus.Messages(bus.HandlerFunc(g.take), g.Logger, "client request")
	service.Consume(ctx, g.Logger, "requests of external NATS clients", g.Bus.ClientConsumer, func(ctx context.Context, c jetstream.Consumer) error {
		return (&bus.Subscriber{Consumer: c, Handler: h, Concurrency: 1, Logger: g.Logger}).Run(ctx)
	})
	return nil
}

// take submits one client's request; its error decides the message's fate.
func (g *Ingress) take(ctx context.Context, d *bus.Delivery) error {
	user, session, ok := protocol.ClientOfSubject(d.Subject)
	if !ok || protocol.CheckID("NATS user", user) != nil || protocol.CheckID("session_id", session) != nil {
		return bus.Permanent(fmt.Errorf("not a client's request subject: %q", d.Subject))
	}
	m := d.Msg
	if m.Type != protocol.TypeRequest {
		return bus.Permanent(fmt.Errorf("client %s published a %s, not a request", user, m.Type))
	}
	req, err := m.DecodeRequest(g.Limits)
	if err != nil {
		return bus.Permanent(fmt.Errorf("client %s: %w", user, err))
	}
	if req.Sandbox != nil {
		// Only the gateway's own sandbox makes sandbox requests (their calls skip the input check).
		return bus.Permanent(fmt.Errorf("client %s published a sandbox request; only Hermes makes those", user))
	}
	if req.Run != "" {
		// A blueprint's step runs in the request its run makes.
		return bus.Permanent(fmt.Errorf("client %s published a request naming a blueprint run; only Hermes makes those", user))
	}
	if req.Approval != "" || req.Recall {
		// An approved call runs in the request Hermes makes when it is approved.
		return bus.Permanent(fmt.Errorf("client %s published a request naming an approval; only Hermes makes those", user))
	}
	if req.Session() != session {
		return bus.Permanent(fmt.Errorf("client %s published a request of session %q on the subject of session %q", user, req.Session(), session))
	}
	t, err := g.Admit.Admit(ctx, admission.Ask{Actor: admission.ClientActor(user), Session: session, Size: len(d.Data)})
	refused := admission.AsRefusal(err)
	switch {
	case err == nil:
	case refused == nil || refused.Code == protocol.CodeBusUnavailable:
		return fmt.Errorf("client %s: admit: %w", user, err) // the bus not answering: tried again
	case refused.Code == protocol.CodeStoreFull && !refused.Never:
		return bus.RetryAfter(refused, refused.RetryAfter)
	case refused.Code == protocol.CodeNotFound:
		return bus.Permanent(fmt.Errorf("client %s published into session %s, which is not its own", user, session))
	default:
		// Waiting would hold every client's requests behind it for nothing.
		return bus.Permanent(fmt.Errorf("client %s: %w", user, refused))
	}
	defer t.Close()
	sub := submit.Submission{Request: req, Trace: clientTrace(m.Trace), Size: len(d.Data), Caller: t.Caller, Owner: t.Owner, NoWait: true}
	out, err := g.Submit.Submit(ctx, sub)
	t.Accepted(err == nil && !out.Replayed)
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
// (httpapi.TraceOf); a trace id it would refuse is replaced with a new one.
func clientTrace(t protocol.TraceContext) protocol.TraceContext {
	out := protocol.TraceContext{TraceID: t.TraceID}
	if !httpapi.PrintableASCII(out.TraceID, 128) {
		var b [16]byte
		_, _ = rand.Read(b[:])
		out.TraceID = hex.EncodeToString(b[:])
	}
	if httpapi.PrintableASCII(t.Traceparent, 128) {
		out.Traceparent = t.Traceparent
		if httpapi.PrintableASCIIOrSpace(t.Tracestate, 512) {
			out.Tracestate = t.Tracestate
		}
	}
	return out
}
