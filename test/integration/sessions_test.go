package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// sseEvent is one server-sent event as a client sees it.
type sseEvent struct {
	id, event, data string
}

// sseStream is an open GET /v1/sessions/{session_id}/events, read by a small parser of the
// text/event-stream format.
type sseStream struct {
	t      *testing.T
	resp   *http.Response
	events chan sseEvent
	ended  chan struct{} // closed when the server ended the stream (or it was closed)
	cancel context.CancelFunc

	mu    sync.Mutex
	retry string // the last retry field
	notes int    // comment lines (keepalives)
}

// openEvents opens the event stream of session at base with the headers given as pairs, and
// requires a 200 event stream.
func openEvents(t *testing.T, base, session, query string, header ...string) *sseStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/sessions/"+session+"/events"+query, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("GET events of %s: HTTP %d: %s", session, resp.StatusCode, body)
	}
	for k, want := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
	s := &sseStream{t: t, resp: resp, events: make(chan sseEvent, 256), ended: make(chan struct{}), cancel: cancel}
	go s.read()
	t.Cleanup(s.close)
	return s
}

// read parses the stream until it ends: fields up to a blank line make an event, dispatched
// when it has data; lines starting with ':' are comments.
func (s *sseStream) read() {
	defer close(s.ended)
	br := bufio.NewReader(s.resp.Body)
	var ev sseEvent
	var data []string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
		if line == "" {
			if data != nil {
				ev.data = strings.Join(data, "\n")
				s.events <- ev
			}
			ev, data = sseEvent{}, nil
			continue
		}
		if strings.HasPrefix(line, ":") {
			s.mu.Lock()
			s.notes++
			s.mu.Unlock()
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			ev.id = value
		case "event":
			ev.event = value
		case "data":
			data = append(data, value)
		case "retry":
			s.mu.Lock()
			s.retry = value
			s.mu.Unlock()
		}
	}
}

func (s *sseStream) close() {
	s.cancel()
	s.resp.Body.Close()
	<-s.ended
}

// recorded is the data of one event: record.JSON of a message.
type recorded struct {
	ID        uint64
	Seq       uint64          `json:"seq"`
	Type      protocol.Type   `json:"type"`
	SessionID string          `json:"session_id"`
	RequestID string          `json:"request_id"`
	Payload   json.RawMessage `json:"payload"`
	Error     string          `json:"error"`
}

// next returns the next event, decoded, checking its id and type.
func (s *sseStream) next() recorded {
	s.t.Helper()
	select {
	case ev := <-s.events:
		var r recorded
		if err := json.Unmarshal([]byte(ev.data), &r); err != nil {
			s.t.Fatalf("event data is not a recorded message: %v: %q", err, ev.data)
		}
		id, err := strconv.ParseUint(ev.id, 10, 64)
		if err != nil || id != r.Seq || ev.event != "message" {
			s.t.Fatalf("event id %q, type %q for seq %d", ev.id, ev.event, r.Seq)
		}
		r.ID = id
		return r
	case <-s.ended:
		s.t.Fatal("the event stream ended")
	case <-time.After(20 * time.Second):
		s.t.Fatal("no event within 20 s")
	}
	return recorded{}
}

// flow reads the next n events and checks they belong to session, with increasing ids.
func (s *sseStream) flow(session string, n int) []recorded {
	s.t.Helper()
	var out []recorded
	for range n {
		r := s.next()
		if r.SessionID != session || r.Error != "" || len(r.Payload) == 0 {
			s.t.Fatalf("event %d: %+v", r.ID, r)
		}
		if len(out) > 0 && r.ID <= out[len(out)-1].ID {
			s.t.Fatalf("event id %d after %d", r.ID, out[len(out)-1].ID)
		}
		out = append(out, r)
	}
	return out
}

// oneCallFlow is what the record holds of a request with one call answered at its first try.
var oneCallFlow = []protocol.Type{protocol.TypeRequest, protocol.TypeToolCall, protocol.TypeToolStarted,
	protocol.TypeToolResult, protocol.TypeResponse}

// requireFlow checks that events are oneCallFlow of requestID.
func requireFlow(t *testing.T, events []recorded, requestID string) {
	t.Helper()
	var got []string
	for _, e := range events {
		got = append(got, e.RequestID+" "+string(e.Type))
	}
	var want []string
	for _, typ := range oneCallFlow {
		want = append(want, requestID+" "+string(typ))
	}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Fatalf("events\n  %s\nwant\n  %s", strings.Join(got, ", "), strings.Join(want, ", "))
	}
}

func echoIn(session, requestID string, n int) map[string]any {
	return withSession(request(requestID, "", call("c1", "echo", map[string]any{"n": n})), session)
}

func TestSessionEventsHistoryThenLive(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	s.route(echoIn("sess_sse", "sse_1", 1))
	s.route(echoIn("sess_other", "other_1", 1)) // another session: never streamed
	s.waitRecorded("sse_1")
	consumers := len(s.consumers())

	ev := openEvents(t, s.base, "sess_sse", "")
	history := ev.flow("sess_sse", len(oneCallFlow))
	requireFlow(t, history, "sse_1")
	ev.mu.Lock()
	retry := ev.retry
	ev.mu.Unlock()
	if retry != "2000" {
		t.Errorf("retry %q, want 2000", retry)
	}

	s.route(echoIn("sess_other", "other_2", 2))
	s.route(echoIn("sess_sse", "sse_2", 2))
	live := ev.flow("sess_sse", len(oneCallFlow))
	requireFlow(t, live, "sse_2")
	if live[0].ID <= history[len(history)-1].ID {
		t.Fatalf("live event %d not after the history's last %d", live[0].ID, history[len(history)-1].ID)
	}
	var req protocol.Request
	if err := json.Unmarshal(live[0].Payload, &req); err != nil || req.RequestID != "sse_2" || len(req.ToolCalls) != 1 {
		t.Fatalf("request payload %s: %v", live[0].Payload, err)
	}
	// The stream's consumer goes with it, not 30 s later when the server would expire it.
	ev.close()
	waitFor(t, "the event stream's consumer deleted", func() bool { return len(s.consumers()) == consumers })
}

func TestSessionEventsResume(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	s.route(echoIn("sess_resume", "res_1", 1))
	s.waitRecorded("res_1")
	first := openEvents(t, s.base, "sess_resume", "")
	all := first.flow("sess_resume", len(oneCallFlow))
	first.close()

	// Reconnecting mid-way with Last-Event-ID: exactly the events after it, then live ones.
	mid := strconv.FormatUint(all[2].ID, 10)
	again := openEvents(t, s.base, "sess_resume", "", "Last-Event-ID", mid)
	if got := again.flow("sess_resume", 2); got[0].ID != all[3].ID || got[1].ID != all[4].ID {
		t.Fatalf("after %s: events %d, %d; want %d, %d", mid, got[0].ID, got[1].ID, all[3].ID, all[4].ID)
	}
	s.route(echoIn("sess_resume", "res_2", 2))
	requireFlow(t, again.flow("sess_resume", len(oneCallFlow)), "res_2") // nothing of res_1 twice

	// ?after= for clients that cannot set headers; Last-Event-ID wins over it, as an
	// EventSource reconnects with its first URL and the header.
	byQuery := openEvents(t, s.base, "sess_resume", "?after="+strconv.FormatUint(all[3].ID, 10))
	if got := byQuery.next(); got.ID != all[4].ID {
		t.Fatalf("?after=%d: first event %d, want %d", all[3].ID, got.ID, all[4].ID)
	}
	both := openEvents(t, s.base, "sess_resume", "?after=0", "Last-Event-ID", strconv.FormatUint(all[4].ID, 10))
	requireFlow(t, both.flow("sess_resume", len(oneCallFlow)), "res_2")
}

func TestSessionEventsCatchUpAcrossGatewayRestart(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	s.route(echoIn("sess_gw", "gw_1", 1))
	s.waitRecorded("gw_1")
	ev := openEvents(t, s.base, "sess_gw", "")
	seen := ev.flow("sess_gw", len(oneCallFlow))

	// The open stream must not hold the gateway's graceful shutdown (10 s) up.
	began := time.Now()
	s.restartGateway("gateway-2")
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("restarting the gateway with an event stream open took %s", took)
	}
	select {
	case <-ev.ended:
	case <-time.After(20 * time.Second):
		t.Fatal("the event stream did not end when its gateway stopped")
	}

	// Missed while no stream was open, then caught up from the last id seen, nothing before.
	s.route(echoIn("sess_gw", "gw_2", 2))
	last := strconv.FormatUint(seen[len(seen)-1].ID, 10)
	again := openEvents(t, s.base, "sess_gw", "", "Last-Event-ID", last)
	requireFlow(t, again.flow("sess_gw", len(oneCallFlow)), "gw_2")
	s.route(echoIn("sess_gw", "gw_3", 3))
	requireFlow(t, again.flow("sess_gw", len(oneCallFlow)), "gw_3")
}

func TestSessionEventsRefusals(t *testing.T) {
	t.Parallel()
	s := start(t, options{routers: -1})
	for _, tc := range []struct {
		path, header, field string
	}{
		{"/v1/sessions/bad.id/events", "", "session_id"},
		{"/v1/sessions/%2A/events", "", "session_id"},
		{"/v1/sessions/%3E/events", "", "session_id"},
		{"/v1/sessions/" + strings.Repeat("s", protocol.MaxIDLen+1) + "/events", "", "session_id"},
		{"/v1/sessions/ok/events", "abc", "Last-Event-ID"},
		{"/v1/sessions/ok/events", "-1", "Last-Event-ID"},
		{"/v1/sessions/ok/events?after=1.5", "", "after"},
		{"/v1/sessions?limit=0", "", "limit"},
		{"/v1/sessions?limit=501", "", "limit"},
	} {
		req, _ := http.NewRequest(http.MethodGet, s.base+tc.path, nil)
		if tc.header != "" {
			req.Header.Set("Last-Event-ID", tc.header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Error struct{ Code, Field string }
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || err != nil || body.Error.Code != "INVALID_REQUEST" || body.Error.Field != tc.field {
			t.Errorf("%s (Last-Event-ID %q): HTTP %d, %+v, %v; want 400 naming %s", tc.path, tc.header, resp.StatusCode, body, err, tc.field)
		}
	}
}

// sessionsList is the answer of GET /v1/sessions.
type sessionsList struct {
	Sessions []struct {
		SessionID     string    `json:"session_id"`
		LastRequestID string    `json:"last_request_id"`
		LastSeq       uint64    `json:"last_seq"`
		LastAt        time.Time `json:"last_at"`
		Requests      uint64    `json:"requests"`
	} `json:"sessions"`
}

func (s *system) sessions(query string) sessionsList {
	s.t.Helper()
	resp, err := http.Get(s.base + "/v1/sessions" + query)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out sessionsList
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &out) != nil || out.Sessions == nil {
		s.t.Fatalf("GET /v1/sessions%s: HTTP %d: %s", query, resp.StatusCode, body)
	}
	return out
}

func TestSessionsList(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	if got := s.sessions(""); len(got.Sessions) != 0 {
		t.Fatalf("before any request: %+v", got)
	}
	began := time.Now().Add(-time.Second)
	for i, step := range []struct{ session, request string }{
		{"sess_a", "a_1"}, {"sess_a", "a_2"}, {"sess_b", "b_1"}, {"sess_c", "c_1"}, {"sess_a", "a_3"},
	} {
		s.route(echoIn(step.session, step.request, i))
	}
	got := s.sessions("")
	var rows []string
	for _, x := range got.Sessions {
		rows = append(rows, fmt.Sprintf("%s %s %d", x.SessionID, x.LastRequestID, x.Requests))
		if x.LastSeq == 0 || x.LastAt.Before(began) || x.LastAt.After(time.Now().Add(time.Second)) {
			t.Errorf("session %s: last_seq %d, last_at %s", x.SessionID, x.LastSeq, x.LastAt)
		}
	}
	if want := "sess_a a_3 3, sess_c c_1 1, sess_b b_1 1"; strings.Join(rows, ", ") != want {
		t.Fatalf("sessions %q, want %q", strings.Join(rows, ", "), want)
	}
	if a, c := got.Sessions[0], got.Sessions[1]; a.LastSeq <= c.LastSeq || a.LastAt.Before(c.LastAt) {
		t.Fatalf("sess_a (seq %d at %s) is not after sess_c (seq %d at %s)", a.LastSeq, a.LastAt, c.LastSeq, c.LastAt)
	}
	if got := s.sessions("?limit=2"); len(got.Sessions) != 2 || got.Sessions[1].SessionID != "sess_c" {
		t.Fatalf("limit 2: %+v", got)
	}
	// The seq is the request's own: the stream holds the request of a_3 there.
	for _, m := range s.stored() {
		if m.Sequence == got.Sessions[0].LastSeq && m.Subject != s.storedRequest("sess_a") {
			t.Fatalf("last_seq %d of sess_a is a message on %s", m.Sequence, m.Subject)
		}
	}
}
