package summarize

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// A summary names stream sequences of its session's stream: one moved from another stream
// (bus.Restream) names the old stream's, and is taken as none — the session is summarized
// afresh — while one written here is taken.
func TestLatestTakesNoSummaryMovedFromAnotherStream(t *testing.T) {
	ctx := context.Background()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{})
	put := func(session string, through uint64, moved bool) {
		m, err := protocol.NewMessage(protocol.TypeLLMSummary, &protocol.LLMSummary{Through: through, Messages: 2, New: 2, Text: "s"})
		if err != nil {
			t.Fatal(err)
		}
		m.MsgID, m.RequestID, m.SessionID = "sum-"+session, "summary-"+session, session
		data, err := protocol.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		msg := &nats.Msg{Subject: protocol.SubjectEvent(protocol.EventSummary, session), Data: data, Header: nats.Header{jetstream.MsgIDHeader: {m.MsgID}}}
		if moved {
			msg.Header.Set(bus.HeaderRestreamed, "HERMES_1:40@2026-12-07T00:00:00Z")
		}
		if _, err := b.JS.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	// Something stored before the summaries, which they cover.
	if _, err := b.JS.Publish(ctx, protocol.SubjectEvent(protocol.EventLLM, "earlier"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	put("here", 1, false)
	put("moved", 1, true)
	if s, seq, err := Latest(ctx, b.JS, "here"); err != nil || s == nil || seq == 0 {
		t.Errorf("a summary written here: %v, %d, %v", s, seq, err)
	}
	if s, seq, err := Latest(ctx, b.JS, "moved"); err != nil || s != nil || seq == 0 {
		t.Errorf("a summary moved here: %v, %d, %v; want none, at its sequence", s, seq, err)
	}
}
