// Package workertest is the conformance suite every worker.Executor must pass, in the spirit of
// Watermill's pub/sub test suite: answers kept exact and matched to their calls, the try's
// timeout, cancellation, retryable against permanent failures, oversized results and panics —
// each through the middleware a Worker runs executors in (worker.Standard).
//
// An executor's own tests call Run with a Harness that makes a tool of the executor's kind
// behave as each case asks. Some cases run the bare executor too, without the middleware: an
// executor itself must stop reading an answer at the call's MaxResultBytes, and must not start
// a try whose context has ended.
package workertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
)

// Failure says how a tool fails.
type Failure int

const (
	// Succeed: the tool does not fail.
	Succeed Failure = iota
	// FailRetryable: the tool fails in a way another try may fix (an HTTP 503, say).
	FailRetryable
	// FailPermanent: the tool refuses the call; no other try can succeed (an HTTP 400, say).
	FailPermanent
)

// Behavior is what the tool does with one call.
type Behavior struct {
	// Answer is the JSON value the tool answers with.
	Answer json.RawMessage
	// Delay is how long the tool takes before it answers.
	Delay time.Duration
	// Fail makes the tool fail instead of answering.
	Fail Failure
	// Size, when positive, makes the tool answer a JSON string of about Size bytes instead.
	Size int
	// Panic makes the tool crash while handling the call.
	Panic bool
	// Stubborn makes the tool ignore that a try ended (its HTTP request aborted, its context
	// done): it answers only after Delay, whatever happens.
	Stubborn bool
}

// script is a Behavior on the wire, as a test tool receives it.
type script struct {
	ID       string          `json:"id"`
	Answer   json.RawMessage `json:"answer,omitempty"`
	DelayMS  int64           `json:"delay_ms,omitempty"`
	Fail     Failure         `json:"fail,omitempty"`
	Size     int             `json:"size,omitempty"`
	Panic    bool            `json:"panic,omitempty"`
	Stubborn bool            `json:"stubborn,omitempty"`
}

// Script is b for the call with id, in a form a tool of any kind can receive as its JSON
// arguments or body; the tool reads it back with ReadScript.
func Script(id string, b Behavior) json.RawMessage {
	data, err := json.Marshal(script{ID: id, Answer: b.Answer, DelayMS: b.Delay.Milliseconds(),
		Fail: b.Fail, Size: b.Size, Panic: b.Panic, Stubborn: b.Stubborn})
	if err != nil {
		panic(fmt.Sprintf("workertest: behavior of %s: %v", id, err)) // Answer is not JSON
	}
	return data
}

// ReadScript decodes what Script made: the call's id and how its tool behaves.
func ReadScript(data []byte) (string, Behavior, error) {
	var s script
	if err := json.Unmarshal(data, &s); err != nil {
		return "", Behavior{}, fmt.Errorf("workertest: script: %w", err)
	}
	return s.ID, Behavior{Answer: s.Answer, Delay: time.Duration(s.DelayMS) * time.Millisecond,
		Fail: s.Fail, Size: s.Size, Panic: s.Panic, Stubborn: s.Stubborn}, nil
}

// Wait takes b's Delay. It returns ctx's error if ctx ends first — unless b is Stubborn, which
// takes the whole Delay whatever happens.
func (b Behavior) Wait(ctx context.Context) error {
	if b.Delay <= 0 {
		return nil
	}
	if b.Stubborn {
		time.Sleep(b.Delay)
		return nil
	}
	t := time.NewTimer(b.Delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Harness puts an executor under test.
type Harness struct {
	// Executor is the executor under test. Required.
	Executor worker.Executor
	// Call returns a call of the executor's kind, with tool call id id, whose tool behaves as
	// b. The suite sets Timeout and MaxResultBytes. Required.
	Call func(t *testing.T, id string, b Behavior) *worker.Call
	// Aborted, when set, reports whether the tool saw the call with id ended from the
	// worker's side before it answered (its HTTP request aborted, its context ended). It may
	// wait a little for the tool to notice.
	Aborted func(t *testing.T, id string) bool
	// Carried, when set, returns the content an answer comes back as where the kind's encoding
	// changes it (a gRPC tool answering a google.protobuf.Value carries numbers as doubles);
	// nil: the answer exactly, numbers as written.
	Carried func(answer json.RawMessage) json.RawMessage
}

// carried is the content answer must come back as.
func (s *suite) carried(answer json.RawMessage) json.RawMessage {
	if s.h.Carried == nil {
		return answer
	}
	return s.h.Carried(answer)
}

// Run runs the conformance suite against h.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Executor == nil || h.Call == nil {
		t.Fatal("workertest: Harness.Executor and Harness.Call are required")
	}
	if !protocol.KnownKind(h.Executor.Kind()) {
		t.Fatalf("workertest: the executor's kind %q is not one of %v", h.Executor.Kind(), protocol.Kinds)
	}
	exec := worker.Chain(h.Executor, worker.Standard()...)
	s := &suite{h: h, exec: exec, bare: worker.Chain(h.Executor, worker.Recover())}
	t.Run("answers exactly", s.answers)
	t.Run("parallel calls keep their own answers", s.parallel)
	t.Run("timeout", s.timeout)
	t.Run("cancellation", s.cancellation)
	t.Run("already cancelled", s.alreadyCancelled)
	t.Run("retryable failure", func(t *testing.T) { s.failure(t, FailRetryable) })
	t.Run("permanent failure", func(t *testing.T) { s.failure(t, FailPermanent) })
	t.Run("oversized result", s.oversized)
	t.Run("panic", s.panics)
}

type suite struct {
	h    Harness
	exec worker.Executor // as a Worker runs it
	bare worker.Executor // without Timeout and LimitResult
}

const (
	timeout  = 10 * time.Second
	maxBytes = 64 << 10
)

func (s *suite) call(t *testing.T, id string, b Behavior) *worker.Call {
	t.Helper()
	c := s.h.Call(t, id, b)
	if c == nil || c.Dispatch == nil {
		t.Fatal("workertest: Harness.Call returned no call")
	}
	if c.Dispatch.Call.ToolCallID != id {
		t.Fatalf("workertest: Harness.Call made a call with id %q, want %q", c.Dispatch.Call.ToolCallID, id)
	}
	if c.Dispatch.Action.Kind != s.h.Executor.Kind() {
		t.Fatalf("workertest: Harness.Call made a %q call for a %q executor", c.Dispatch.Action.Kind, s.h.Executor.Kind())
	}
	c.Timeout, c.MaxResultBytes = timeout, maxBytes
	if c.Attempt == 0 {
		c.Attempt, c.MaxAttempts = 1, 3
	}
	return c
}

// run executes c under ctx and returns what it gave and how long it took; a panic escaping
// the executor fails the test.
func (s *suite) run(t *testing.T, ctx context.Context, c *worker.Call) (out worker.Outcome, took time.Duration, err error) {
	t.Helper()
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("a panic escaped the executor (with worker.Standard): %v", p)
		}
	}()
	out, err = s.exec.Execute(ctx, c)
	return out, time.Since(start), err
}

func (s *suite) answers(t *testing.T) {
	answer := json.RawMessage(`{"big":9007199254740993,"name":"张三","list":[1,2.5,"x",null,true],"nested":{"k":"v"}}`)
	out, _, err := s.run(t, t.Context(), s.call(t, "answer_1", Behavior{Answer: answer}))
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	if out.Result.Status != protocol.ResultOK {
		t.Fatalf("status %s (%s %s), want ok", out.Result.Status, out.Result.ErrorCode, out.Result.Content)
	}
	if want := s.carried(answer); !jsonEqual(out.Result.Content, want) {
		t.Fatalf("content %s, want %s (numbers exact)", out.Result.Content, want)
	}
	if out.Result.ExecutionTimeMS < 0 {
		t.Errorf("execution_time_ms %d", out.Result.ExecutionTimeMS)
	}
}

func (s *suite) parallel(t *testing.T) {
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for i := range n {
		id := fmt.Sprintf("par_%d", i)
		answer := json.RawMessage(fmt.Sprintf(`{"id":%q,"i":%d}`, id, i))
		c := s.call(t, id, Behavior{Answer: answer, Delay: time.Duration(n-i) * 5 * time.Millisecond})
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := s.exec.Execute(t.Context(), c)
			switch {
			case err != nil:
				errs <- fmt.Sprintf("%s: %v", id, err)
			case !jsonEqual(out.Result.Content, s.carried(answer)):
				errs <- fmt.Sprintf("%s got %s, want %s", id, out.Result.Content, s.carried(answer))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func (s *suite) timeout(t *testing.T) {
	const delay = time.Second // five times the try's timeout (a stubborn tool's server, closing, waits it out)
	c := s.call(t, "slow_1", Behavior{Answer: json.RawMessage(`{}`), Delay: delay, Stubborn: true})
	c.Timeout = 200 * time.Millisecond
	out, took, err := s.run(t, t.Context(), c)
	if err != nil {
		t.Fatalf("Execute: %v; a try that outlives its timeout is TOOL_TIMEOUT, not an error", err)
	}
	r := out.Result
	if r.Status != protocol.ResultError || r.ErrorCode != protocol.CodeToolTimeout || r.ErrorOrigin != protocol.OriginHermes {
		t.Fatalf("result %s/%s/%s, want error/%s/hermes", r.Status, r.ErrorCode, r.ErrorOrigin, protocol.CodeToolTimeout)
	}
	if !out.Retryable {
		t.Error("a timeout is not retryable")
	}
	if took >= delay {
		t.Errorf("Execute waited for the tool (%v); it must give up at the timeout", took)
	}
}

func (s *suite) cancellation(t *testing.T) {
	const delay = 5 * time.Second
	c := s.call(t, "cancel_1", Behavior{Answer: json.RawMessage(`{}`), Delay: delay})
	ctx, cancel := context.WithCancelCause(t.Context())
	time.AfterFunc(100*time.Millisecond, func() { cancel(worker.ErrCancelled) })
	out, took, err := s.run(t, ctx, c)
	if err == nil {
		t.Fatalf("Execute returned the outcome %s/%s and no error; a try whose context ended is not judged", out.Result.Status, out.Result.ErrorCode)
	}
	if took >= delay {
		t.Errorf("Execute waited for the tool (%v) after its context ended", took)
	}
	if s.h.Aborted != nil && !s.h.Aborted(t, "cancel_1") {
		t.Error("the tool never saw the try end: it was not aborted")
	}
}

func (s *suite) alreadyCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for _, e := range []struct {
		name string
		exec worker.Executor
	}{{"with the middleware", s.exec}, {"the bare executor", s.bare}} {
		out, err := e.exec.Execute(ctx, s.call(t, "cancelled_1", Behavior{Answer: json.RawMessage(`{}`)}))
		if err == nil {
			t.Errorf("%s: Execute with an ended context returned %s/%s and no error", e.name, out.Result.Status, out.Result.ErrorCode)
		}
	}
}

func (s *suite) failure(t *testing.T, f Failure) {
	out, _, err := s.run(t, t.Context(), s.call(t, fmt.Sprintf("fail_%d", f), Behavior{Fail: f}))
	if err != nil {
		t.Fatalf("Execute: %v; a tool's failure is an outcome, not an error", err)
	}
	r := out.Result
	if r.Status != protocol.ResultError || r.ErrorCode == "" || (r.ErrorOrigin != protocol.OriginTool && r.ErrorOrigin != protocol.OriginHermes) {
		t.Fatalf("result %s/%q/%q, want an error with a code and an origin", r.Status, r.ErrorCode, r.ErrorOrigin)
	}
	if want := f == FailRetryable; out.Retryable != want {
		t.Errorf("retryable %v, want %v", out.Retryable, want)
	}
	if len(r.Content) > 0 && !json.Valid(r.Content) {
		t.Errorf("content is not JSON: %q", r.Content)
	}
}

func (s *suite) oversized(t *testing.T) {
	for _, e := range []struct {
		name string
		exec worker.Executor
	}{{"with the middleware", s.exec}, {"the bare executor", s.bare}} {
		out, err := e.exec.Execute(t.Context(), s.call(t, "big_1", Behavior{Size: 4 * maxBytes}))
		if err != nil {
			t.Fatalf("%s: Execute: %v", e.name, err)
		}
		r := out.Result
		if r.Status != protocol.ResultError || r.ErrorCode != protocol.CodeResultTooLarge || out.Retryable {
			t.Fatalf("%s: result %s/%s retryable=%v, want error/%s, not retryable", e.name, r.Status, r.ErrorCode, out.Retryable, protocol.CodeResultTooLarge)
		}
		if len(r.Content) > 1024 {
			t.Errorf("%s: content holds %d bytes; it must describe the error, not carry the answer", e.name, len(r.Content))
		}
	}
	fits, _, err := s.run(t, t.Context(), s.call(t, "big_2", Behavior{Size: maxBytes / 2}))
	if err != nil || fits.Result.Status != protocol.ResultOK {
		t.Fatalf("an answer of half the limit: %v %s/%s", err, fits.Result.Status, fits.Result.ErrorCode)
	}
}

func (s *suite) panics(t *testing.T) {
	out, _, err := s.run(t, t.Context(), s.call(t, "panic_1", Behavior{Panic: true}))
	if err == nil && out.Result.Status == protocol.ResultOK {
		t.Fatal("a tool that panicked gave an ok result")
	}
	// The executor still works.
	out, _, err = s.run(t, t.Context(), s.call(t, "after_panic", Behavior{Answer: json.RawMessage(`{"ok":true}`)}))
	if err != nil || out.Result.Status != protocol.ResultOK {
		t.Fatalf("after a panic: %v %s/%s", err, out.Result.Status, out.Result.ErrorCode)
	}
}

// jsonEqual compares two JSON values, keeping numbers exactly as written.
func jsonEqual(a, b []byte) bool {
	va, ea := decode(a)
	vb, eb := decode(b)
	return ea == nil && eb == nil && reflect.DeepEqual(va, vb)
}

func decode(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	return v, err
}
