package worker

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Middleware wraps an Executor: timeouts, result limits and panic recovery today; bulkheads
// and contract checks are middleware too.
type Middleware func(Executor) Executor

// Chain wraps e in mw; mw[0] is the outermost, the first to see a call.
func Chain(e Executor, mw ...Middleware) Executor {
	for i := len(mw) - 1; i >= 0; i-- {
		e = mw[i](e)
	}
	return e
}

// Standard is the middleware every worker runs each executor in, outermost first: Recover,
// Timeout, LimitResult.
func Standard() []Middleware { return []Middleware{Recover(), Timeout(), LimitResult()} }

// ExecutorFunc adapts a function to an Executor of kind.
func ExecutorFunc(kind string, f func(ctx context.Context, call *Call) (Outcome, error)) Executor {
	return executorFunc{kind: kind, f: f}
}

type executorFunc struct {
	kind string
	f    func(ctx context.Context, call *Call) (Outcome, error)
}

func (e executorFunc) Kind() string { return e.kind }
func (e executorFunc) Execute(ctx context.Context, call *Call) (Outcome, error) {
	return e.f(ctx, call)
}

// wrap builds a middleware's executor around next, keeping its kind.
func wrap(next Executor, f func(ctx context.Context, call *Call) (Outcome, error)) Executor {
	return executorFunc{kind: next.Kind(), f: f}
}

// Recover turns a panic in the executor into an error: the try is not judged, the call is
// released and redelivered (and given up after the consumer's deliveries), and the worker
// lives on.
func Recover() Middleware {
	return func(next Executor) Executor {
		return wrap(next, func(ctx context.Context, call *Call) (out Outcome, err error) {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("worker: the %s executor panicked on %s: %v\n%s", next.Kind(), call.Tool(), p, debug.Stack())
				}
			}()
			return next.Execute(ctx, call)
		})
	}
}

// Timeout bounds each try by the call's Timeout: ctx carries it as a deadline, and an executor
// that gives up because of it (returning the deadline's error) is answered TOOL_TIMEOUT, which
// is retryable. A try whose own context ended (shutdown, cancellation) stays an error, and one
// whose context has ended already is not started.
func Timeout() Middleware {
	return func(next Executor) Executor {
		return wrap(next, func(ctx context.Context, call *Call) (Outcome, error) {
			if ctx.Err() != nil {
				return Outcome{}, context.Cause(ctx)
			}
			if call.Timeout <= 0 {
				return next.Execute(ctx, call)
			}
			tctx, cancel := context.WithTimeout(ctx, call.Timeout)
			defer cancel()
			out, err := next.Execute(tctx, call)
			if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				return TimedOut(call), nil
			}
			return out, err
		})
	}
}

// TimedOut is the outcome of a try that did not answer within its time (Call.TryTimeout).
func TimedOut(call *Call) Outcome {
	ms := call.TryTimeout().Milliseconds()
	return Failed(protocol.CodeToolTimeout, protocol.OriginHermes,
		fmt.Sprintf("the tool did not answer within timeout_ms=%d; raise timeout_ms in route %s or check why the tool is slow", ms, call.Dispatch.Route),
		fmt.Sprintf("no answer within %d ms", ms), true)
}

// LimitResult answers RESULT_TOO_LARGE, not retryable, for an ok result whose content is
// larger than the call's MaxResultBytes (executors should stop reading before that; this is
// the last line).
func LimitResult() Middleware {
	return func(next Executor) Executor {
		return wrap(next, func(ctx context.Context, call *Call) (Outcome, error) {
			out, err := next.Execute(ctx, call)
			if err == nil && call.MaxResultBytes > 0 && int64(len(out.Result.Content)) > call.MaxResultBytes {
				return TooLarge(call.MaxResultBytes), nil
			}
			return out, err
		})
	}
}

// TooLarge is the outcome of a tool that answered more than limit bytes.
func TooLarge(limit int64) Outcome {
	return Failed(protocol.CodeResultTooLarge, protocol.OriginHermes,
		fmt.Sprintf("the tool answered more than %d bytes; ask for less (paging, filters) or raise the worker's --max-result-bytes", limit),
		fmt.Sprintf("result larger than %d bytes", limit), false)
}
