package worker

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"golang.org/x/sync/errgroup"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/ledger"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// DefaultMaxResultBytes bounds a tool's answer unless configured otherwise.
const DefaultMaxResultBytes = 1 << 20

// Config configures a Worker.
type Config struct {
	// Bus is the provisioned bus. Required.
	Bus *bus.Bus
	// Instance names this worker in the messages it sends. Required.
	Instance string
	// Executors run the calls, one per action kind. At least one is required; the worker
	// pulls calls of these kinds only.
	Executors []Executor
	// Tools lists the tools served by executors that do not name their own (see Tools). Empty
	// means every tool with a consumer of the executor's kind, including tools that get one
	// while the worker runs.
	Tools []string
	// Concurrency bounds calls of one tool running at once in this worker. Default 32.
	Concurrency int
	// MaxResultBytes bounds a tool's answer. Default DefaultMaxResultBytes.
	MaxResultBytes int64
	// Middleware wraps every executor, inside Standard (which is always applied).
	Middleware []Middleware
	// Pools sizes the bulkheads: the calls of a tool take a slot of its resource level's pool
	// (Pools.Level) in this worker, so slow heavy tools wait only for each other.
	Pools Pools
	// Level says a tool's resource level now (its contract's: L, M or H); nil, or "", is M.
	Level func(tool string) string
	// Contracts gives the contract versions calls were routed under: their answers are judged
	// by them (CheckContracts). Nil answers every call routed under a contract
	// CONTRACT_UNAVAILABLE.
	Contracts Contracts
	// Observer is told of tries, retries and results (metrics); nil observes nothing.
	Observer Observer
	// Serving, when set, is told each tool the worker begins to serve, with its kind (once
	// each, from Run; it must not block).
	Serving func(kind, tool string)
	// TrustedSeals, when set, are the routers' public keys by key id: the worker runs only
	// tool calls one of them sealed (protocol.Seal). Any other call — forged by whoever else
	// can publish on the bus — is dropped: not run, no result, no dead letter (which would
	// answer the forged ids and pre-empt a genuine result), counted in RefusedCalls and
	// logged (at most once a second). Empty runs every call, as before seals.
	TrustedSeals map[string]ed25519.PublicKey
	// FastLane, when set, answers the fast lane too: read-only calls a router sends over
	// request/reply (FastService), each run once in a slot of its tool's pool, answered with
	// its sealed result, which the router records. The worker's NATS user must be allowed to
	// subscribe to protocol.FilterFastCalls and to answer (bus.Access.Responses).
	FastLane bool
	// Logger; nil discards.
	Logger *slog.Logger
}

// Validate reports what is missing or wrong in c.
func (c *Config) Validate() error {
	switch {
	case c.Bus == nil:
		return errors.New("worker: Config.Bus is required")
	case c.Instance == "":
		return errors.New("worker: Config.Instance is required")
	case len(c.Executors) == 0:
		return errors.New("worker: Config.Executors needs at least one executor")
	}
	for id, k := range c.TrustedSeals {
		if len(k) != ed25519.PublicKeySize {
			return fmt.Errorf("worker: Config.TrustedSeals[%q] is %d bytes, not an ed25519 public key", id, len(k))
		}
	}
	kinds := map[string]bool{}
	for _, e := range c.Executors {
		if e == nil {
			return errors.New("worker: Config.Executors holds a nil executor")
		}
		k := e.Kind()
		if !protocol.KnownKind(k) {
			return fmt.Errorf("worker: executor kind %q is not one of %v", k, protocol.Kinds)
		}
		if kinds[k] {
			return fmt.Errorf("worker: two executors of kind %q", k)
		}
		kinds[k] = true
		if t, ok := e.(Tools); ok {
			for _, name := range t.Tools() {
				if err := protocol.CheckToolName("tools", name); err != nil {
					return fmt.Errorf("worker: %s executor: %w", k, err)
				}
			}
		}
	}
	for _, t := range c.Tools {
		if err := protocol.CheckToolName("tools", t); err != nil {
			return fmt.Errorf("worker: %w", err)
		}
	}
	return nil
}

// Worker runs tool calls: it pulls the calls of the tools and kinds it serves from their
// shared durable consumers, claims each in the call ledger, runs it with the executor for its
// kind, and records and publishes its result. Any number of workers may serve the same tools;
// they share the consumers.
type Worker struct {
	cfg     Config
	pub     *bus.Publisher
	execs   map[string]Executor // kind → executor wrapped in its middleware
	fixed   map[string][]string // kind → the tools its executor names (Tools)
	sets    map[string]ToolSet  // kind → its executor's changing tools (ToolSet)
	log     *slog.Logger
	obs     Observer
	running running
	pools   map[string]*bus.Pool // resource level → its pool

	mu      sync.Mutex
	serving map[string]bool // consumer name → served

	fast fastLane

	refused    atomic.Int64 // calls dropped for their seal
	refusedLog atomic.Int64 // unix nanos of the last refusal logged
}

// RefusedCalls counts the tool calls this worker dropped because no trusted router sealed them.
func (w *Worker) RefusedCalls() int64 { return w.refused.Load() }

// New returns a Worker for cfg. Nothing runs until Run.
func New(cfg Config) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 32
	}
	if cfg.MaxResultBytes <= 0 {
		cfg.MaxResultBytes = DefaultMaxResultBytes
	}
	w := &Worker{cfg: cfg, log: cfg.Logger, obs: cfg.Observer, serving: map[string]bool{}, pools: cfg.Pools.make(),
		execs: map[string]Executor{}, fixed: map[string][]string{}, sets: map[string]ToolSet{},
		pub: cfg.Bus.NewPublisher(protocol.Sender{Role: protocol.RoleToolWorker, Instance: cfg.Instance})}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	if w.obs == nil {
		w.obs = nopObserver{}
	}
	// The contract check sits just inside Recover: it reads the contract before the tool's
	// timeout starts, and judges what the timeout and the result limit leave.
	mw := slices.Concat(Standard()[:1], []Middleware{CheckContracts(cfg.Contracts)}, Standard()[1:], cfg.Middleware)
	for _, e := range cfg.Executors {
		w.execs[e.Kind()] = Chain(e, mw...)
		if t, ok := e.(Tools); ok {
			// An executor that names its tools serves those and no others, none if it names
			// none.
			w.fixed[e.Kind()] = append([]string{}, t.Tools()...)
		} else if t, ok := e.(ToolSet); ok {
			w.sets[e.Kind()] = t
		}
	}
	return w, nil
}

// Pools sizes a worker's bulkheads, one pool of handler slots per resource level (contract
// execution_policy.resource_level: L light, M medium, H heavy). Zero sizes take the defaults.
type Pools struct {
	L, M, H int
	// Shared, when positive, puts every level in one pool of that size: no bulkheads.
	Shared int
}

// Default pool sizes of a worker.
const (
	DefaultPoolL = 64
	DefaultPoolM = 32
	DefaultPoolH = 8
)

func (p Pools) make() map[string]*bus.Pool {
	if p.Shared > 0 {
		one := bus.NewPool(p.Shared)
		return map[string]*bus.Pool{"L": one, "M": one, "H": one}
	}
	size := func(n, def int) int {
		if n <= 0 {
			return def
		}
		return n
	}
	return map[string]*bus.Pool{"L": bus.NewPool(size(p.L, DefaultPoolL)), "M": bus.NewPool(size(p.M, DefaultPoolM)), "H": bus.NewPool(size(p.H, DefaultPoolH))}
}

// Pool returns the pool the calls of tool take their slots from now.
func (w *Worker) Pool(tool string) *bus.Pool {
	level := "M"
	if w.cfg.Level != nil {
		if l := w.cfg.Level(tool); w.pools[l] != nil {
			level = l
		}
	}
	return w.pools[level]
}

// Kinds are the action kinds this worker runs, sorted.
func (w *Worker) Kinds() []string {
	out := make([]string, 0, len(w.execs))
	for k := range w.execs {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Run serves calls until ctx is done and returns once in-flight calls are settled. Executors
// that name their tools serve those; the others serve Config.Tools, or, when it is empty,
// follow the hermes-tools bucket and start serving each tool of their kind as it appears.
func (w *Worker) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopSignals, err := w.listenForCancels(ctx)
	if err != nil {
		return err
	}
	defer stopSignals()
	if w.cfg.FastLane {
		if err := w.startFast(); err != nil {
			return err
		}
		defer w.stopFast()
	}
	var wg sync.WaitGroup
	start := func(name string, run func(context.Context) error) bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.serving[name] || ctx.Err() != nil {
			return false
		}
		w.serving[name] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil {
				cancel(err)
			}
		}()
		return true
	}
	serve := func(kind, tool string) {
		if !start(bus.ToolConsumer(kind, tool), func(ctx context.Context) error { return w.serve(ctx, kind, tool) }) {
			return
		}
		w.serveFast(ctx, kind, tool)
		if w.cfg.Serving != nil {
			w.cfg.Serving(kind, tool)
		}
	}
	// Executors whose tools change (ToolSet) serve, of their kind's tools, those they have:
	// the others wait here until they change.
	var waitMu sync.Mutex
	waiting := map[string]map[string]bool{} // kind → tools not had yet
	offer := func(kind, tool string) {
		set := w.sets[kind]
		if set == nil {
			serve(kind, tool)
			return
		}
		// Asked and noted under one lock, which the rescan below holds too: a change between
		// the two cannot be missed.
		waitMu.Lock()
		defer waitMu.Unlock()
		if set.Has(tool) {
			serve(kind, tool)
			return
		}
		if waiting[kind] == nil {
			waiting[kind] = map[string]bool{}
		}
		waiting[kind][tool] = true
	}
	for kind, set := range w.sets {
		changed := set.Changed() // before any offer: a change from now on is seen
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case <-changed:
				}
				changed = set.Changed() // taken before the scan: a change during it is seen next
				waitMu.Lock()
				for tool := range waiting[kind] {
					if set.Has(tool) {
						delete(waiting[kind], tool)
						serve(kind, tool)
					}
				}
				waitMu.Unlock()
			}
		}()
	}
	follow := false
	for kind := range w.execs {
		switch {
		case w.fixed[kind] != nil:
			for _, tool := range w.fixed[kind] {
				serve(kind, tool)
			}
		case len(w.cfg.Tools) > 0:
			for _, tool := range w.cfg.Tools {
				serve(kind, tool)
			}
		default:
			follow = true
		}
	}
	if follow {
		watcher, err := w.cfg.Bus.Tools.WatchAll(ctx)
		if err != nil {
			return fmt.Errorf("worker: watch tools: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { _ = watcher.Stop() }()
			for {
				select {
				case <-ctx.Done():
					return
				case e, ok := <-watcher.Updates():
					if !ok {
						cancel(errors.New("worker: the watch of hermes-tools ended"))
						return
					}
					if e == nil || e.Operation() != jetstream.KeyValuePut {
						continue
					}
					kind, tool, ok := protocol.ParseKeyTool(e.Key())
					if ok && w.execs[kind] != nil && w.fixed[kind] == nil {
						offer(kind, tool)
					}
				}
			}
		}()
	}
	<-ctx.Done()
	w.mu.Lock() // no serve starts after this point
	serving := len(w.serving)
	w.mu.Unlock()
	wg.Wait()
	w.log.Debug("worker stopped", "consumers", serving)
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// serve runs the calls of tool of kind from their consumer until ctx is done.
func (w *Worker) serve(ctx context.Context, kind, tool string) error {
	cons, err := w.cfg.Bus.EnsureToolConsumer(ctx, kind, tool)
	if err != nil {
		return err
	}
	// The lease and progress signals follow the consumer's own ack deadline (set when it was
	// created, possibly by another process with another configuration).
	lease := w.cfg.Bus.Config().AckWait
	if info := cons[0].CachedInfo(); info != nil && info.Config.AckWait > 0 {
		lease = info.Config.AckWait
	}
	r := &runner{w: w, kind: kind, ledger: ledger.New(w.cfg.Bus.Claims, w.cfg.Instance, lease)}
	name := cons[0].CachedInfo().Name
	log := w.log.With("tool", tool, "consumer", name)
	log.Info("serving tool", "kind", kind, "record_streams", len(cons))
	h := bus.Messages(bus.HandlerFunc(r.handle), log, "hermes.tool "+tool)
	// One subscriber per record stream; the tool's pool (its bulkhead) bounds them together.
	g, ctx := errgroup.WithContext(ctx)
	for _, c := range cons {
		g.Go(func() error {
			return (&bus.Subscriber{Consumer: c, Handler: h, Concurrency: w.cfg.Concurrency, Progress: lease / 3,
				Pool: func() *bus.Pool { return w.Pool(tool) }, Logger: log}).Run(ctx)
		})
	}
	return g.Wait()
}
