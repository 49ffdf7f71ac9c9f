package demotools

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
)

// maxBodyBytes bounds every request body; a larger body is answered 413.
const maxBodyBytes = 1 << 20

// shutdownGrace is how long Serve lets in-flight requests finish after its ctx is done before
// it closes their connections.
const shutdownGrace = 5 * time.Second

// route is one tool endpoint: the method and ServeMux path pattern it answers.
type route struct {
	tool    string
	method  string
	pattern string
	h       http.Handler
}

// server holds the state of one Handler: the echo tool's counters and barriers, the orders the
// change tools change, and the clock the fake data is derived from.
type server struct {
	logger   *slog.Logger
	now      func() time.Time
	fails    *failCounter
	barriers *barrierSet
	orders   *orderStore
	pause    func(ctx context.Context, d time.Duration) error // a change's hold_ms
	routes   []route
	mux      *http.ServeMux
	paths    *http.ServeMux      // path-only patterns, to tell 405 from 404
	allowed  map[string][]string // path pattern → methods
}

// Handler returns the demo tools' HTTP handler with fresh state (echo counters, barriers, the
// orders the change tools change).
// A nil logger discards. The handler is safe for concurrent use.
func Handler(logger *slog.Logger) http.Handler {
	return newServer(logger, time.Now)
}

var _ http.Handler = (*server)(nil)

func newServer(logger *slog.Logger, now func() time.Time) *server {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &server{
		logger:   logger,
		now:      now,
		fails:    newFailCounter(maxFailKeys),
		barriers: newBarrierSet(),
		orders:   newOrderStore(maxLiveOrders, initialOrder),
		pause:    sleep,
		mux:      http.NewServeMux(),
		paths:    http.NewServeMux(),
		allowed:  make(map[string][]string),
	}
	s.routes = []route{
		{"get_policy_number", http.MethodGet, "/v1/policy/number", s.tool(s.policyNumber)},
		{"get_policy_status", http.MethodGet, "/v1/policy/status", s.tool(s.policyStatus)},
		{"weather_search", http.MethodGet, "/v1/weather", s.tool(s.weatherSearch)},
		{"calendar_query", http.MethodGet, "/v1/calendar/activities", s.tool(s.calendarQuery)},
		{"order_query", http.MethodGet, "/v1/orders/{order_id}", s.contracted(s.orderQuery)},
		{"order_query", http.MethodGet, "/v1/orders/{$}", s.contracted(s.orderQuery)},
		{"order_query", http.MethodGet, "/v1/orders", s.contracted(s.orderQuery)},
		{"logistics_urge", http.MethodPost, "/v1/logistics/urge", s.contracted(s.logisticsUrge)},
		{"address_update", http.MethodPost, "/v1/orders/{order_id}/address", s.tool(s.addressUpdate)},
		{"address_update", http.MethodPost, "/v1/orders/address", s.tool(s.addressUpdate)},
		{"refund_apply", http.MethodPost, "/v1/orders/{order_id}/refund", s.tool(s.refundApply)},
		{"refund_apply", http.MethodPost, "/v1/orders/refund", s.tool(s.refundApply)},
		{"inventory_query", http.MethodGet, "/v1/inventory", s.tool(s.inventoryQuery)},
		{"sample_send", http.MethodPost, "/v1/samples", s.tool(s.sampleSend)},
		{"echo", http.MethodPost, "/v1/echo", http.HandlerFunc(s.echo)},
		{"echo", http.MethodGet, "/v1/echo", http.HandlerFunc(s.echo)},
		{"order_query_broken", http.MethodGet, "/v1/broken/orders", s.contracted(s.orderQueryBroken)},
		{"payment_charge_broken", http.MethodPost, "/v1/broken/payments", http.HandlerFunc(s.paymentChargeBroken)},
		{"payment_charge_broken", http.MethodPost, "/v1/sandbox/payments", http.HandlerFunc(s.paymentChargeBroken)},
		{"", http.MethodGet, "/v1/orders/{order_id}/changes", s.tool(s.orderChanges)},
		{"", http.MethodGet, "/healthz", s.tool(s.health)},
		{"", http.MethodGet, "/health", s.tool(s.health)},
		{"", http.MethodGet, "/{$}", s.tool(s.index)},
	}
	for _, rt := range s.routes {
		s.mux.Handle(rt.method+" "+rt.pattern, rt.h)
		if _, ok := s.allowed[rt.pattern]; !ok {
			s.paths.Handle(rt.pattern, http.NotFoundHandler())
		}
		s.allowed[rt.pattern] = append(s.allowed[rt.pattern], rt.method)
		if rt.method == http.MethodGet {
			s.allowed[rt.pattern] = append(s.allowed[rt.pattern], http.MethodHead)
		}
	}
	s.mux.HandleFunc("/", s.notFound)
	return s
}

// ServeHTTP times the request, bounds its body, recovers a panic as a 500 and dispatches.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tw := &timedWriter{ResponseWriter: w, start: time.Now()}
	r.Body = http.MaxBytesReader(tw, r.Body, maxBodyBytes)
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.logger.Error("demo tool panicked", "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
			if !tw.wroteHeader {
				writeError(tw, &toolError{Status: http.StatusInternalServerError, Code: "INTERNAL",
					Hint: "report this bug in the demo tools", Message: fmt.Sprint("panic: ", v)})
			}
		}
		s.logger.LogAttrs(r.Context(), slog.LevelDebug, "demo tool request",
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("status", tw.status), slog.Duration("duration", time.Since(tw.start)),
			slog.String("request_id", r.Header.Get("X-Request-ID")),
			slog.String("idempotency_key", r.Header.Get("Idempotency-Key")))
	}()
	s.mux.ServeHTTP(tw, r)
}

// notFound answers a path no tool serves (404) or a known path with the wrong method (405).
func (s *server) notFound(w http.ResponseWriter, r *http.Request) {
	if _, pattern := s.paths.Handler(r); pattern != "" {
		methods := s.allowed[pattern]
		w.Header().Set("Allow", strings.Join(methods, ", "))
		writeError(w, &toolError{Status: http.StatusMethodNotAllowed, Code: "METHOD_NOT_ALLOWED",
			Hint:    "call " + r.URL.Path + " with " + strings.Join(methods, " or "),
			Message: r.Method + " is not allowed on " + r.URL.Path})
		return
	}
	var paths []string
	for _, e := range s.endpoints() {
		paths = append(paths, e.Method+" "+e.Path)
	}
	writeError(w, &toolError{Status: http.StatusNotFound, Code: "NOT_FOUND",
		Hint:    "fix the route's url path; the demo tools serve " + strings.Join(paths, ", "),
		Message: "no demo tool at " + r.URL.Path})
}

// health answers GET /healthz and GET /health (what the sandbox asks).
func (s *server) health(*http.Request, args) (any, error) {
	return map[string]string{"status": "ok"}, nil
}

// endpoint is how a tool is called.
type endpoint struct {
	Tool   string `json:"tool"`
	Method string `json:"method"`
	Path   string `json:"path"`
}

// endpoints returns each tool's main endpoint, in the order the tools are listed.
func (s *server) endpoints() []endpoint {
	var out []endpoint
	seen := make(map[string]bool)
	for _, rt := range s.routes {
		if rt.tool == "" || seen[rt.tool] {
			continue
		}
		seen[rt.tool] = true
		out = append(out, endpoint{rt.tool, rt.method, rt.pattern})
	}
	return out
}

// index answers GET / with the list of tools and their endpoints.
func (s *server) index(*http.Request, args) (any, error) {
	return map[string]any{"service": "hermes demo tools", "tools": s.endpoints()}, nil
}

// timedWriter sets X-Execution-Time, the milliseconds since the request arrived, on the
// response just before its header is written, and remembers the status for the log.
type timedWriter struct {
	http.ResponseWriter
	start       time.Time
	status      int
	wroteHeader bool
}

func (w *timedWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.wroteHeader = true
		w.status = code
		w.Header().Set("X-Execution-Time", strconv.FormatInt(time.Since(w.start).Milliseconds(), 10))
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *timedWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *timedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// freshConns are the connections of a server that have sent no request yet. Shutdown closes
// idle connections at once but waits for a new one until it is 5 s old (net/http's rule), so a
// connection a client dialled and never used would hold every shutdown that long; nothing is
// in flight on it, so close closes it as an idle one. It is safe for concurrent use.
type freshConns struct {
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// track is the server's ConnState hook.
func (f *freshConns) track(c net.Conn, st http.ConnState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st != http.StateNew {
		delete(f.conns, c)
		return
	}
	if f.conns == nil {
		f.conns = map[net.Conn]struct{}{}
	}
	f.conns[c] = struct{}{}
}

// close closes every connection that has sent no request yet; Shutdown calls it once it has
// stopped accepting.
func (f *freshConns) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		_ = c.Close()
	}
}

// Serve serves Handler on ln until ctx is done, then shuts down gracefully (in-flight requests
// get up to 5 s, after which their connections are closed and their contexts cancelled; idle
// connections, and those that have sent no request, are closed at once) and returns nil once
// every handler has returned. It returns other errors from http.Server.
// Serve closes ln.
func Serve(ctx context.Context, ln net.Listener, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return serve(ctx, ln, newServer(logger, time.Now), logger, shutdownGrace)
}

// serve is Serve with the handler and grace period given.
func serve(ctx context.Context, ln net.Listener, h http.Handler, logger *slog.Logger, grace time.Duration) error {
	var inflight sync.WaitGroup
	var fresh freshConns
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inflight.Add(1)
			defer inflight.Done()
			h.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		ConnState:         fresh.track,
	}
	srv.RegisterOnShutdown(fresh.close)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	logger.Info("demo tools listening", "addr", ln.Addr().String())

	select {
	case err := <-errc:
		// The listener failed: drop the connections still open and wait for their handlers.
		_ = srv.Close()
		inflight.Wait()
		return fmt.Errorf("demotools: serve: %w", err)
	case <-ctx.Done():
	}

	// Phase one: stop accepting and let in-flight requests finish within the grace period.
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		// Phase two: closing the connections cancels the handlers' contexts, and every demo
		// tool returns promptly once its context is done.
		logger.Warn("demo tools: grace period over, closing connections", "error", err)
		_ = srv.Close()
	}
	err := <-errc
	inflight.Wait()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("demotools: serve: %w", err)
	}
	return nil
}
