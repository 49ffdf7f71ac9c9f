package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/internal/tracing"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Config configures a Gateway.
type Config struct {
	// Conn is the NATS connection responses are received on. Required.
	Conn *nats.Conn
	// Bus is the provisioned bus on Conn. Required.
	Bus *bus.Bus
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
	// Logger; nil discards.
	Logger *slog.Logger
}

// Gateway serves HTTP clients.
type Gateway struct {
	cfg      Config
	pub      *bus.Publisher
	log      *slog.Logger
	waiting  waiters
	mux      *http.ServeMux
	handler  http.Handler // mux, counted
	sessions sessionsAPI
}

// New returns a Gateway for cfg. Nothing runs until Run.
func New(cfg Config) (*Gateway, error) {
	if cfg.Conn == nil || cfg.Bus == nil || cfg.Instance == "" {
		return nil, errors.New("gateway: Config.Conn, Config.Bus and Config.Instance are required")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.DefaultWait <= 0 {
		cfg.DefaultWait = 30 * time.Second
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 5 * time.Minute
	}
	g := &Gateway{cfg: cfg, log: cfg.Logger,
		pub: bus.NewPublisher(cfg.Bus.JS, protocol.Sender{Role: protocol.RoleGateway, Instance: cfg.Instance})}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	g.mux = http.NewServeMux()
	g.mux.HandleFunc("POST /v1/route", g.handleRoute)
	g.mux.HandleFunc("GET /v1/requests/{request_id}", g.handleGetRequest)
	g.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	g.mux.HandleFunc("GET /readyz", g.handleReady)
	g.registerSessions()
	registerWeb(g.mux)
	if cfg.Gatherer != nil {
		g.mux.Handle("GET /metrics", metrics.Handler(cfg.Gatherer))
	}
	if g.cfg.Metrics == nil {
		g.cfg.Metrics = metrics.New(nil)
	}
	g.handler = g.cfg.Metrics.Instrument(g.mux)
	return g, nil
}

// Handle adds a handler to the gateway's mux (e.g. metrics or pages of later features).
func (g *Gateway) Handle(pattern string, h http.Handler) { g.mux.Handle(pattern, h) }

// Handler returns the gateway's HTTP handler. Responses reach it only while Run (or Listen)
// runs.
func (g *Gateway) Handler() http.Handler { return g.handler }

// Listen subscribes to responses until ctx is done. Run calls it; use it directly when serving
// Handler from another server.
func (g *Gateway) Listen(ctx context.Context) error {
	sub, err := g.cfg.Conn.Subscribe(protocol.FilterResponses, func(msg *nats.Msg) {
		m, err := protocol.Unmarshal(msg.Data)
		if err != nil {
			g.log.Warn("undecodable response on the bus", "subject", msg.Subject, "err", err)
			return
		}
		resp, err := m.DecodeResponse()
		if err != nil {
			g.log.Warn("invalid response on the bus", "subject", msg.Subject, "msg_id", m.MsgID, "err", err)
			return
		}
		g.waiting.deliver(resp)
	})
	if err != nil {
		return fmt.Errorf("gateway: subscribe to responses: %w", err)
	}
	_ = sub.SetPendingLimits(1<<20, 1<<30)
	<-ctx.Done()
	return sub.Unsubscribe()
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

const (
	// envelopeAllowance is what the envelope may add to a request body on the bus.
	envelopeAllowance = 4 << 10
	// publishTimeout bounds accepting and publishing one request; within it, the client's
	// wait does, but never below minAcceptTime.
	publishTimeout = 10 * time.Second
	minAcceptTime  = time.Second
	// lookupTimeout bounds reading a recorded response once the wait has run out.
	lookupTimeout = time.Second
)

// intake is what hermes-intake records for each accepted request_id.
type intake struct {
	Fingerprint string    `json:"fingerprint"`
	SessionID   string    `json:"session_id"`
	TraceID     string    `json:"trace_id"`
	AcceptedAt  time.Time `json:"accepted_at"`
}

func (g *Gateway) handleRoute(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, CodeBodyTooLarge,
				fmt.Sprintf("the request body is larger than %d bytes", g.cfg.MaxBodyBytes), nil)
			return
		}
		writeError(w, http.StatusBadRequest, CodeInvalidRequest, "could not read the request body: "+err.Error(), nil)
		return
	}
	wait, err := g.waitFor(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error(), err)
		return
	}
	trace, err := traceOf(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error(), err)
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
		writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error(), err)
		return
	}
	w.Header().Set("X-Request-ID", req.RequestID)
	span.SetAttributes(attribute.String("hermes.request_id", req.RequestID), attribute.String("hermes.session_id", req.Session()),
		attribute.String("hermes.trace_id", trace.TraceID), attribute.Int("hermes.tool_calls", len(req.ToolCalls)))
	log := g.log.With("request_id", req.RequestID, "session_id", req.Session(), "msg_id", protocol.MsgIDRequest(req.RequestID), "trace_id", trace.TraceID)
	if limit := g.cfg.Bus.MaxMessageBytes() - envelopeAllowance; len(body) > limit {
		writeError(w, http.StatusRequestEntityTooLarge, CodeBodyTooLarge,
			fmt.Sprintf("the request is %d bytes; the bus carries at most %d in one message", len(body), limit), nil)
		return
	}
	if !g.cfg.Conn.IsConnected() {
		// Refused before anything is written: a request sent on a connection that is down
		// would wait in the client's reconnect buffer and might be accepted after this
		// answer had said it failed.
		log.Debug("request refused: not connected to NATS")
		writeNotConnected(w, "nothing was accepted; retry with the same request_id")
		return
	}
	// Accepting and publishing run to completion even if the client leaves: an accepted
	// request_id must not be left without its request on the bus.
	// The whole POST is answered within the client's wait (at least minAcceptTime for
	// accepting) plus lookupTimeout: a bus that stops answering (a leader stepping down, a
	// node without quorum) must not hold the client past its own timeout.
	deadline := time.Now().Add(wait)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(sctx), min(max(wait, minAcceptTime), publishTimeout))
	defer cancel()

	canon, _ := json.Marshal(req)
	sum := sha256.Sum256(canon)
	rec := intake{Fingerprint: hex.EncodeToString(sum[:]), SessionID: req.Session(), TraceID: trace.TraceID, AcceptedAt: time.Now().UTC()}
	recBytes, _ := json.Marshal(&rec)
	replies, done := g.waiting.add(req.RequestID)
	defer done()
	m, err := protocol.NewMessage(protocol.TypeRequest, req)
	if err != nil {
		writeError(w, http.StatusInternalServerError, CodeInvalidRequest, err.Error(), nil)
		return
	}
	m.MsgID, m.RequestID, m.SessionID, m.Trace = protocol.MsgIDRequest(req.RequestID), req.RequestID, req.Session(), trace
	m.Recipient = protocol.RoleRouter
	if _, err := g.cfg.Bus.Intake.Create(ctx, req.RequestID, recBytes); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			log.Error("record intake", "err", err)
			writeError(w, http.StatusServiceUnavailable, CodeBusUnavailable, "the bus is not reachable; retry with the same request_id", nil)
			return
		}
		prev, err := g.intakeOf(ctx, req.RequestID)
		if err != nil {
			log.Error("read intake", "err", err)
			writeError(w, http.StatusServiceUnavailable, CodeBusUnavailable, "the bus is not reachable; retry with the same request_id", nil)
			return
		}
		if prev.Fingerprint != rec.Fingerprint {
			writeError(w, http.StatusConflict, CodeRequestIDConflict,
				fmt.Sprintf("request_id %s was already used for a different request; use a new request_id", req.RequestID), nil)
			return
		}
		if resp, ok := g.recorded(ctx, req.RequestID); ok {
			w.Header().Set("X-Hermes-Replayed", "true")
			writeResponse(w, resp)
			return
		}
		// Accepted before but not answered yet (or the first gateway died before publishing):
		// publishing again is safe, the stream and the router deduplicate it.
		m.Trace.TraceID = prev.TraceID
		w.Header().Set("X-Trace-ID", prev.TraceID)
	}
	// Published only once the id is accepted (or known to carry this same request): a
	// different request under a used id must never reach the bus.
	if _, err := g.pub.Publish(ctx, protocol.SubjectRequest(req.Session()), m); err != nil {
		log.Error("publish request", "err", err)
		writeError(w, http.StatusServiceUnavailable, CodeBusUnavailable, "the request could not be published; retry with the same request_id", nil)
		return
	}
	log.Debug("request published")
	cancel()
	ctx = r.Context()
	timer := time.NewTimer(max(time.Until(deadline), 0))
	defer timer.Stop()
	select {
	case resp := <-replies:
		span.AddEvent("response", oteltrace.WithAttributes(attribute.String("hermes.status", string(resp.Status))))
		writeResponse(w, resp)
	case <-timer.C:
		// The response may have been recorded while this gateway missed the bus message. While
		// the connection is down the record cannot be read: asking would hold the client until
		// the lookup times out.
		connected := g.cfg.Conn.IsConnected()
		if connected {
			lctx, lcancel := context.WithTimeout(context.WithoutCancel(ctx), lookupTimeout)
			resp, ok := g.recorded(lctx, req.RequestID)
			lcancel()
			if ok {
				writeResponse(w, resp)
				return
			}
		}
		var body apiError
		body.Error.Code = CodeTimeout
		body.Error.Message = fmt.Sprintf("no response within %s; the request keeps running, fetch it from status_url", wait)
		if !connected {
			body.Error.Message += " (the gateway is not connected to NATS right now)"
		}
		body.RequestID, body.StatusURL = req.RequestID, "/v1/requests/"+req.RequestID
		writeJSON(w, http.StatusGatewayTimeout, &body)
	case <-ctx.Done():
		// The client left; the request keeps running.
	}
}

func (g *Gateway) intakeOf(ctx context.Context, requestID string) (*intake, error) {
	e, err := g.cfg.Bus.Intake.Get(ctx, requestID)
	if err != nil {
		return nil, err
	}
	var rec intake
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, fmt.Errorf("gateway: decode intake of %s: %w", requestID, err)
	}
	return &rec, nil
}

// recorded returns the response recorded for requestID, if any.
func (g *Gateway) recorded(ctx context.Context, requestID string) (*protocol.Response, bool) {
	e, err := g.cfg.Bus.Responses.Get(ctx, requestID)
	if err != nil {
		return nil, false
	}
	m, err := protocol.Unmarshal(e.Value())
	if err != nil {
		g.log.Error("recorded response undecodable", "request_id", requestID, "err", err)
		return nil, false
	}
	resp, err := m.DecodeResponse()
	if err != nil {
		g.log.Error("recorded response invalid", "request_id", requestID, "err", err)
		return nil, false
	}
	return resp, true
}

func (g *Gateway) handleGetRequest(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("request_id")
	if err := protocol.CheckID("request_id", id); err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error(), err)
		return
	}
	if !g.cfg.Conn.IsConnected() {
		writeNotConnected(w, "retry")
		return
	}
	ctx := r.Context()
	if resp, ok := g.recorded(ctx, id); ok {
		writeResponse(w, resp)
		return
	}
	_, ierr := g.cfg.Bus.Intake.Get(ctx, id)
	_, perr := g.cfg.Bus.Calls.Get(ctx, id)
	if ierr == nil || perr == nil {
		writeJSON(w, http.StatusAccepted, map[string]string{"request_id": id, "status": "pending"})
		return
	}
	if !errors.Is(ierr, jetstream.ErrKeyNotFound) {
		writeError(w, http.StatusServiceUnavailable, CodeBusUnavailable, "the bus is not reachable", nil)
		return
	}
	writeError(w, http.StatusNotFound, CodeNotFound, fmt.Sprintf("no request %s is known (or it is older than the state TTL)", id), nil)
}

func (g *Gateway) handleReady(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if !g.cfg.Conn.IsConnected() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": "not connected to NATS"})
		return
	}
	if _, err := g.cfg.Bus.Stream.Info(ctx); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": "stream not reachable"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
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
func traceOf(r *http.Request) (protocol.TraceContext, error) {
	t := protocol.TraceContext{TraceID: r.Header.Get("X-Trace-ID")}
	if t.TraceID != "" && !printableASCII(t.TraceID, 128) {
		return t, &protocol.FieldError{Field: "X-Trace-ID", Reason: "must be 1 to 128 printable ASCII characters without spaces"}
	}
	if tp := r.Header.Get("traceparent"); printableASCII(tp, 128) {
		t.Traceparent = tp
		if ts := r.Header.Get("tracestate"); printableASCIIOrSpace(ts, 512) {
			t.Tracestate = ts
		}
	}
	return t, nil
}

func printableASCII(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

func printableASCIIOrSpace(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}
