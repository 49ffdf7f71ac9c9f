package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Func is a tool written as a Go function: it gets the call's arguments (a JSON object) and
// returns a value encoded as the result's JSON content, or an error. A *ToolError says how the
// call failed; any other error is TOOL_FAILED and not retried. It should return once ctx
// ends: the try ends then anyway (TOOL_TIMEOUT at its deadline), and a function still running
// is left to finish on its own, its answer dropped. A panic is a failed try, tried again.
type Func func(ctx context.Context, args json.RawMessage) (any, error)

// ToolError is a failure a Func reports about its call.
type ToolError struct {
	// Code is the tool's own error code, kept in tool_error_code when protocol.ToolCode takes
	// it; error_code is TOOL_FAILED (error_origin "tool").
	Code string
	// Hint tells the caller what to do about it.
	Hint string
	// Retryable marks a failure another try may fix.
	Retryable bool
	// Err is the failure itself; its text becomes the result's content.
	Err error
}

func (e *ToolError) Error() string {
	if e.Err == nil {
		return e.Code
	}
	return e.Err.Error()
}

func (e *ToolError) Unwrap() error { return e.Err }

// Funcs runs tools written as Go functions in this process: calls of kind protocol.ActionGo.
// It serves exactly the tools it holds (Tools).
type Funcs struct {
	funcs map[string]Func
}

var (
	_ Executor = (*Funcs)(nil)
	_ Tools    = (*Funcs)(nil)
)

// NewFuncs returns an executor for the tools in funcs, by name; names must be valid tool names.
func NewFuncs(funcs map[string]Func) (*Funcs, error) {
	f := &Funcs{funcs: make(map[string]Func, len(funcs))}
	for name, fn := range funcs {
		if err := protocol.CheckToolName("tool", name); err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
		if fn == nil {
			return nil, fmt.Errorf("worker: tool %s has no function", name)
		}
		f.funcs[name] = fn
	}
	return f, nil
}

// Kind is protocol.ActionGo.
func (f *Funcs) Kind() string { return protocol.ActionGo }

// Tools lists the tools f serves, sorted.
func (f *Funcs) Tools() []string {
	names := make([]string, 0, len(f.funcs))
	for n := range f.funcs {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Execute runs the call's function.
func (f *Funcs) Execute(ctx context.Context, call *Call) (Outcome, error) {
	if ctx.Err() != nil {
		return Outcome{}, context.Cause(ctx)
	}
	fn, ok := f.funcs[call.Tool()]
	if !ok {
		return Failed(protocol.CodeActionUnsupported, protocol.OriginHermes,
			fmt.Sprintf("this worker serves the Go tools %v, not %s; check which program serves it", f.Tools(), call.Tool()),
			fmt.Sprintf("no Go tool %s here", call.Tool()), false), nil
	}
	args := call.Dispatch.Call.Arguments
	if len(call.Dispatch.Params) > 0 {
		merged, err := call.Arguments()
		if err != nil {
			return Failed(protocol.CodeBadArguments, protocol.OriginHermes, "send the arguments as a JSON object", err.Error(), false), nil
		}
		args, _ = json.Marshal(merged)
	}
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	// The function runs on its own goroutine, so a try ends at its deadline (or shutdown, or
	// cancellation) even when the function ignores ctx: it is then left to finish on its own,
	// and what it returns is dropped.
	done := make(chan funcAnswer, 1)
	go func() {
		start := time.Now()
		defer func() {
			if p := recover(); p != nil {
				done <- funcAnswer{err: fmt.Errorf("worker: Go tool %s panicked: %v\n%s", call.Tool(), p, debug.Stack()), panicked: true}
			}
		}()
		v, err := fn(ctx, args)
		done <- funcAnswer{v: v, err: err, took: time.Since(start)}
	}()
	var a funcAnswer
	select {
	case a = <-done:
	case <-ctx.Done():
		return Outcome{}, context.Cause(ctx)
	}
	if a.panicked {
		return Outcome{}, a.err // not judged: the call is tried again, and given up in the end
	}
	if a.err != nil {
		if ctx.Err() != nil && (errors.Is(a.err, ctx.Err()) || errors.Is(a.err, context.Cause(ctx))) {
			return Outcome{}, a.err // the try ended with its context: not the tool's failure
		}
		out := funcFailure(a.err)
		out.Result.ExecutionTimeMS = a.took.Milliseconds()
		out.Answered = AnsweredValue
		return out, nil
	}
	content, err := json.Marshal(a.v)
	if err != nil {
		return Failed(protocol.CodeToolBadResponse, protocol.OriginTool,
			"the Go tool returned a value that does not encode as JSON; return plain data",
			fmt.Sprintf("cannot encode the result as JSON: %v", err), false), nil
	}
	if call.MaxResultBytes > 0 && int64(len(content)) > call.MaxResultBytes {
		return TooLarge(call.MaxResultBytes), nil
	}
	out := OK(content, a.took)
	out.Answered = AnsweredValue
	return out, nil
}

// funcAnswer is what a Go tool's function gave.
type funcAnswer struct {
	v        any
	err      error
	took     time.Duration
	panicked bool
}

func funcFailure(err error) Outcome {
	var te *ToolError
	if errors.As(err, &te) {
		return Outcome{Result: protocol.ToolFailure(protocol.CodeToolFailed, te.Code, te.Hint, err.Error()), Retryable: te.Retryable}
	}
	return Failed(protocol.CodeToolFailed, protocol.OriginTool, "the tool failed; see its content", err.Error(), false)
}
