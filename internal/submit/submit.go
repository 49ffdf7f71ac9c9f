// Package submit is Hermes' one way to hand a request to the bus and await its answer: accept
// its request_id once, publish it, wait for the response within a bound, find it recorded
// later, and cancel it. The HTTP gateway, the command line and the front doors to come are
// thin layers over a Submitter: decode, submit, render.
//
// Guarantees: a request_id is accepted once (its plan, recorded with create in hermes-calls as
// it is accepted, before anything is published); the same request submitted again
// — concurrently, later, from another process — runs nothing twice and gets the first
// response (Outcome.Replayed), or waits for it while it runs; another request under a used id
// gets ErrConflict and is never published. Accepting and publishing run to completion even if
// the caller's context ends, so an accepted request_id is never left without its request on
// the bus. While the NATS connection is down nothing is accepted (ErrNotConnected): a publish
// from a reconnect buffer could be accepted after the caller was told it failed. A response is
// returned only as read from the bus or the record, never guessed. A caller over its budget of
// stored bytes (Config.Budget, kept per Submitter) is refused with a BudgetError before anything
// is accepted.
package submit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/internal/answer"
	"github.com/hermesbus/hermes/internal/fastlane"
	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/internal/park"
	"github.com/hermesbus/hermes/internal/wake"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Errors of Submit, Status and Cancel.
var (
	// ErrNotConnected: the NATS connection is down (it reconnects by itself); nothing was
	// accepted. Try again with the same request_id.
	ErrNotConnected = errors.New("submit: not connected to NATS")
	// ErrUnavailable: the bus did not answer in time; nothing or only part was done. Try again
	// with the same request_id: every step is idempotent.
	ErrUnavailable = errors.New("submit: the bus is not reachable")
	// ErrConflict: the request_id was accepted before for a different request.
	ErrConflict = errors.New("submit: request_id already used for a different request")
	// ErrTooLarge: the request does not fit in one bus message.
	ErrTooLarge = errors.New("submit: request larger than a bus message")
	// ErrNotFound: no request with this id is known (or it is older than the state TTL).
	ErrNotFound = errors.New("submit: no such request")
	// ErrFinished: the request has its response; it can no longer be cancelled.
	ErrFinished = errors.New("submit: the request has finished")
)

// Timing bounds.
const (
	// publishTimeout bounds accepting and publishing one request; within it, the caller's
	// wait does, but never below minAcceptTime.
	publishTimeout = 10 * time.Second
	minAcceptTime  = time.Second
	// lookupTimeout bounds reading a recorded response, when it is announced or once the wait
	// has run out; lookAgain is how soon a read that failed is tried again.
	lookupTimeout = time.Second
	lookAgain     = 200 * time.Millisecond
	// envelopeAllowance is what the envelope may add to a request on the bus.
	envelopeAllowance = 4 << 10
)

// Config configures a Submitter.
type Config struct {
	// Conn is the NATS connection responses are received on; its state says whether the bus
	// is reachable. Required.
	Conn *nats.Conn
	// Bus is the provisioned bus on Conn. Required.
	Bus *bus.Bus
	// Sender names who submits (role gateway or cli, and the instance). Required.
	Sender protocol.Sender
	// Budget bounds the bytes of requests each caller (Submission.Caller's id) may have
	// accepted here; the zero value is none. Requests without a caller, and the contract
	// sandbox's, are not counted.
	Budget Budget
	// Metrics counts requests answered here (cancellations); nil counts into unexported
	// metrics.
	Metrics *metrics.Metrics
	// Fast, when set, asks the routers first to answer each request that may take the fast
	// lane (package fastlane): not serial, not the sandbox's, awaited. What it declines, or
	// does not answer in time, takes the durable path.
	Fast *fastlane.Client
	// Logger; nil discards.
	Logger *slog.Logger
}

// Submitter submits requests and awaits their responses. It is safe for concurrent use;
// responses reach waiting callers only while Run runs.
type Submitter struct {
	cfg     Config
	pub     *bus.Publisher
	answer  *answer.Responder
	log     *slog.Logger
	waiting wake.Waiters
	budget  *budgets // nil: none
}

// New returns a Submitter for cfg.
func New(cfg Config) (*Submitter, error) {
	if cfg.Conn == nil || cfg.Bus == nil || cfg.Sender.Role == "" || cfg.Sender.Instance == "" {
		return nil, errors.New("submit: Config.Conn, Config.Bus and Config.Sender are required")
	}
	s := &Submitter{cfg: cfg, log: cfg.Logger, pub: cfg.Bus.NewPublisher(cfg.Sender), budget: newBudgets(cfg.Budget)}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.answer = answer.New(cfg.Bus, s.pub, park.New(cfg.Bus, s.pub, s.log), cfg.Metrics, s.log)
	return s, nil
}

// Run receives responses from the bus and hands them to waiting callers until ctx is done.
func (s *Submitter) Run(ctx context.Context) error {
	stop, err := s.Listen()
	if err != nil {
		return err
	}
	<-ctx.Done()
	return stop()
}

// Listen starts receiving responses, as Run does, and returns once the subscription is in
// place; stop ends it. Responses are those the record stream announces as it stores them.
func (s *Submitter) Listen() (stop func() error, err error) {
	handle := func(msg *nats.Msg) {
		// An announcement only wakes those waiting for its request, who then read the
		// response their request has on the record, in their own session: never the
		// announcement's bytes, which anyone able to publish on its subject could forge.
		if requestID, ok := protocol.LiveResponseRequest(msg.Subject); ok {
			s.waiting.Wake(requestID)
		}
	}
	sub, err := s.cfg.Conn.Subscribe(protocol.FilterLiveResponses, handle)
	if err != nil {
		return nil, fmt.Errorf("submit: subscribe to responses: %w", err)
	}
	_ = sub.SetPendingLimits(1<<20, 1<<30)
	stop = sub.Unsubscribe
	// In place once the server has them: a response announced after Listen returns is seen.
	if err := s.cfg.Conn.Flush(); err != nil {
		_ = stop()
		return nil, fmt.Errorf("submit: subscribe to responses: %w", err)
	}
	return stop, nil
}

// Connected reports whether the NATS connection is up.
func (s *Submitter) Connected() bool { return s.cfg.Conn.IsConnected() }

// Submission is one request to submit.
type Submission struct {
	// Request is the validated request.
	Request *protocol.Request
	// Trace is the caller's trace context; its TraceID is the request's correlation id.
	Trace protocol.TraceContext
	// Wait bounds how long Submit waits for the response; the request keeps running after.
	// At least a second is given to accepting and publishing, whatever Wait says.
	Wait time.Duration
	// Size is the request's encoded size as received, checked against the bus message limit
	// (0: not checked here).
	Size int
	// Caller, when set, is who made the request, recorded in its envelope (and every message
	// that follows it).
	Caller *protocol.Caller
	// Owner, when set, names who the request's session belongs to (bus.HeaderOwner).
	Owner string
	// NoWait returns as soon as the request is published (Outcome.Pending), for submitters
	// nobody waits on; accepting and publishing then get the whole publish timeout.
	NoWait bool
}

// Outcome is what came of a submission.
type Outcome struct {
	// Response is the request's response; nil when Pending.
	Response *protocol.Response
	// Pending: no response within the wait; the request keeps running (Status finds it).
	Pending bool
	// Replayed: the request_id was accepted before, and this is the first run's response.
	Replayed bool
	// TraceID is the correlation id the request runs under: the submission's, or the first
	// submission's when this one joined a request accepted before and still running.
	TraceID string
}

// Submit accepts sub's request (once per request_id), publishes it and waits for its response
// until sub.Wait runs out (Outcome.Pending) or ctx ends (ctx's error; the request keeps
// running). It returns ErrNotConnected, ErrUnavailable, ErrConflict, ErrTooLarge or a
// BudgetError (ErrOverBudget) when nothing new runs.
//
// A request with a caller is counted against the caller's budget (Config.Budget) before it is
// accepted, and given back unless it was published (refused, failed, or answered from the
// record).
func (s *Submitter) Submit(ctx context.Context, sub Submission) (*Outcome, error) {
	req := sub.Request
	if req == nil {
		return nil, errors.New("submit: no request")
	}
	if limit := s.cfg.Bus.MaxMessageBytes() - envelopeAllowance; sub.Size > limit {
		return nil, fmt.Errorf("%w: the request is %d bytes; the bus carries at most %d in one message", ErrTooLarge, sub.Size, limit)
	}
	log := s.log.With("request_id", req.RequestID, "session_id", req.Session(), "msg_id", protocol.MsgIDRequest(req.RequestID), "trace_id", sub.Trace.TraceID)
	if !s.Connected() {
		log.Debug("request refused: not connected to NATS")
		return nil, ErrNotConnected
	}
	published := false
	if sub.Caller != nil && req.Sandbox == nil {
		refund, err := s.budget.take(sub.Caller.ID, requestCost(sub))
		if err != nil {
			log.Info("request refused: the caller is over its budget", "caller", sub.Caller.ID, "err", err)
			return nil, err
		}
		defer func() {
			if !published {
				refund()
			}
		}()
	}
	out := &Outcome{TraceID: sub.Trace.TraceID}
	// The whole submission ends within the caller's wait (at least minAcceptTime for
	// accepting) plus lookupTimeout: a bus that stops answering (a leader stepping down, a
	// node without quorum) must not hold the caller past its own wait. Accepting and
	// publishing go on even if the caller leaves.
	deadline := time.Now().Add(sub.Wait)
	accept := min(max(sub.Wait, minAcceptTime), publishTimeout)
	if sub.NoWait {
		accept = publishTimeout
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), accept)
	defer cancel()
	wake, done := s.waiting.Add(req.RequestID)
	defer done()
	m, err := protocol.NewMessage(protocol.TypeRequest, req)
	if err != nil {
		return nil, err
	}
	m.MsgID, m.RequestID, m.SessionID, m.Trace = protocol.MsgIDRequest(req.RequestID), req.RequestID, req.Session(), sub.Trace
	m.Recipient, m.Caller = protocol.RoleRouter, sub.Caller
	if err := m.Validate(); err != nil {
		// What the router would refuse is refused here, before anything is kept.
		return nil, fmt.Errorf("submit: %w", err)
	}
	uncertain := false // asked on the fast lane, no answer: a router may have taken it
	if fast := s.cfg.Fast; fast.Enabled() && !req.Serial && req.Sandbox == nil && !sub.NoWait {
		a := s.askFast(ctx, m, sub, log)
		switch a.Outcome {
		case protocol.FastConflict:
			return nil, fmt.Errorf("%w: request_id %s was already used for a different request; use a new request_id", ErrConflict, req.RequestID)
		case protocol.FastReplayed:
			out.Response, out.Replayed = a.Response, true
			return out, nil
		case protocol.FastAnswered:
			published = true // recorded by the router that answered it
			out.Response = a.Response
			return out, nil
		case protocol.FastDurable:
			// A router took it and put it on the durable path (or it runs already): its
			// response comes as any durable request's.
			published = true
			cancel()
			return s.await(ctx, req, deadline, out, wake, log)
		case "":
			uncertain = true
		}
	}
	// Accepting is recording the request's plan: its calls, session and fingerprint, written
	// once per request_id. The same request again finds it and joins the first run; another
	// request under the id is refused before anything reaches the bus.
	plan := bus.PlanOf(m, req, time.Now())
	plan.AtIntake = true
	created, first, err := s.cfg.Bus.CreatePlan(actx, req.RequestID, plan)
	switch {
	case bus.IsPermanent(err):
		// What is kept under the id is no plan (damaged): no retry reads it better.
		log.Error("record the plan", "err", err)
		return nil, fmt.Errorf("%w: request_id %s: what the record keeps under it is not a plan; use a new request_id", ErrConflict, req.RequestID)
	case err != nil:
		log.Error("record the plan", "err", err)
		return nil, fmt.Errorf("%w: record the plan: %v", ErrUnavailable, err)
	}
	if !created {
		if first.Fingerprint != "" && first.Fingerprint != plan.Fingerprint {
			return nil, fmt.Errorf("%w: request_id %s was already used for a different request; use a new request_id", ErrConflict, req.RequestID)
		}
		if resp, ok := s.recorded(actx, req.RequestID, first.SessionID); ok {
			out.Response, out.Replayed = resp, true
			return out, nil
		}
		if uncertain && first.Fast && time.Since(first.AcceptedAt) < fastlane.Ownership {
			// A router took it on the fast lane a moment ago and did not answer in time: it
			// answers it yet, or puts it on the durable path itself. Publishing it here would
			// run it twice.
			published = true
			cancel()
			return s.await(ctx, req, deadline, out, wake, log)
		}
		// Accepted before but not answered yet (or the first submitter died before
		// publishing): publishing again is safe, the stream and the router deduplicate it.
		if first.Trace.TraceID != "" {
			m.Trace.TraceID, out.TraceID = first.Trace.TraceID, first.Trace.TraceID
		}
	}
	// Published only once the plan is recorded (or known to be this same request's): a
	// different request under a used id must never reach the bus. The first publication says
	// its plan is recorded, so the router taking it need not record or read it.
	var hdr nats.Header
	if created {
		hdr = nats.Header{bus.HeaderPlanned: []string{"1"}}
	}
	if sub.Owner != "" {
		if hdr == nil {
			hdr = nats.Header{}
		}
		hdr.Set(bus.HeaderOwner, sub.Owner)
	}
	if _, err := s.pub.PublishWith(actx, protocol.SubjectRequest(req.Session()), m, hdr); err != nil {
		log.Error("publish request", "err", err)
		return nil, fmt.Errorf("%w: publish: %v", ErrUnavailable, err)
	}
	published = true
	log.Debug("request published")
	cancel()
	if sub.NoWait {
		out.Pending = true
		return out, nil
	}
	return s.await(ctx, req, deadline, out, wake, log)
}

// await waits for the response of req, announced (wake) or on the record, until deadline
// (out.Pending) or ctx ends.
func (s *Submitter) await(ctx context.Context, req *protocol.Request, deadline time.Time, out *Outcome, wake <-chan struct{}, log *slog.Logger) (*Outcome, error) {
	timer := time.NewTimer(max(time.Until(deadline), 0))
	defer timer.Stop()
	var again <-chan time.Time // a look that failed is tried again
	warned, fails := false, 0
	look := func() bool {
		lctx, lcancel := context.WithTimeout(context.WithoutCancel(ctx), lookupTimeout)
		defer lcancel()
		resp, err := s.cfg.Bus.AnnouncedResponse(lctx, req.RequestID, req.Session())
		switch {
		case err == nil:
			out.Response = resp
			return true
		case errors.Is(err, bus.ErrNotFound):
			// Announced, yet not on the record under this request in its session: not its
			// response (forged, or another session's). Wait on.
			if !warned {
				warned = true
				log.Warn("a response was announced that the record does not hold for this request; ignored")
			}
		default:
			if fails++; fails == 1 {
				log.Warn("could not read the announced response; looking again", "err", err)
			}
			again = time.After(min(lookAgain<<min(fails-1, 4), 2*time.Second))
		}
		return false
	}
	for {
		select {
		case <-wake:
			if look() {
				return out, nil
			}
		case <-again:
			again = nil
			if look() {
				return out, nil
			}
		case <-timer.C:
			// The response may have been recorded while this process missed the bus message.
			// While the connection is down the record cannot be read: asking would hold the
			// caller until the lookup times out.
			if s.Connected() {
				lctx, lcancel := context.WithTimeout(context.WithoutCancel(ctx), lookupTimeout)
				resp, ok := s.recorded(lctx, req.RequestID, req.Session())
				lcancel()
				if ok {
					out.Response = resp
					return out, nil
				}
			}
			out.Pending = true
			return out, nil
		case <-ctx.Done():
			return nil, ctx.Err() // the caller left; the request keeps running
		}
	}
}

// askFast asks the routers to answer m on the fast lane. Asking is part of accepting: it runs
// its course (fastlane.Client's wait) whatever the caller's wait or context, so that a router
// that took the request is heard. An empty outcome is no answer at all.
func (s *Submitter) askFast(ctx context.Context, m *protocol.Message, sub Submission, log *slog.Logger) fastlane.Answer {
	m.Sender = s.pub.Sender()
	data, err := protocol.Marshal(m)
	if err != nil {
		return fastlane.Answer{Outcome: protocol.FastDeclined}
	}
	var hdr nats.Header
	if sub.Owner != "" {
		hdr = nats.Header{bus.HeaderOwner: []string{sub.Owner}}
	}
	a := s.cfg.Fast.Ask(context.WithoutCancel(ctx), m, data, hdr)
	if a.Outcome == protocol.FastDeclined {
		log.Debug("the fast lane declined the request; the durable path takes it")
	}
	return a
}

// recorded returns the response recorded for requestID (of session, when known), if any.
func (s *Submitter) recorded(ctx context.Context, requestID, session string) (*protocol.Response, bool) {
	_, resp, err := s.cfg.Bus.Response(ctx, requestID, session)
	if err != nil {
		if !errors.Is(err, bus.ErrNotFound) {
			s.log.Error("recorded response unreadable", "request_id", requestID, "err", err)
		}
		return nil, false
	}
	return resp, true
}

// Status returns requestID's response once it has one; pending is true while it runs. It
// returns ErrNotFound for a request it does not know, ErrNotConnected or ErrUnavailable when it
// cannot tell.
func (s *Submitter) Status(ctx context.Context, requestID string) (resp *protocol.Response, pending bool, err error) {
	if !s.Connected() {
		return nil, false, ErrNotConnected
	}
	_, resp, err = s.cfg.Bus.Response(ctx, requestID, "")
	if err == nil {
		return resp, false, nil
	}
	if !errors.Is(err, bus.ErrNotFound) {
		return nil, false, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	_, perr := s.cfg.Bus.Plan(ctx, requestID)
	if perr == nil {
		return nil, true, nil
	}
	if !errors.Is(perr, bus.ErrNotFound) {
		return nil, false, fmt.Errorf("%w: %v", ErrUnavailable, perr)
	}
	return nil, false, fmt.Errorf("%w: no request %s is known (or it is older than the record)", ErrNotFound, requestID)
}

// Session returns the session of request requestID, from its plan: ErrNotFound when no plan
// of it is kept (unknown, older than the record, or accepted before plans were kept at intake).
func (s *Submitter) Session(ctx context.Context, requestID string) (string, error) {
	p, err := s.cfg.Bus.Plan(ctx, requestID)
	switch {
	case err == nil:
		return p.SessionID, nil
	case errors.Is(err, bus.ErrNotFound):
		return "", fmt.Errorf("%w: no request %s is known", ErrNotFound, requestID)
	}
	return "", fmt.Errorf("%w: %v", ErrUnavailable, err)
}
