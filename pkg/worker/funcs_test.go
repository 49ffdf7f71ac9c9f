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
	if _, err := worker.NewFuncs(map[string]worker.Func{"a.b": func(context.Context, json.RawMessage) (any, error) { return nil, nil }}); err == nil {
		t.Error("a tool name that is not a subject token was accepted")
	}
	if _, err := worker.NewFuncs(map[string]worker.Func{"nil_tool": nil}); err == nil {
		t.Error("a tool without a function was accepted")
	}
}
