package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/demotools"
	"github.com/hermesbus/hermes/internal/gateway"
	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/internal/router"
	"github.com/hermesbus/hermes/internal/routes"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/hermes"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// SystemConfig describes a whole Hermes in one process: what hermes up and hermes bench run.
type SystemConfig struct {
	// Trust names keys trusted beside the system's own (--trusted-seals): other routers', whose
	// calls the workers here run, and workers', whose results of the tools named count.
	Trust trust
	// NATSURL names an external server; empty embeds one. NATSAuth is how every service
	// authenticates to an external server (the embedded one gives each its own user).
	NATSURL  string
	NATSAuth bus.Credentials
	// DataDir, SyncAlways and NATSListen configure the embedded server.
	DataDir    string
	SyncAlways bool
	NATSListen string
	// HTTPAddr is the gateway's listen address.
	HTTPAddr string
	// DemoAddr is the demo tools' listen address; empty runs none. DemoGRPCAddr is where their
	// gRPC service (customer.ProfileService) listens, when they run; empty runs it nowhere.
	DemoAddr     string
	DemoGRPCAddr string
	// Routes is the table; RoutesPath, when set and WatchRoutes, is reloaded on change.
	Routes      *routes.Table
	RoutesPath  string
	WatchRoutes bool
	// ToolWorkers is how many tool workers run in this process (0: none; bench starts worker
	// processes of its own).
	ToolWorkers int
	Worker      WorkerConfig
	Gateway     gateway.Config
	Bus         bus.Config
	Limits      protocol.Limits
	Instance    string
	Logger      *slog.Logger
	// OIDC, when it names an issuer, lets the gateway take that issuer's tokens too.
	OIDC auth.OIDCConfig
	// KeyFile keeps the admin key the system starts with (see ensureAdminKey); empty makes a
	// new key each start, kept nowhere (System.Key tells it).
	KeyFile string
	// Contracts is a directory of tools' contracts registered at start (registerContracts);
	// empty registers none.
	Contracts string
	// LLM configures the agent loop behind POST /v1/chat/completions; none when it asks for
	// no model. Chat, when set, is used instead (a model configured by the caller).
	LLM  llmFlags
	Chat *ChatConfig
}

// System is a started SystemConfig. Run it, then it cleans up after itself.
type System struct {
	// results are the keys trusted to seal results; meetingKey seals the Go meeting tools'.
	results    protocol.ResultKeys
	meetingKey *router.SealKey
	// GatewayURL and DemoURL are http:// base URLs; DemoURL is empty without demo tools.
	GatewayURL, DemoURL string
	// LLM describes the agent loop's model; empty without one.
	LLM string
	// DemoGRPC is the demo gRPC service's address; empty when it does not run.
	DemoGRPC string
	// ClientURL is where other processes reach NATS: the external URL, or the embedded
	// server's when it listens; empty when the embedded server takes in-process clients only.
	ClientURL string
	// NATSDescription says which NATS this is, for people.
	NATSDescription string
	// Services names what runs, for people: "router (stages serial, plan, route)", …
	Services []string
	// Key is the admin API key the gateway takes (see SystemConfig.KeyFile).
	Key SystemKey
	// Contracts says what contracts the start registered, for people ("" for none).
	Contracts string
	// Bus is the bus configuration the system provisions with, defaults applied.
	Bus bus.Config
	// Seeds are the files holding the nkey seeds of the embedded server's users, by role
	// (DATA/nats/<role>.nk); empty with an external server.
	Seeds map[bus.Role]string

	front   func(context.Context) error
	back    []func(context.Context) error
	cleanup []func()
}

// StartSystem starts NATS (or connects), provisions the bus and builds every service; nothing
// handles messages until Run.
func StartSystem(ctx context.Context, cfg SystemConfig) (_ *System, err error) {
	sys := &System{Bus: bus.WithDefaults(cfg.Bus)}
	defer func() {
		if err != nil {
			sys.close() // what started before the failure: the server, connections, listeners
		}
	}()
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	obs, err := observe(ctx, "hermes")
	if err != nil {
		return nil, err
	}
	sys.cleanup = append(sys.cleanup, obs.close)
	// Each service connects as the user of its role, with its role's inbox (roleOpts); the
	// embedded server lets in no one else, and each user only what its role needs
	// (bus.AccessOf).
	var connOpts []nats.Option
	roleOpts := map[bus.Role][]nats.Option{}
	if cfg.NATSURL == "" {
		users, seeds, err := upUsers(cfg.DataDir)
		if err != nil {
			return nil, err
		}
		sys.Seeds = seeds
		s, err := bus.StartServer(bus.ServerConfig{StoreDir: cfg.DataDir, Listen: cfg.NATSListen, SyncAlways: cfg.SyncAlways,
			MaxFileStore: max(bus.DefaultMaxFileStore, bus.StoreBytes(cfg.Bus)+1<<30), Users: users})
		if err != nil {
			return nil, err
		}
		sys.cleanup = append(sys.cleanup, s.Close)
		connOpts = append(connOpts, s.ConnectOption())
		for role, path := range seeds {
			o, err := roleOptions(role, path)
			if err != nil {
				return nil, err
			}
			roleOpts[role] = o
		}
		abs, _ := filepath.Abs(cfg.DataDir)
		sync := "interval"
		if cfg.SyncAlways {
			sync = "always"
		}
		sys.NATSDescription = fmt.Sprintf("embedded, JetStream store in %s (sync %s)", abs, sync)
		if cfg.NATSListen != "" {
			sys.ClientURL = s.ClientURL()
			sys.NATSDescription += ", clients at " + sys.ClientURL
		}
	} else {
		sys.ClientURL, sys.NATSDescription = cfg.NATSURL, bus.Redact(cfg.NATSURL)
		if connOpts, err = cfg.NATSAuth.Options(); err != nil {
			return nil, err
		}
	}
	if cfg.DemoAddr != "" {
		ln, err := listen(cfg.DemoAddr, "demo tools")
		if err != nil {
			return nil, err
		}
		sys.cleanup = append(sys.cleanup, func() { ln.Close() })
		sys.back = append(sys.back, func(ctx context.Context) error { return demotools.Serve(ctx, ln, log.With("service", "demo-tools")) })
		if got := ln.Addr().String(); got != demoToolsAddr {
			// Routes name 127.0.0.1:8081: dial where the demo tools really are.
			cfg.Worker.Resolve = withResolve(cfg.Worker.Resolve, demoToolsAddr, got)
		}
		sys.DemoURL = "http://" + ln.Addr().String()
		if cfg.DemoGRPCAddr != "" {
			gln, err := listen(cfg.DemoGRPCAddr, "demo gRPC service")
			if err != nil {
				return nil, err
			}
			sys.cleanup = append(sys.cleanup, func() { gln.Close() })
			sys.back = append(sys.back, func(ctx context.Context) error {
				return demotools.ServeProfiles(ctx, gln, log.With("service", "demo-grpc"))
			})
			if got := gln.Addr().String(); got != demoGRPCAddr {
				// Routes name 127.0.0.1:8090: dial where the service really is.
				cfg.Worker.Resolve = withResolve(cfg.Worker.Resolve, demoGRPCAddr, got)
			}
			sys.DemoGRPC = gln.Addr().String()
		}
	}
	// One connection per service, as separate processes would have. The admin's provisions
	// the bus; the services only use it, as they would with --no-provision.
	conn := func(name string, role bus.Role) (*nats.Conn, *bus.Bus, error) {
		bc := cfg.Bus
		bc.NoProvision = cfg.Bus.NoProvision || role != bus.RoleAdmin
		nc, b, err := Connect(ctx, cfg.NATSURL, cfg.Instance+"-"+name, bc, log, append(slices.Clone(connOpts), roleOpts[role]...)...)
		if err == nil {
			sys.cleanup = append(sys.cleanup, nc.Close)
		}
		return nc, b, err
	}
	_, ab, err := conn("provision", bus.RoleAdmin)
	if err != nil {
		return nil, err
	}
	if cfg.Contracts != "" {
		desc, registered, left, err := registerContracts(ctx, registry.NewStore(ab.Contracts), cfg.Contracts)
		if err != nil {
			return nil, err
		}
		sys.Contracts = fmt.Sprintf("%d tools from %s", len(registered), desc)
		if len(left) > 0 {
			sys.Contracts += fmt.Sprintf("; %d registered by others kept (%s)", len(left), strings.Join(left, ", "))
		}
	}
	// Every call the router sends is sealed (the key pair lives in the data dir). On its own
	// server, the workers here run only sealed calls: a call published on the bus by anyone
	// else is dropped. On a server shared with other routers, they trust only what
	// --trusted-seals names, if anything: calls of routers they do not know must not be
	// taken from the shared consumers and dropped.
	seal, trusted, err := upSealKeys(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if cfg.NATSURL == "" || len(cfg.Trust.calls) > 0 {
		for id, k := range cfg.Trust.calls {
			trusted[id] = k
		}
		for id, k := range cfg.Worker.TrustedSeals {
			trusted[id] = k
		}
		cfg.Worker.TrustedSeals = trusted
	}
	// Every result is sealed too, by the service that records it, and counts only when a key
	// trusted for its call's tool sealed it: the services here seal with the system's key
	// (trusted with any tool), the Go meeting tools with a key of their own trusted with
	// their tools only (as a tool program beside Hermes would be), and --trusted-seals adds
	// other routers' and workers' keys.
	results, meetingKey, err := upResultKeys(seal, cfg.Trust)
	if err != nil {
		return nil, err
	}
	sys.results, sys.meetingKey = results, meetingKey
	baseConn := conn
	conn = func(name string, role bus.Role) (*nats.Conn, *bus.Bus, error) {
		nc, b, err := baseConn(name, role)
		if err == nil {
			b.SealResults(seal.ID, seal.Key)
			b.TrustResults(results)
		}
		return nc, b, err
	}
	_, rb, err := conn("router", bus.RoleRouter)
	if err != nil {
		return nil, err
	}
	obs.watchBacklog(rb, log)
	r, err := NewRouter(rb, RouterConfig{Instance: cfg.Instance + "-router", Routes: cfg.Routes, Path: routesPath(cfg),
		Reload: 2 * time.Second, Concurrency: 64, Limits: cfg.Limits, Metrics: obs.metrics, Seal: seal, Logger: log})
	if err != nil {
		return nil, err
	}
	sys.back = append(sys.back, r.Run)
	sys.Services = append(sys.Services, fmt.Sprintf("router (pipeline: %s)", strings.Join(r.Stages(), " → ")))
	{
		_, db, err := conn("dead-letters", bus.RoleRouter)
		if err != nil {
			return nil, err
		}
		d, err := NewDeadLetters(db, cfg.Instance+"-dead-letters", cfg.Limits, obs.metrics, log)
		if err != nil {
			return nil, err
		}
		sys.back = append(sys.back, d.Run)
		sys.Services = append(sys.Services, "dead-letter processor (hermes dlq ls)")
	}
	var mcpWorker *WorkerService
	for i := range cfg.ToolWorkers {
		name := "toolworker"
		if i > 0 {
			name = fmt.Sprintf("toolworker-%d", i+1)
		}
		_, wb, err := conn(name, bus.RoleWorker)
		if err != nil {
			return nil, err
		}
		wc := cfg.Worker
		wc.Instance, wc.Metrics, wc.Logger = cfg.Instance+"-"+name, obs.metrics, log
		if i > 0 {
			wc.MCP = nil // the first worker holds the MCP servers: one program each
		}
		w, err := NewWorker(wb, wc)
		if err != nil {
			return nil, err
		}
		sys.back = append(sys.back, w.Run)
		if i == 0 {
			sys.Services = append(sys.Services, fmt.Sprintf("tool worker × %d (kinds %s)", cfg.ToolWorkers, strings.Join(w.Kinds(), ", ")))
			if wc.MCP != nil {
				mcpWorker = w
				var names []string
				for _, srv := range wc.MCP.Servers {
					names = append(names, srv.Name)
				}
				sys.Services = append(sys.Services, "MCP servers held by the tool worker: "+strings.Join(names, ", ")+" (hermes mcp ls)")
			}
		}
	}
	gnc, gb, err := conn("gateway", bus.RoleGateway)
	if err != nil {
		return nil, err
	}
	gc := cfg.Gateway
	gc.Instance, gc.Limits, gc.Metrics, gc.Gatherer, gc.Logger = cfg.Instance+"-gateway", cfg.Limits, obs.metrics, obs.reg, log
	if gc.Callers, err = CallerVerifier(gb, cfg.OIDC); err != nil {
		return nil, err
	}
	gc.Signins = NewSignins(gb)
	chat, chatDesc, stopLLM, err := cfg.LLM.chat(ctx, obs.metrics, log)
	if err != nil {
		return nil, err
	}
	sys.cleanup = append(sys.cleanup, stopLLM)
	if cfg.Chat != nil {
		chat, chatDesc = cfg.Chat, cfg.Chat.Model
	}
	if chat != nil {
		sys.LLM = chatDesc
	}
	g, err := NewGateway(gnc, gb, gc, chat)
	if err != nil {
		return nil, err
	}
	gln, err := listen(cfg.HTTPAddr, "gateway")
	if err != nil {
		return nil, err
	}
	sys.cleanup = append(sys.cleanup, func() { gln.Close() })
	// Made once the gateway has its port, so that a key made is a key shown.
	if sys.Key, err = ensureAdminKey(ctx, auth.NewKeys(ab.Keys), cfg.KeyFile); err != nil {
		return nil, err
	}
	sys.GatewayURL = "http://" + gln.Addr().String()
	sys.Services = append(sys.Services, "gateway")
	if mcpWorker != nil && sys.Key.Key != "" {
		mcpWorker.RegisterThrough(sys.GatewayURL, sys.Key.Key)
	}
	if cfg.DemoAddr != "" {
		sys.back = append(sys.back, sys.meetingTools(cfg, append(slices.Clone(connOpts), roleOpts[bus.RoleWorker]...), log))
		sys.Services = append(sys.Services, "meeting tools in Go, on the SDK ("+strings.Join(demotools.MeetingToolNames, ", ")+")")
	}
	sys.front = func(ctx context.Context) error { return g.Run(ctx, gln) }
	return sys, nil
}

// meetingTools serves the demo's Go tools with the SDK as a tool worker's user, registering
// their contracts through this system's gateway with its admin key (the gateway comes up after
// them: the SDK waits for it). Should that fail, the rest of the system runs on without them.
func (s *System) meetingTools(cfg SystemConfig, opts []nats.Option, log *slog.Logger) func(context.Context) error {
	log = log.With("service", "meeting-tools")
	mc := hermes.Config{NATS: cfg.NATSURL, Options: opts, Instance: cfg.Instance + "-meeting-tools",
		TrustedSeals: cfg.Worker.TrustedSeals, SealKeyID: s.meetingKey.ID, SealKey: s.meetingKey.Key, TrustedResults: s.results, Logger: log}
	if s.Key.Key != "" {
		mc.Gateway, mc.APIKey = s.GatewayURL, s.Key.Key
	}
	return func(ctx context.Context) error {
		if err := demotools.ServeMeetings(ctx, mc); err != nil && ctx.Err() == nil {
			log.Error("the Go meeting tools stopped; the rest runs on without them", "err", err)
			<-ctx.Done()
		}
		return nil
	}
}

// userOption connects as role's user of the embedded server, with its role's inbox; it does
// nothing with an external server.
func (s *System) userOption(role bus.Role) nats.Option {
	path, ok := s.Seeds[role]
	if !ok {
		return func(*nats.Options) error { return nil }
	}
	opts, err := roleOptions(role, path)
	return func(o *nats.Options) error {
		if err != nil {
			return err
		}
		for _, opt := range opts {
			if err := opt(o); err != nil {
				return err
			}
		}
		return nil
	}
}

// roleOptions connect as the user of role whose nkey seed is in path, with the inbox prefix
// the role's permissions name.
func roleOptions(role bus.Role, path string) ([]nats.Option, error) {
	a, err := bus.AccessOf(role, string(role))
	if err != nil {
		return nil, err
	}
	o, err := nats.NkeyOptionFromSeed(path)
	if err != nil {
		return nil, fmt.Errorf("NATS user %s: %w", role, err)
	}
	return []nats.Option{o, nats.CustomInboxPrefix(a.Inbox)}, nil
}

// upUsers are the embedded server's NATS users, one per role, each with its seed kept in
// DATA/nats/<role>.nk (made on first start, mode 0600): the services here connect with them,
// and so may the command line (the admin's) and more workers or clients started beside.
func upUsers(dataDir string) ([]bus.User, map[bus.Role]string, error) {
	dir := filepath.Join(dataDir, "nats")
	var users []bus.User
	seeds := map[bus.Role]string{}
	for _, r := range bus.Roles {
		u, path, err := bus.LoadOrNewUser(dir, string(r), r)
		if err != nil {
			return nil, nil, err
		}
		users, seeds[r] = append(users, u), path
	}
	return users, seeds, nil
}

// routesPath is the file the router reloads, if any.
func routesPath(cfg SystemConfig) string {
	if cfg.WatchRoutes {
		return cfg.RoutesPath
	}
	return ""
}

// Run runs the system until ctx is done. On shutdown the gateway stops taking requests and
// lets those in flight finish while the router, workers and demo tools still run; then they
// stop; then the connections close and the embedded server shuts down.
func (s *System) Run(ctx context.Context) error {
	defer s.close()
	if s.front == nil {
		return errors.New("app: system not started")
	}
	return runLayers(ctx, s.front, s.back...)
}

func (s *System) close() {
	for i := len(s.cleanup) - 1; i >= 0; i-- {
		s.cleanup[i]()
	}
	s.cleanup = nil
}

// withResolve is resolve (a copy) with from dialed at to, unless resolve says otherwise.
func withResolve(resolve map[string]string, from, to string) map[string]string {
	out := map[string]string{from: to}
	for k, v := range resolve {
		out[k] = v
	}
	return out
}
