package ingress

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Version is the version of the micro service's API (semantic: a change that breaks a client
// raises its major).
const Version = "1.0.0"

// HeaderWait, on a call of the request endpoint, says how long to wait for the response (a Go
// duration: "90s"; default Service.Wait, at most Service.MaxWait).
const HeaderWait = "Hermes-Wait"

// Service is the NATS micro service "hermes" that external clients call with request/reply,
// in JSON, from any language: its endpoint request (protocol.SubjectClientService(user,
// "request")) takes a HermesRequest with the HTTP API's field names, submits it as the NATS user
// the subject names — admitted, recorded and crash-safe as any other: asked again with the same
// request_id it is answered from the record — and replies with the HermesResponse once the
// request is done. Every gateway serves it, in one queue group, and says so to discovery (nats
// micro ls, info, stats).
//
// Every error is a reply whose body is {"error": {"code", "message", "field"?}} with the micro
// error headers (Nats-Service-Error-Code: an HTTP status; Nats-Service-Error: the message), so
// stats count it: a request that is not JSON, over MaxBytes, with unknown fields or ids no subject
// may hold, into another caller's session, or one the caller is over its budget for. A response
// that has not come within the wait is a 504 TIMEOUT naming the request_id: the request keeps
// running, and asking again with the same request_id waits for it again.
type Service struct {
	Conn   *nats.Conn
	Submit Submitter
	Admit  Admitter
	// Reader, when set, serves the endpoint response: a request's response read by its
	// request_id, for a client that published it into the stream (fire and forget).
	Reader Reader
	// Record, when set, serves the endpoint follow: a session's messages sent to the client.
	Record jetstream.JetStream
	// Limits bound each request; zero fields take protocol.DefaultLimits.
	Limits protocol.Limits
	// Wait is how long a call waits for its response unless it says (default 30 s); MaxWait
	// bounds what it may say (default 5 min, and under bus.ClientReplyWithin).
	Wait, MaxWait time.Duration
	// MaxBytes bounds a request (default 1 MiB, as the clients' stream).
	MaxBytes int
	// MaxInFlight bounds the calls served at once by this process (default 256); over it a
	// call is refused 503 at once. MaxPerClient bounds those of one client (default 16); over
	// it, 429.
	MaxInFlight, MaxPerClient int
	// Grace is how long a stopping service lets the calls it holds wait for their responses
	// (default 10 s); then each is answered 503, to ask again (its request keeps running).
	Grace time.Duration
	// Instance names this process in the service's metadata.
	Instance string
	Logger   *slog.Logger

	wg        sync.WaitGroup
	slots     chan struct{}
	mu        sync.Mutex
	stopped   bool            // no call is taken once set
	perClient map[string]int  // calls held, by client
	stopping  context.Context // ends when the service stops: the follows with it
	// What happens after admission, which micro's own stats do not see (they count a call
	// when it is handed on): calls waiting now, answered with a response, refused after
	// admission (a timeout included), and the time spent waiting for responses.
	inFlight, answered, failed, waited atomic.Int64
}

// serving is what the service adds to micro's stats (nats micro stats hermes: "data").
type serving struct {
	InFlight int64 `json:"in_flight"`
	Answered int64 `json:"answered"`
	// Failed were refused after they were admitted: over budget, a request_id conflict, no
	// response within the wait, the bus unreachable.
	Failed int64 `json:"failed_after_admission"`
	// AverageWait is the mean time from admission to the reply, in nanoseconds.
	AverageWait int64 `json:"average_wait"`
}

func (s *Service) stats(*micro.Endpoint) any {
	out := serving{InFlight: s.inFlight.Load(), Answered: s.answered.Load(), Failed: s.failed.Load()}
	if n := out.Answered + out.Failed; n > 0 {
		out.AverageWait = s.waited.Load() / n
	}
	return out
}

// Reader reads requests' sessions, their owners and their responses (the gateway's submitter
// and admitter).
type Reader interface {
	Session(ctx context.Context, requestID string) (string, error)
	Status(ctx context.Context, requestID string) (*protocol.Response, bool, error)
	MayRead(ctx context.Context, a admission.Actor, session string) (bool, error)
}

// Name names the service.
func (s *Service) Name() string { return "micro service hermes (external clients' request/reply)" }

// Validate says what the service lacks to run.
func (s *Service) Validate() error {
	if s.Conn == nil || s.Submit == nil || s.Admit == nil {
		return errors.New("ingress: Conn, Submit and Admit are required")
	}
	return nil
}

func (s *Service) defaults() {
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	if s.Wait <= 0 {
		s.Wait = 30 * time.Second
	}
	if limit := bus.ClientReplyWithin - 30*time.Second; s.MaxWait <= 0 || s.MaxWait > limit {
		s.MaxWait = min(5*time.Minute, limit)
	}
	s.Wait = min(s.Wait, s.MaxWait)
	if s.MaxBytes <= 0 {
		s.MaxBytes = 1 << 20
	}
	if s.MaxInFlight <= 0 {
		s.MaxInFlight = 256
	}
	if s.MaxPerClient <= 0 {
		s.MaxPerClient = 16
	}
	if s.Grace <= 0 {
		s.Grace = 10 * time.Second
	}
	s.perClient = map[string]int{}
	s.slots = make(chan struct{}, s.MaxInFlight)
}

// Run serves the service until ctx ends; then it takes no new call, and the calls it holds are
// answered (each within its wait) before it returns.
func (s *Service) Run(ctx context.Context) error {
	s.defaults()
	svc, err := micro.AddService(s.Conn, micro.Config{
		Name:         protocol.ServiceName,
		Version:      Version,
		Description:  "Hermes, a message bus for AI agents: submit a request of tool calls, get its response (JSON)",
		QueueGroup:   protocol.ServiceName,
		Metadata:     map[string]string{"instance": s.Instance},
		StatsHandler: s.stats,
	})
	if err != nil {
		return fmt.Errorf("ingress: the micro service: %w", err)
	}
	// served is a context of its own: a call taken is answered while the service stops, for
	// Grace; then it is ended.
	served, endServed := context.WithCancel(context.WithoutCancel(ctx))
	defer endServed()
	s.stopping = ctx
	type endpoint struct {
		name, description string
		serve             func(context.Context, micro.Request)
	}
	endpoints := []endpoint{
		{protocol.EndpointRequest, "submit a HermesRequest (the HTTP API's JSON) as the NATS user the subject names; replies with its HermesResponse", s.take},
	}
	if s.Reader != nil {
		endpoints = append(endpoints, endpoint{protocol.EndpointResponse, `the response of one of your requests, by its request_id ({"request_id": …}): the response, or {"request_id", "status": "pending"}`, s.response})
	}
	if s.Record != nil {
		endpoints = append(endpoints, endpoint{protocol.EndpointFollow, `follow one of your sessions ({"session_id": …, "for": "5m", "after": 0}): its messages are sent as JSON to the subject it answers`, s.follow})
	}
	for _, e := range endpoints {
		serve := e.serve
		err := svc.AddEndpoint(e.name, micro.HandlerFunc(func(r micro.Request) { serve(served, r) }),
			micro.WithEndpointSubject(protocol.SubjectClientService("*", e.name)),
			micro.WithEndpointMetadata(map[string]string{"description": e.description, "content_type": protocol.ContentTypeJSON,
				"subject": protocol.SubjectClientService("<your NATS user>", e.name)}))
		if err != nil {
			_ = svc.Stop()
			return fmt.Errorf("ingress: the micro service's endpoint %s: %w", e.name, err)
		}
	}
	s.Logger.Info("micro service serving", "name", protocol.ServiceName, "id", svc.Info().ID, "subject", protocol.FilterClientServices)
	<-ctx.Done()
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	err = svc.Stop()
	held := make(chan struct{})
	go func() { s.wg.Wait(); close(held) }()
	select {
	case <-held:
	case <-time.After(s.Grace):
		endServed()
		<-held
	}
	return err
}

// hold notes one more call being handled, unless the service stops.
func (s *Service) hold() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return false
	}
	s.wg.Add(1)
	return true
}

// holdClient notes one more call of client held, unless it holds MaxPerClient.
func (s *Service) holdClient(client string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.perClient[client] >= s.MaxPerClient {
		return false
	}
	s.perClient[client]++
	return true
}

func (s *Service) releaseClient(client string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.perClient[client]--; s.perClient[client] <= 0 {
		delete(s.perClient, client)
	}
}

// take checks and admits one call where micro delivers it (so its stats count what is refused
// then), and submits it and waits for its response beside the others; it refuses the call when
// MaxInFlight are served.
func (s *Service) take(ctx context.Context, r micro.Request) {
	if r.Reply() == "" {
		return // nobody would hear the answer: nothing is submitted
	}
	release, ok := s.place(r)
	if !ok {
		return
	}
	c, ok := s.admit(ctx, r)
	if !ok {
		release()
		return
	}
	s.inFlight.Add(1)
	go func() {
		defer func() { s.releaseClient(c.user); s.inFlight.Add(-1); release() }()
		s.serve(ctx, r.Reply(), c)
	}()
}

// place takes one of the service's places for a call or a follow — one of MaxInFlight, held
// until release, which Run waits for when it stops — or refuses r, the service stopping or full.
func (s *Service) place(r micro.Request) (release func(), ok bool) {
	if !s.hold() {
		s.refuse(r, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "", "this gateway is stopping; ask again")
		return nil, false
	}
	select {
	case s.slots <- struct{}{}:
	default:
		s.wg.Done()
		s.refuse(r, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "", fmt.Sprintf("this gateway serves %d calls and follows now; try again shortly", s.MaxInFlight))
		return nil, false
	}
	return func() { <-s.slots; s.wg.Done() }, true
}

// admitClient admits ask of client user, within its MaxPerClient, or refuses r saying why; the
// ticket's holder releases the client (releaseClient) once done.
func (s *Service) admitClient(ctx context.Context, r micro.Request, user string, ask admission.Ask) (*admission.Ticket, bool) {
	if !s.holdClient(user) {
		s.refuse(r, http.StatusTooManyRequests, protocol.CodeRateLimited, "", fmt.Sprintf("you have %d calls and follows at this gateway; ask again once one ends", s.MaxPerClient))
		return nil, false
	}
	ask.Actor = admission.ClientActor(user)
	t, err := s.Admit.Admit(ctx, ask)
	if err == nil {
		return t, true
	}
	s.releaseClient(user)
	if refused := admission.AsRefusal(err); refused != nil {
		s.refuse(r, refused.Status, refused.Code, refused.Field, refused.Message)
		return nil, false
	}
	s.Logger.Warn("admit", "client", user, "err", err)
	s.refuse(r, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "", "the bus is not reachable; ask again")
	return nil, false
}

// call is an admitted call, waiting to be submitted.
type call struct {
	user    string
	headers micro.Headers
	size    int
	req     *protocol.Request
	t       *admission.Ticket
	wait    time.Duration
	log     *slog.Logger
}

// admit checks a call and admits its request, or refuses it.
func (s *Service) admit(ctx context.Context, r micro.Request) (*call, bool) {
	user, ok := s.client(r)
	if !ok {
		return nil, false
	}
	log := s.Logger.With("client", user)
	if len(r.Data()) > s.MaxBytes {
		s.refuse(r, http.StatusRequestEntityTooLarge, protocol.CodeBodyTooLarge, "", fmt.Sprintf("the request is %d bytes; at most %d", len(r.Data()), s.MaxBytes))
		return nil, false
	}
	wait := s.Wait
	if v := r.Headers().Get(HeaderWait); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > s.MaxWait {
			s.refuse(r, http.StatusBadRequest, protocol.CodeInvalidRequest, HeaderWait, fmt.Sprintf("%s: %q is not a wait from 1ms to %s (a Go duration: 90s)", HeaderWait, protocol.Shorten(v, 32), s.MaxWait))
			return nil, false
		}
		wait = d
	}
	req, err := protocol.DecodeRequestJSON(r.Data(), s.Limits)
	if err != nil {
		var fe *protocol.FieldError
		field := ""
		if errors.As(err, &fe) {
			field = fe.Field
		}
		s.refuse(r, http.StatusBadRequest, protocol.CodeInvalidRequest, field, err.Error())
		return nil, false
	}
	if err := clientMay(user, req); err != nil {
		s.refuse(r, http.StatusBadRequest, protocol.CodeInvalidRequest, "", err.Error())
		return nil, false
	}
	t, ok := s.admitClient(ctx, r, user, admission.Ask{Session: req.Session(), Hold: admission.HoldWaiting, Size: len(r.Data())})
	if !ok {
		return nil, false
	}
	return &call{user: user, headers: r.Headers(), size: len(r.Data()), req: req, t: t, wait: wait, log: log}, true
}

// serve submits an admitted call's request and replies with its response.
func (s *Service) serve(ctx context.Context, reply string, c *call) {
	req, t, wait, log := c.req, c.t, c.wait, c.log
	defer t.Close()
	start := time.Now()
	defer func() { s.waited.Add(int64(time.Since(start))) }()
	h := c.headers
	tc := protocol.TraceContext{TraceID: h.Get(bus.HeaderTraceID), Traceparent: h.Get(bus.HeaderTraceparent), Tracestate: h.Get(bus.HeaderTracestate)}
	sctx, cancel := context.WithTimeout(ctx, wait+5*time.Second)
	defer cancel()
	out, err := s.Submit.Submit(sctx, submit.Submission{Request: req, Trace: clientTrace(tc), Wait: wait, Size: c.size, Caller: t.Caller, Owner: t.Owner})
	t.Accepted(err == nil && !out.Replayed)
	switch {
	case err == nil:
	case errors.Is(err, submit.ErrTooLarge):
		s.fail(reply, http.StatusRequestEntityTooLarge, protocol.CodeBodyTooLarge, "", strings.TrimPrefix(err.Error(), submit.ErrTooLarge.Error()+": "))
		return
	case errors.Is(err, submit.ErrOverBudget):
		s.fail(reply, http.StatusTooManyRequests, protocol.CodeRateLimited, "", err.Error())
		return
	case errors.Is(err, submit.ErrConflict):
		s.fail(reply, http.StatusConflict, protocol.CodeRequestIDConflict, "request_id", strings.TrimPrefix(err.Error(), submit.ErrConflict.Error()+": "))
		return
	case errors.Is(err, protocol.ErrInvalid):
		s.fail(reply, http.StatusBadRequest, protocol.CodeInvalidRequest, "", strings.TrimPrefix(err.Error(), "submit: "))
		return
	case ctx.Err() != nil:
		s.fail(reply, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "", "this gateway stopped before the response came; ask again with the same request_id (the request keeps running)")
		return
	case errors.Is(err, submit.ErrNotConnected), errors.Is(err, submit.ErrUnavailable), sctx.Err() != nil:
		s.fail(reply, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "", "the bus is not reachable; ask again with the same request_id")
		return
	default:
		log.Error("submit", "request_id", req.RequestID, "err", err)
		s.fail(reply, http.StatusInternalServerError, protocol.CodeInternal, "", "the request could not be submitted; ask again with the same request_id")
		return
	}
	if out.Pending {
		s.fail(reply, http.StatusGatewayTimeout, protocol.CodeTimeout, "", fmt.Sprintf("no response to %s within %s; the request keeps running: ask again with the same request_id to wait again", req.RequestID, wait))
		return
	}
	resp := out.Response
	if resp.Results == nil {
		resp.Results = []protocol.ToolResult{}
	}
	body, err := json.Marshal(resp)
	if err != nil {
		s.fail(reply, http.StatusInternalServerError, protocol.CodeInternal, "", "the response could not be written as JSON")
		return
	}
	msg := &nats.Msg{Subject: reply, Data: body, Header: nats.Header{bus.HeaderContentType: {protocol.ContentTypeJSON}, bus.HeaderTraceID: {out.TraceID}}}
	if err := s.Conn.PublishMsg(msg); err != nil {
		log.Warn("reply", "request_id", req.RequestID, "err", err)
	}
	s.answered.Add(1)
}

// fail answers an admitted call with an error, from beside micro's handler (so on the reply
// subject itself, with micro's error headers), counted as failed after admission.
func (s *Service) fail(reply string, status int, code, field, message string) {
	s.failed.Add(1)
	msg := &nats.Msg{Subject: reply, Data: errorBody(code, field, message), Header: nats.Header{
		bus.HeaderContentType: {protocol.ContentTypeJSON},
		micro.ErrorCodeHeader: {strconv.Itoa(status)},
		micro.ErrorHeader:     {protocol.Shorten(message, 256)},
	}}
	if err := s.Conn.PublishMsg(msg); err != nil {
		s.Logger.Warn("reply", "err", err)
	}
}

// maxAskBytes bounds a call of the endpoints response and follow.
const maxAskBytes = 1 << 10

// client is the client whose subject r came on, or it refuses r.
func (s *Service) client(r micro.Request) (string, bool) {
	user, endpoint, ok := protocol.ClientOfService(r.Subject())
	if !ok || protocol.CheckID("NATS user", user) != nil {
		if endpoint == "" {
			endpoint = "<endpoint>"
		}
		s.refuse(r, http.StatusBadRequest, protocol.CodeInvalidRequest, "", "not a client's subject: call "+protocol.SubjectClientService("<your NATS user>", endpoint))
		return "", false
	}
	return user, true
}

// decodeAsk reads r's body, one JSON object of shape (said in the error) and nothing after it,
// into v, or refuses r.
func (s *Service) decodeAsk(r micro.Request, v any, shape string) bool {
	if len(r.Data()) > maxAskBytes {
		s.refuse(r, http.StatusRequestEntityTooLarge, protocol.CodeBodyTooLarge, "", fmt.Sprintf("the ask is %d bytes; at most %d", len(r.Data()), maxAskBytes))
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(r.Data()))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("more follows the object")
	}
	if err != nil {
		s.refuse(r, http.StatusBadRequest, protocol.CodeInvalidRequest, "", "the ask is "+shape+": "+err.Error())
		return false
	}
	return true
}

// response answers the response of one of the client's requests: only a request of a session
// the client owns is its; another's is as unknown as one that never was (404).
func (s *Service) response(ctx context.Context, r micro.Request) {
	user, ok := s.client(r)
	if !ok {
		return
	}
	var ask struct {
		RequestID string `json:"request_id"`
	}
	if !s.decodeAsk(r, &ask, `{"request_id": "…"}`) {
		return
	}
	if err := protocol.CheckID("request_id", ask.RequestID); err != nil {
		s.refuse(r, http.StatusBadRequest, protocol.CodeInvalidRequest, "request_id", err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	unknown := fmt.Sprintf("no request %s of yours is known (or it is older than the state TTL)", ask.RequestID)
	session, err := s.Reader.Session(ctx, ask.RequestID)
	mine := false
	if err == nil {
		mine, err = s.Reader.MayRead(ctx, admission.ClientActor(user), session)
	}
	switch {
	case errors.Is(err, submit.ErrNotFound) || (err == nil && !mine):
		s.refuse(r, http.StatusNotFound, protocol.CodeNotFound, "request_id", unknown)
		return
	case err != nil:
		s.Logger.Warn("read a request's session", "client", user, "request_id", ask.RequestID, "err", err)
		s.refuse(r, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "", "the bus is not reachable; ask again")
		return
	}
	resp, pending, err := s.Reader.Status(ctx, ask.RequestID)
	switch {
	case errors.Is(err, submit.ErrNotFound):
		s.refuse(r, http.StatusNotFound, protocol.CodeNotFound, "request_id", unknown)
		return
	case err != nil:
		s.refuse(r, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "", "the bus is not reachable; ask again")
		return
	}
	var body []byte
	if pending {
		body, _ = json.Marshal(map[string]string{"request_id": ask.RequestID, "status": "pending"})
	} else {
		if resp.Results == nil {
			resp.Results = []protocol.ToolResult{}
		}
		body, _ = json.Marshal(resp)
	}
	if err := r.Respond(body, micro.WithHeaders(micro.Headers{bus.HeaderContentType: {protocol.ContentTypeJSON}})); err != nil {
		s.Logger.Warn("reply", "err", err)
	}
}

// errorBody is an error reply's body: {"error": {"code", "message", "field"?}}.
func errorBody(code, field, message string) []byte {
	var body ServiceError
	body.Error.Code, body.Error.Message, body.Error.Field = code, message, field
	b, _ := json.Marshal(body)
	return b
}

// ServiceError is the body of the service's error replies.
type ServiceError struct {
	Error struct {
		Code    string `json:"code" jsonschema:"required,description=Hermes' error code: INVALID_REQUEST, NOT_FOUND, RATE_LIMITED, TIMEOUT, BUS_UNAVAILABLE, …"`
		Message string `json:"message" jsonschema:"required"`
		Field   string `json:"field,omitempty" jsonschema:"description=the field the problem is in"`
	} `json:"error" jsonschema:"required"`
}

// refuse replies with an error from micro's handler: status as the micro error code, and
// errorBody as its body.
func (s *Service) refuse(r micro.Request, status int, code, field, message string) {
	b := errorBody(code, field, message)
	if err := r.Error(strconv.Itoa(status), protocol.Shorten(message, 256), b, micro.WithHeaders(micro.Headers{bus.HeaderContentType: {protocol.ContentTypeJSON}})); err != nil {
		s.Logger.Warn("reply", "err", err)
	}
}
