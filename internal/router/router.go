package router

import (
	"context"
	"crypto/ed25519"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/hermesbus/hermes/internal/answer"
	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/internal/park"
	"github.com/hermesbus/hermes/internal/routes"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/contract"
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
	// Concurrency bounds results handled at once. Default 64.
	Concurrency int
	// Limits bound requests read from the bus; zero fields take protocol.DefaultLimits.
	Limits protocol.Limits
	// Kinds are the action kinds dispatched; calls routed to another kind are answered
	// ACTION_UNSUPPORTED. Default protocol.ImplementedKinds.
	Kinds []string
	// Contracts returns a tool's contract now (registry.Live.Current); nil: no tool has one.
	// The contract stage runs after the plan stage when it is set.
	Contracts func(tool string) (*contract.Compiled, error)
	// Stages run between the contract and the route stages, in order (policies, rate
	// limits… to come).
	Stages []Stage
	// Last run after the route stage, in order: they see each routed call's dispatch (state
	// coordination, the last word before a call leaves).
	Last []Stage
	// Release is told of every recorded result whose call ran under a grant (a turn on a
	// resource it changes, protocol.Grant): the turn ends. An error retries the result's
	// delivery; nil: grants are not followed.
	Release func(ctx context.Context, g *protocol.Grant, requestID, callID, session, status string) error
	// Metrics counts answered requests; nil counts into unexported metrics.
	Metrics *metrics.Metrics
	// PartitionWatch is how often the router reads the record's number of request partitions
	// again, to read the new ones when it changed. Default DefaultPartitionWatch.
	PartitionWatch time.Duration
	// Seal, when set, signs every tool call this router dispatches (protocol.Seal), so that
	// workers trusting its key run only calls a router sent.
	Seal *SealKey
	// Logger; nil discards.
	Logger *slog.Logger
}

// SealKey is a router's signing key: its id, the ed25519 private key, and how long a seal is
// good (default 24 hours: a call is run within that or not at all).
type SealKey struct {
	ID  string
	Key ed25519.PrivateKey
	TTL time.Duration
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

// Router routes requests to tools through its pipeline and aggregates results into
// responses.
type Router struct {
	cfg       Config
	pub       *bus.Publisher
	table     atomic.Pointer[routes.Table]
	log       *slog.Logger
	pipeline  *Pipeline
	agg       *aggregator
	lot       *park.Lot
	consumers sync.Map   // consumer name → the in-flight bound it was given: consumers this process has ensured
	writes    fastWrites // requests whose record this process's fast lane writes
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
	if len(cfg.Kinds) == 0 {
		cfg.Kinds = protocol.ImplementedKinds
	}
	r := &Router{
		cfg: cfg,
		pub: cfg.Bus.NewPublisher(protocol.Sender{Role: protocol.RoleRouter, Instance: cfg.Instance}),
		log: cfg.Logger,
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	r.table.Store(cfg.Routes)
	r.lot = park.New(cfg.Bus, r.pub, r.log)
	// The sweep's backstop: a request waiting for another's response goes once that one is
	// answered, even if whoever answered it stopped before waking it.
	r.lot.Settled = func(ctx context.Context, key string) (bool, error) {
		rid, ok := strings.CutPrefix(key, protocol.WakeOnResponse(""))
		if !ok || !protocol.ValidToken(rid, protocol.MaxIDLen) {
			return false, nil
		}
		return cfg.Bus.Answered(ctx, rid, "")
	}
	limit := cfg.Limits.MaxToolCalls
	if limit <= 0 {
		limit = protocol.DefaultLimits.MaxToolCalls
	}
	r.agg = &aggregator{bus: cfg.Bus, answer: answer.New(cfg.Bus, r.pub, r.lot, cfg.Metrics, r.log), maxCall: limit, release: cfg.Release}
	wake := r.agg.answer.WakeNext
	stages := []Stage{
		&SerialStage{Sessions: cfg.Bus.Sessions, Answered: cfg.Bus.Answered, Plan: cfg.Bus.Plan, WakeNext: wake},
		&PlanStage{Plans: &busPlans{bus: cfg.Bus, pub: r.pub, answer: r.agg.answer}, WakeNext: wake, StateTTL: cfg.Bus.Config().StateTTL},
	}
	if cfg.Contracts != nil {
		cs := &ContractStage{Contracts: cfg.Contracts}
		if kv := cfg.Bus.Contracts; kv != nil {
			cs.Versions = (&contract.Versions{KV: kv}).At
			cs.Candidate = func(ctx context.Context, tool string) (uint64, error) {
				e, err := kv.Get(ctx, protocol.SandboxKey(tool))
				if errors.Is(err, jetstream.ErrKeyNotFound) {
					return 0, nil
				}
				if err != nil {
					return 0, err
				}
				return e.Revision(), nil
			}
		}
		stages = append(stages, cs)
	}
	stages = append(stages, cfg.Stages...)
	stages = append(stages, &RouteStage{Table: r.Routes, Kinds: cfg.Kinds, Ensure: r.ensureTool})
	stages = append(stages, cfg.Last...)
	r.pipeline = &Pipeline{Stages: stages, Out: &busOutlet{bus: cfg.Bus, pub: r.pub, lot: r.lot, seal: cfg.Seal}}
	return r, nil
}

// SetRoutes replaces the routes table; calls routed after it returns use t.
func (r *Router) SetRoutes(t *routes.Table) { r.table.Store(t) }

// Routes returns the table in use.
func (r *Router) Routes() *routes.Table { return r.table.Load() }

// Stages lists the pipeline's stages, in order.
func (r *Router) Stages() []string {
	out := make([]string, len(r.pipeline.Stages))
	for i, s := range r.pipeline.Stages {
		out[i] = s.Name()
	}
	return out
}

// Run ensures the consumers of every routed tool exist, then handles requests and results
// until ctx is done, and returns after in-flight messages are settled.
func (r *Router) Run(ctx context.Context) error {
	for _, name := range r.Routes().ToolNames() {
		for _, kind := range r.Routes().KindsOf(name) {
			if r.runs(kind) {
				if err := r.ensureTool(ctx, kind, name, r.inFlight(name)); err != nil {
					return err
				}
			}
		}
	}
	resCons, err := r.cfg.Bus.Consumers(ctx, bus.ConsumerRouterResults)
	if err != nil {
		return err
	}
	requests := r.holding(bus.Messages(bus.HandlerFunc(r.handleRequest), r.log, "hermes.route"))
	results := bus.Messages(r.fastRecorded(bus.HandlerFunc(r.agg.handle)), r.log, "hermes.aggregate")
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.routeRequests(ctx, requests) })
	// Each record stream's results; together no more at once than one stream's would be.
	var pool func() *bus.Pool
	if len(resCons) > 1 {
		shared := bus.NewPool(max(r.cfg.Concurrency, 1))
		pool = func() *bus.Pool { return shared }
	}
	for _, c := range resCons {
		g.Go(func() error {
			return (&bus.Subscriber{Consumer: c, Handler: results, Concurrency: r.cfg.Concurrency, Pool: pool, Logger: r.log}).Run(ctx)
		})
	}
	// Timers of parked requests go off wherever a router runs.
	g.Go(func() error { return r.lot.Run(ctx) })
	return g.Wait()
}

// holding observes how long each request holds its partition (handled by h), and how many
// partitions this router holds at once: what sizes the record's partitions (README, "How many
// requests at once").
func (r *Router) holding(h bus.Handler) bus.Handler {
	m := r.cfg.Metrics
	return bus.HandlerFunc(func(ctx context.Context, d *bus.Delivery) error {
		m.PartitionsBusy.Inc()
		start := time.Now()
		defer func() {
			m.PartitionHold.Observe(time.Since(start).Seconds())
			m.PartitionsBusy.Dec()
		}()
		return h.Handle(ctx, d)
	})
}

func (r *Router) runs(kind string) bool {
	for _, k := range r.cfg.Kinds {
		if k == kind {
			return true
		}
	}
	return false
}

// inFlight is the bound of tool's calls in flight its contract sets now (0: none).
func (r *Router) inFlight(tool string) int {
	if r.cfg.Contracts == nil {
		return 0
	}
	if c, err := r.cfg.Contracts(tool); err == nil && c != nil && c.ExecutionPolicy != nil {
		return c.ExecutionPolicy.MaxInFlight
	}
	return 0
}

// ensureTool makes sure tool's consumer of kind exists with at most maxInFlight calls in
// flight; a negative bound asks for the one the tool's contract sets now.
func (r *Router) ensureTool(ctx context.Context, kind, tool string, maxInFlight int) error {
	if maxInFlight < 0 {
		maxInFlight = r.inFlight(tool)
	}
	name := bus.ToolConsumer(kind, tool)
	if n, ok := r.consumers.Load(name); ok && n.(int) == maxInFlight {
		return nil
	}
	if err := r.cfg.Bus.SetToolInFlight(ctx, kind, tool, maxInFlight); err != nil {
		return err
	}
	r.consumers.Store(name, maxInFlight)
	return nil
}

// handleRequest runs one delivery of a request through the pipeline. It is idempotent: on a
// redelivery, a repeated request or a wake-up it dispatches again only calls that have no
// result yet, under the same message ids, so the stream drops what was already published.
func (r *Router) handleRequest(ctx context.Context, d *bus.Delivery) error {
	req, err := d.Msg.DecodeRequest(r.cfg.Limits)
	if err != nil {
		return bus.Permanent(err)
	}
	job := NewJob(d.Msg, req, d.Data, d.Header.Get(bus.HeaderWoken), d.Log)
	job.Planned = d.NumDelivered == 1 && !job.Woken && d.Header.Get(bus.HeaderPlanned) != "" && d.Header.Get(bus.HeaderRedrive) == ""
	return r.pipeline.Run(ctx, job)
}
