package record

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// publishRequest publishes request req of session as the gateway would, and returns its sequence.
func publishRequest(t testing.TB, pub *bus.Publisher, session, req string) uint64 {
	t.Helper()
	m, err := protocol.NewMessage(protocol.TypeRequest, &protocol.Request{RequestID: req, SessionID: session, Intent: "x",
		ToolCalls: []protocol.ToolCall{{ToolCallID: "c", Name: "echo", Arguments: json.RawMessage(`{}`)}}})
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDRequest(req), req, session
	ack, err := pub.Publish(context.Background(), protocol.SubjectRequest(session), m)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

func recent(t testing.TB, js jetstream.JetStream, limit int) []Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got, err := RecentSessions(ctx, js, limit, "")
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestRecentSessions(t *testing.T) {
	t.Parallel()
	js, pub := newRecord(t)
	if got := recent(t, js, 10); len(got) != 0 {
		t.Fatalf("empty record: %+v", got)
	}
	publishRequest(t, pub, "a", "a1")
	publishRequest(t, pub, "b", "b1")
	publishStarted(t, pub, "a", "a1", 1) // not a request: does not count
	publishRequest(t, pub, "a", "a2")
	lastC := publishRequest(t, pub, "c", "c1")
	// A request published without Hermes' headers (another program): its id is read from it.
	m, _ := protocol.NewMessage(protocol.TypeRequest, &protocol.Request{RequestID: "d1", SessionID: "d", Intent: "x",
		ToolCalls: []protocol.ToolCall{{ToolCallID: "c", Name: "echo", Arguments: json.RawMessage(`{}`)}}})
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDRequest("d1"), "d1", "d"
	data, _ := protocol.Marshal(m)
	if _, err := js.Publish(context.Background(), protocol.SubjectRequest("d"), data); err != nil {
		t.Fatal(err)
	}
	got := recent(t, js, 10)
	type row struct {
		id, last string
		n        uint64
	}
	var rows []row
	for _, s := range got {
		rows = append(rows, row{s.ID, s.LastRequestID, s.Requests})
		if s.LastAt.IsZero() || s.LastSeq == 0 {
			t.Errorf("session %s without time or seq: %+v", s.ID, s)
		}
	}
	want := []row{{"d", "d1", 1}, {"c", "c1", 1}, {"a", "a2", 2}, {"b", "b1", 1}}
	if fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Fatalf("sessions %v, want %v", rows, want)
	}
	if got[1].LastSeq != lastC {
		t.Errorf("c: last seq %d, want %d", got[1].LastSeq, lastC)
	}
	if got := recent(t, js, 2); len(got) != 2 || got[0].ID != "d" || got[1].ID != "c" {
		t.Fatalf("limit 2: %+v", got)
	}
	if got := recent(t, js, 3); len(got) != 3 || got[2].ID != "a" {
		t.Fatalf("limit 3: %+v", got)
	}
}

// BenchmarkRecentSessions lists the 50 and the 500 most recent of 5,000 sessions (two requests
// each), as GET /v1/sessions does.
func BenchmarkRecentSessions(b *testing.B) {
	js, _ := newRecord(b)
	const sessions = 5000
	ctx := context.Background()
	pub := bus.NewPublisher(js, protocol.Sender{Role: "bench"})
	for round := range 2 {
		for i := range sessions {
			session := fmt.Sprintf("sess_%05d", i)
			req := fmt.Sprintf("%s_%d", session, round)
			m, _ := protocol.NewMessage(protocol.TypeRequest, &protocol.Request{RequestID: req, SessionID: session,
				Intent: "x", ToolCalls: []protocol.ToolCall{{ToolCallID: "c", Name: "echo", Arguments: json.RawMessage(`{}`)}}})
			m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDRequest(req), req, session
			if _, err := pub.Publish(ctx, protocol.SubjectRequest(session), m); err != nil {
				b.Fatal(err)
			}
		}
	}
	if si, err := js.Stream(ctx, protocol.StreamName); err != nil || si.CachedInfo().State.Msgs != 2*sessions {
		b.Fatalf("stream holds %+v (%v)", si.CachedInfo().State, err)
	}
	for _, limit := range []int{50, 500} {
		b.Run(fmt.Sprintf("limit=%d", limit), func(b *testing.B) {
			for b.Loop() {
				got := recent(b, js, limit)
				if len(got) != limit || got[0].ID != fmt.Sprintf("sess_%05d", sessions-1) || got[0].Requests != 2 {
					b.Fatalf("%d sessions, first %+v", len(got), got[0])
				}
			}
		})
	}
}
