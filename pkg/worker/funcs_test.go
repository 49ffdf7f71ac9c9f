package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
	"github.com/hermesbus/hermes/pkg/worker/workertest"
)

func TestFuncsConformance(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	aborted := map[string]bool{}
	funcs, err := worker.NewFuncs(map[string]worker.Func{
		"behave": func(ctx context.Context, args json.RawMessage) (any, error) {
			id, b, err := workertest.ReadScript(args)
			if err != nil {
				return nil, &worker.ToolError{Code: protocol.CodeBadArguments, Err: err}
			}
			if err := b.Wait(ctx); err != nil {
				mu.Lock()
				aborted[id] = true
				mu.Unlock()
				return nil, err
			}
			switch {
			case b.Panic:
				panic("tool bug")
			case b.Fail == workertest.FailRetryable:
				return nil, &worker.ToolError{Code: "OVERLOADED", Hint: "try later", Retryable: true, Err: errors.New("overloaded")}
			case b.Fail == workertest.FailPermanent:
				return nil, errors.New("no such order")
			case b.Size > 0:
				return strings.Repeat("x", b.Size), nil
			}
			return b.Answer, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	workertest.Run(t, workertest.Harness{
		Executor: funcs,
		Call: func(t *testing.T, id string, b workertest.Behavior) *worker.Call {
			body := workertest.Script(id, b)
			return &worker.Call{RequestID: "req_conf", SessionID: "s", Dispatch: &protocol.Dispatch{
				Call:   protocol.ToolCall{ToolCallID: id, Name: "behave", Arguments: body},
				Route:  "behave",
				Action: protocol.Action{Kind: protocol.ActionGo, TimeoutMS: 10_000},
			}}
		},
		Aborted: func(t *testing.T, id string) bool {
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				mu.Lock()
				ok := aborted[id]
				mu.Unlock()
				if ok {
					return true
				}
				time.Sleep(10 * time.Millisecond)
			}
			return false
		},
	})
}

func TestNewFuncsRefusesBadTools(t *testing.T) {
	t.Parallel()
	if _, err := worker.NewFuncs(map[string]worker.Func{"a.b": func(context.Context, json.RawMessage) (any, error) { return nil, nil }}); err == nil {
		t.Error("a tool name that is not a subject token was accepted")
	}
	if _, err := worker.NewFuncs(map[string]worker.Func{"nil_tool": nil}); err == nil {
		t.Error("a tool without a function was accepted")
	}
}

// A Go tool's own code is its own (tool_error_code), never Hermes' verdict: error_code is
// TOOL_FAILED, and a code that is one of Hermes', or not a code, is dropped.
func TestFuncCodesAreTheTools(t *testing.T) {
	t.Parallel()
	funcs, err := worker.NewFuncs(map[string]worker.Func{
		"fail": func(_ context.Context, args json.RawMessage) (any, error) {
			var in struct{ Code string }
			_ = json.Unmarshal(args, &in)
			return nil, &worker.ToolError{Code: in.Code, Hint: "h", Retryable: true, Err: errors.New("no")}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for code, kept := range map[string]string{"OVERLOADED": "OVERLOADED", protocol.CodeNoRoute: "", protocol.CodeDeadLettered: "", "not a code": "", "": ""} {
		args, _ := json.Marshal(map[string]string{"code": code})
		out, err := funcs.Execute(context.Background(), &worker.Call{RequestID: "r", SessionID: "s", Dispatch: &protocol.Dispatch{
			Call: protocol.ToolCall{ToolCallID: "c", Name: "fail", Arguments: args}, Route: "fail",
			Action: protocol.Action{Kind: protocol.ActionGo, TimeoutMS: 1000}}})
		if err != nil {
			t.Fatal(err)
		}
		r := out.Result
		if r.ErrorCode != protocol.CodeToolFailed || r.ErrorOrigin != protocol.OriginTool || r.ToolErrorCode != kept || !out.Retryable {
			t.Errorf("code %q: error_code %q origin %q tool_error_code %q retryable %v", code, r.ErrorCode, r.ErrorOrigin, r.ToolErrorCode, out.Retryable)
		}
	}
}
