package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// FastService is the NATS micro service through which workers answer the fast lane: one
// endpoint per tool a worker serves (protocol.SubjectFastCall), in the queue group
// protocol.FastQueue, so that one live worker of the tool answers each call.
const FastService = "hermes-fastlane"

// What a worker remembers of the answers it gave on the fast lane, by call: a call asked again
// (its router's retry, or the durable path taking it over) is answered with the first answer,
// not run again — the same call, that is: the same message id, session and dispatch. At most
// fastRemembered answers and fastRememberedBytes of them are kept, none longer than
// fastRememberedFor.
const (
	fastRemembered      = 4096
	fastRememberedBytes = 32 << 20
	fastRememberedFor   = 10 * time.Minute
)

// fastLane is a worker's side of the fast lane: its micro service, and the answers it gave.
type fastLane struct {
	svc   micro.Service
	calls sync.WaitGroup // the fast-lane calls in hand

	mu      sync.Mutex
	closing bool                  // no call is taken once set
	seen    map[string]fastAnswer // call key → the answer given
	order   []string              // seen's keys, oldest first
	bytes   int                   // the answers' sizes, together
	inRun   map[string]*fastRun   // call key → its run going on
}

// fastAnswer is what a worker did of a call on the fast lane, and when: the answer it gave (ok),
// or the tries it made without one.
type fastAnswer struct {
	res   protocol.ToolResult
	ok    bool
	tries int
	// began is when the first try began, and codes what each try without an answer failed
	// with ("" when it was not judged): the durable path that takes the call over records them.
	began time.Time
	codes []string
	at    time.Time
	size  int
}

// callKey names one call: its message id, session and dispatch (a call under a reused id is
// another call).
func callKey(m *protocol.Message) string {
	sum := sha256.Sum256(m.Payload)
	return m.MsgID + "\x00" + m.SessionID + "\x00" + hex.EncodeToString(sum[:16])
}

// fastRun is a call running on the fast lane here: closed done when it ends; its try now.
type fastRun struct {
	done    chan struct{}
	attempt int // guarded by fastLane.mu
}

// start notes that the call of key runs now; false when it runs already (its end is then
// waited for by await). end says it ended.
func (f *fastLane) start(key string) (run *fastRun, end func(), ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.inRun[key]; ok {
		return nil, nil, false
	}
	if f.inRun == nil {
		f.inRun = map[string]*fastRun{}
	}
	r := &fastRun{done: make(chan struct{})}
	f.inRun[key] = r
	return r, func() {
		f.mu.Lock()
		delete(f.inRun, key)
		f.mu.Unlock()
		close(r.done)
	}, true
}

// trying notes that r makes try attempt now.
func (f *fastLane) trying(r *fastRun, attempt int) {
	f.mu.Lock()
	r.attempt = attempt
	f.mu.Unlock()
}

// running returns the try the call of key makes on the fast lane here now (0: none).
func (f *fastLane) running(key string) int {
	if f == nil {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.inRun[key]; r != nil {
		return r.attempt
	}
	return 0
}

// remember keeps res as the answer to the call of key, whose first try began then.
func (f *fastLane) remember(key string, res protocol.ToolResult, began time.Time) {
	f.keep(key, fastAnswer{res: res, ok: true, tries: res.Attempts, began: began, codes: res.Retried})
}

// tried keeps that the call of key was tried here without an answer, from began, each try
// failing with its code of codes: the durable path that takes it over goes on counting from
// there.
func (f *fastLane) tried(key string, began time.Time, codes []string) {
	f.keep(key, fastAnswer{tries: len(codes), began: began, codes: codes})
}

func (f *fastLane) keep(key string, a fastAnswer) {
	res := a.res
	size := len(key) + len(res.Content) + len(res.Rejected) + len(res.RecoveryHint) + 256
	if size > fastRememberedBytes/16 {
		return // too large to keep: asked again, it runs again
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen == nil {
		f.seen = map[string]fastAnswer{}
	}
	if _, ok := f.seen[key]; ok {
		return
	}
	for len(f.order) > 0 && (len(f.order) >= fastRemembered || f.bytes+size > fastRememberedBytes) {
		f.forgetOldest()
	}
	a.at, a.size = time.Now(), size
	f.seen[key] = a
	f.order = append(f.order, key)
	f.bytes += size
}

func (f *fastLane) forgetOldest() {
	k := f.order[0]
	f.order = f.order[1:]
	f.bytes -= f.seen[k].size
	delete(f.seen, k)
}

// answered returns the result this worker answered the call of key with on the fast lane, if
// it did, lately.
func (f *fastLane) answered(key string) (protocol.ToolResult, bool) {
	a := f.done(key)
	return a.res, a.ok
}

// done is what this worker did of the call of key on the fast lane, lately (zero: nothing).
func (f *fastLane) done(key string) fastAnswer {
	if f == nil {
		return fastAnswer{}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.order) > 0 && time.Since(f.seen[f.order[0]].at) > fastRememberedFor {
		f.forgetOldest()
	}
	return f.seen[key]
}

// await waits while the call of key runs on the fast lane here, then returns what came of it:
// its answer, if it gave one, and the tries it made (zero when it never ran here, or ctx ended
// first).
func (f *fastLane) await(ctx context.Context, key string) fastAnswer {
	if f == nil {
		return fastAnswer{}
	}
	f.mu.Lock()
	r := f.inRun[key]
	f.mu.Unlock()
	if r != nil {
		select {
		case <-r.done:
		case <-ctx.Done():
			return fastAnswer{}
		}
	}
	return f.done(key)
}

// startFast registers the worker's fast-lane service (no endpoints yet).
func (w *Worker) startFast() error {
	svc, err := micro.AddService(w.cfg.Bus.JS.Conn(), micro.Config{Name: FastService, Version: "1.0.0",
		Description: "a Hermes tool worker's fast lane: read-only calls its routers send over request/reply",
		Metadata:    map[string]string{"instance": w.cfg.Instance}, QueueGroup: protocol.FastQueue})
	if err != nil {
		return fmt.Errorf("worker: the fast lane's service: %w", err)
	}
	w.fast.svc = svc
	return nil
}

// stopFast stops taking fast-lane calls and waits for those running.
func (w *Worker) stopFast() {
	if w.fast.svc == nil {
		return
	}
	w.fast.mu.Lock()
	w.fast.closing = true // no call is taken from here on: calls counts them all
	w.fast.mu.Unlock()
	_ = w.fast.svc.Stop()
	w.fast.calls.Wait()
}

// serveFast adds tool's endpoint, of kind, to the fast lane's service.
func (w *Worker) serveFast(ctx context.Context, kind, tool string) {
	if w.fast.svc == nil {
		return
	}
	err := w.fast.svc.AddEndpoint(kind+"-"+tool, micro.HandlerFunc(func(r micro.Request) { w.fastCall(ctx, kind, tool, r) }),
		micro.WithEndpointSubject(protocol.SubjectFastCall(kind, tool)),
		micro.WithEndpointMetadata(map[string]string{"tool": tool, "kind": kind,
			"description": "read-only calls of " + tool + ", sealed by a router; answered with the sealed result"}))
	if err != nil {
		w.log.Warn("the tool's fast-lane endpoint", "tool", tool, "err", err)
	}
}

// fastSlotWait bounds how long a fast-lane call waits for a slot of its tool's pool.
const fastSlotWait = 100 * time.Millisecond

// fastCall answers one fast-lane call, in a slot of its tool's pool: a call that finds none free
// within fastSlotWait is declined (its router takes the durable path, where it waits its turn).
func (w *Worker) fastCall(ctx context.Context, kind, tool string, r micro.Request) {
	w.fast.mu.Lock()
	closing := w.fast.closing || ctx.Err() != nil
	if !closing {
		w.fast.calls.Add(1)
	}
	w.fast.mu.Unlock()
	if closing {
		_ = r.Respond([]byte("stopping"), micro.WithHeaders(micro.Headers{bus.HeaderFast: {protocol.FastDeclined}}))
		return
	}
	go func() {
		defer w.fast.calls.Done()
		pool := w.Pool(tool)
		if !pool.TakeWithin(ctx, fastSlotWait) {
			_ = r.Respond([]byte("no free slot"), micro.WithHeaders(micro.Headers{bus.HeaderFast: {protocol.FastDeclined}}))
			return
		}
		defer pool.Put()
		data, outcome := w.runFast(ctx, kind, tool, r.Data(), fastWithin(r.Headers()))
		_ = r.Respond(data, micro.WithHeaders(micro.Headers{bus.HeaderFast: {outcome}}))
	}()
}

// fastWithin is how long the router asking waits for the answer (bus.HeaderFastWithin): 1 s
// when it does not say, at most a minute.
func fastWithin(h micro.Headers) time.Duration {
	d, err := time.ParseDuration(h.Get(bus.HeaderFastWithin))
	if err != nil || d <= 0 {
		return time.Second
	}
	return min(d, time.Minute)
}

// runFast runs a fast-lane call, tried as its route's retry policy says within what its router
// waits (within), and returns the answer and what it is: the call's sealed
// result (protocol.FastAnswered), or why it was not run (FastRefused: no trusted router sealed
// it, or it is not a read-only call of this tool), or that the durable path should take it
// over (FastRetry: a failure another try may fix, or a try that was not judged).
func (w *Worker) runFast(ctx context.Context, kind, tool string, data []byte, within time.Duration) ([]byte, string) {
	m, err := protocol.Unmarshal(data)
	if err != nil {
		return []byte("not a Hermes message: " + err.Error()), protocol.FastRefused
	}
	if keys := w.cfg.TrustedSeals; len(keys) > 0 {
		if err := m.VerifySeal(keys, time.Now()); err != nil {
			w.refused.Add(1)
			return []byte("no trusted router sealed this call"), protocol.FastRefused
		}
	}
	if m.Type != protocol.TypeToolCall {
		return []byte("not a tool call"), protocol.FastRefused
	}
	disp, err := m.DecodeDispatch()
	if err != nil {
		return []byte(err.Error()), protocol.FastRefused
	}
	if disp.Call.Name != tool || disp.Action.Kind != kind || !disp.ReadOnly {
		return []byte("only read-only calls of " + tool + " (" + kind + ") are answered here"), protocol.FastRefused
	}
	key := callKey(m)
	run, end, first := w.fast.start(key)
	if !first {
		// Asked again while it runs (a router's retry): the first run answers.
		return []byte("the call runs already"), protocol.FastDeclined
	}
	defer end()
	if res, ok := w.fast.answered(key); ok {
		// Asked again (the reply was lost): the same answer, not another run.
		return w.fastResult(m, res)
	}
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	defer w.running.add(m.RequestID, disp.Call.ToolCallID, stop)()
	// Tried as its route's retry policy says, within what its router waits for.
	until := time.Now().Add(within)
	maxAttempts := max(disp.Action.Retry.MaxAttempts, 1)
	var out Outcome
	var retried []string // the codes of the failed tries before the last
	firstTry := time.Now().UTC()
	attempt := 1
	for ; ; attempt++ {
		var waited time.Duration
		if attempt == 1 && !m.CreatedAt.IsZero() {
			waited = max(time.Since(m.CreatedAt), 0)
		}
		// Its start goes on the record with the router's record of the call, in order (the
		// router writes it once answered: a start written here would come before its request).
		w.fast.trying(run, attempt)
		w.obs.Started(tool, attempt, waited)
		began := time.Now()
		var err error
		out, err = w.try(ctx, kind, m, disp, attempt, maxAttempts)
		w.obs.Finished(tool, time.Since(began))
		if err != nil || errors.Is(context.Cause(ctx), ErrCancelled) {
			// Not judged (shutdown, a panic) or cancelled: the durable path decides.
			w.fast.tried(key, firstTry, append(retried, ""))
			return []byte("the try was not judged"), protocol.FastRetry
		}
		if out.Result.Status == protocol.ResultOK || !out.Retryable || attempt >= maxAttempts {
			break
		}
		delay := max(RetryDelay(disp.Action.Retry, attempt), out.RetryAfter)
		if time.Now().Add(delay).After(until) {
			// The next try would come after the router stopped waiting: the durable path
			// tries it again, counting on from these tries.
			w.obs.Retrying(tool, out.Result.ErrorCode)
			retried = append(retried, protocol.Shorten(out.Result.ErrorCode, protocol.MaxErrorCodeBytes))
			w.fast.tried(key, firstTry, retried)
			return []byte(out.Result.ErrorCode), protocol.FastRetry
		}
		w.obs.Retrying(tool, out.Result.ErrorCode)
		retried = append(retried, protocol.Shorten(out.Result.ErrorCode, protocol.MaxErrorCodeBytes))
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			w.fast.tried(key, firstTry, retried)
			return []byte("stopping"), protocol.FastRetry
		}
	}
	res := out.Result
	res.ToolCallID, res.Name, res.Route, res.Attempts = disp.Call.ToolCallID, tool, disp.Route, attempt
	res.Retried = retried
	hermesCode(&res)
	data, outcome := w.fastResult(m, res)
	if outcome == protocol.FastAnswered {
		w.fast.remember(key, res, firstTry)
		w.obs.Recorded(&res)
	}
	return data, outcome
}

// fastResult is res as the sealed tool_result message the call's router records; a result
// larger than one bus message becomes RESULT_TOO_LARGE, as on the durable path.
func (w *Worker) fastResult(cause *protocol.Message, res protocol.ToolResult) ([]byte, string) {
	for {
		out, err := protocol.NewMessage(protocol.TypeToolResult, &res)
		if err != nil {
			return []byte(err.Error()), protocol.FastRetry
		}
		out.Follow(cause, protocol.MsgIDToolResult(cause.RequestID, res.ToolCallID))
		out.Attempt = res.Attempts
		data, err := w.cfg.Bus.SealedResult(w.pub, out)
		if errors.Is(err, bus.ErrTooLarge) && res.ErrorCode != protocol.CodeResultTooLarge {
			res = tooLarge(res, w.cfg.Bus.MaxMessageBytes())
			continue
		}
		if err != nil {
			return []byte(err.Error()), protocol.FastRetry
		}
		return data, protocol.FastAnswered
	}
}
