package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/deadletter"
	"github.com/hermesbus/hermes/internal/record"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// A record of several streams: each session whole in one, sessions spread over them; routing,
// tools, results, responses, reading a session back, listing sessions and dead letters work
// across them as on a record of one.
func TestARecordOfSeveralStreams(t *testing.T) {
	t.Parallel()
	const streams = 4
	s := start(t, options{workers: 2, bus: bus.Config{Streams: streams, Partitions: 8, AckWait: time.Second, MaxDeliver: 3}})
	l := s.admin.Layout()
	if l.Streams() != streams || len(s.admin.Streams) != streams {
		t.Fatalf("layout of %d streams, %d opened; want %d", l.Streams(), len(s.admin.Streams), streams)
	}
	// Sessions over every stream, two requests each, the second after the first.
	var sessions []string
	used := map[int]int{}
	for i := 0; len(sessions) < 12; i++ {
		session := fmt.Sprintf("streams_%d", i)
		if used[l.StreamOf(session)] >= 3 {
			continue
		}
		used[l.StreamOf(session)]++
		sessions = append(sessions, session)
	}
	for _, session := range sessions {
		for n := range 2 {
			req := request(fmt.Sprintf("%s_r%d", session, n), "", call("c1", "echo", map[string]any{"n": n}))
			req["session_id"] = session
			r := s.route(req)
			if r.Status != protocol.StatusSuccess || len(r.Results) != 1 || r.Results[0].Status != protocol.ResultOK {
				t.Fatalf("%s request %d: %+v", session, n, r)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Each session read back whole, from its own stream, in order.
	for _, session := range sessions {
		root := protocol.RecordRoot(l.StreamOf(session))
		var types []protocol.Type
		waitFor(t, "the record of "+session, func() bool {
			types = types[:0]
			_, err := record.ReadSession(ctx, s.js, session, record.Start{}, func(e *record.Entry) error {
				if !strings.HasPrefix(e.Subject, root+".") {
					t.Errorf("%s: %s is not in its stream (%s)", session, e.Subject, root)
				}
				if e.Msg != nil {
					types = append(types, e.Msg.Type)
				}
				return nil
			})
			return err == nil && countTypes(types, protocol.TypeResponse) == 2
		})
		if countTypes(types, protocol.TypeRequest) != 2 || countTypes(types, protocol.TypeToolCall) != 2 || countTypes(types, protocol.TypeToolResult) != 2 {
			t.Errorf("%s's record: %v", session, types)
		}
		if types[0] != protocol.TypeRequest || types[len(types)-1] != protocol.TypeResponse {
			t.Errorf("%s's record out of order: %v", session, types)
		}
	}
	// Every stream holds its own sessions' messages, and only those.
	for k := range streams {
		msgs := s.storedIn(protocol.RecordStream(k))
		if len(msgs) == 0 {
			t.Errorf("stream %s holds nothing", protocol.RecordStream(k))
		}
		for _, m := range msgs {
			session := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
			if l.StreamOf(session) != k {
				t.Errorf("stream %s holds %s, of a session of stream %d", protocol.RecordStream(k), m.Subject, l.StreamOf(session))
			}
		}
	}
	// The whole record read (hermes replay), and what the what-if replay reads of it: every
	// stream, each in its order; a start sequence only within one session.
	total := 0
	for k := range streams {
		total += len(s.storedIn(protocol.RecordStream(k)))
	}
	if n, err := record.Read(ctx, s.js, nil, record.Start{}, func(*record.Entry) error { return nil }); err != nil || n != total {
		t.Errorf("the whole record read: %d messages, %v; want %d", n, err, total)
	}
	requests := 0
	filters := append([]string{protocol.FilterRequests, protocol.FilterResults}, protocol.FiltersAllToolCalls()...)
	if _, err := record.Read(ctx, s.js, filters, record.Start{}, func(e *record.Entry) error {
		if e.Msg != nil && e.Msg.Type == protocol.TypeRequest {
			requests++
		}
		return nil
	}); err != nil || requests != 2*len(sessions) {
		t.Errorf("the requests of every session: %d, %v; want %d", requests, err, 2*len(sessions))
	}
	if _, err := record.Read(ctx, s.js, nil, record.Start{Seq: 2}, func(*record.Entry) error { return nil }); err == nil {
		t.Error("a start sequence over every stream was taken")
	}
	// Following every session (hermes tail), and one session from a sequence (its events
	// page): what is stored from then on, in each stream.
	fctx, stop := context.WithCancel(ctx)
	followed := make(chan string, 64)
	ready := make(chan struct{})
	go func() {
		_ = record.Follow(fctx, s.js, nil, func() { close(ready) }, func(e *record.Entry) error {
			if e.Msg != nil && e.Msg.Type == protocol.TypeResponse {
				followed <- e.Msg.SessionID
			}
			return nil
		})
	}()
	<-ready
	last := sessions[len(sessions)-1]
	var from uint64
	_, _ = record.ReadSession(ctx, s.js, last, record.Start{}, func(e *record.Entry) error { from = e.Seq; return nil })
	streamed := make(chan protocol.Type, 64)
	go func() {
		_ = record.Stream(fctx, s.js, protocol.FilterSession(last), record.Start{Seq: from + 1}, nil, func(e *record.Entry) error {
			if e.Msg != nil {
				streamed <- e.Msg.Type
			}
			return nil
		})
	}()
	for _, session := range []string{sessions[0], last} {
		req := request(session+"_r9", "", call("c1", "echo", map[string]any{"n": 9}))
		req["session_id"] = session
		s.route(req)
	}
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case id := <-followed:
			got[id] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("followed the responses of %v; want %s and %s", got, sessions[0], last)
		}
	}
	if first := <-streamed; first != protocol.TypeRequest {
		t.Errorf("session %s streamed from after its last message: first %s, want its new request", last, first)
	}
	stop()
	// The sessions listed, from every stream, latest first.
	recent, err := record.RecentSessions(ctx, s.js, 100, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(recent) != len(sessions) || recent[0].ID != last {
		t.Errorf("recent sessions %d (first %v), want %d (first %s)", len(recent), recent[0], len(sessions), last)
	}
	for _, r := range recent {
		if want := map[bool]uint64{true: 3, false: 2}[r.ID == sessions[0] || r.ID == last]; r.Requests != want {
			t.Errorf("session %s: %d requests, want %d", r.ID, r.Requests, want)
		}
	}
	// A call given up in a stream beyond the first becomes a dead letter that names it.
	var poisoned string
	for i := 0; poisoned == ""; i++ {
		if session := fmt.Sprintf("poison_%d", i); l.StreamOf(session) > 0 {
			poisoned = session
		}
	}
	s.poisoned = poisoned
	subject := l.SubjectToolCall(protocol.ActionHTTP, "echo", poisoned)
	s.publishRaw(subject, []byte("not msgpack at all"))
	dl := s.waitDeadLetter(subject)
	if got, want := dl.Header.Get(deadletter.HeaderStream), l.StreamNameOf(poisoned); got != want {
		t.Errorf("dead letter names stream %q, want %q", got, want)
	}
	if id := dl.Header.Get("Nats-Msg-Id"); !strings.Contains(id, l.StreamNameOf(poisoned)) {
		t.Errorf("dead letter id %q does not name its stream", id)
	}
}

func countTypes(types []protocol.Type, t protocol.Type) int {
	n := 0
	for _, x := range types {
		if x == t {
			n++
		}
	}
	return n
}
