package protocol_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// The sandbox's sessions are its own: no caller's request may be recorded in one (where it
// would pass for a sandbox's case), and a sandbox request calls only the tool it tries, under
// that tool's sandbox session, its probe one of its calls.
func TestSandboxSessionsAreReserved(t *testing.T) {
	call := []protocol.ToolCall{{ToolCallID: "c", Name: "order_query", Arguments: json.RawMessage(`{}`)}}
	for _, r := range []protocol.Request{
		{RequestID: "r1", SessionID: "sandbox-order_query", ToolCalls: call},
		{RequestID: "sandbox-x", ToolCalls: call},
	} {
		if err := r.Validate(protocol.Limits{}); err == nil || !strings.Contains(err.Error(), "sandbox") {
			t.Errorf("%+v: %v", r, err)
		}
	}
	sb := &protocol.Sandbox{Tool: "order_query", Revision: 3, Probe: "c"}
	good := protocol.Request{RequestID: "sandbox-order_query-3", SessionID: "sandbox-order_query", ToolCalls: call, Sandbox: sb}
	if err := good.Validate(protocol.Limits{}); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]func(r *protocol.Request){
		"another tool's session": func(r *protocol.Request) { r.SessionID = "sandbox-echo" },
		"another tool called":    func(r *protocol.Request) { r.ToolCalls = []protocol.ToolCall{{ToolCallID: "c", Name: "echo"}} },
		"a probe of no call":     func(r *protocol.Request) { r.Sandbox = &protocol.Sandbox{Tool: "order_query", Probe: "zz"} },
	} {
		r := good
		bad(&r)
		if err := r.Validate(protocol.Limits{}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A caller cannot make its request a sandbox one (whose calls skip the input check): the edge
// does not take the field.
func TestACallerCannotAskForTheSandbox(t *testing.T) {
	_, err := protocol.DecodeRequestJSON([]byte(`{"request_id":"r","tool_calls":[{"tool_call_id":"c","name":"pay","arguments":{"amount":-5}}],
		"sandbox":{"tool":"pay","revision":1}}`), protocol.Limits{})
	if err == nil || !strings.Contains(err.Error(), "sandbox") {
		t.Fatalf("decoded: %v", err)
	}
}
