package record

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

var t0 = time.Date(2026, 3, 16, 12, 0, 1, 123e6, time.UTC)

// encode builds and encodes a message of typ carrying payload in request req_abc of session s1.
func encode(t testing.TB, typ protocol.Type, payload any, sender string) []byte {
	t.Helper()
	m, err := protocol.NewMessage(typ, payload)
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = "msg-"+string(typ), "req_abc", "s1"
	m.Sender = protocol.Sender{Role: "test", Instance: sender}
	data, err := protocol.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// entry round-trips a message through the bus codec, as Read delivers it.
func entry(t testing.TB, seq uint64, ms int, typ protocol.Type, payload any, sender string) *Entry {
	t.Helper()
	e := Decode(seq, "hermes.x.s1", t0.Add(time.Duration(ms)*time.Millisecond), encode(t, typ, payload, sender))
	if e.Err != nil {
		t.Fatalf("decode %s: %v", typ, e.Err)
	}
	return e
}

func sampleRequest() *protocol.Request {
	return &protocol.Request{RequestID: "req_abc", SessionID: "s1", Intent: "查询王五的保单", ToolCalls: []protocol.ToolCall{
		{ToolCallID: "call_1", Name: "get_policy_status", Arguments: json.RawMessage(`{"policy_id":"P1"}`)},
		{ToolCallID: "call_2", Name: "weather_search", Arguments: json.RawMessage(`{"city":"北京"}`)},
	}}
}

func sampleDispatch() *protocol.Dispatch {
	return &protocol.Dispatch{Call: sampleRequest().ToolCalls[0], Route: "policy_status", Params: map[string]string{"name": "王五"},
		Action: protocol.Action{Kind: protocol.ActionHTTP, TimeoutMS: 4000,
			Retry: protocol.RetryPolicy{MaxAttempts: 3, BackoffFactor: 2, InitialIntervalMS: 100, MaxIntervalMS: 10000},
			HTTP:  &protocol.HTTPAction{URL: "http://policy:8000/v1/status", Method: "GET"}}}
}
