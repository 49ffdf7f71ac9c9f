package worker

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/protocol"
)

var _ Executor = unsupported{}

func TestCallIdempotencyKey(t *testing.T) {
	t.Parallel()
	c := &Call{RequestID: "req-7", Attempt: 1, Dispatch: &protocol.Dispatch{Call: protocol.ToolCall{ToolCallID: "call_3"}}}
	first := c.IdempotencyKey()
	if first != "req-7/call_3" {
		t.Errorf("IdempotencyKey() = %q, want %q", first, "req-7/call_3")
	}
	c.Attempt = 4
	if again := c.IdempotencyKey(); again != first {
		t.Errorf("IdempotencyKey() on try 4 = %q, want the same key as try 1, %q", again, first)
	}
}

func TestUnsupportedExecutor(t *testing.T) {
	t.Parallel()
	c := &Call{RequestID: "req-1", Attempt: 1, Dispatch: &protocol.Dispatch{
		Call:   protocol.ToolCall{ToolCallID: "call_1", Name: "lookup", Arguments: json.RawMessage(`{}`)},
		Route:  "grpc-lookup",
		Action: protocol.Action{Kind: protocol.ActionGRPC, GRPC: &protocol.GRPCAction{Service: "svc.Lookup", Method: "Get"}},
	}}
	out, err := unsupported{kind: protocol.ActionGRPC}.Execute(t.Context(), c)
	if err != nil {
		t.Fatalf("Execute error: %v", err)
	}
	r := out.Result
	if r.Status != protocol.ResultError || r.ErrorCode != protocol.CodeActionUnsupported || r.ErrorOrigin != protocol.OriginHermes {
		t.Errorf("result = %s/%s/%s, want error/%s/%s", r.Status, r.ErrorCode, r.ErrorOrigin, protocol.CodeActionUnsupported, protocol.OriginHermes)
	}
	if out.Retryable {
		t.Error("an unsupported action is retryable; no later try can succeed")
	}
	for _, want := range []string{"grpc-lookup", `"grpc"`} {
		if !strings.Contains(r.RecoveryHint, want) {
			t.Errorf("recovery hint %q does not mention %s", r.RecoveryHint, want)
		}
	}
	var content string
	if err := json.Unmarshal(r.Content, &content); err != nil || !strings.Contains(content, "grpc") {
		t.Errorf("content = %s, want a JSON string naming the kind", r.Content)
	}
}

// A call's arguments get the route's captures under the names they do not use: an argument of
// the same name wins over a capture.
func TestCallArgumentsTakeTheRoutesCaptures(t *testing.T) {
	t.Parallel()
	c := &Call{Dispatch: &protocol.Dispatch{Call: protocol.ToolCall{Arguments: json.RawMessage(`{"name":"赵六","n":1}`)},
		Params: map[string]string{"name": "李四", "match_1": "保单"}}}
	args, err := c.Arguments()
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(args)
	if string(got) != `{"match_1":"保单","n":1,"name":"赵六"}` {
		t.Errorf("arguments %s", got)
	}
	c.Dispatch.Call.Arguments = nil
	if args, err := c.Arguments(); err != nil || string(args["name"]) != `"李四"` {
		t.Errorf("without arguments: %s %v", args, err)
	}
	c.Dispatch.Call.Arguments = json.RawMessage(`[1]`)
	if _, err := c.Arguments(); err == nil {
		t.Error("arguments that are no JSON object were taken")
	}
}
