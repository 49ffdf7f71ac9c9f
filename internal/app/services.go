package app

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/examples"
	"github.com/hermesbus/hermes/internal/approvals"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/coordination"
	"github.com/hermesbus/hermes/internal/deadletter"
	"github.com/hermesbus/hermes/internal/discovery"
	"github.com/hermesbus/hermes/internal/fastlane"
	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/internal/park"
	"github.com/hermesbus/hermes/internal/policies"
	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/internal/router"
	"github.com/hermesbus/hermes/internal/routes"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/ledger"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/retry"
	"github.com/hermesbus/hermes/pkg/worker"
	"github.com/hermesbus/hermes/pkg/worker/grpcexec"
	"github.com/hermesbus/hermes/pkg/worker/httpexec"
	"github.com/hermesbus/hermes/pkg/worker/mcpexec"
)

// Connect dials NATS (url, or in-process with opts) and provisions the bus, retrying both
// for up to 30 s: how every Hermes service, and the integration tests, get their bus.
func Connect(ctx context.Context, url, name string, cfg bus.Config, log *slog.Logger, opts ...nats.Option) (*nats.Conn, *bus.Bus, error) {
	log = orDiscard(log)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	nc, err := bus.Connect(cctx, url, name, log, opts...)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	cfg = withBuckets(cfg)
	var b *bus.Bus
	err = retry.Do(cctx, bus.ConnectRetry, time.Time{}, func() (err error) {
		b, err = bus.Provision(cctx, js, cfg)
		if errors.Is(err, bus.ErrNotProvisioned) {
			return retry.Stop(err) // nothing to wait for: no Hermes service set it up
		}
		return err
	}, func(err error, _ time.Duration) { log.Warn("provisioning the bus failed; retrying", "err", err) })
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	for _, d := range b.Drift {
		log.Warn(d)
	}
	return nc, b, nil
}

// defaultRoutes is the routes file used when none is named.
const defaultRoutes = "examples/routes.yaml"

// loadRoutes loads path; the default path falls back to the copy built into the binary when
// the file is not there. It reports what it loaded.
func loadRoutes(path string) (*routes.Table, string, bool, error) {
	t, err := routes.Load(path)
	if err == nil {
		return t, path, true, nil
	}
	if path == defaultRoutes && errors.Is(err, fs.ErrNotExist) {
		data, rerr := examples.Files.ReadFile("routes.yaml")
		if rerr != nil {
			return nil, "", false, rerr
		}
		t, err = routes.Parse(path, data)
		return t, path + " (built-in copy)", false, err
	}
	return nil, "", false, err
}

// RouterConfig configures a router service.
type RouterConfig struct {
	// Instance names the router. Required.
	Instance string
	// Routes is the table; Path, when set, is reloaded every Reload (0: never) while it runs.
	Routes *routes.Table
	Path   string
	Reload time.Duration
	// Concurrency bounds results handled at once.
	Concurrency int
	Limits      protocol.Limits
	// Stages run between the plan and the route stages.
	Stages  []router.Stage
	Metrics *metrics.Metrics
	// Seal, when set, signs every tool call the router dispatches.
	Seal *router.SealKey
	// Fast configures the router's side of the fast lane.
	Fast FastLaneConfig
	// PartitionWatch is how often the router reads the record's number of request partitions
	// again (0: router.DefaultPartitionWatch).
	PartitionWatch time.Duration
	Logger         *slog.Logger
}

// FastLaneConfig configures a router's side of the fast lane (package fastlane).
type FastLaneConfig struct {
	// Off: the router answers no fast-lane request (every request takes the durable path).
	Off bool
	// CallWait bounds the wait for a worker's answer; Buffer the answered requests whose
	// record waits to be written. Zero values take fastlane's defaults.
	CallWait time.Duration
	Buffer   int
}

// RouterService is a router, reloading its routes file when it changes and following the
// tools' contracts.
type RouterService struct {
	*router.Router
	path      string
	reload    time.Duration
	contracts *registry.Live
	policies  *policies.Book
	expirer   *approvals.Expirer
	turns     *coordination.Turns
	// lane is the router's side of the fast lane; nil when off.
	lane *fastlane.Lane
	// announce shows the router to NATS micro discovery until its context ends.
	announce func(ctx context.Context) error
	log      *slog.Logger
}

// NewRouter builds the router service on b.
func NewRouter(b *bus.Bus, cfg RouterConfig) (*RouterService, error) {
	log := orDiscard(cfg.Logger).With("service", "router")
	live := registry.NewLive(b.Contracts, log)
	book, stage, expirer, err := policyStage(b, cfg.Instance, log)
	if err != nil {
		return nil, err
	}
	coord, turns, err := coordinationStage(b, cfg.Instance, log)
	if err != nil {
		return nil, err
	}
	r, err := router.New(router.Config{Bus: b, Routes: cfg.Routes, Instance: cfg.Instance, Concurrency: cfg.Concurrency,
		Limits: cfg.Limits, Contracts: live.Current, Stages: append([]router.Stage{stage}, cfg.Stages...), Last: []router.Stage{coord},
		Release: turns.Release, Metrics: cfg.Metrics, Seal: cfg.Seal, PartitionWatch: cfg.PartitionWatch, Logger: log})
	if err != nil {
		return nil, err
	}
	announce := func(ctx context.Context) error {
		return discovery.Serve(ctx, b.JS.Conn(), discovery.RouterService, "a Hermes router: it routes each request's calls through its pipeline", cfg.Instance,
			map[string]string{"pipeline": strings.Join(r.Stages(), " → ")})
	}
	var lane *fastlane.Lane
	if !cfg.Fast.Off {
		if lane, err = fastlane.New(fastlane.Config{Conn: b.JS.Conn(), Bus: b, Router: r, Limits: cfg.Limits,
			CallWait: cfg.Fast.CallWait, Buffer: cfg.Fast.Buffer, Metrics: cfg.Metrics, Logger: log.With("part", "fastlane")}); err != nil {
			return nil, err
		}
	}
	return &RouterService{Router: r, path: cfg.Path, reload: cfg.Reload, contracts: live, policies: book, expirer: expirer, turns: turns,
		lane: lane, announce: announce, log: log}, nil
}

// Lane is the router's side of the fast lane; nil when it is off.
func (s *RouterService) Lane() *fastlane.Lane { return s.lane }

// coordinationStage is a router's coordination stage on b, and the turns it ends and passes on
// (every router follows the leases).
func coordinationStage(b *bus.Bus, instance string, log *slog.Logger) (*coordination.Stage, *coordination.Turns, error) {
	kv := b.Bucket(coordination.Bucket)
	if kv == nil {
		return nil, nil, fmt.Errorf("router: the bus has no coordination bucket (%s): open it with app.Connect", coordination.Bucket)
	}
	pub := b.NewPublisher(protocol.Sender{Role: protocol.RoleRouter, Instance: instance})
	lot := park.New(b, pub, log)
	wake := func(ctx context.Context, key string) error {
		_, err := lot.Wake(ctx, key)
		return err
	}
	answered := func(ctx context.Context, rid string) (bool, error) { return b.Answered(ctx, rid, "") }
	running := func(ctx context.Context, rid, cid string) (bool, error) {
		return ledger.Running(ctx, b.Claims, ledger.Key(rid, cid), b.Config().AckWait)
	}
	store, events := &coordination.Store{KV: kv, JS: b.JS, Answered: answered, Running: running}, &coordination.Events{Pub: pub, Log: log}
	turns := &coordination.Turns{Store: store, Events: events, Wake: wake, Log: log.With("part", "coordination")}
	return &coordination.Stage{Store: store, Events: events, Wake: wake, Turns: turns}, turns, nil
}

// Contract is tool's contract as this router follows it now (nil: none known to it).
func (s *RouterService) Contract(tool string) (*contract.Compiled, error) {
	return s.contracts.Current(tool)
}

// Policies is the applied policies this router decides calls under, as it follows them.
func (s *RouterService) Policies() *policies.Book { return s.policies }

// Run runs the router until ctx is done, reloading its routes file when it changes and keeping
// the last good table when a change is bad. It takes no request before it knows every contract
// registered.
func (s *RouterService) Run(ctx context.Context) error {
	if err := s.contracts.Start(ctx); err != nil {
		return err
	}
	if err := s.policies.Start(ctx); err != nil {
		return err
	}
	go func() { _ = s.expirer.Run(ctx) }()
	go func() { _ = s.turns.Run(ctx) }()
	go func() {
		if err := s.announce(ctx); err != nil {
			s.log.Warn("not shown to NATS micro discovery", "err", err)
		}
	}()
	if s.path != "" && s.reload > 0 {
		go func() {
			_ = routes.Watch(ctx, s.path, s.reload, func(t *routes.Table) {
				if t.Digest == s.Routes().Digest {
					return
				}
				s.SetRoutes(t)
				s.log.Info("routes reloaded", "file", s.path, "rules", len(t.Rules))
			}, s.log)
		}()
	}
	if s.lane == nil {
		return s.Router.Run(ctx)
	}
	// The fast lane answers once the router runs, and stops with it, writing what it answered.
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.Router.Run(gctx) })
	g.Go(func() error { return s.lane.Run(gctx) })
	return g.Wait()
}

// WorkerConfig configures a tool worker service: Hermes' HTTP executor, plus any others.
type WorkerConfig struct {
	// Instance names the worker. Required.
	Instance string
	// Tools it serves; empty: every tool of its kinds, following new ones.
	Tools []string
	// AllowEnv and Resolve configure the HTTP and gRPC executors (httpexec.New, grpcexec.New);
	// GRPCDescriptors is the directory of descriptor sets gRPC routes may name.
	AllowEnv        []string
	Resolve         map[string]string
	GRPCDescriptors string
	// Concurrency bounds calls of one tool at once; MaxResultBytes bounds an answer.
	Concurrency    int
	MaxResultBytes int64
	// Executors run beside the HTTP executor (Go tools in this process, say); one of kind http
	// replaces it.
	Executors []worker.Executor
	// Pools sizes the worker's bulkheads by resource level.
	Pools worker.Pools
	// TrustedSeals, when set, makes the worker run only tool calls these routers' keys sealed.
	TrustedSeals map[string]ed25519.PublicKey
	// MCP, when set, names the MCP servers the worker holds (LoadMCPConfig); their tools'
	// contracts are registered through Gateway with APIKey (tools:admin), when given.
	MCP             *MCPConfig
	Gateway, APIKey string
	// NoFastLane: the worker answers no fast-lane call (its tools' calls all come from the
	// bus).
	NoFastLane bool
	Metrics    *metrics.Metrics
	Logger     *slog.Logger
}

// WorkerService is a tool worker following the tools' contracts (for their resource levels),
// and holding the MCP servers its configuration names.
type WorkerService struct {
	*worker.Worker
	tools     *discovery.Tools
	contracts *registry.Live
	mcp       *mcpService
	grpc      *grpcexec.Executor
	log       *slog.Logger
}

// Run runs the worker until ctx is done, once it knows every contract registered.
func (s *WorkerService) Run(ctx context.Context) error {
	if err := s.contracts.Start(ctx); err != nil {
		return err
	}
	defer s.grpc.Close() // its connections, once no call runs
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	shown := make(chan struct{})
	go func() {
		defer close(shown)
		if err := s.tools.Run(ctx); err != nil {
			s.log.Warn("not shown to NATS micro discovery", "err", err)
		}
	}()
	defer func() { cancel(); <-shown }()
	if s.mcp == nil {
		return s.Worker.Run(ctx)
	}
	done := make(chan error, 1)
	go func() { done <- s.mcp.run(ctx) }()
	err := s.Worker.Run(ctx)
	cancel()
	<-done
	return err
}

// RegisterThrough makes the worker register its MCP servers' tools' contracts through the
// gateway at base with key; it must be called before Run.
func (s *WorkerService) RegisterThrough(base, key string) {
	if s.mcp != nil {
		s.mcp.gateway = &gatewayAPI{base: base, client: &http.Client{Timeout: 30 * time.Second}, key: keyFlag{fixed: key}}
	}
}

// MCPStates says what the worker knows of its MCP servers (none without).
func (s *WorkerService) MCPStates() []mcpexec.State {
	if s.mcp == nil {
		return nil
	}
	return s.mcp.exec.States()
}

// NewWorker builds a tool worker on b.
func NewWorker(b *bus.Bus, cfg WorkerConfig) (*WorkerService, error) {
	m := cfg.Metrics
	if m == nil {
		m = metrics.New(nil)
	}
	he, err := httpexec.New(cfg.AllowEnv, cfg.Resolve)
	if err != nil {
		return nil, err
	}
	ge, err := grpcexec.New(grpcexec.Config{AllowEnv: cfg.AllowEnv, Resolve: cfg.Resolve, Descriptors: cfg.GRPCDescriptors, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	var execs []worker.Executor
	for _, own := range []worker.Executor{he, ge} {
		if !slices.ContainsFunc(cfg.Executors, func(e worker.Executor) bool { return e != nil && e.Kind() == own.Kind() }) {
			execs = append(execs, own)
		}
	}
	execs = append(execs, cfg.Executors...)
	log := orDiscard(cfg.Logger).With("service", "toolworker")
	var ms *mcpService
	if cfg.MCP != nil {
		if ms, err = newMCPServiceFor(cfg.MCP, cfg.Instance, b, cfg.Gateway, cfg.APIKey, m, log); err != nil {
			return nil, err
		}
		execs = append(execs, ms.exec)
	}
	// The worker reads the contract versions its calls name by revision, and follows the
	// contracts for each tool's resource level (its bulkhead).
	live := registry.NewLive(b.Contracts, log)
	var known sync.Map // tool → its last known level, kept while the contracts are not followed
	level := func(tool string) string {
		c, err := live.Current(tool)
		switch {
		case errors.Is(err, registry.ErrNotFollowing):
			if l, ok := known.Load(tool); ok {
				return l.(string)
			}
			return ""
		case err == nil && c != nil && c.ExecutionPolicy != nil:
			known.Store(tool, c.ExecutionPolicy.ResourceLevel)
			return c.ExecutionPolicy.ResourceLevel
		}
		known.Store(tool, "")
		return ""
	}
	tools := &discovery.Tools{Conn: b.JS.Conn(), Instance: cfg.Instance, Logger: log}
	w, err := worker.New(worker.Config{Bus: b, Instance: cfg.Instance, Executors: execs, Tools: cfg.Tools,
		Concurrency: cfg.Concurrency, MaxResultBytes: cfg.MaxResultBytes, Contracts: live, Pools: cfg.Pools, Level: level,
		Observer: tools.Observer(m.Worker()), Serving: tools.Serving, TrustedSeals: cfg.TrustedSeals, FastLane: !cfg.NoFastLane, Logger: log})
	if err != nil {
		return nil, err
	}
	return &WorkerService{Worker: w, tools: tools, contracts: live, mcp: ms, grpc: ge, log: log}, nil
}

// CallerVerifier names callers by the API keys kept on b and, when o names an issuer, by that
// issuer's tokens; each answer is remembered for a few seconds (a revoked key stops working
// within auth.Cached's TTL, an expired token at its expiry).
func CallerVerifier(b *bus.Bus, o auth.OIDCConfig) (auth.Verifier, error) {
	chain := auth.Chain{Keys: apiKeys(b)}
	if o.Issuer != "" || o.Audience != "" {
		v, err := auth.NewOIDC(o)
		if err != nil {
			return nil, fmt.Errorf("--oidc-issuer and --oidc-audience: %w", err)
		}
		chain.OIDC = v
	}
	return &auth.Cached{Next: chain}, nil
}

// NewSignins keeps browsers' sign-ins on b; those made with an API key end when it is revoked.
func NewSignins(b *bus.Bus) *auth.Signins {
	return auth.NewSignins(b.Bucket(auth.SigninsBucket), apiKeys(b))
}

// NewDeadLetters builds the dead-letter processor on b.
func NewDeadLetters(b *bus.Bus, instance string, limits protocol.Limits, m *metrics.Metrics, log *slog.Logger) (*deadletter.Processor, error) {
	return deadletter.New(deadletter.Config{Bus: b, Instance: instance, Limits: limits, Metrics: m,
		Logger: orDiscard(log).With("service", "dead-letters")})
}

func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

func listen(addr, what string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: listen on %s: %w", what, addr, err)
	}
	return ln, nil
}
