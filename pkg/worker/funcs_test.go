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
	type spec struct {
		ID      string          `json:"id"`
		Answer  json.RawMessage `json:"answer"`
		DelayMS int             `json:"delay_ms"`
		Fail    int             `json:"fail"`
		Size    int             `json:"size"`
		Panic   bool            `json:"panic"`
		Stub    bool            `json:"stubborn"`
	}
	funcs, err := worker.NewFuncs(map[string]worker.Func{
		"behave": func(ctx context.Context, args json.RawMessage) (any, error) {
			var s spec
			if err := json.Unmarshal(args, &s); err != nil {
				return nil, &worker.ToolError{Code: protocol.CodeBadArguments, Err: err}
			}
			if s.DelayMS > 0 && s.Stub {
				time.Sleep(time.Duration(s.DelayMS) * time.Millisecond) // deaf to ctx
			} else if s.DelayMS > 0 {
				select {
				case <-time.After(time.Duration(s.DelayMS) * time.Millisecond):
				case <-ctx.Done():
					mu.Lock()
					aborted[s.ID] = true
					mu.Unlock()
					return nil, ctx.Err()
				}
			}
			switch {
			case s.Panic:
				panic("tool bug")
			case s.Fail == int(workertest.FailRetryable):
				return nil, &worker.ToolError{Code: "OVERLOADED", Hint: "try later", Retryable: true, Err: errors.New("overloaded")}
			case s.Fail == int(workertest.FailPermanent):
				return nil, errors.New("no such order")
			case s.Size > 0:
				return strings.Repeat("x", s.Size), nil
			}
			return s.Answer, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	workertest.Run(t, workertest.Harness{
		Executor: funcs,
		Call: func(t *testing.T, id string, b workertest.Behavior) *worker.Call {
			body, _ := json.Marshal(spec{ID: id, Answer: b.Answer, DelayMS: int(b.Delay / time.Millisecond), Fail: int(b.Fail), Size: b.Size, Panic: b.Panic, Stub: b.Stubborn})
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
