package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// publishRequests publishes reqs of one session in order, each awaiting the stream's ack, as
// a client sending them one after another without waiting for answers would.
func (s *system) publishRequests(session string, reqs []*protocol.Request) {
	s.t.Helper()
	pub := s.admin.NewPublisher(protocol.Sender{Role: protocol.RoleClient, Instance: "order-test"}) // to the stream that keeps the session
	for _, r := range reqs {
		r.SessionID = session
		m, err := protocol.NewMessage(protocol.TypeRequest, r)
		if err != nil {
			s.t.Error(err)
			return
		}
		m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDRequest(r.RequestID), r.RequestID, session
		if _, err := pub.Publish(context.Background(), protocol.SubjectRequest(session), m); err != nil {
			s.t.Error(err)
			return
		}
	}
}

// sessionTimeline is what the record says about a session's requests, by stream sequence.
type sessionTimeline struct {
	accepted   []string          // request ids in the order the stream stored them
	dispatched map[string]uint64 // request id → sequence of its first tool_call
	answered   map[string]uint64 // request id → sequence of its (first) response
	results    map[string]uint64 // request id → sequence of its first tool_result
	responses  map[string]int    // request id → response messages recorded
}

func (s *system) timelines() map[string]*sessionTimeline {
	s.t.Helper()
	out := map[string]*sessionTimeline{}
	for _, raw := range s.stored() {
		m, err := protocol.Unmarshal(raw.Data)
		if err != nil {
			continue
		}
		tl := out[m.SessionID]
		if tl == nil {
			tl = &sessionTimeline{dispatched: map[string]uint64{}, answered: map[string]uint64{}, results: map[string]uint64{}, responses: map[string]int{}}
			out[m.SessionID] = tl
		}
		switch m.Type {
		case protocol.TypeRequest:
			tl.accepted = append(tl.accepted, m.RequestID)
		case protocol.TypeToolCall:
			if _, ok := tl.dispatched[m.RequestID]; !ok {
				tl.dispatched[m.RequestID] = raw.Sequence
			}
		case protocol.TypeToolResult:
			if _, ok := tl.results[m.RequestID]; !ok {
				tl.results[m.RequestID] = raw.Sequence
			}
		case protocol.TypeResponse:
			if _, ok := tl.answered[m.RequestID]; !ok {
				tl.answered[m.RequestID] = raw.Sequence
			}
			tl.responses[m.RequestID]++
		}
	}
	return out
}

func (s *system) waitResponses(n int) {
	s.t.Helper()
	waitFor(s.t, fmt.Sprintf("%d responses", n), func() bool {
		got := 0
		for _, raw := range s.stored() {
			if m, err := protocol.Unmarshal(raw.Data); err == nil && m.Type == protocol.TypeResponse {
				got++
			}
		}
		return got >= n
	})
}

// TestSessionOrderHoldsAcrossRoutersAndARouterCrash sends the requests of several sessions
// interleaved, to two routers (one a child process killed with SIGKILL in the middle), and
// checks that every session's requests were dispatched in the order the stream accepted them,
// each answered once.
func TestSessionOrderHoldsAcrossRoutersAndARouterCrash(t *testing.T) {
	long(t, "order across a router crash")
	s := start(t, options{routers: -1, workers: 2, bus: bus.Config{AckWait: 2 * time.Second}})
	victim := s.spawn("router", "victim-router", "--routes", "testdata/routes.yaml")
	waitFor(t, "the victim router to start", func() bool { return strings.Contains(victim.out.String(), "router running") })
	s.addRouter("router-2")
	const sessions, each = 8, 25
	nc, _ := s.connect()
	var seen atomic.Int64 // calls the victim dispatched
	sub, err := nc.Subscribe(protocol.FilterToolCalls(protocol.ActionHTTP, "*"), func(msg *nats.Msg) {
		if m, err := protocol.Unmarshal(msg.Data); err == nil && m.Sender.Instance == "victim-router" {
			seen.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	var wg sync.WaitGroup
	for i := range sessions {
		wg.Go(func() {
			reqs := make([]*protocol.Request, each)
			for j := range reqs {
				reqs[j] = &protocol.Request{RequestID: fmt.Sprintf("ord_%d_%02d", i, j), ToolCalls: []protocol.ToolCall{
					{ToolCallID: "a", Name: "echo", Arguments: []byte(fmt.Sprintf(`{"delay_ms":%d,"j":%d}`, (i*7+j)%11, j))}}}
			}
			s.publishRequests(fmt.Sprintf("sess_ord_%d", i), reqs)
		})
	}
	waitFor(t, "the victim router to dispatch calls", func() bool { return seen.Load() >= 10 })
	victim.kill()
	wg.Wait()
	s.waitResponses(sessions * each)
	s.drain()

	byRouter := map[string]int{}
	for _, m := range s.record() {
		if m.Type == protocol.TypeToolCall {
			byRouter[m.Sender.Instance]++
		}
	}
	t.Logf("calls dispatched per router: %v", byRouter)
	if byRouter["router-2"] == 0 || byRouter["victim-router"] == 0 {
		t.Errorf("both routers should have dispatched: %v", byRouter)
	}
	for i := range sessions {
		session := fmt.Sprintf("sess_ord_%d", i)
		tl := s.timelines()[session]
		if tl == nil || len(tl.accepted) != each {
			t.Fatalf("%s: %v requests recorded, want %d", session, tl, each)
		}
		var last uint64
		for k, id := range tl.accepted {
			seq, ok := tl.dispatched[id]
			if !ok {
				t.Fatalf("%s: %s was never dispatched", session, id)
			}
			if seq < last {
				t.Fatalf("%s: %s (accepted #%d) was dispatched before the request accepted before it", session, id, k)
			}
			last = seq
			if tl.responses[id] != 1 {
				t.Fatalf("%s: %s has %d responses, want 1", session, id, tl.responses[id])
			}
		}
	}
}

// TestSerialRequestsRunOneAtATime: the serial requests of a session each start only after
// the previous one's response — also when that one failed to route — while another session's
// requests, sent at the same time, do not wait.
func TestSerialRequestsRunOneAtATime(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	serial := make([]*protocol.Request, 6)
	for j := range serial {
		name := "record"
		if j == 2 {
			name = "no_such_tool" // answered at once with NO_ROUTE; the next must still go
		}
		serial[j] = &protocol.Request{RequestID: fmt.Sprintf("ser_%d", j), Serial: true, ToolCalls: []protocol.ToolCall{
			{ToolCallID: "a", Name: name, Arguments: []byte(`{"delay_ms":60}`)}}}
	}
	free := make([]*protocol.Request, 6)
	for j := range free {
		free[j] = &protocol.Request{RequestID: fmt.Sprintf("free_%d", j), ToolCalls: []protocol.ToolCall{
			{ToolCallID: "a", Name: "record", Arguments: []byte(`{"delay_ms":60}`)}}}
	}
	// The free session shares the serial one's partition: waiting serial requests must not
	// hold up the partition.
	freeSession := ""
	for i := 0; freeSession == ""; i++ {
		if name := fmt.Sprintf("sess_free_%d", i); s.partitionOf(name) == s.partitionOf("sess_serial") {
			freeSession = name
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { s.publishRequests("sess_serial", serial) })
	wg.Go(func() { s.publishRequests(freeSession, free) })
	wg.Wait()
	s.waitResponses(len(serial) + len(free))
	s.drain()
	tls := s.timelines()
	ser, fr := tls["sess_serial"], tls[freeSession]
	for j := 1; j < len(serial); j++ {
		prev, cur := serial[j-1].RequestID, serial[j].RequestID
		started := ser.dispatched[cur]
		if j == 2 { // ser_2 is unrouted: it dispatches nothing; its NO_ROUTE result shows when it ran
			started = ser.results[cur]
		}
		if started == 0 || started < ser.answered[prev] {
			t.Fatalf("serial %s started at seq %d, before %s was answered at seq %d", cur, started, prev, ser.answered[prev])
		}
	}
	for id, n := range ser.responses {
		if n != 1 {
			t.Fatalf("%s: %d responses", id, n)
		}
	}
	// The free session did not wait for the serial one: all of its requests were dispatched
	// before the serial session's last was answered.
	last := ser.answered[serial[len(serial)-1].RequestID]
	for _, r := range free {
		if fr.dispatched[r.RequestID] == 0 || fr.dispatched[r.RequestID] > last {
			t.Fatalf("free request %s dispatched at %d, after the serial session ended at %d", r.RequestID, fr.dispatched[r.RequestID], last)
		}
	}
}
