package sandbox

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// submitter answers the sandbox's request with answer (nil: pending, as a request still
// running when the budget runs out), and its cancellation with every call CANCELLED but those
// answer would have given an ok result.
type submitter struct {
	answer func(protocol.ToolCall) protocol.ToolResult
	done   map[string]bool // calls that finished before the budget ran out

	mu        sync.Mutex
	requests  []*protocol.Request
	cancelled []submit.Cancellation
}

func (s *submitter) Submit(_ context.Context, sub submit.Submission) (*submit.Outcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, sub.Request)
	if s.done != nil {
		return &submit.Outcome{Pending: true}, nil
	}
	return &submit.Outcome{Response: s.respond(sub.Request, false)}, nil
}

func (s *submitter) Cancel(_ context.Context, requestID string, c submit.Cancellation) (*protocol.Response, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancelled = append(s.cancelled, c)
	return s.respond(s.requests[len(s.requests)-1], true), false, nil
}

func (s *submitter) respond(req *protocol.Request, cancelled bool) *protocol.Response {
	resp := &protocol.Response{RequestID: req.RequestID, SessionID: req.SessionID}
	for i := range req.ToolCalls {
		c := &req.ToolCalls[i]
		r := s.answer(*c)
		if cancelled && !s.done[c.ToolCallID] {
			r = protocol.CancelledResult(c, "", 1, "sandbox")
		}
		r.ToolCallID, r.Name = c.ToolCallID, c.Name
		resp.Results = append(resp.Results, r)
	}
	resp.Status = protocol.ResponseStatus(resp.Results)
	if cancelled {
		resp.Error = &protocol.ResponseError{Code: protocol.CodeCancelled, Message: "cancelled by sandbox"}
	}
	return resp
}

// bucket is the contracts' bucket as the sandbox uses it (Put and Delete), in memory.
type bucket struct {
	jetstream.KeyValue // nil: other methods panic
	mem                *bustest.MemKV
}

func (b bucket) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	return b.mem.Put(ctx, key, value)
}

func (b bucket) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	return b.mem.Delete(ctx, key, opts...)
}

func okResult(protocol.ToolCall) protocol.ToolResult {
	return protocol.ToolResult{Status: protocol.ResultOK, Content: json.RawMessage(`{}`), Attempts: 1}
}

func parse(t *testing.T, doc string) *contract.Contract {
	t.Helper()
	c, err := registry.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// What a try does before and after the calls: a tool with side effects and no sandbox reach is
// not tried without leave (nothing sent, nothing kept); with leave it is; an unreachable tool
// is refused for it; a try over its budget cancels what did not finish and reports those cases
// unfinished; the candidate is kept only while it is tried.
func TestTryOutcomes(t *testing.T) {
	const sideEffects = "name: charge_it\neffects: side_effects\ninput_schema: {amount: {type: number, required: true}}\n"
	const echo = "name: echo\ninput_schema:\n  type: object\n  properties:\n    delay_ms: {type: integer, minimum: 0, maximum: 20000}\n"
	unreachable := func(protocol.ToolCall) protocol.ToolResult {
		return protocol.ErrorResult(protocol.CodeToolUnreachable, protocol.OriginHermes, "is it running?",
			"tool unreachable: dial tcp 127.0.0.1:9: connect: connection refused")
	}
	for _, tc := range []struct {
		name string
		doc  string
		opt  Options
		sub  *submitter
		// want
		verdict, reason string
		sent            bool
		unfinished      bool
	}{
		{name: "side effects without leave", doc: sideEffects, sub: &submitter{answer: okResult},
			verdict: Skipped, reason: "side effects"},
		{name: "side effects with leave", doc: sideEffects, opt: Options{AllowSideEffects: true}, sub: &submitter{answer: okResult},
			verdict: Passed, sent: true},
		{name: "unreachable", doc: echo, sub: &submitter{answer: unreachable},
			verdict: Refused, reason: "the tool is unreachable: dial tcp 127.0.0.1:9: connect: connection refused", sent: true},
		{name: "over budget", doc: echo, opt: Options{Budget: 2 * time.Second},
			sub:     &submitter{answer: okResult, done: map[string]bool{probeID: true, "case-01": true}},
			verdict: Refused, reason: "did not finish within the sandbox's budget of 2s", sent: true, unfinished: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kv := bustest.NewMemKV()
			s := &Sandbox{KV: bucket{mem: kv}, Submit: tc.sub}
			rep, err := s.Try(t.Context(), parse(t, tc.doc), tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Verdict != tc.verdict || !strings.Contains(rep.Reason, tc.reason) {
				t.Errorf("verdict %s (%s); want %s (%s)", rep.Verdict, rep.Reason, tc.verdict, tc.reason)
			}
			if sent := len(tc.sub.requests) > 0; sent != tc.sent {
				t.Fatalf("sent %v, want %v", sent, tc.sent)
			}
			if !tc.sent {
				if kv.Calls["Put"] != 0 || len(rep.Cases) != 0 {
					t.Errorf("a skipped try kept a candidate (%d puts) or reports cases (%d)", kv.Calls["Put"], len(rep.Cases))
				}
				return
			}
			req := tc.sub.requests[0]
			if req.Sandbox == nil || req.Sandbox.Tool != rep.Tool || req.SessionID != protocol.SandboxSession(rep.Tool) || req.ToolCalls[0].ToolCallID != probeID {
				t.Errorf("the sandbox request: %+v", req)
			}
			if kv.Calls["Put"] != 1 || len(kv.Keys()) != 0 {
				t.Errorf("the candidate: %d puts, keys left %v; want kept while tried, then deleted", kv.Calls["Put"], kv.Keys())
			}
			if !tc.unfinished {
				if len(tc.sub.cancelled) != 0 || rep.Unfinished != 0 {
					t.Errorf("cancelled %v, %d unfinished", tc.sub.cancelled, rep.Unfinished)
				}
				return
			}
			if len(tc.sub.cancelled) != 1 || !strings.Contains(tc.sub.cancelled[0].Reason, "budget of 2s ran out") {
				t.Errorf("cancellations %+v; want one naming the budget", tc.sub.cancelled)
			}
			if rep.Unfinished != len(rep.Cases)-1 || rep.Cases[0].Outcome != CasePassed {
				t.Errorf("%d of %d cases unfinished, the first %s; want every one but the first, which finished", rep.Unfinished, len(rep.Cases), rep.Cases[0].Outcome)
			}
		})
	}
}
