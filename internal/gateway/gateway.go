package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/asyncapi"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/erasure"
	"github.com/hermesbus/hermes/internal/fastlane"
	"github.com/hermesbus/hermes/internal/httpapi"
	"github.com/hermesbus/hermes/internal/memory"
	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/internal/policies"
	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/internal/sandbox"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/tracing"
)

// Config configures a Gateway.
type Config struct {
	// Conn is the NATS connection responses are received on. Required.
	Conn *nats.Conn
	// Bus is the provisioned bus on Conn. Required.
	Bus *bus.Bus
	// NoFastLane: every request takes the durable path; otherwise each that may is asked of
	// the routers on the fast lane first, waiting at most FastWait for a router's answer
	// (fastlane.DefaultAskWait when 0).
	NoFastLane bool
	FastWait   time.Duration
	// Instance names this gateway in the messages it sends. Required.
	Instance string
	// MaxBodyBytes bounds a request body; larger bodies get 413. Default 1 MiB.
	MaxBodyBytes int64
	// DefaultWait is how long POST /v1/route waits for the response. Default 30 s.
	DefaultWait time.Duration
	// MaxWait bounds the wait a client may ask for with ?timeout=. Default 5 min.
	MaxWait time.Duration
	// Limits bound requests; zero fields take protocol.DefaultLimits.
	Limits protocol.Limits
	// Metrics counts HTTP requests; nil counts into unexported metrics.
	Metrics *metrics.Metrics
	// Gatherer, when set, is served at GET /metrics.
	Gatherer prometheus.Gatherer
	// Callers, when set, names the caller of every request but /healthz, /readyz and the
	// web page's files, and each endpoint checks its permission (auth.PermSubmit; /metrics
	// auth.PermMetrics). Nil serves everyone, as Hermes did before callers had identities.
	Callers auth.Verifier
	// Signins, with Callers, lets browsers sign in (POST /v1/signin) and then call with a
	// cookie; nil: bearer credentials only.
	Signins Signins
	// PublicHosts are the host names the gateway answers for besides IP addresses and
	// localhost (the Host header; see guard).
	PublicHosts []string
	// CallerLimits bound each caller (with Callers); zero fields take DefaultCallerLimits.
	CallerLimits admission.CallerLimits
	// StoreCheckEvery is how often the gateway looks at how full the store is (requests are
	// refused near its limits). Default 2 s.
	StoreCheckEvery time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
}

// Submitter is what the gateway's handlers, and its doors, need of a submit.Submitter.
type Submitter interface {
	Submit(ctx context.Context, sub submit.Submission) (*submit.Outcome, error)
	Status(ctx context.Context, requestID string) (*protocol.Response, bool, error)
	Cancel(ctx context.Context, requestID string, c submit.Cancellation) (*protocol.Response, bool, error)
	Session(ctx context.Context, requestID string) (string, error)
	Connected() bool
	Run(ctx context.Context) error
}

var _ Submitter = (*submit.Submitter)(nil)

// Gateway serves HTTP clients.
type Gateway struct {
	cfg      Config
	submit   Submitter
	log      *slog.Logger
	mux      *http.ServeMux
	handler  http.Handler // mux, counted
	sessions sessionsAPI
	// admit admits every request of every door this gateway serves (package admission).
	admit  *admission.Admitter
	limits *admission.Limits // admit's
	// tools is the tool registry (/api/v1/tools); nil without a contracts bucket.
	tools   *registry.Store
	sandbox *sandbox.Sandbox
	// approvals serve /v1/approvals; empty without the approvals' bucket.
	approvals approvalsAPI
	// memory keeps what Hermes remembers about users (/v1/memory).
	memory   *memory.Store
	erasures *erasure.Asks // nil when the bus has no erasures' bucket
	// policies are the tools' applied policies (/api/v1/policies), and book the same
	// followed live, which decides what listings offer each caller; nil without the
	// policies' bucket.
	policies *policies.Store
	book     *policies.Book
	local    *policies.Local
	signins  auth.Verifier // cfg.Signins, its answers remembered; nil without
	// blueprints serve /api/v1/blueprints and the runs; empty without their buckets.
	blueprints blueprintsAPI
	// fast asks the routers on the fast lane (nil: off).
	fast *fastlane.Client
	// runCtx is the context of the runs this gateway drives: ended when Listen returns.
	runCtx   context.Context
	stopRuns context.CancelFunc
}

// New returns a Gateway for cfg. Nothing runs until Run.
func New(cfg Config) (*Gateway, error) {
	if cfg.Conn == nil || cfg.Bus == nil || cfg.Instance == "" {
		return nil, errors.New("gateway: Config.Conn, Config.Bus and Config.Instance are required")
	}
	if cfg.Bus.Bucket(admission.OwnersBucket) == nil {
		// Without it each gateway would keep its own owners, and another could give a session away.
		return nil, fmt.Errorf("gateway: the bus has no sessions' owners bucket %s (bus.Config.Buckets: admission.Bucket)", admission.OwnersBucket)
	}
	if cfg.Bus.Bucket(policies.PoliciesBucket) == nil {
		// Without it the tools' policies could be neither changed nor followed here.
		return nil, fmt.Errorf("gateway: the bus has no policies' bucket %s (bus.Config.Buckets: policies.Buckets)", policies.PoliciesBucket)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var fast *fastlane.Client
	if !cfg.NoFastLane {
		fast = fastlane.NewClient(cfg.Conn, cfg.FastWait)
	}
	s, err := submit.New(submit.Config{Conn: cfg.Conn, Bus: cfg.Bus, Sender: protocol.Sender{Role: protocol.RoleGateway, Instance: cfg.Instance},
		Budget: cfg.CallerLimits.OrDefault().SubmitBudget(), Metrics: cfg.Metrics, Fast: fast, Logger: log})
	if err != nil {
		return nil, err
	}
	g := newGateway(cfg, s)
	g.fast = fast
	return g, nil
}

// FastLane is the gateway's client of the fast lane; nil when it is off.
func (g *Gateway) FastLane() *fastlane.Client { return g.fast }

// newGateway builds the gateway around s, cfg's defaults applied.
func newGateway(cfg Config, s Submitter) *Gateway {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.DefaultWait <= 0 {
		cfg.DefaultWait = 30 * time.Second
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 5 * time.Minute
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New(nil)
	}
	g := &Gateway{cfg: cfg, log: cfg.Logger, submit: s}
	g.runCtx, g.stopRuns = context.WithCancel(context.Background())
	if cfg.Signins != nil {
		g.signins = &auth.Cached{Next: cfg.Signins}
	}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	g.admit = admission.New(admission.Config{Bus: cfg.Bus, Limits: cfg.CallerLimits, StoreCheckEvery: cfg.StoreCheckEvery,
		Logger: g.log.With("part", "admission")})
	g.limits = g.admit.Limits()
	g.mux = http.NewServeMux()
	g.mux.HandleFunc("POST /v1/route", g.require(auth.PermSubmit, g.handleRoute))
	g.mux.HandleFunc("GET /v1/requests/{request_id}", g.require(auth.PermSubmit, g.handleGetRequest))
	g.mux.HandleFunc("DELETE /v1/requests/{request_id}", g.require(auth.PermSubmit, g.handleCancel))
	g.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	g.mux.HandleFunc("GET /readyz", g.handleReady)
	// The public subjects' AsyncAPI document: what any NATS client may publish and call. It
	// describes the API, holds nothing of anyone, and needs no key.
	doc := asyncapi.JSON()
	g.mux.HandleFunc("GET /v1/asyncapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(doc)
	})
	g.registerSessions()
	g.registerBrowser()
	g.registerTools()
	g.registerApprovals()
	g.registerPolicies()
	g.registerBlueprints()
	g.registerCoordination()
	g.registerMemory()
	registerWeb(g.mux)
	if cfg.Gatherer != nil {
		g.mux.HandleFunc("GET /metrics", g.require(auth.PermMetrics, metrics.Handler(cfg.Gatherer).ServeHTTP))
	}
	g.handler = g.cfg.Metrics.Instrument(g.guard(g.mux))
	return g
}

// Handle adds a handler to the gateway's mux (e.g. metrics or pages of later features).
func (g *Gateway) Handle(pattern string, h http.Handler) { g.mux.Handle(pattern, h) }

// Handler returns the gateway's HTTP handler. Responses reach it only while Run (or Listen)
// runs.
func (g *Gateway) Handler() http.Handler { return g.handler }

// Listen receives responses, watches how full the store is, follows the tools' applied
// policies and memory's bucket, until ctx is done. Run calls it; use it directly when serving Handler from another
// server.
func (g *Gateway) Listen(ctx context.Context) error {
	// One look before anything is taken: the limits are known to the first request.
	g.admit.Look(ctx)
	var watch sync.WaitGroup
	defer watch.Wait()
	defer g.stopRuns() // before watch.Wait: the runs' resumer waits for them
	watch.Go(func() { _ = g.admit.Run(ctx) })
	if g.book != nil {
		watch.Go(func() { _ = g.book.Run(ctx) })
	}
	if s := g.approvals.starter; s != nil {
		watch.Go(func() { _ = s.Run(ctx) })
	}
	if rs := g.blueprints.resumer; rs != nil {
		watch.Go(func() { _ = rs.Run(ctx) })
	}
	if m := g.memory; m != nil && m.Cache != nil {
		// Memory's hot tier serves reads once it follows the bucket; until then they go
		// to the bus.
		watch.Go(func() {
			if err := m.Cache.Run(ctx, m.KV, g.log.With("part", "memory")); err != nil && ctx.Err() == nil {
				g.log.Warn("memory's hot tier does not follow the bucket; reads go to the bus", "err", err)
			}
		})
	}
	return g.submit.Run(ctx)
}

// Run serves HTTP on ln until ctx is done, then stops accepting, gives in-flight requests up to
// 10 s, and returns.
func (g *Gateway) Run(ctx context.Context, ln net.Listener) error {
	lctx, stopListen := context.WithCancel(context.WithoutCancel(ctx))
	listenErr := make(chan error, 1)
	go func() { listenErr <- g.Listen(lctx) }()
	srv := &http.Server{Handler: g.handler, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelWarn)}
	srv.RegisterOnShutdown(g.sessions.streams.stop) // event streams never end by themselves
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	var err error
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if serr := srv.Shutdown(sctx); serr != nil {
			_ = srv.Close()
		}
		cancel()
	case err = <-serveErr:
		err = fmt.Errorf("gateway: serve: %w", err)
	}
	stopListen()
	if lerr := <-listenErr; err == nil && lerr != nil {
		err = lerr
	}
	return err
}

// handleRoute is POST /v1/route: decode, submit, render.
func (g *Gateway) handleRoute(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, protocol.CodeBodyTooLarge,
				fmt.Sprintf("the request body is larger than %d bytes", g.cfg.MaxBodyBytes), nil)
			return
		}
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, "could not read the request body: "+err.Error(), nil)
		return
	}
	wait, err := g.waitFor(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, err.Error(), err)
		return
	}
	trace, err := traceOf(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, err.Error(), err)
		return
	}
	sctx, span := tracing.Tracer().Start(tracing.Context(r.Context(), trace), "POST /v1/route", oteltrace.WithSpanKind(oteltrace.SpanKindServer))
	defer span.End()
	tracing.Inject(sctx, &trace)
	if trace.TraceID == "" {
		// Without the caller's correlation id, the W3C trace id serves, so logs and traces agree.
		trace.TraceID = tracing.TraceID(sctx)
	}
	if trace.TraceID == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		trace.TraceID = hex.EncodeToString(b[:])
	}
	w.Header().Set("X-Trace-ID", trace.TraceID)
	req, err := protocol.DecodeRequestJSON(body, g.cfg.Limits)
	if err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, err.Error(), err)
		return
	}
	w.Header().Set("X-Request-ID", req.RequestID)
	a, ok := actorOf(w, r, req.User)
	if !ok {
		return
	}
	t, ok := g.admitted(sctx, w, admission.Ask{Actor: a, Need: auth.PermSubmit, Session: req.Session(), Hold: admission.HoldWaiting, Size: len(body)})
	if !ok {
		return
	}
	defer t.Close()
	sub := submit.Submission{Request: req, Trace: trace, Wait: wait, Size: len(body), Caller: t.Caller, Owner: t.Owner}
	if span.IsRecording() {
		span.SetAttributes(attribute.String("hermes.request_id", req.RequestID), attribute.String("hermes.session_id", req.Session()),
			attribute.String("hermes.trace_id", trace.TraceID), attribute.Int("hermes.tool_calls", len(req.ToolCalls)))
	}
	out, err := g.submit.Submit(sctx, sub)
	t.Accepted(err == nil && !out.Replayed)
	switch {
	case err == nil:
	case errors.Is(err, submit.ErrTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, protocol.CodeBodyTooLarge, strings.TrimPrefix(err.Error(), submit.ErrTooLarge.Error()+": "), nil)
		return
	case errors.Is(err, submit.ErrOverBudget):
		var be *submit.BudgetError
		errors.As(err, &be)
		writeRefusal(w, &admission.Refusal{Status: http.StatusTooManyRequests, Code: protocol.CodeRateLimited, Message: err.Error(), RetryAfter: be.RetryAfter})
		return
	case errors.Is(err, submit.ErrConflict):
		writeError(w, http.StatusConflict, protocol.CodeRequestIDConflict, strings.TrimPrefix(err.Error(), submit.ErrConflict.Error()+": "), nil)
		return
	case errors.Is(err, submit.ErrNotConnected):
		writeNotConnected(w, "nothing was accepted; retry with the same request_id")
		return
	case errors.Is(err, protocol.ErrInvalid):
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, strings.TrimPrefix(err.Error(), "submit: "), err)
		return
	case errors.Is(err, submit.ErrUnavailable):
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the bus is not reachable; retry with the same request_id", nil)
		return
	case r.Context().Err() != nil:
		return // the client left; the request keeps running
	default:
		g.log.Error("submit", "request_id", req.RequestID, "err", err)
		writeError(w, http.StatusInternalServerError, protocol.CodeInternal, err.Error(), nil)
		return
	}
	if out.TraceID != "" {
		w.Header().Set("X-Trace-ID", out.TraceID)
	}
	if out.Replayed {
		w.Header().Set("X-Hermes-Replayed", "true")
	}
	if out.Pending {
		var body apiError
		body.Error.Code = protocol.CodeTimeout
		body.Error.Message = fmt.Sprintf("no response within %s; the request keeps running, fetch it from status_url", wait)
		if !g.submit.Connected() {
			body.Error.Message += " (the gateway is not connected to NATS right now)"
		}
		body.RequestID, body.StatusURL = req.RequestID, statusURL(req.RequestID)
		writeJSON(w, http.StatusGatewayTimeout, &body)
		return
	}
	span.AddEvent("response", oteltrace.WithAttributes(attribute.String("hermes.status", out.Response.Status)))
	writeResponse(w, out.Response)
}

// admitted admits ask (package admission), or answers its refusal and returns false.
func (g *Gateway) admitted(ctx context.Context, w http.ResponseWriter, ask admission.Ask) (*admission.Ticket, bool) {
	t, err := g.admit.Admit(ctx, ask)
	switch refused := admission.AsRefusal(err); {
	case err == nil:
		return t, true
	case refused != nil:
		writeRefusal(w, refused)
	case ctx.Err() != nil:
	default:
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the bus is not reachable; retry", nil)
	}
	return nil, false
}

// statusURL is where a request's response can be fetched.
func statusURL(requestID string) string { return "/v1/requests/" + requestID }

// handleGetRequest is GET /v1/requests/{request_id}.
func (g *Gateway) handleGetRequest(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("request_id")
	if err := protocol.CheckID("request_id", id); err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, err.Error(), err)
		return
	}
	if _, ok := g.mayReadRequest(w, r, id); !ok {
		return
	}
	resp, pending, err := g.submit.Status(r.Context(), id)
	switch {
	case err == nil && pending:
		writeJSON(w, http.StatusAccepted, map[string]string{"request_id": id, "status": "pending"})
	case err == nil:
		writeResponse(w, resp)
	case errors.Is(err, submit.ErrNotConnected):
		writeNotConnected(w, "retry")
	case errors.Is(err, submit.ErrNotFound):
		writeError(w, http.StatusNotFound, protocol.CodeNotFound, fmt.Sprintf("no request %s is known (or it is older than the state TTL)", id), nil)
	default:
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the bus is not reachable", nil)
	}
}

// handleCancel is DELETE /v1/requests/{request_id}[?reason=…]: 200 with the cancelled
// request's response (again, with X-Hermes-Replayed, when it was cancelled before), 409 with
// the response when it had finished, 404 when unknown.
func (g *Gateway) handleCancel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("request_id")
	if err := protocol.CheckID("request_id", id); err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, err.Error(), err)
		return
	}
	a, ok := g.mayReadRequest(w, r, id)
	if !ok {
		return
	}
	reason := r.URL.Query().Get("reason")
	if len(reason) > protocol.MaxCancelTextBytes || !utf8.ValidString(reason) {
		err := &protocol.FieldError{Field: "reason", Reason: fmt.Sprintf("must be UTF-8 of at most %d bytes", protocol.MaxCancelTextBytes)}
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, err.Error(), err)
		return
	}
	resp, replayed, err := g.submit.Cancel(r.Context(), id, submit.Cancellation{By: describe(a, r), Reason: reason})
	switch {
	case err == nil:
		if replayed {
			w.Header().Set("X-Hermes-Replayed", "true")
		}
		writeResponse(w, resp)
	case errors.Is(err, submit.ErrFinished):
		var body apiError
		body.Error.Code = protocol.CodeAlreadyFinished
		body.Error.Message = fmt.Sprintf("request %s has finished (%s); there is nothing to cancel", id, resp.Status)
		body.RequestID, body.StatusURL, body.Response = id, statusURL(id), resp
		writeJSON(w, http.StatusConflict, &body)
	case errors.Is(err, submit.ErrNotFound):
		writeError(w, http.StatusNotFound, protocol.CodeNotFound, fmt.Sprintf("no request %s is known (or it is older than the state TTL)", id), nil)
	case errors.Is(err, submit.ErrNotConnected):
		writeNotConnected(w, "nothing was cancelled; retry")
	case errors.Is(err, protocol.ErrInvalid):
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, err.Error(), err)
	default:
		g.log.Error("cancel", "request_id", id, "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the cancellation could not be completed; retry (cancelling again is safe)", nil)
	}
}

// describe names a for the record: the caller's name and id (and the end user), or, when the
// gateway asks for no caller, r's address as this gateway saw it.
func describe(a admission.Actor, r *http.Request) string {
	if a.Caller == nil {
		return "http " + r.RemoteAddr
	}
	s := a.Caller.Name + " (" + a.Caller.ID + ")"
	if a.User != "" {
		s += " for " + a.User
	}
	// The record keeps at most protocol.MaxCancelTextBytes of it (a token's issuer and
	// subject may be longer).
	return protocol.Shorten(s, protocol.MaxCancelTextBytes)
}

// mayReadRequest answers 404 unless the actor of r may read request id's session, as it would
// for an unknown request; 503 when that cannot be told. It returns the actor.
func (g *Gateway) mayReadRequest(w http.ResponseWriter, r *http.Request, id string) (admission.Actor, bool) {
	a, ok := actorOf(w, r, "")
	if !ok || a.ReadsAll() {
		return a, ok
	}
	session, err := g.submit.Session(r.Context(), id)
	if err == nil {
		var mine bool
		if mine, err = g.admit.MayRead(r.Context(), a, session); err == nil && mine {
			return a, true
		}
	}
	if err == nil || errors.Is(err, submit.ErrNotFound) {
		writeError(w, http.StatusNotFound, protocol.CodeNotFound, fmt.Sprintf("no request %s is known (or it is older than the state TTL)", id), nil)
		return a, false
	}
	g.log.Warn("read a request's session", "request_id", id, "err", err)
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the bus is not reachable", nil)
	return a, false
}

func (g *Gateway) handleReady(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if !g.cfg.Conn.IsConnected() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": "not connected to NATS"})
		return
	}
	for _, s := range g.cfg.Bus.Streams { // each of the record's
		if _, err := s.Info(ctx); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": "stream not reachable"})
			return
		}
	}
	if g.book != nil && !g.book.Following() {
		// Until then the listings offer nobody a tool.
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": "the tools' policies are not followed yet"})
		return
	}
	out := map[string]any{"status": "ready"}
	if mcp := g.mcpStates(ctx); len(mcp) > 0 {
		// Counts only: this answers everyone; hermes mcp ls (the bus's admin) shows which
		// server is where, and why.
		byState := map[string]int{}
		for _, w := range mcp {
			for _, s := range w.Servers {
				state := s.State
				if w.Stale {
					state = "stale"
				}
				byState[state]++
			}
		}
		out["mcp"] = map[string]any{"workers": len(mcp), "servers": byState}
	}
	writeJSON(w, http.StatusOK, out)
}

// mcpWorker is what a tool worker keeps on the bus of the MCP servers it holds (shown by
// /readyz; a worker not heard of for 20 s is marked stale).
type mcpWorker struct {
	Worker    string    `json:"worker"`
	UpdatedAt time.Time `json:"updated_at"`
	Stale     bool      `json:"stale,omitempty"`
	Servers   []struct {
		State string `json:"state"`
	} `json:"servers"`
}

// mcpStates reads the MCP servers' states the tool workers keep in hermes-tools; what cannot be
// read is left out (readiness is the gateway's own).
func (g *Gateway) mcpStates(ctx context.Context) []mcpWorker {
	kv := g.cfg.Bus.Tools
	if kv == nil {
		return nil
	}
	keys, err := kv.ListKeysFiltered(ctx, protocol.MCPStatePrefix+">")
	if err != nil {
		return nil
	}
	var out []mcpWorker
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue
		}
		var st mcpWorker
		if json.Unmarshal(e.Value(), &st) != nil {
			continue
		}
		st.Stale = time.Since(st.UpdatedAt) > 20*time.Second
		out = append(out, st)
	}
	return out
}

// waitFor reads ?timeout= (a Go duration like 5s, or milliseconds).
func (g *Gateway) waitFor(r *http.Request) (time.Duration, error) {
	v := r.URL.Query().Get("timeout")
	if v == "" {
		return g.cfg.DefaultWait, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		ms, merr := strconv.Atoi(v)
		if merr != nil {
			return 0, &protocol.FieldError{Field: "timeout", Reason: fmt.Sprintf("must be a duration like 5s or a number of milliseconds (got %q)", v)}
		}
		d = time.Duration(ms) * time.Millisecond
	}
	if d <= 0 || d > g.cfg.MaxWait {
		return 0, &protocol.FieldError{Field: "timeout", Reason: fmt.Sprintf("must be above 0 and at most %s", g.cfg.MaxWait)}
	}
	return d, nil
}

// traceOf reads the caller's X-Trace-ID and W3C trace context.
func traceOf(r *http.Request) (protocol.TraceContext, error) { return httpapi.TraceOf(r) }
