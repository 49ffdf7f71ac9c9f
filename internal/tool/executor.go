package tool

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Call is one try of a tool call handed to an Executor.
type Call struct {
	RequestID   string
	SessionID   string
	Trace       protocol.TraceContext
	Attempt     int
	Dispatch    *protocol.Dispatch
	MaxAttempts int
}

// IdempotencyKey is the same for every try of one call.
func (c *Call) IdempotencyKey() string { return c.RequestID + "/" + c.Dispatch.Call.ToolCallID }

// Outcome is what one try produced.
type Outcome struct {
	// Result holds status, content, execution time and, for errors, code, origin and hint.
	// The worker fills in the call id, name, route and attempts.
	Result protocol.ToolResult
	// Retryable marks a failure another try may fix.
	Retryable bool
	// RetryAfter is a lower bound for the next try's delay asked for by the tool (Retry-After).
	RetryAfter time.Duration
}

// Executor runs one try of a call of one action kind. It returns an error only when the try
// could not be judged (e.g. ctx was cancelled by shutdown); every tool failure is an Outcome.
type Executor interface {
	Execute(ctx context.Context, call *Call) (Outcome, error)
}

func failure(code, origin, hint string, content any, retryable bool) Outcome {
	return Outcome{Result: protocol.ToolResult{
		Status: protocol.ResultError, Content: mustJSON(content), ErrorCode: code, ErrorOrigin: origin, RecoveryHint: hint,
	}, Retryable: retryable}
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(fmt.Sprint(v))
	}
	return b
}

// unsupported answers calls of an action kind this worker cannot run.
type unsupported struct{ kind string }

func (u unsupported) Execute(_ context.Context, c *Call) (Outcome, error) {
	return failure(protocol.CodeActionUnsupported, protocol.OriginHermes,
		fmt.Sprintf("route %s uses a %q action, which no Hermes tool worker runs yet; route the tool over http", c.Dispatch.Route, u.kind),
		fmt.Sprintf("action kind %q is not supported", u.kind), false), nil
}
