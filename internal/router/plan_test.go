package router

import (
	"testing"

	"github.com/hermesbus/hermes/pkg/protocol"
)

func TestPlanRoundTrip(t *testing.T) {
	m := &protocol.Message{MsgID: "request:r1", RequestID: "r1", SessionID: "s1", Trace: protocol.TraceContext{TraceID: "t"}}
	p := newPlan(m, &protocol.Request{RequestID: "r1", ToolCalls: []protocol.ToolCall{{ToolCallID: "a", Name: "x"}, {ToolCallID: "b", Name: "y"}}})
	b, err := p.encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodePlan(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.SessionID != "s1" || len(got.CallIDs) != 2 || got.CallIDs[1] != "b" || got.Names[0] != "x" || got.Trace.TraceID != "t" || got.RequestMsg != "request:r1" {
		t.Fatalf("plan %+v", got)
	}
}

// FuzzDecodePlan: a plan read back from KV never panics the router, whatever the bytes.
func FuzzDecodePlan(f *testing.F) {
	m := &protocol.Message{MsgID: "request:r1", RequestID: "r1", SessionID: "s1"}
	good, _ := newPlan(m, &protocol.Request{RequestID: "r1", ToolCalls: []protocol.ToolCall{{ToolCallID: "a", Name: "x"}}}).encode()
	f.Add(good)
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x81, 0xa8, 'c', 'a', 'l', 'l', '_', 'i', 'd', 's', 0xdd, 0x7f, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := decodePlan(data)
		if err == nil && p == nil {
			t.Fatal("nil plan without error")
		}
	})
}
