package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Executor runs one try of a call of one action kind.
type Executor interface {
	// Kind is the action kind it runs (protocol.ActionHTTP, protocol.ActionGo, …). A worker
	// pulls only calls of the kinds its executors run.
	Kind() string
	// Execute runs one try. It returns an error only when the try could not be judged — its
	// context ended (shutdown, or the request was cancelled), or the executor itself failed;
	// such a call is tried again later or answered by whoever ended it. Every failure of the
	// tool is an Outcome. It must return soon after ctx ends, and honour the call's Timeout
	// and MaxResultBytes (the conformance suite in workertest checks all of it).
	Execute(ctx context.Context, call *Call) (Outcome, error)
}

// Tools is implemented by executors that serve a fixed set of tools (Go functions, say): a
// worker serves exactly those for the executor's kind. An executor without it runs whatever
// tool its calls name (HTTP: the URL travels in the call).
type Tools interface {
	Tools() []string
}

// ToolSet is implemented by executors whose tools change while they run (an MCP server's
// list): of the tools of its kind that have a consumer, a worker serves those Has reports,
// looking again at the others whenever Changed is closed. A tool once served stays served (a
// call that finds it gone again is the executor's to answer).
type ToolSet interface {
	Has(tool string) bool
	Changed() <-chan struct{}
}

// Call is one try of a tool call handed to an Executor.
type Call struct {
	RequestID string
	SessionID string
	Trace     protocol.TraceContext
	// Attempt numbers this try, from 1; MaxAttempts is the route's limit.
	Attempt     int
	MaxAttempts int
	// Dispatch is the call with the action resolved by the router.
	Dispatch *protocol.Dispatch
	// Timeout bounds this try (the route's timeout_ms); ctx carries it as a deadline too.
	Timeout time.Duration
	// MaxResultBytes bounds the tool's answer; a larger one is RESULT_TOO_LARGE.
	MaxResultBytes int64
}

// IdempotencyKey is the same for every try of one call: <request_id>/<tool_call_id>.
func (c *Call) IdempotencyKey() string { return c.RequestID + "/" + c.Dispatch.Call.ToolCallID }

// TryTimeout is how long this try may take: Timeout, else the route's timeout_ms (at least
// 1 ms), for an executor run without the Timeout middleware.
func (c *Call) TryTimeout() time.Duration {
	if c.Timeout > 0 {
		return c.Timeout
	}
	return time.Duration(max(c.Dispatch.Action.TimeoutMS, 1)) * time.Millisecond
}

// ResultLimit is the largest answer this try takes: MaxResultBytes, else
// DefaultMaxResultBytes.
func (c *Call) ResultLimit() int64 {
	if c.MaxResultBytes > 0 {
		return c.MaxResultBytes
	}
	return DefaultMaxResultBytes
}

// Tool is the called tool's name.
func (c *Call) Tool() string { return c.Dispatch.Call.Name }

// Arguments are the call's JSON arguments, with the route's captures added under names the
// arguments do not use.
func (c *Call) Arguments() (map[string]json.RawMessage, error) {
	args := map[string]json.RawMessage{}
	if len(c.Dispatch.Call.Arguments) > 0 {
		if err := json.Unmarshal(c.Dispatch.Call.Arguments, &args); err != nil {
			return nil, fmt.Errorf("arguments must be a JSON object: %v", err)
		}
		if args == nil {
			args = map[string]json.RawMessage{}
		}
	}
	for k, v := range c.Dispatch.Params {
		if _, ok := args[k]; !ok {
			b, _ := json.Marshal(v)
			args[k] = b
		}
	}
	return args, nil
}

// Outcome is what one try produced.
type Outcome struct {
	// Result holds status, content, execution time and, for errors, code, origin and hint.
	// The worker fills in the call id, name, route and attempts.
	Result protocol.ToolResult
	// Retryable marks a failure another try may fix.
	Retryable bool
	// RetryAfter is a lower bound for the next try's delay asked for by the tool (Retry-After).
	RetryAfter time.Duration
	// Answered says whether Result holds what the tool itself said, for its contract to
	// judge (CheckContracts).
	Answered Answered
}

// OK is a successful outcome with content (a JSON value) that took took.
func OK(content json.RawMessage, took time.Duration) Outcome {
	return Outcome{Result: protocol.ToolResult{Status: protocol.ResultOK, Content: content, ExecutionTimeMS: took.Milliseconds()}}
}

// Failed is a failed outcome (protocol.ErrorResult): code, who failed, a hint for the caller,
// the content, and whether another try may succeed.
func Failed(code, origin, hint string, content any, retryable bool) Outcome {
	return Outcome{Result: protocol.ErrorResult(code, origin, hint, content), Retryable: retryable}
}

// ErrCancelled is the cause of a try's context when its request was cancelled.
var ErrCancelled = errors.New("worker: the request was cancelled")

// unsupported answers calls of an action kind this worker cannot run, or that came through
// another kind's consumer.
type unsupported struct{ kind string }

func (u unsupported) Kind() string { return u.kind }

func (u unsupported) Execute(_ context.Context, c *Call) (Outcome, error) {
	return Failed(protocol.CodeActionUnsupported, protocol.OriginHermes,
		fmt.Sprintf("route %s uses a %q action, which no Hermes tool worker runs yet; route the tool over http", c.Dispatch.Route, u.kind),
		fmt.Sprintf("action kind %q is not supported", u.kind), false), nil
}
