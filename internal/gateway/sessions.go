package gateway

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/record"
	"github.com/hermesbus/hermes/pkg/protocol"
)

const (
	// maxEventStreams bounds the event streams one gateway serves at once; more get 503.
	maxEventStreams = 256
	// keepaliveEvery is how often an event stream sends a comment, so that proxies and clients
	// see it alive while its session is quiet.
	keepaliveEvery = 15 * time.Second
	// eventWriteTimeout bounds one write to an event stream: a client that stops reading is
	// dropped, and its slot freed, once its buffers are full for this long.
	eventWriteTimeout = 30 * time.Second
	// recheckInterval is how often an event stream asks whether its credential still names a
	// caller.
	recheckInterval = 5 * time.Second
	// eventsRetry is the reconnection delay, in milliseconds, an event stream asks of clients.
	eventsRetry = "2000"

	// defaultSessions and maxSessions are GET /v1/sessions' default and largest limit.
	defaultSessions = 50
	maxSessions     = 500
	// sessionsTimeout bounds listing sessions; maxListings bounds listings running at once.
	sessionsTimeout = 5 * time.Second
	maxListings     = 4
)

// sessionsAPI serves a session's record as server-sent events and lists recent sessions.
type sessionsAPI struct {
	streams  eventStreams
	listings chan struct{} // a slot per listing running
}

// registerSessions adds the sessions endpoints to g's mux.
func (g *Gateway) registerSessions() {
	g.sessions.streams.max = maxEventStreams
	g.sessions.listings = make(chan struct{}, maxListings)
	g.mux.HandleFunc("GET /v1/sessions", g.require(auth.PermSubmit, g.handleListSessions))
	g.mux.HandleFunc("GET /v1/sessions/{session_id}/events", g.require(auth.PermSubmit, g.handleSessionEvents))
}

// handleSessionEvents streams the session's recorded messages as server-sent events: its whole
// history, then each new message as it is stored, each once and in stream order, until the
// client leaves or the gateway stops. The id of each event is the message's stream sequence; a
// client resuming with Last-Event-ID (or ?after=) gets every message after it.
func (g *Gateway) handleSessionEvents(w http.ResponseWriter, r *http.Request) {
	filters, err := record.SessionFilters("session_id", r.PathValue("session_id"))
	if err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, err.Error(), err)
		return
	}
	after, err := eventsAfter(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, err.Error(), err)
		return
	}
	a, ok := actorOf(w, r, "")
	if !ok {
		return
	}
	// Someone else's session, or one that does not exist, is not held open: 404 alike.
	t, ok := g.admitted(r.Context(), w, admission.Ask{Actor: a, Need: auth.PermSubmit, Session: r.PathValue("session_id"), Mode: admission.Follow,
		Hold: admission.HoldStream, Store: admission.StoreNone})
	if !ok {
		return
	}
	defer t.Close()
	if !g.cfg.Conn.IsConnected() {
		writeNotConnected(w, "retry")
		return
	}
	if r.Method == http.MethodHead {
		setEventHeaders(w.Header())
		return
	}
	ctx, done, err := g.sessions.streams.add(r.Context())
	if err != nil {
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, protocol.CodeUnavailable, err.Error(), nil)
		return
	}
	defer done()
	from := record.Start{}
	if after > 0 {
		from.Seq = after + 1
	}

	rc := http.NewResponseController(w)
	var mu sync.Mutex // one writer at a time: events and keepalives
	send := func(b []byte) error {
		mu.Lock()
		defer mu.Unlock()
		_ = rc.SetWriteDeadline(time.Now().Add(eventWriteTimeout))
		if _, err := w.Write(b); err != nil {
			return err
		}
		return rc.Flush()
	}
	ctx, cancel := context.WithCancel(ctx)
	var keepalives sync.WaitGroup
	defer func() {
		cancel()
		keepalives.Wait() // nothing writes once the handler has returned
	}()
	started := false
	ready := func() {
		started = true
		setEventHeaders(w.Header())
		w.WriteHeader(http.StatusOK)
		if send([]byte("retry: "+eventsRetry+"\n\n")) != nil {
			cancel()
			return
		}
		keepalives.Go(func() { keepalive(ctx, keepaliveEvery, cancel, send) })
		keepalives.Go(func() { recheckEvery(ctx, recheckInterval, cancel) })
	}
	var buf []byte
	err = record.Stream(ctx, g.cfg.Bus.JS, filters, from, ready, func(e *record.Entry) error {
		buf = appendEvent(buf[:0], e)
		return send(buf)
	})
	switch {
	case err == nil:
	case !started && errors.Is(err, record.ErrNoRecord):
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the record (stream "+protocol.StreamName+") is not there", nil)
	case !started:
		g.log.Warn("session events: open the record", "session_id", r.PathValue("session_id"), "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the record could not be read; retry", nil)
	default:
		g.log.Debug("session events ended", "session_id", r.PathValue("session_id"), "err", err)
	}
}

func setEventHeaders(h http.Header) {
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
}

// appendEvent appends e to buf as one event: its stream sequence as id, type message, and
// record.JSON(e) as its one line of data (a rejected answer withheld: record.ForCallers). An
// entry JSON cannot encode is sent with the error.
func appendEvent(buf []byte, e *record.Entry) []byte {
	data, err := record.JSON(record.ForCallers(e))
	if err != nil {
		data, _ = record.JSON(&record.Entry{Seq: e.Seq, Subject: e.Subject, Time: e.Time, Msg: e.Msg,
			Err: fmt.Errorf("gateway: encode as JSON: %w", err)})
	}
	buf = append(buf, "id: "...)
	buf = strconv.AppendUint(buf, e.Seq, 10)
	buf = append(buf, "\nevent: message\ndata: "...)
	buf = append(buf, data...)
	return append(buf, "\n\n"...)
}

// keepalive sends a comment every interval until ctx is done; a send that fails calls stop.
func keepalive(ctx context.Context, every time.Duration, stop context.CancelFunc, send func([]byte) error) {
	untilNot(ctx, every, stop, func() bool { return send([]byte(": keepalive\n\n")) == nil })
}

// untilNot calls ok every interval until ctx is done, or until ok says false: then it calls
// stop.
func untilNot(ctx context.Context, every time.Duration, stop context.CancelFunc, ok func() bool) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !ok() {
				stop()
				return
			}
		}
	}
}

// recheckEvery asks every interval whether the stream's credential still names a caller, and
// calls stop once it does not: a revoked key, an expired token or a sign-out ends the streams
// it opened too. (A credential that cannot be checked for a moment keeps its stream.)
func recheckEvery(ctx context.Context, every time.Duration, stop context.CancelFunc) {
	untilNot(ctx, every, stop, func() bool { return !errors.Is(stillValid(ctx), auth.ErrUnauthenticated) })
}

// eventsAfter reads where a client resumes: the Last-Event-ID header an EventSource sends when
// it reconnects, else ?after= (for clients that cannot set headers; the header wins, as an
// EventSource keeps its first URL). 0, when neither is given, streams from the beginning.
func eventsAfter(r *http.Request) (uint64, error) {
	field, v := "Last-Event-ID", r.Header.Get("Last-Event-ID")
	if v == "" {
		field, v = "after", r.URL.Query().Get("after")
	}
	return parseEventID(field, v)
}

// parseEventID reads an event id: a stream sequence, in decimal, below 2^64-1; "" is 0.
func parseEventID(field, v string) (uint64, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n == math.MaxUint64 {
		return 0, &protocol.FieldError{Field: field, Reason: "must be the id of an event: a stream sequence, in decimal"}
	}
	return n, nil
}

// errTooManyStreams and errStopping say why an event stream was refused.
var (
	errTooManyStreams = errors.New("too many event streams are open on this gateway; retry later or on another")
	errStopping       = errors.New("the gateway is shutting down; retry")
)

// eventStreams counts the open event streams, refuses more than max, and ends them all when
// the gateway stops: a stream never ends by itself, so the HTTP server's graceful shutdown
// would otherwise wait for it in vain. It is safe for concurrent use.
type eventStreams struct {
	mu      sync.Mutex
	max     int
	next    uint64
	open    map[uint64]context.CancelFunc
	stopped bool
}

// add registers a stream of a request with context parent. It returns the stream's context,
// ended by stop, and done, to call when the stream ends.
func (s *eventStreams) add(parent context.Context) (context.Context, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.stopped:
		return nil, nil, errStopping
	case len(s.open) >= s.max:
		return nil, nil, errTooManyStreams
	}
	if s.open == nil {
		s.open = map[uint64]context.CancelFunc{}
	}
	ctx, cancel := context.WithCancel(parent)
	s.next++
	id := s.next
	s.open[id] = cancel
	return ctx, func() {
		s.mu.Lock()
		delete(s.open, id)
		s.mu.Unlock()
		cancel()
	}, nil
}

// stop ends every open stream and refuses new ones.
func (s *eventStreams) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	for _, cancel := range s.open {
		cancel()
	}
}

// sessionJSON is one session of GET /v1/sessions.
type sessionJSON struct {
	SessionID     string    `json:"session_id"`
	LastRequestID string    `json:"last_request_id"`
	LastSeq       uint64    `json:"last_seq"`
	LastAt        time.Time `json:"last_at"`
	Requests      uint64    `json:"requests"`
}

// handleListSessions answers the sessions whose latest request was stored last, latest first.
func (g *Gateway) handleListSessions(w http.ResponseWriter, r *http.Request) {
	limit, err := sessionsLimit(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, err.Error(), err)
		return
	}
	if !g.cfg.Conn.IsConnected() {
		writeNotConnected(w, "retry")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), sessionsTimeout)
	defer cancel()
	select {
	case g.sessions.listings <- struct{}{}:
		defer func() { <-g.sessions.listings }()
	case <-ctx.Done():
		writeError(w, http.StatusServiceUnavailable, protocol.CodeUnavailable, "too many listings are running; retry", nil)
		return
	}
	a, ok := actorOf(w, r, "")
	if !ok {
		return
	}
	owner := "" // every session
	if !a.ReadsAll() {
		owner = a.Owner()
	}
	t, ok := g.admitted(ctx, w, admission.Ask{Actor: a, Need: auth.PermSubmit, Mode: admission.NoSession, Hold: admission.HoldListing, Store: admission.StoreNone})
	if !ok {
		return
	}
	defer t.Close()
	list, err := record.RecentSessions(ctx, g.cfg.Bus.JS, limit, owner)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil {
			writeError(w, http.StatusGatewayTimeout, protocol.CodeTimeout,
				fmt.Sprintf("listing sessions took longer than %s", sessionsTimeout), nil)
			return
		}
		g.log.Warn("list sessions", "err", err)
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the record could not be read; retry", nil)
		return
	}
	out := struct {
		Sessions []sessionJSON `json:"sessions"`
	}{Sessions: make([]sessionJSON, 0, len(list))}
	for _, s := range list {
		out.Sessions = append(out.Sessions, sessionJSON{SessionID: s.ID, LastRequestID: s.LastRequestID,
			LastSeq: s.LastSeq, LastAt: s.LastAt, Requests: s.Requests})
	}
	writeJSON(w, http.StatusOK, &out)
}

// sessionsLimit reads ?limit=: 1 to maxSessions, default defaultSessions.
func sessionsLimit(r *http.Request) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return defaultSessions, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxSessions {
		return 0, &protocol.FieldError{Field: "limit", Reason: fmt.Sprintf("must be a number from 1 to %d", maxSessions)}
	}
	return n, nil
}
