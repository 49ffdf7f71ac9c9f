package bus_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// forgedResult publishes, as a tool worker's NATS user, a result of call c1 of request r1 on
// its subject, sealed with key (nil: unsealed) under id, under the genuine result's message id
// and, with first, only if the subject holds nothing yet — as an attacker racing the real
// worker would.
func forgedResult(t *testing.T, ctx context.Context, js jetstream.JetStream, name string, key ed25519.PrivateKey, id string, first bool) {
	t.Helper()
	res := &protocol.ToolResult{ToolCallID: "c1", Name: name, Status: protocol.ResultOK, Content: []byte(`{"forged":true}`), Attempts: 1}
	m, err := protocol.NewMessage(protocol.TypeToolResult, res)
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDToolResult("r1", "c1"), "r1", "s1"
	m.Sender = protocol.Sender{Role: protocol.RoleToolWorker, Instance: "the-real-one"}
	if key != nil {
		m.SealResult(key, id)
	}
	data, err := protocol.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	msg := &nats.Msg{Subject: protocol.SubjectResult("r1", "c1", "s1"), Data: data, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, m.MsgID)
	if first {
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	}
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatalf("the forged result was not stored: %v", err)
	}
}

// TestAForgedResultIsNeverTheCallsResult: with trusted result keys, a result published by a tool
// worker's user — unsealed, sealed by a stranger, or sealed by another tool's worker — before
// the genuine one (under its message id, so the genuine one's is spent) or after it, is never
// read as the call's result: the genuine worker records its result after it, and readers take
// the genuine one. Without trusted keys (before results were sealed), the forgery won.
func TestAForgedResultIsNeverTheCallsResult(t *testing.T) {
	t.Parallel()
	routerPub, routerKey, _ := ed25519.GenerateKey(rand.Reader)
	echoPub, echoKey, _ := ed25519.GenerateKey(rand.Reader)
	crmPub, crmKey, _ := ed25519.GenerateKey(rand.Reader)
	_, strangerKey, _ := ed25519.GenerateKey(rand.Reader)
	keys := protocol.ResultKeys{"router": {Key: routerPub}, "echo-worker": {Key: echoPub, Tools: []string{"echo"}},
		"crm-worker": {Key: crmPub, Tools: []string{"crm_lookup"}}}
	for _, c := range []struct {
		name  string
		key   ed25519.PrivateKey
		id    string
		claim string // the tool the forged result names
	}{
		{"unsealed", nil, "", "echo"},
		{"sealed by an unknown key", strangerKey, "stranger", "echo"},
		{"sealed by another tool's worker", crmKey, "crm-worker", "echo"},
		{"sealed by another tool's worker, naming its own tool", crmKey, "crm-worker", "crm_lookup"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s, _, ctx, attacker := planned(t)
			forgedResult(t, ctx, attacker, c.claim, c.key, c.id, true)

			w := workerBus(t, s, keys, "echo-worker", echoKey)
			rec, mine, err := w.RecordResult(ctx, bus.NewPublisher(w.JS, protocol.Sender{Role: protocol.RoleToolWorker, Instance: "w1"}), genuine(t), &protocol.ToolResult{ToolCallID: "c1", Name: "echo"})
			if err != nil || !mine {
				t.Fatalf("the genuine result was not recorded after the forged one: mine %v, %v", mine, err)
			}
			forgedResult(t, ctx, attacker, c.claim, c.key, c.id, false) // and one after it

			r := workerBus(t, s, keys, "router", routerKey)
			_, res, err := r.Result(ctx, "r1", "c1", "s1", "")
			if err != nil || string(res.Content) != `{"genuine":true}` {
				t.Fatalf("the router reads %+v, %v; want the genuine result", res, err)
			}
			got, err := r.Results(ctx, "r1", "s1", []string{"c1"}, nil, rec.Seq)
			if err != nil || got["c1"] == nil || got["c1"].Seq != rec.Seq {
				t.Fatalf("the batch read finds %+v, %v; want the genuine result at %d", got["c1"], err, rec.Seq)
			}
		})
	}
	t.Run("without trusted keys, the first result stands, forged or not", func(t *testing.T) {
		t.Parallel()
		_, admin, ctx, attacker := planned(t)
		forgedResult(t, ctx, attacker, "echo", nil, "", true)
		_, res, err := admin.Result(ctx, "r1", "c1", "s1", "")
		if err != nil || string(res.Content) != `{"forged":true}` {
			t.Fatalf("read %+v, %v", res, err)
		}
	})
}

// planned is a locked server with request r1's plan recorded (planOf), its admin's bus, a
// context for the test, and JetStream as a tool worker's user, the attacker.
func planned(t *testing.T) (*bustest.Server, *bus.Bus, context.Context, jetstream.JetStream) {
	t.Helper()
	s := bustest.NewLockedServer(t)
	admin := s.Provision(t, bus.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	planOf(t, ctx, admin)
	attacker, err := jetstream.New(s.ConnectAs(t, bus.RoleWorker))
	if err != nil {
		t.Fatal(err)
	}
	return s, admin, ctx, attacker
}

// planOf records request r1's plan: one call c1 of echo.
func planOf(t *testing.T, ctx context.Context, b *bus.Bus) {
	t.Helper()
	if _, _, err := b.CreatePlan(ctx, "r1", &bus.Plan{SessionID: "s1", CallIDs: []string{"c1"}, Names: []string{"echo"}}); err != nil {
		t.Fatal(err)
	}
}

func genuine(t *testing.T) *protocol.Message {
	t.Helper()
	res := &protocol.ToolResult{ToolCallID: "c1", Name: "echo", Status: protocol.ResultOK, Content: []byte(`{"genuine":true}`), Attempts: 1}
	m, err := protocol.NewMessage(protocol.TypeToolResult, res)
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDToolResult("r1", "c1"), "r1", "s1"
	return m
}

// workerBus is a bus of the admin user that seals results with key (named id) and trusts keys.
func workerBus(t *testing.T, s *bustest.Server, keys protocol.ResultKeys, id string, key ed25519.PrivateKey) *bus.Bus {
	t.Helper()
	b := s.Provision(t, bus.Config{NoProvision: true})
	b.SealResults(id, key)
	b.TrustResults(keys)
	return b
}

// TestWhatFollowsAResultHidesNothing: bytes that are no result, or a forged result, appended to
// a call's subject after its genuine result do not hide it — readers look past them — and a
// later writer (a cancellation, say) finds the genuine result before them rather than
// recording a second one.
func TestWhatFollowsAResultHidesNothing(t *testing.T) {
	t.Parallel()
	routerPub, routerKey, _ := ed25519.GenerateKey(rand.Reader)
	keys := protocol.ResultKeys{"router": {Key: routerPub}}
	s, _, ctx, attacker := planned(t)
	w := workerBus(t, s, keys, "router", routerKey)
	pub := bus.NewPublisher(w.JS, protocol.Sender{Role: protocol.RoleToolWorker, Instance: "w1"})
	rec, mine, err := w.RecordResult(ctx, pub, genuine(t), &protocol.ToolResult{ToolCallID: "c1", Name: "echo"})
	if err != nil || !mine {
		t.Fatalf("recording: %v %v", mine, err)
	}
	if _, err := attacker.Publish(ctx, protocol.SubjectResult("r1", "c1", "s1"), []byte("junk")); err != nil {
		t.Fatal(err)
	}
	forgedResult(t, ctx, attacker, "echo", nil, "", false)
	if _, err := attacker.Publish(ctx, protocol.SubjectResult("r1", "c1", "s1"), []byte("more junk")); err != nil {
		t.Fatal(err)
	}
	_, res, err := w.Result(ctx, "r1", "c1", "s1", "echo")
	if err != nil || string(res.Content) != `{"genuine":true}` {
		t.Fatalf("read %+v, %v; want the genuine result", res, err)
	}
	got, err := w.Results(ctx, "r1", "s1", []string{"c1"}, nil, rec.Seq)
	if err != nil || got["c1"] == nil || got["c1"].Seq != rec.Seq {
		t.Fatalf("the batch read finds %+v, %v; want the genuine result at %d", got["c1"], err, rec.Seq)
	}
	cancelled := genuine(t)
	cancelled.Payload, _ = msgpackResult(&protocol.ToolResult{ToolCallID: "c1", Name: "echo", Status: protocol.ResultError, ErrorCode: protocol.CodeCancelled})
	have, mine, err := w.RecordResult(ctx, bus.NewPublisher(w.JS, protocol.Sender{Role: protocol.RoleGateway, Instance: "g1"}), cancelled, &protocol.ToolResult{ToolCallID: "c1", Name: "echo"})
	if err != nil || mine || have.Seq != rec.Seq {
		t.Fatalf("a cancellation after the result: mine %v, at %v, %v; want the genuine result at %d to stand", mine, have, err, rec.Seq)
	}
}

func msgpackResult(r *protocol.ToolResult) ([]byte, error) {
	m, err := protocol.NewMessage(protocol.TypeToolResult, r)
	if err != nil {
		return nil, err
	}
	return m.Payload, nil
}
