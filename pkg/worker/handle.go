package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/ledger"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/retry"
	"github.com/hermesbus/hermes/pkg/tracing"
)

// claimWaitInPlace is how soon a holder's lease must run out for a delivery to wait for it
// rather than be redelivered later.
const claimWaitInPlace = time.Second

// runner runs the calls of one consumer: one tool, one kind.
type runner struct {
	w      *Worker
	kind   string
	ledger *ledger.Ledger
}

// handle runs one delivery of a tool call: at most one try, then a result or a delayed
// redelivery. A call the ledger says finished (its result recorded) is not run again, a call
// held by a live worker is left to it, and a cancelled call is not started (or, running, is
// stopped). Nothing here reads the record.
func (r *runner) handle(ctx context.Context, d *bus.Delivery) error {
	w, m, log := r.w, d.Msg, d.Log
	if keys := w.cfg.TrustedSeals; len(keys) > 0 {
		// A genuine call whose seal expired goes on, to be answered DEADLINE_EXCEEDED (try),
		// never run: its request must get an answer.
		if err := m.VerifySeal(keys, time.Now()); err != nil && !errors.Is(err, protocol.ErrSealExpired) {
			// Dropped, not terminated: a termination would become a dead letter answering
			// ids the forger chose.
			n := w.refused.Add(1)
			if last := w.refusedLog.Load(); time.Since(time.Unix(0, last)) > time.Second && w.refusedLog.CompareAndSwap(last, time.Now().UnixNano()) {
				log.Warn("refused a tool call no trusted router sealed", "why", err, "refused_so_far", n)
			}
			return nil
		}
	}
	disp, err := m.DecodeDispatch()
	if err != nil {
		return bus.Permanent(err)
	}
	callID, tool, redrive := disp.Call.ToolCallID, disp.Call.Name, redriveOf(d)
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attribute.String("hermes.tool", tool), attribute.String("hermes.tool_call_id", callID))
	}
	// What this worker sends about the call (start, result) follows from its span.
	tracing.Inject(ctx, &m.Trace)
	log = log.With("tool", tool, "tool_call_id", callID)
	// Listening for a cancellation starts before the claim: one that comes later still stops
	// the try, and one that came earlier marked the claim. Recording uses parent, which a
	// cancellation does not end (shutdown does).
	parent := ctx
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	defer w.running.add(m.RequestID, callID, stop)()

	key := ledger.Key(m.RequestID, callID)
	h, wait, err := r.ledger.Acquire(ctx, key)
	if errors.Is(err, ledger.ErrClaimed) && wait <= claimWaitInPlace && retry.Sleep(ctx, wait+10*time.Millisecond) {
		// The holder's lease runs out in a moment (it likely died just now): waiting here
		// keeps this delivery instead of spending one more of the call's deliveries.
		h, wait, err = r.ledger.Acquire(ctx, key)
	}
	switch {
	case errors.Is(err, ledger.ErrFinished):
		// Finished (perhaps by a worker presumed dead): its result is on the record, and so
		// reaches aggregation. (A call re-driven from the dead letters runs again over the
		// answer the dead-letter processor gave it — its re-driver saw to that — but not over
		// the tool's own.)
		log.Info("call already has a result; not running it again")
		return nil
	case errors.Is(err, ledger.ErrCancelled):
		log.Info("call cancelled before it started")
		return w.finishCancelled(parent, m, disp, 0, "", redrive, r.ledger)
	case err != nil && !errors.Is(err, ledger.ErrClaimed):
		return err
	}
	if err != nil {
		log.Info("call held by a live worker; checking again later", "delay", wait)
		return bus.RetryAfter(err, wait+10*time.Millisecond)
	}
	defer h.Done()
	var fast fastAnswer
	if w.cfg.FastLane {
		fastKey := callKey(m)
		if n := w.fast.running(fastKey); n > 0 {
			// It runs here on the fast lane, whose router gave it to the durable path: that
			// try is this delivery's, and its start is recorded now, after the request.
			if err := w.publishStarted(ctx, m, disp, n, "", time.Now()); err != nil {
				log.Warn("could not record the start of the fast lane's try", "err", err)
			}
		}
		fast = w.fast.await(ctx, fastKey)
	}
	if fast.ok {
		// This worker answered it on the fast lane, or did while this delivery waited (its
		// router gave up on the answer, or the record did not reach the bus): that answer is
		// its result, recorded now, and it is not run again.
		log.Info("call answered on the fast lane; recording that answer")
		res := fast.res
		if h.Attempt() == 1 { // its tries' starts, which its router may not have recorded
			w.publishFastStarts(ctx, m, disp, fast, log)
		}
		return r.finishHolding(ctx, h, m, &res, redrive, log)
	}
	// Tries made here on the fast lane count among the call's: their starts, which its router
	// never recorded (it had no answer), are recorded now, before this try's.
	attempt := h.Attempt() + fast.tries
	retrying := h.LastErrorCode()
	if h.Attempt() == 1 && fast.tries > 0 { // the call's first claim: its tries were the fast lane's
		w.publishFastStarts(ctx, m, disp, fast, log)
		retrying = protocol.RetriedBefore(fast.codes, attempt)
	}
	var waited time.Duration
	if attempt == 1 && !m.CreatedAt.IsZero() {
		waited = max(time.Since(m.CreatedAt), 0)
	}
	maxAttempts := max(disp.Action.Retry.MaxAttempts, 1)
	if err := w.publishStarted(ctx, m, disp, attempt, retrying, time.Now()); err != nil {
		h.Release(context.WithoutCancel(ctx), "")
		return err
	}
	w.obs.Started(tool, attempt, waited)
	began := time.Now()
	out, err := r.tryHolding(ctx, h, m, disp, stop, attempt, maxAttempts)
	w.obs.Finished(tool, time.Since(began))
	final := err == nil && (out.Result.Status == protocol.ResultOK || !out.Retryable || attempt >= maxAttempts)
	if errors.Is(context.Cause(ctx), ErrCancelled) || h.Cancelled() {
		if !final {
			by := ""
			if ce := (*CancelledError)(nil); errors.As(context.Cause(ctx), &ce) {
				by = ce.By
			}
			log.Info("call cancelled while it ran", "attempt", attempt, "by", by)
			return w.finishCancelled(context.WithoutCancel(parent), m, disp, attempt, by, redrive, r.ledger)
		}
		// It finished anyway: its real result is recorded unless the cancellation's was first.
	}
	// Recording the result is not cut short by a cancellation arriving meanwhile: the first
	// result recorded wins, and a cancellation records its own.
	ctx = parent
	if err != nil {
		h.Release(context.WithoutCancel(ctx), "")
		return err // not judged (shutdown, executor panic): redeliver
	}
	if !final {
		delay := max(RetryDelay(disp.Action.Retry, attempt), out.RetryAfter)
		h.Release(ctx, out.Result.ErrorCode)
		w.obs.Retrying(tool, out.Result.ErrorCode)
		log.Info("try failed; retrying", "attempt", attempt, "max_attempts", maxAttempts, "error_code", out.Result.ErrorCode, "delay", delay)
		return bus.RetryAfter(fmt.Errorf("%s on try %d of %d", out.Result.ErrorCode, attempt, maxAttempts), delay)
	}
	res := out.Result
	res.ToolCallID, res.Name, res.Route, res.Attempts = callID, tool, disp.Route, attempt
	if res.Status != protocol.ResultOK {
		log.Info("call failed", "attempts", attempt, "error_code", res.ErrorCode)
	}
	return r.finishHolding(ctx, h, m, &res, redrive, log)
}

// redrive is what a tool call re-driven from the dead letters carries: the re-drive's id and
// the record sequence its result follows (bus.HeaderRedriveAfter).
type redrive struct {
	id    string
	after uint64
}

func redriveOf(d *bus.Delivery) redrive {
	r := redrive{id: d.Header.Get(bus.HeaderRedrive)}
	if r.id != "" {
		// Set by whoever re-drove the call (a router's or an administrator's credential:
		// no worker publishes tool calls); unreadable, 0: the ledger then decides what is
		// there.
		r.after, _ = strconv.ParseUint(d.Header.Get(bus.HeaderRedriveAfter), 10, 64)
	}
	return r
}

// recordRetry spaces out tries to record a finished call's result while the bus is
// unreachable: 100 ms doubling up to 2 s.
var recordRetry = retry.Policy{Initial: 100 * time.Millisecond, Factor: 2, Max: 2 * time.Second}

// finishHolding records the result of a finished try, trying again while the bus is
// unreachable for up to two leases, and holding the call meanwhile: the result is known, so
// it must not be lost to a short outage, nor the call left to wait out its claim. A retry
// after an ambiguous failure is stored once (the same message id). The claim says first that
// this holder is recording (so a holder taking the call over after this one died leaves its
// result standing), and once the result is recorded that the call is finished, so no delivery
// runs it again; a worker stopping in between leaves the call to run again, and the record
// keeps the first result.
func (r *runner) finishHolding(ctx context.Context, h *ledger.Hold, m *protocol.Message, res *protocol.ToolResult, redrive redrive, log *slog.Logger) error {
	lease := r.ledger.Lease()
	// Before the keep-alive: a hold's writes are one at a time. Whether the mark is this
	// holder's, the ledger says again when something is recorded first (Settled).
	_, _ = h.Recording(ctx)
	stop := h.KeepAlive(ctx, lease/3, nil)
	defer stop()
	recorded := false
	err := retry.Do(ctx, recordRetry, time.Now().Add(2*lease), func() error {
		var err error
		recorded, err = r.w.finish(ctx, m, res, redrive, r.ledger)
		if bus.IsPermanent(err) {
			return retry.Stop(err)
		}
		return err
	}, func(err error, wait time.Duration) {
		log.Warn("recording the result failed; trying again", "err", err, "in", wait)
	})
	if err != nil {
		return err
	}
	if !recorded {
		log.Info("another result of the call was recorded first; it stands")
		return nil
	}
	stop()
	if err := h.Finish(ctx); err != nil {
		// The result is recorded: a later delivery of the call runs it again only if the
		// ledger never learns it is finished, and the record keeps the first result.
		log.Warn("the result is recorded, but the ledger could not be told the call is finished", "err", err)
	}
	return nil
}

// tryHolding runs one try while renewing h; the renewal stops when the try ends, and stops
// the try (stop) when it finds the call cancelled.
func (r *runner) tryHolding(ctx context.Context, h *ledger.Hold, m *protocol.Message, disp *protocol.Dispatch, stop context.CancelCauseFunc, attempt, maxAttempts int) (Outcome, error) {
	defer h.KeepAlive(ctx, r.ledger.Lease()/3, func() { stop(&CancelledError{}) })()
	return r.w.try(ctx, r.kind, m, disp, attempt, maxAttempts)
}

// try runs one try of the call with the executor for its action kind.
func (w *Worker) try(ctx context.Context, kind string, m *protocol.Message, disp *protocol.Dispatch, attempt, maxAttempts int) (Outcome, error) {
	if !m.Deadline.IsZero() && time.Now().After(m.Deadline) {
		return Failed(protocol.CodeDeadlineExceeded, protocol.OriginHermes,
			"the request's deadline passed before the call could run; send it again with a later deadline",
			"deadline exceeded", false), nil
	}
	if len(w.cfg.TrustedSeals) > 0 && m.Seal != nil && time.Now().After(m.Seal.Expires) {
		return Failed(protocol.CodeDeadlineExceeded, protocol.OriginHermes,
			"the call waited longer than its router's seal is good for (its ledger entry may be gone, so it is not run); send the request again",
			"seal expired", false), nil
	}
	exec := w.execs[disp.Action.Kind]
	if exec == nil || disp.Action.Kind != kind {
		// No router dispatches a call of one kind on another kind's subject; one published
		// there otherwise is answered, not run.
		exec = Chain(unsupported{kind: disp.Action.Kind}, Standard()...)
	}
	return exec.Execute(ctx, &Call{RequestID: m.RequestID, SessionID: m.SessionID, Trace: m.Trace,
		Attempt: attempt, MaxAttempts: maxAttempts, Dispatch: disp,
		Timeout: time.Duration(max(disp.Action.TimeoutMS, 1)) * time.Millisecond, MaxResultBytes: w.cfg.MaxResultBytes})
}

// publishStarted records the starts of the tries a call had on this worker's fast lane,
// 1 to fast.tries, each retrying what the one before failed with (fast.codes). Recorded by the
// router already (it took the answer), they are the same messages, and stored once.
func (w *Worker) publishFastStarts(ctx context.Context, m *protocol.Message, disp *protocol.Dispatch, fast fastAnswer, log *slog.Logger) {
	for attempt := 1; attempt <= fast.tries; attempt++ {
		if err := w.publishStarted(ctx, m, disp, attempt, protocol.RetriedBefore(fast.codes, attempt), fast.began); err != nil {
			log.Warn("could not record the start of the fast lane's try", "err", err)
		}
	}
}

// publishStarted records the start of try attempt of disp's call, at; retrying is the error
// code the try before it failed with ("" for a first try, or when unknown).
func (w *Worker) publishStarted(ctx context.Context, cause *protocol.Message, disp *protocol.Dispatch, attempt int, retrying string, at time.Time) error {
	if attempt <= 1 {
		retrying = ""
	}
	out, err := protocol.NewMessage(protocol.TypeToolStarted, &protocol.ToolStarted{
		ToolCallID: disp.Call.ToolCallID, Name: disp.Call.Name, Attempt: attempt, StartedAt: at.UTC(), Retrying: retrying})
	if err != nil {
		return bus.Permanent(err)
	}
	out.Follow(cause, protocol.MsgIDToolStarted(cause.RequestID, disp.Call.ToolCallID, attempt))
	out.Attempt, out.Correlation = attempt, nil
	// A start is an event for people and dashboards: it does not wait for the stream's ack.
	return w.pub.PublishNoWait(ctx, protocol.SubjectEvent(protocol.EventToolStarted, cause.SessionID), out)
}

// finishCancelled answers a call of a cancelled request: the canceller records a CANCELLED
// result for every unfinished call; recording one here too (the first recorded wins) makes
// sure the call has it even if the canceller stopped half-way.
func (w *Worker) finishCancelled(ctx context.Context, m *protocol.Message, disp *protocol.Dispatch, attempts int, by string, redrive redrive, l *ledger.Ledger) error {
	res := protocol.CancelledResult(&disp.Call, disp.Route, attempts, by)
	_, err := w.finish(ctx, m, &res, redrive, l)
	return err
}

// tooLarge is the RESULT_TOO_LARGE error that stands for res, larger than the bus's limit.
func tooLarge(res protocol.ToolResult, limit int) protocol.ToolResult {
	r := protocol.ErrorResult(protocol.CodeResultTooLarge, protocol.OriginHermes,
		fmt.Sprintf("the tool answered more than the bus carries in one message (%d bytes); ask for less (paging, filters)", limit),
		fmt.Sprintf("result of %d bytes does not fit in one bus message", len(res.Content)))
	r.ToolCallID, r.Name, r.Route, r.Attempts = res.ToolCallID, res.Name, res.Route, res.Attempts
	r.ExecutionTimeMS = res.ExecutionTimeMS
	return r
}

// hermesCode makes res's error_code one of Hermes' codes: an executor's own code is the tool's
// word, not Hermes', and moves to tool_error_code (unless the tool's contract declared it).
func hermesCode(res *protocol.ToolResult) {
	if res.ErrorCode != "" && !protocol.IsHermesCode(res.ErrorCode) && !declaredCode(res) {
		if res.ToolErrorCode == "" {
			res.ToolErrorCode = protocol.ToolCode(res.ErrorCode)
		}
		res.ErrorCode = protocol.CodeToolFailed
	}
}

// finish records the call's final result on the record, without reading it
// (bus.PublishResult), its error_code made one of Hermes' (the executor's own code moved to
// tool_error_code, unless the tool's contract declared it), and reports whether it is the
// call's recorded result: false when another was recorded first, which stands. A result too
// large for one bus message is recorded as a RESULT_TOO_LARGE error. A re-driven call
// publishes under a message id of its own (the id of the first answer is spent in the
// duplicate window), after the answer it supersedes.
func (w *Worker) finish(ctx context.Context, cause *protocol.Message, res *protocol.ToolResult, redrive redrive, l *ledger.Ledger) (bool, error) {
	hermesCode(res)
	// Whether a result recorded first stands: the ledger says so of a finished or cancelled
	// call, and of one another holder began recording; anything else there is no result of
	// the call.
	settled := func(ctx context.Context) (bool, error) {
		return l.Settled(ctx, ledger.Key(cause.RequestID, res.ToolCallID))
	}
	if c := cause.Correlation; c != nil && c.Grant != nil && res.Grant == nil && c.Grant.Check() == nil {
		res.Grant = c.Grant // the turn the call ran under: its transaction id and fencing token
	}
	id := protocol.MsgIDToolResult(cause.RequestID, res.ToolCallID)
	if redrive.id != "" {
		id = protocol.MsgIDRedrivenResult(cause.RequestID, res.ToolCallID, redrive.id)
	}
	for {
		out, err := protocol.NewMessage(protocol.TypeToolResult, res)
		if err != nil {
			return false, bus.Permanent(err)
		}
		out.Follow(cause, id)
		out.Attempt = res.Attempts
		mine, err := w.cfg.Bus.PublishResult(ctx, w.pub, out, res, redrive.after, settled)
		if err == nil && mine {
			w.obs.Recorded(res)
		}
		if errors.Is(err, bus.ErrTooLarge) && res.ErrorCode != protocol.CodeResultTooLarge {
			*res = tooLarge(*res, w.cfg.Bus.MaxMessageBytes())
			continue
		}
		return mine, err
	}
}
