package integration

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/router"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// TestForgedResultsAreRefused is the attack of a tool worker's credential on another session's
// call: while the call runs, a client with the toolworker NATS user publishes a result for it
// on its result subject, first (expected last subject sequence 0) and under the genuine
// result's message id. Unsealed, sealed by another tool's worker for the call's tool, or sealed
// by it under its own tool's name, the forged result is refused by the router (a dead letter
// says why) and never aggregated: the caller gets the tool's own answer, recorded after it.
func TestForgedResultsAreRefused(t *testing.T) {
	t.Parallel()
	_, routerKey, _ := ed25519.GenerateKey(nil)
	crmPub, crmKey, _ := ed25519.GenerateKey(nil)
	s := start(t, options{workers: 1, seal: &router.SealKey{ID: "r1", Key: routerKey},
		resultKeys: protocol.ResultKeys{"crm-worker": {Key: crmPub, Tools: []string{"crm_lookup"}}}})
	attacker, err := jetstream.New(s.srv.ConnectAs(t, bus.RoleWorker))
	if err != nil {
		t.Fatal(err)
	}
	for i, forge := range []struct {
		name string
		seal func(*protocol.Message)
		tool string
	}{
		{"unsealed", nil, "echo"},
		{"sealed by another tool's worker", func(m *protocol.Message) { m.SealResult(crmKey, "crm-worker") }, "echo"},
		{"sealed by another tool's worker, naming its tool", func(m *protocol.Message) { m.SealResult(crmKey, "crm-worker") }, "crm_lookup"},
	} {
		t.Run(forge.name, func(t *testing.T) {
			if forge.seal != nil {
				variant(t, "pkg/bus's TestAForgedResultIsNeverTheCallsResult (a result sealed by another tool's worker never counts) and the unsealed case here")
			}
			t.Parallel()
			id := fmt.Sprintf("forge_%d", i)
			done := make(chan *protocol.Response, 1)
			go func() {
				done <- s.route(request(id, "", call("c1", "echo", map[string]any{"who": "genuine", "delay_ms": 1500})))
			}()
			waitFor(t, "the call to be dispatched", func() bool {
				for _, m := range s.stored() {
					if m.Subject == protocol.SubjectToolCall(protocol.ActionHTTP, "echo", id) {
						return true
					}
				}
				return false
			})
			res := &protocol.ToolResult{ToolCallID: "c1", Name: forge.tool, Status: protocol.ResultOK, Content: []byte(`{"who":"forger"}`), Attempts: 1}
			m, err := protocol.NewMessage(protocol.TypeToolResult, res)
			if err != nil {
				t.Fatal(err)
			}
			m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDToolResult(id, "c1"), id, id
			m.Correlation = &protocol.Correlation{CallIDs: []string{"c1"}}
			if forge.seal != nil {
				forge.seal(m)
			}
			data, err := protocol.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			msg := &nats.Msg{Subject: protocol.SubjectResult(id, "c1", id), Data: data, Header: nats.Header{}}
			msg.Header.Set(jetstream.MsgIDHeader, m.MsgID)
			msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
			if _, err := attacker.PublishMsg(s.ctx, msg); err != nil {
				t.Fatalf("the forged result was not stored: %v", err)
			}
			var resp *protocol.Response
			select {
			case resp = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("no response")
			}
			got := result(t, resp, "c1")
			var content map[string]any
			_ = json.Unmarshal(got.Content, &content)
			if got.Status != protocol.ResultOK || content["who"] != "genuine" {
				t.Fatalf("the caller got %s %s; want the tool's own answer", got.Status, got.Content)
			}
			waitFor(t, "a dead letter saying why the forged result was refused", func() bool {
				for _, d := range s.deadLetters() {
					if strings.Contains(d.Header.Get("Hermes-Dlq-Reason"), "refused result of "+id+"/c1") {
						return true
					}
				}
				return false
			})
		})
	}
}
