package tool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/hermesbus/hermes/internal/ledger"
	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/internal/tracing"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Config configures a Worker.
type Config struct {
	// Bus is the provisioned bus. Required.
	Bus *bus.Bus
	// Instance names this worker in the messages it sends. Required.
	Instance string
	// Tools lists the tools this worker serves. Empty means every tool that has a consumer,
	// including tools that get one while the worker runs.
	Tools []string
	// Concurrency bounds calls of one tool running at once in this worker. Default 32.
	Concurrency int
	// AllowEnv lists the environment variables ${env.NAME} placeholders may read, each as NAME
	// (sent to whatever host a call names) or NAME@host:port (sent only to that host).
	AllowEnv []string
	// Resolve maps host:port in routes to another host:port to dial (like curl --resolve).
	Resolve map[string]string
	// MaxResultBytes bounds a tool's answer. Default DefaultMaxResultBytes.
	MaxResultBytes int64
	// Executors by action kind; nil means the HTTP executor for "http". Kinds without one fail
	// with ACTION_UNSUPPORTED.
	Executors map[string]Executor
	// Metrics observes dispatch delays, tries, retries and results; nil counts into unexported
	// metrics.
	Metrics *metrics.Metrics
	// Logger; nil discards.
	Logger *slog.Logger
}

// Worker runs tool calls.
type Worker struct {
	cfg       Config
	pub       *bus.Publisher
	executors map[string]Executor
	log       *slog.Logger

	mu      sync.Mutex
	serving map[string]bool
}

// New returns a Worker for cfg.
func New(cfg Config) (*Worker, error) {
	if cfg.Bus == nil || cfg.Instance == "" {
		return nil, errors.New("tool: Config.Bus and Config.Instance are required")
	}
	for _, t := range cfg.Tools {
		if err := protocol.CheckToolName("tools", t); err != nil {
			return nil, fmt.Errorf("tool: %w", err)
		}
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 32
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New(nil)
	}
	w := &Worker{cfg: cfg, log: cfg.Logger, serving: map[string]bool{},
		pub: bus.NewPublisher(cfg.Bus.JS, protocol.Sender{Role: protocol.RoleToolWorker, Instance: cfg.Instance})}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	w.executors = cfg.Executors
	if w.executors == nil {
		env := &EnvResolver{Allowed: map[string]bool{}, Hosts: map[string]string{}}
		for _, n := range cfg.AllowEnv {
			name, host, bound := strings.Cut(n, "@")
			env.Allowed[name] = true
			if bound {
				env.Hosts[name] = host
			}
		}
		w.executors = map[string]Executor{protocol.ActionHTTP: &HTTPExecutor{
			Client:         NewHTTPClient(cfg.Resolve),
			Env:            env,
			MaxResultBytes: cfg.MaxResultBytes,
		}}
	}
	return w, nil
}

// Run serves the configured tools until ctx is done and returns once in-flight calls are
// settled. With no tools configured it follows the hermes-tools bucket and starts serving each
// tool as it appears.
func (w *Worker) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	serve := func(tool string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.serving[tool] || ctx.Err() != nil {
			return
		}
		w.serving[tool] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.serve(ctx, tool); err != nil {
				cancel(err)
			}
		}()
	}
	if len(w.cfg.Tools) > 0 {
		for _, t := range w.cfg.Tools {
			serve(t)
		}
	} else {
		watcher, err := w.cfg.Bus.Tools.WatchAll(ctx)
		if err != nil {
			return fmt.Errorf("tool: watch tools: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					_ = watcher.Stop()
					return
				case e, ok := <-watcher.Updates():
					if !ok {
						cancel(errors.New("tool: the watch of hermes-tools ended"))
						return
					}
					if e != nil && e.Operation() == jetstream.KeyValuePut && protocol.ValidToken(e.Key(), protocol.MaxToolNameLen) {
						serve(e.Key())
					}
				}
			}
		}()
	}
	<-ctx.Done()
	w.mu.Lock() // no serve starts after this point
	w.mu.Unlock()
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func (w *Worker) serve(ctx context.Context, tool string) error {
	cons, err := w.cfg.Bus.EnsureToolConsumer(ctx, tool)
	if err != nil {
		return err
	}
	// The lease and progress signals follow the consumer's own ack deadline (set when it was
	// created, possibly by another process with another configuration).
	lease := w.cfg.Bus.Config().AckWait
	if info := cons.CachedInfo(); info != nil && info.Config.AckWait > 0 {
		lease = info.Config.AckWait
	}
	r := &runner{w: w, ledger: ledger.New(w.cfg.Bus.Claims, w.cfg.Instance, lease)}
	w.log.Info("serving tool", "tool", tool, "consumer", bus.ToolConsumer(tool))
	return (&bus.Subscriber{Consumer: cons, Handler: bus.HandlerFunc(r.handle), Concurrency: w.cfg.Concurrency,
		Progress: lease / 3, Logger: w.log.With("tool", tool)}).Run(ctx)
}

// runner runs the calls of one tool.
type runner struct {
	w      *Worker
	ledger *ledger.Ledger
}

// handle runs one delivery of a tool call: at most one try, then a result or a delayed
// redelivery. A call with a recorded result is not run again, and a call held by a live worker
// is left to it.
func (r *runner) handle(ctx context.Context, d *bus.Delivery) (err error) {
	w := r.w
	m, err := protocol.Unmarshal(d.Data)
	if err != nil {
		return bus.Permanent(err)
	}
	disp, err := m.DecodeDispatch()
	if err != nil {
		return bus.Permanent(err)
	}
	callID := disp.Call.ToolCallID
	ctx, span := tracing.Start(ctx, m, "hermes.tool "+disp.Call.Name, trace.SpanKindConsumer,
		attribute.String("hermes.tool", disp.Call.Name), attribute.String("hermes.tool_call_id", callID))
	defer func() { tracing.End(span, err) }()
	// What this worker sends about the call (start, result) follows from its span.
	tracing.Inject(ctx, &m.Trace)
	key := ledger.Key(m.RequestID, callID)
	log := w.log.With("request_id", m.RequestID, "session_id", m.SessionID, "msg_id", m.MsgID,
		"trace_id", m.Trace.TraceID, "tool", disp.Call.Name, "tool_call_id", callID)
	h, wait, err := r.ledger.Acquire(ctx, key)
	if err != nil && !errors.Is(err, ledger.ErrClaimed) {
		return err
	}
	if err != nil || !h.Fresh() {
		// Tried before: it may be finished (perhaps by a worker presumed dead, or this one's
		// publish failed). Then make sure the recorded result reaches the router, and do not
		// run the call again.
		e, gerr := w.cfg.Bus.Calls.Get(ctx, key)
		if gerr == nil || !errors.Is(gerr, jetstream.ErrKeyNotFound) {
			if h != nil {
				h.Release(ctx, "")
			}
			if gerr != nil {
				return fmt.Errorf("tool: check for a recorded result: %w", gerr) // unknown: do not run it now
			}
			log.Info("call already has a result; publishing it again instead of running the call")
			return w.cfg.Bus.Republish(ctx, w.pub, protocol.SubjectToolResult(m.SessionID), e.Value())
		}
	}
	if err != nil {
		log.Info("call held by a live worker; checking again later", "delay", wait)
		return bus.RetryAfter(err, wait+10*time.Millisecond)
	}
	defer h.Done()
	attempt := h.Attempt()
	tool := disp.Call.Name
	if attempt == 1 && !m.CreatedAt.IsZero() {
		w.cfg.Metrics.Dispatch.WithLabelValues(tool).Observe(max(time.Since(m.CreatedAt), 0).Seconds())
	}
	maxAttempts := max(disp.Action.Retry.MaxAttempts, 1)
	if err := w.publishStarted(ctx, m, disp, attempt); err != nil {
		h.Release(context.WithoutCancel(ctx), "")
		return err
	}
	inFlight := w.cfg.Metrics.InFlight.WithLabelValues(tool)
	inFlight.Inc()
	began := time.Now()
	out, err := r.tryHolding(ctx, h, m, disp, maxAttempts)
	inFlight.Dec()
	w.cfg.Metrics.Execution.WithLabelValues(tool).Observe(time.Since(began).Seconds())
	if err != nil {
		h.Release(context.WithoutCancel(ctx), "")
		return err // not judged (shutdown, executor panic): redeliver
	}
	if out.Result.Status != protocol.ResultOK && out.Retryable && attempt < maxAttempts {
		delay := max(RetryDelay(disp.Action.Retry, attempt), out.RetryAfter)
		h.Release(ctx, out.Result.ErrorCode)
		w.cfg.Metrics.Retries.WithLabelValues(tool, out.Result.ErrorCode).Inc()
		log.Info("try failed; retrying", "attempt", attempt, "max_attempts", maxAttempts, "error_code", out.Result.ErrorCode, "delay", delay)
		return bus.RetryAfter(fmt.Errorf("%s on try %d of %d", out.Result.ErrorCode, attempt, maxAttempts), delay)
	}
	res := out.Result
	res.ToolCallID, res.Name, res.Route, res.Attempts = callID, disp.Call.Name, disp.Route, attempt
	res.RequestCallIDs, res.RequestSerial = disp.RequestCallIDs, disp.Serial
	if res.Status != protocol.ResultOK {
		log.Info("call failed", "attempts", attempt, "error_code", res.ErrorCode)
	}
	return r.finishHolding(ctx, h, m, &res, d.Header.Get(bus.HeaderRedrive), log)
}

// finishHolding records and publishes the result of a finished try, trying again while the bus
// is unreachable for up to two leases, and holding the call meanwhile: the result is known, so
// it must not be lost to a short outage, nor the call left to wait out its claim. Recording is
// idempotent (the first recorded result wins), so a retry after an ambiguous failure is safe.
func (r *runner) finishHolding(ctx context.Context, h *ledger.Hold, m *protocol.Message, res *protocol.ToolResult, redrive string, log *slog.Logger) error {
	lease := r.ledger.Lease()
	stop := h.KeepAlive(ctx, lease/3)
	defer stop()
	giveUp := time.Now().Add(2 * lease)
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		err := r.w.finish(ctx, m, res, redrive)
		if err == nil || bus.IsPermanent(err) || ctx.Err() != nil || time.Now().After(giveUp) {
			return err
		}
		log.Warn("recording the result failed; trying again", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

// tryHolding runs one try while renewing h; the renewal stops when the try ends. A panic in
// the executor ends the try with an error, so the call is released and redelivered.
func (r *runner) tryHolding(ctx context.Context, h *ledger.Hold, m *protocol.Message, disp *protocol.Dispatch, maxAttempts int) (out Outcome, err error) {
	stop := h.KeepAlive(ctx, r.ledger.Lease()/3)
	defer func() {
		stop()
		if p := recover(); p != nil {
			err = fmt.Errorf("tool: executor for %s panicked: %v", disp.Action.Kind, p)
		}
	}()
	return r.w.try(ctx, m, disp, h.Attempt(), maxAttempts)
}

// try runs one try of the call with the executor for its action kind.
func (w *Worker) try(ctx context.Context, m *protocol.Message, disp *protocol.Dispatch, attempt, maxAttempts int) (Outcome, error) {
	if !m.Deadline.IsZero() && time.Now().After(m.Deadline) {
		return failure(protocol.CodeDeadlineExceeded, protocol.OriginHermes,
			"the request's deadline passed before the call could run; send it again with a later deadline",
			"deadline exceeded", false), nil
	}
	exec, ok := w.executors[disp.Action.Kind]
	if !ok {
		exec = unsupported{kind: disp.Action.Kind}
	}
	return exec.Execute(ctx, &Call{RequestID: m.RequestID, SessionID: m.SessionID, Trace: m.Trace,
		Attempt: attempt, Dispatch: disp, MaxAttempts: maxAttempts})
}

func (w *Worker) publishStarted(ctx context.Context, cause *protocol.Message, disp *protocol.Dispatch, attempt int) error {
	out, err := protocol.NewMessage(protocol.TypeToolStarted, &protocol.ToolStarted{
		ToolCallID: disp.Call.ToolCallID, Name: disp.Call.Name, Attempt: attempt, StartedAt: time.Now().UTC()})
	if err != nil {
		return bus.Permanent(err)
	}
	out.Follow(cause, protocol.MsgIDToolStarted(cause.RequestID, disp.Call.ToolCallID, attempt))
	out.Attempt = attempt
	// A start is an event for people and dashboards: it does not wait for the stream's ack.
	return w.pub.PublishNoWait(ctx, protocol.SubjectEvent(protocol.EventToolStarted, cause.SessionID), out)
}

// finish records the call's final result and publishes it. Once recorded, the call is done:
// if publishing fails, the redelivery publishes the recorded result instead of running the
// call again. A result too large for one bus message is recorded as a RESULT_TOO_LARGE error.
// A re-driven call (redrive set) publishes under a message id of its own: the id of the first
// answer is spent in the duplicate window.
func (w *Worker) finish(ctx context.Context, cause *protocol.Message, res *protocol.ToolResult, redrive string) error {
	id := protocol.MsgIDToolResult(cause.RequestID, res.ToolCallID)
	if redrive != "" {
		id += ":redrive:" + redrive
	}
	for {
		out, err := protocol.NewMessage(protocol.TypeToolResult, res)
		if err != nil {
			return bus.Permanent(err)
		}
		out.Follow(cause, id)
		out.Attempt = res.Attempts
		_, mine, err := w.cfg.Bus.RecordResult(ctx, w.pub, out, res)
		if err == nil && mine {
			w.cfg.Metrics.ToolResults.WithLabelValues(res.Name, string(res.Status), res.ErrorCode).Inc()
		}
		if errors.Is(err, bus.ErrTooLarge) && res.ErrorCode != protocol.CodeResultTooLarge {
			size := len(res.Content)
			*res = protocol.ToolResult{ToolCallID: res.ToolCallID, Name: res.Name, Route: res.Route, Attempts: res.Attempts,
				RequestCallIDs: res.RequestCallIDs, RequestSerial: res.RequestSerial,
				ExecutionTimeMS: res.ExecutionTimeMS, Status: protocol.ResultError, ErrorCode: protocol.CodeResultTooLarge,
				ErrorOrigin: protocol.OriginHermes, Content: mustJSON(fmt.Sprintf("result of %d bytes does not fit in one bus message", size)),
				RecoveryHint: fmt.Sprintf("the tool answered more than the bus carries in one message (%d bytes); ask for less (paging, filters)", w.cfg.Bus.MaxMessageBytes())}
			continue
		}
		return err
	}
}
