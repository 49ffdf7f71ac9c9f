package integration

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/router"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// With routers sealing their calls and workers trusting only their key, a tool call forged by
// another client of the bus — here aimed at the recording tool with a header the route never
// had — is dropped: never run, no result recorded for its ids (which would pre-empt a genuine
// one), counted. A copy of a genuine call with its action changed is dropped too. Genuine calls
// run as before.
func TestForgedToolCallsAreDropped(t *testing.T) {
	t.Parallel()
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	s := start(t, options{workers: 1, seal: &router.SealKey{ID: "r1", Key: priv}})
	resp := s.route(map[string]any{"request_id": "sealed_1", "tool_calls": []map[string]any{call("c1", "record", map[string]any{})}})
	if resp.Status != protocol.StatusSuccess {
		t.Fatalf("a genuine call: %+v", resp)
	}
	if len(s.recorder.tries("sealed_1/c1")) != 1 {
		t.Fatal("the genuine call did not reach the tool")
	}

	_, b := s.connect()
	pub := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: "forger"})
	ctx := context.Background()
	forge := func(requestID string, seal func(*protocol.Message)) {
		m, err := protocol.NewMessage(protocol.TypeToolCall, &protocol.Dispatch{Call: protocol.ToolCall{ToolCallID: "c1", Name: "record", Arguments: []byte(`{}`)},
			Route: "record", Action: protocol.Action{Kind: protocol.ActionHTTP, TimeoutMS: 2000, Retry: protocol.RetryPolicy{MaxAttempts: 1, BackoffFactor: 1},
				HTTP: &protocol.HTTPAction{URL: "http://127.0.0.1:8082/record", Method: "POST", Headers: map[string]string{"X-Forged": "yes"}}}})
		if err != nil {
			t.Fatal(err)
		}
		m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDToolCall(requestID, "c1"), requestID, requestID
		m.Recipient = bus.ToolConsumer(protocol.ActionHTTP, "record")
		if seal != nil {
			seal(m)
		}
		if _, err := pub.Publish(ctx, protocol.SubjectToolCall(protocol.ActionHTTP, "record", requestID), m); err != nil {
			t.Fatal(err)
		}
	}
	forge("forged_1", nil) // unsealed
	_, other, _ := ed25519.GenerateKey(nil)
	forge("forged_2", func(m *protocol.Message) { m.SealWith(other, "r1", time.Now().Add(time.Hour)) }) // another key under the trusted id
	forge("forged_3", func(m *protocol.Message) {                                                       // a genuine seal, another payload
		m.SealWith(priv, "r1", time.Now().Add(time.Hour))
		m.Payload = append(m.Payload[:len(m.Payload):len(m.Payload)], 0xc0)
	})
	waitFor(t, "the worker to drop three forged calls", func() bool { return s.workers[0].RefusedCalls() >= 3 })
	for _, id := range []string{"forged_1", "forged_2", "forged_3"} {
		if n := len(s.recorder.tries(id + "/c1")); n != 0 {
			t.Errorf("%s reached the tool %d times", id, n)
		}
		_, err := b.Stream.GetLastMsgForSubject(ctx, protocol.SubjectResult(id, "c1", id))
		if !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Errorf("%s: a result was recorded for the forged ids: %v", id, err)
		}
	}
	// And the bus goes on: another genuine call runs.
	if resp := s.route(map[string]any{"request_id": "sealed_2", "tool_calls": []map[string]any{call("c1", "record", map[string]any{})}}); resp.Status != protocol.StatusSuccess {
		t.Fatalf("a genuine call after the forged ones: %+v", resp)
	}
}

// A response announced on hermes.live.response.<request>.<session> that the record does not
// hold (published there by a client with the right to, or delivered there by a consumer) is
// never handed to the caller waiting on POST /v1/route: the gateway hands out the record's
// response only. A client user of the bus cannot publish a response at all.
func TestForgedResponsesNeverReachTheCaller(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	type answer struct {
		status int
		body   []byte
	}
	got := make(chan answer, 1)
	go func() {
		status, _, body := s.post(request("forged_resp_1", "", call("c1", "echo", map[string]any{"delay_ms": 1500})), "")
		got <- answer{status, body}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, b := s.connect()
	waitFor(t, "the request accepted", func() bool { _, err := b.Plan(ctx, "forged_resp_1"); return err == nil })
	plan, err := b.Plan(ctx, "forged_resp_1")
	if err != nil {
		t.Fatal(err)
	}
	forged := &protocol.Response{RequestID: "forged_resp_1", SessionID: plan.SessionID, Status: protocol.StatusSuccess,
		Results: []protocol.ToolResult{{ToolCallID: "c1", Name: "echo", Status: protocol.ResultOK, Content: []byte(`{"forged":true}`)}}}
	m, err := protocol.NewMessage(protocol.TypeResponse, forged)
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDResponse("forged_resp_1"), "forged_resp_1", plan.SessionID
	data, err := protocol.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.JS.Conn().Publish(protocol.SubjectLiveResponse("forged_resp_1", plan.SessionID), data); err != nil {
		t.Fatal(err)
	}
	// The client user may not even try to record one.
	nc := s.srv.ConnectAs(t, bus.RoleClient)
	s.violating = true
	if err := nc.Publish(protocol.SubjectResponse("forged_resp_1", plan.SessionID), data); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	a := <-got
	if a.status != 200 {
		t.Fatalf("HTTP %d: %s", a.status, a.body)
	}
	resp := decodeResponse(t, a.body)
	if r := result(t, resp, "c1"); bytes.Contains(r.Content, []byte("forged")) || r.Status != protocol.ResultOK {
		t.Fatalf("the caller got the forged response: %+v %s", r, r.Content)
	}
	if _, genuine, err := b.Response(ctx, "forged_resp_1", plan.SessionID); err != nil || bytes.Contains(genuine.Results[0].Content, []byte("forged")) {
		t.Fatalf("the record holds %+v (%v)", genuine, err)
	}
}
