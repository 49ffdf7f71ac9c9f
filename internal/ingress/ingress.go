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
	"mime"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/deadletter"
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
// for it (clients read it through a gateway). A request is the envelope Hermes' services write
// (msgpack), or JSON with the HTTP API's field names when its Content-Type header says
// application/json. What can never be submitted (not a request, malformed, a session not the
// subject's, one owned by another caller, a request_id used for another request) is kept as a
// dead letter naming the problem (hermes dlq ls), and nothing of it reaches the record. While
// the store is near full, requests wait. If the consumer cannot be read, it is looked for again.
func (g *Ingress) Run(ctx context.Context) error {
	if g.Logger == nil {
		g.Logger = slog.New(slog.DiscardHandler)
	}
	h := bus.Chain(bus.HandlerFunc(g.take), bus.Recover(), g.deadLetter(), decode(), bus.Log(g.Logger), bus.Trace("client request", trace.SpanKindConsumer))
	service.Consume(ctx, g.Logger, "requests of external NATS clients", g.Bus.ClientConsumer, func(ctx context.Context, c jetstream.Consumer) error {
		return (&bus.Subscriber{Consumer: c, Handler: h, Concurrency: 1, Logger: g.Logger}).Run(ctx)
	})
	return nil
}

// contentType is the media type a client's message says it is written in ("" for none).
func contentType(h nats.Header) (string, error) {
	v := h.Get(bus.HeaderContentType)
	if v == "" {
		return "", nil
	}
	mt, _, err := mime.ParseMediaType(v)
	if err != nil || (mt != protocol.ContentTypeJSON && mt != protocol.ContentTypeMsgpack) {
		return "", fmt.Errorf("Content-Type %q: a client's request is %s or %s", protocol.Shorten(v, 64), protocol.ContentTypeJSON, protocol.ContentTypeMsgpack)
	}
	return mt, nil
}

// decode decodes the envelope of a msgpack request (bus.Decode); a JSON one is read by take.
func decode() bus.Middleware {
	msgpack := bus.Decode()
	return func(next bus.Handler) bus.Handler {
		viaEnvelope := msgpack(next)
		return bus.HandlerFunc(func(ctx context.Context, d *bus.Delivery) error {
			ct, err := contentType(d.Header)
			switch {
			case err != nil:
				return bus.Permanent(err)
			case ct == protocol.ContentTypeJSON:
				return next.Handle(ctx, d)
			}
			return viaEnvelope.Handle(ctx, d)
		})
	}
}

// Bounds of the dead letters of clients' requests: a client decides what it publishes, and
// the dead letters are every consumer's (a router's, which operators re-drive, among them).
const (
	// maxLetterData is how much of a request its dead letter keeps (the rest is counted).
	maxLetterData = 16 << 10
	// lettersPerClient is how many dead letters one client's requests make a minute in one
	// gateway; past it, what it publishes and can never be submitted is only logged.
	lettersPerClient = 60
)

// letters counts each client's dead letters in the current minute.
type letters struct {
	mu     sync.Mutex
	minute time.Time
	n      map[string]int
}

// take reports whether client may have one more dead letter now.
func (l *letters) take(client string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if m := now.Truncate(time.Minute); !m.Equal(l.minute) || l.n == nil {
		l.minute, l.n = m, map[string]int{}
	}
	if l.n[client] >= lettersPerClient {
		return false
	}
	l.n[client]++
	return true
}

// deadLetter keeps what a client published and can never be submitted as a dead letter, with
// why (hermes dlq ls), before it is dropped: its first 16 KiB, and at most lettersPerClient a
// minute of one client (past that it is logged only). Should the letter not be written, the
// request is tried again.
func (g *Ingress) deadLetter() bus.Middleware {
	var counts letters
	return func(next bus.Handler) bus.Handler {
		return bus.HandlerFunc(func(ctx context.Context, d *bus.Delivery) error {
			err := next.Handle(ctx, d)
			if !bus.IsPermanent(err) {
				return err
			}
			user, _, _ := protocol.ClientOfSubject(d.Subject)
			if !counts.take(user, time.Now()) {
				g.Logger.Warn("external client's request dropped without a dead letter: the client has had its share this minute",
					"client", protocol.Shorten(user, 64), "err", err)
				return err
			}
			data := d.Data
			if len(data) > maxLetterData {
				data = data[:maxLetterData]
			}
			letter := deadletter.Message(protocol.ClientStreamName, bus.ConsumerClients, d.Subject, d.StreamSeq, d.NumDelivered, protocol.Shorten(err.Error(), 1024), data, d.Header)
			if len(data) < len(d.Data) {
				letter.Header.Set(deadletter.HeaderSize, strconv.Itoa(len(d.Data)))
			}
			if _, perr := g.Bus.JS.PublishMsg(ctx, letter); perr != nil {
				return fmt.Errorf("ingress: keep the dead letter (%v): %w", err, perr)
			}
			return err
		})
	}
}

// take submits one client's request; its error decides the message's fate.
func (g *Ingress) take(ctx context.Context, d *bus.Delivery) error {
	user, session, ok := protocol.ClientOfSubject(d.Subject)
	if !ok || protocol.CheckID("NATS user", user) != nil || protocol.CheckID("session_id", session) != nil {
		return bus.Permanent(fmt.Errorf("not a client's request subject: %q", d.Subject))
	}
	var req *protocol.Request
	var tc protocol.TraceContext
	if m := d.Msg; m != nil {
		if m.Type != protocol.TypeRequest {
			return bus.Permanent(fmt.Errorf("client %s published a %s, not a request", user, m.Type))
		}
		r, err := m.DecodeRequest(g.Limits)
		if err != nil {
			return bus.Permanent(fmt.Errorf("client %s: %w", user, err))
		}
		req, tc = r, m.Trace
	} else {
		// JSON, as the HTTP API takes it; its trace context in the headers.
		r, err := protocol.DecodeRequestJSON(d.Data, g.Limits)
		if err != nil {
			return bus.Permanent(fmt.Errorf("client %s: %w", user, err))
		}
		req = r
		tc = protocol.TraceContext{TraceID: d.Header.Get(bus.HeaderTraceID), Traceparent: d.Header.Get(bus.HeaderTraceparent), Tracestate: d.Header.Get(bus.HeaderTracestate)}
	}
	if err := clientMay(user, req); err != nil {
		return bus.Permanent(err)
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
	sub := submit.Submission{Request: req, Trace: clientTrace(tc), Size: len(d.Data), Caller: t.Caller, Owner: t.Owner, NoWait: true}
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

// clientMay refuses a request of client user that only Hermes itself makes.
func clientMay(user string, req *protocol.Request) error {
	switch {
	case req.Sandbox != nil:
		// Only the gateway's own sandbox makes sandbox requests (their calls skip the input check).
		return fmt.Errorf("client %s published a sandbox request; only Hermes makes those", user)
	case req.Run != "":
		// A blueprint's step runs in the request its run makes.
		return fmt.Errorf("client %s published a request naming a blueprint run; only Hermes makes those", user)
	case req.Approval != "" || req.Recall:
		// An approved call runs in the request Hermes makes when it is approved.
		return fmt.Errorf("client %s published a request naming an approval; only Hermes makes those", user)
	}
	return nil
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
