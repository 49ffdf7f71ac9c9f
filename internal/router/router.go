package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"go.opentelemetry.io/otel/trace"

	"github.com/hermesbus/hermes/internal/deadletter"
	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/internal/routes"
	"github.com/hermesbus/hermes/internal/tracing"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Config configures a Router.
type Config struct {
	// Bus is the provisioned bus. Required.
	Bus *bus.Bus
	// Routes is the initial routes table. Required; replace it with SetRoutes.
	Routes *routes.Table
	// Instance names this router in the messages it sends. Required.
	Instance string
	// Concurrency bounds requests and results handled at once, each. Default 64.
	Concurrency int
	// Limits bound requests read from the bus; zero fields take protocol.DefaultLimits.
	Limits protocol.Limits
	// Metrics counts answered requests; nil counts into unexported metrics.
	Metrics *metrics.Metrics
	// Logger; nil discards.
	Logger *slog.Logger
}

// Validate reports a missing required field.
func (c *Config) Validate() error {
	switch {
	case c.Bus == nil:
		return errors.New("router: Config.Bus is required")
	case c.Routes == nil:
		return errors.New("router: Config.Routes is required")
	case c.Instance == "":
		return errors.New("router: Config.Instance is required")
	}
	return nil
}

// Router routes requests to tools and aggregates results into responses.
type Router struct {
	cfg       Config
	pub       *bus.Publisher
	table     atomic.Pointer[routes.Table]
	log       *slog.Logger
	consumers sync.Map // tool name → struct{}: consumers this process has ensured

}

// New returns a Router for cfg.
func New(cfg Config) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 64
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New(nil)
	}
	r := &Router{
		cfg: cfg,
		pub: bus.NewPublisher(cfg.Bus.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: cfg.Instance}),
		log: cfg.Logger,
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	r.table.Store(cfg.Routes)
	return r, nil
}

// SetRoutes replaces the routes table; calls routed after it returns use t.
func (r *Router) SetRoutes(t *routes.Table) { r.table.Store(t) }

// Routes returns the table in use.
func (r *Router) Routes() *routes.Table { return r.table.Load() }

// Run ensures the consumers of every routed tool exist, then handles requests, results and
// dead-letter advisories until ctx is done, and returns after in-flight messages are settled.
func (r *Router) Run(ctx context.Context) error {
	for _, tool := range r.Routes().ToolNames() {
		if err := r.ensureTool(ctx, tool); err != nil {
			return err
		}
	}
	var err error
	reqCons := make([]jetstream.Consumer, protocol.RequestPartitions)
	for p := range reqCons {
		if reqCons[p], err = r.cfg.Bus.Consumer(ctx, bus.RequestConsumer(p)); err != nil {
			return err
		}
	}
	resCons, err := r.cfg.Bus.Consumer(ctx, bus.ConsumerRouterResults)
	if err != nil {
		return err
	}
	dead, err := deadletter.New(deadletter.Config{Bus: r.cfg.Bus, Instance: r.cfg.Instance, Limits: r.cfg.Limits,
		Metrics: r.cfg.Metrics, Wake: r.Wake, Logger: r.log})
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return dead.Run(ctx) })
	for _, c := range reqCons {
		// One request of a partition at a time (the consumer allows no more): its session's
		// order holds.
		g.Go(func() error {
			return (&bus.Subscriber{Consumer: c, Handler: bus.HandlerFunc(r.handleRequest), Concurrency: 1, Logger: r.log}).Run(ctx)
		})
	}
	g.Go(func() error {
		return (&bus.Subscriber{Consumer: resCons, Handler: bus.HandlerFunc(r.handleResult),
			Concurrency: r.cfg.Concurrency, Logger: r.log}).Run(ctx)
	})
	return g.Wait()
}

func (r *Router) ensureTool(ctx context.Context, tool string) error {
	if _, ok := r.consumers.Load(tool); ok {
		return nil
	}
	if _, err := r.cfg.Bus.EnsureToolConsumer(ctx, tool); err != nil {
		return err
	}
	r.consumers.Store(tool, struct{}{})
	return nil
}

// handleRequest records the request's plan and dispatches each call. It is idempotent: on a
// redelivery or a repeated request it dispatches again only calls that have no result yet,
// under the same message ids, so the stream drops what was already published.
func (r *Router) handleRequest(ctx context.Context, d *bus.Delivery) (err error) {
	m, err := protocol.Unmarshal(d.Data)
	if err != nil {
		return bus.Permanent(err)
	}
	ctx, span := tracing.Start(ctx, m, "hermes.route", trace.SpanKindConsumer)
	defer func() { tracing.End(span, err) }()
	req, err := m.DecodeRequest(r.cfg.Limits)
	if err != nil {
		return bus.Permanent(err)
	}
	if req.Serial {
		ready, prev, err := r.serialGate(ctx, m, d.Data)
		if err != nil || !ready {
			if err == nil && prev != "" {
				r.log.Info("serial request waits for the previous one's response", "request_id", m.RequestID,
					"session_id", m.SessionID, "msg_id", m.MsgID, "trace_id", m.Trace.TraceID, "after", prev)
			}
			return err
		}
	}
	return r.dispatch(ctx, m, req)
}

// dispatch records the request's plan and dispatches its calls (see handleRequest).
func (r *Router) dispatch(ctx context.Context, m *protocol.Message, req *protocol.Request) error {
	log := r.log.With("request_id", m.RequestID, "session_id", m.SessionID, "msg_id", m.MsgID, "trace_id", m.Trace.TraceID)
	p := newPlan(m, req)
	enc, err := p.encode()
	if err != nil {
		return bus.Permanent(err)
	}
	fresh := true
	if _, err := r.cfg.Bus.Calls.Create(ctx, m.RequestID, enc); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("router: record plan: %w", err)
		}
		fresh = false
	}
	if !fresh {
		done, err := r.resume(ctx, m, p, log)
		if err != nil || done {
			return err
		}
	}
	table := r.Routes()
	batch := make([]bus.Outgoing, 0, len(req.ToolCalls))
	for i := range req.ToolCalls {
		call := &req.ToolCalls[i]
		if !fresh {
			if _, err := r.cfg.Bus.Calls.Get(ctx, bus.ResultKey(m.RequestID, call.ToolCallID)); err == nil {
				continue // already has its result
			}
		}
		out, err := r.route(ctx, m, req, p.CallIDs, call, table, log)
		if err != nil {
			return err
		}
		if out != nil {
			batch = append(batch, *out)
		}
	}
	// The calls go out together: they are independent, and none waits for another's ack.
	if err := r.pub.PublishBatch(ctx, batch); err != nil {
		return err
	}
	return nil
}

// resume handles a request whose plan exists already. It reports done when the request has
// its response (which it publishes again, deduplicated by the stream), or when this message
// reuses the request_id for other content (ignored: the first request keeps the id).
func (r *Router) resume(ctx context.Context, m *protocol.Message, mine *plan, log *slog.Logger) (bool, error) {
	entry, err := r.cfg.Bus.Calls.Get(ctx, m.RequestID)
	if err != nil {
		return false, fmt.Errorf("router: read plan: %w", err)
	}
	if first, err := decodePlan(entry.Value()); err == nil && first.Fingerprint != "" && first.Fingerprint != mine.Fingerprint {
		log.Warn("request_id reused for a different request; ignored")
		return true, nil
	}
	resp, err := r.cfg.Bus.Responses.Get(ctx, m.RequestID)
	if err == nil {
		return true, r.cfg.Bus.Republish(ctx, r.pub, protocol.SubjectResponse(m.SessionID), resp.Value())
	}
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, fmt.Errorf("router: read response: %w", err)
	}
	log.Info("request seen before; dispatching the calls that have no result yet")
	return false, nil
}

// route matches one call and returns its tool_call message to publish; a call with no route
// gets its NO_ROUTE result at once instead (and route returns nil). ids are every call id of
// the request.
func (r *Router) route(ctx context.Context, m *protocol.Message, req *protocol.Request, ids []string, call *protocol.ToolCall, table *routes.Table, log *slog.Logger) (*bus.Outgoing, error) {
	rule, params, ok := table.Match(call.Name, req.Intent)
	if !ok {
		log.Info("no route", "tool", call.Name, "tool_call_id", call.ToolCallID)
		content := fmt.Sprintf("no route matches tool %q with this intent", call.Name)
		return nil, r.publishResult(ctx, m, &protocol.ToolResult{
			ToolCallID: call.ToolCallID, Name: call.Name, Status: protocol.ResultError, RequestCallIDs: ids, RequestSerial: req.Serial,
			Content: jsonString(content), ErrorCode: protocol.CodeNoRoute, ErrorOrigin: protocol.OriginHermes,
			RecoveryHint: fmt.Sprintf("add a rule for tool_name %s to the routes file (%s), or check the tool name and intent", call.Name, table.File),
		})
	}
	if err := r.ensureTool(ctx, call.Name); err != nil {
		return nil, err
	}
	out, err := protocol.NewMessage(protocol.TypeToolCall, &protocol.Dispatch{Call: *call, Route: rule.Name, Params: params,
		Action: rule.Action, RequestCallIDs: ids, Serial: req.Serial})
	if err != nil {
		return nil, bus.Permanent(err)
	}
	out.Follow(m, protocol.MsgIDToolCall(m.RequestID, call.ToolCallID))
	tracing.Inject(ctx, &out.Trace)
	out.Recipient = bus.ToolConsumer(call.Name)
	log.Debug("dispatching", "tool", call.Name, "tool_call_id", call.ToolCallID, "route", rule.Name)
	return &bus.Outgoing{Subject: protocol.SubjectToolCall(call.Name, m.SessionID), Msg: out}, nil
}

// publishResult records and publishes a result the router decided itself (e.g. NO_ROUTE); it
// is then aggregated like any tool's result.
func (r *Router) publishResult(ctx context.Context, cause *protocol.Message, res *protocol.ToolResult) error {
	out, err := protocol.NewMessage(protocol.TypeToolResult, res)
	if err != nil {
		return bus.Permanent(err)
	}
	out.Follow(cause, protocol.MsgIDToolResult(cause.RequestID, res.ToolCallID))
	tracing.Inject(ctx, &out.Trace)
	_, _, err = r.cfg.Bus.RecordResult(ctx, r.pub, out, res)
	return err
}

func jsonString(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}
