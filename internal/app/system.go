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

	"github.com/hermesbus/hermes/internal/audit"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/internal/demotools"
	"github.com/hermesbus/hermes/internal/fastlane"
	"github.com/hermesbus/hermes/internal/gateway"
	"github.com/hermesbus/hermes/internal/policies"
	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/internal/router"
	"github.com/hermesbus/hermes/internal/routes"
	"github.com/hermesbus/hermes/internal/service"
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
	// Fast configures the fast lane: the routers' side, and with Off, the gateway's and the
	// workers' too.
	Fast FastLaneConfig
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
	// Policies is a policy file (pkg/policy) applied at start to each tool it names that never
	// had a policy applied (applyStartPolicies); nil applies none.
	Policies []byte
	// Blueprints are blueprint documents registered at start, each whose name never had a
	// blueprint (applyStartBlueprints); nil registers none.
	Blueprints [][]byte
	// LLM configures the agent loop behind POST /v1/chat/completions; none when it asks for
	// no model. Chat, when set, is used instead (a model configured by the caller).
	LLM  llmFlags
	Chat *ChatConfig
	// Audit, when it names a database, runs the audit service beside the others: the record
	// projected into PostgreSQL (hermes up --audit-postgres).
	Audit AuditConfig
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
	// Contracts says what contracts the start registered, for people ("" for none); Policies
	// the same of policies.
	Contracts  string
	Policies   string
	Blueprints string
	// Bus is the bus configuration the system provisions with, defaults applied.
	Bus bus.Config
	// Seeds are the files holding the nkey seeds of the embedded server's users, by role
	// (DATA/nats/<role>.nk); empty with an external server.
	Seeds map[bus.Role]string

	// fast is the gateway's client of the fast lane, lanes the routers' sides (none when off).
	fast  *fastlane.Client
	lanes []*fastlane.Lane
	// services are every service of the system (StartSystem), run by Run.
	services service.List
	cleanup  []func()
}

// FastLane is the gateway's client of the fast lane (nil when it is off): turning it off sends
// every request down the durable path.
func (s *System) FastLane() *fastlane.Client { return s.fast }

// Lanes are the routers' sides of the fast lane.
func (s *System) Lanes() []*fastlane.Lane { return s.lanes }

// StartSystem starts NATS (or connects), provisions the bus and builds every service of the
// system into one list (System.Run runs it); nothing handles messages until Run.
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
	u := &upper{sys: sys, cfg: cfg, ctx: ctx, log: log, obs: obs, roleOpts: map[bus.Role][]nats.Option{}}
	for _, step := range []func() error{u.nats, u.demoTools, u.provision, u.sealKeys, u.router, u.deadLetters, u.eraser, u.audit, u.workers, u.gateway, u.meetingTools} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	return sys, nil
}

// upper builds a System, one service at a time (StartSystem).
type upper struct {
	sys *System
	cfg SystemConfig
	ctx context.Context
	log *slog.Logger
	obs *observer
	// connOpts connect every service; roleOpts connect each role's as its own user (the
	// embedded server's).
	connOpts []nats.Option
	roleOpts map[bus.Role][]nats.Option
	admin    *bus.Bus
	// seal seals the calls the router sends and the results the services record.
	seal      *router.SealKey
	mcpWorker *WorkerService // the tool worker holding the MCP servers, if any
}

// nats starts the embedded server, each service with its own user and only its role's
// permissions (bus.AccessOf), or takes the external server's credentials.
func (u *upper) nats() error {
	cfg, sys := u.cfg, u.sys
	if cfg.NATSURL != "" {
		sys.ClientURL, sys.NATSDescription = cfg.NATSURL, bus.Redact(cfg.NATSURL)
		var err error
		u.connOpts, err = cfg.NATSAuth.Options()
		return err
	}
	users, seeds, err := upUsers(cfg.DataDir)
	if err != nil {
		return err
	}
	sys.Seeds = seeds
	s, err := bus.StartServer(bus.ServerConfig{StoreDir: cfg.DataDir, Listen: cfg.NATSListen, SyncAlways: cfg.SyncAlways,
		MaxFileStore: max(bus.DefaultMaxFileStore, bus.StoreBytes(withBuckets(cfg.Bus))+1<<30), Users: users, Buckets: Buckets(cfg.Bus)})
	if err != nil {
		return err
	}
	sys.cleanup = append(sys.cleanup, s.Close)
	u.connOpts = append(u.connOpts, s.ConnectOption())
	for role, path := range seeds {
		o, err := roleOptions(role, path)
		if err != nil {
			return err
		}
		u.roleOpts[role] = o
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
	return nil
}

// demoTools serves the demo tools (HTTP, and gRPC when asked), the routes dialing them where
// they really listen.
func (u *upper) demoTools() error {
	cfg, sys, log := &u.cfg, u.sys, u.log
	if cfg.DemoAddr == "" {
		return nil
	}
	ln, err := listen(cfg.DemoAddr, "demo tools")
	if err != nil {
		return err
	}
	sys.cleanup = append(sys.cleanup, func() { ln.Close() })
	sys.services.Add(service.Back, service.Func("demo tools", func(ctx context.Context) error { return demotools.Serve(ctx, ln, log.With("service", "demo-tools")) }))
	if got := ln.Addr().String(); got != demoToolsAddr {
		// Routes name 127.0.0.1:8081: dial where the demo tools really are.
		cfg.Worker.Resolve = withResolve(cfg.Worker.Resolve, demoToolsAddr, got)
	}
	sys.DemoURL = "http://" + ln.Addr().String()
	if cfg.DemoGRPCAddr == "" {
		return nil
	}
	gln, err := listen(cfg.DemoGRPCAddr, "demo gRPC service")
	if err != nil {
		return err
	}
	sys.cleanup = append(sys.cleanup, func() { gln.Close() })
	sys.services.Add(service.Back, service.Func("demo gRPC service", func(ctx context.Context) error {
		return demotools.ServeProfiles(ctx, gln, log.With("service", "demo-grpc"))
	}))
	if got := gln.Addr().String(); got != demoGRPCAddr {
		// Routes name 127.0.0.1:8090: dial where the service really is.
		cfg.Worker.Resolve = withResolve(cfg.Worker.Resolve, demoGRPCAddr, got)
	}
	sys.DemoGRPC = gln.Addr().String()
	return nil
}

// conn opens one connection for a service, as a separate process would have, as the user of
// its role. The admin's provisions the bus; the services only use it, as they would with
// --no-provision. Once the seal keys are known (sealKeys), each bus seals the results it
// records with the system's key and trusts the system's result keys.
func (u *upper) conn(name string, role bus.Role) (*nats.Conn, *bus.Bus, error) {
	bc := u.cfg.Bus
	bc.NoProvision = u.cfg.Bus.NoProvision || role != bus.RoleAdmin
	nc, b, err := Connect(u.ctx, u.cfg.NATSURL, u.cfg.Instance+"-"+name, bc, u.log, append(slices.Clone(u.connOpts), u.roleOpts[role]...)...)
	if err != nil {
		return nil, nil, err
	}
	u.sys.cleanup = append(u.sys.cleanup, nc.Close)
	if u.seal != nil {
		b.SealResults(u.seal.ID, u.seal.Key)
		b.TrustResults(u.sys.results)
	}
	return nc, b, nil
}

// provision provisions the bus as the admin, and registers the contracts asked for.
func (u *upper) provision() error {
	_, ab, err := u.conn("provision", bus.RoleAdmin)
	if err != nil {
		return err
	}
	u.admin = ab
	if len(u.cfg.Policies) > 0 {
		desc, err := applyStartPolicies(u.ctx, policies.NewStore(ab.Bucket(policies.PoliciesBucket)), u.cfg.Policies)
		if err != nil {
			return err
		}
		u.sys.Policies = desc
	}
	if len(u.cfg.Blueprints) > 0 {
		desc, err := applyStartBlueprints(u.ctx, blueprints.NewLibrary(ab.Bucket(blueprints.BlueprintsBucket)), u.cfg.Blueprints)
		if err != nil {
			return err
		}
		u.sys.Blueprints = desc
	}
	if u.cfg.Contracts == "" {
		return nil
	}
	desc, registered, left, err := registerContracts(u.ctx, registry.NewStore(ab.Contracts), u.cfg.Contracts)
	if err != nil {
		return err
	}
	u.sys.Contracts = fmt.Sprintf("%d tools from %s", len(registered), desc)
	if len(left) > 0 {
		u.sys.Contracts += fmt.Sprintf("; %d registered by others kept (%s)", len(left), strings.Join(left, ", "))
	}
	return nil
}

// sealKeys loads (or makes) the keys calls and results are sealed with. Every call the
// router sends is sealed (the key pair lives in the data dir). On its own server, the
// workers here run only sealed calls: a call published on the bus by anyone else is dropped.
// On a server shared with other routers, they trust only what --trusted-seals names, if
// anything: calls of routers they do not know must not be taken from the shared consumers and
// dropped. Every result is sealed too, by the service that records it, and counts only when
// a key trusted for its call's tool sealed it: the services here seal with the system's key
// (trusted with any tool), the Go meeting tools with a key of their own trusted with their
// tools only (as a tool program beside Hermes would be), and --trusted-seals adds other
// routers' and workers' keys.
func (u *upper) sealKeys() error {
	cfg := &u.cfg
	seal, trusted, err := upSealKeys(cfg.DataDir)
	if err != nil {
		return err
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
	results, meetingKey, err := upResultKeys(seal, cfg.Trust)
	if err != nil {
		return err
	}
	u.sys.results, u.sys.meetingKey, u.seal = results, meetingKey, seal
	return nil
}

// router builds the router.
func (u *upper) router() error {
	_, rb, err := u.conn("router", bus.RoleRouter)
	if err != nil {
		return err
	}
	u.obs.watchBacklog(rb, u.log)
	r, err := NewRouter(rb, RouterConfig{Instance: u.cfg.Instance + "-router", Routes: u.cfg.Routes, Path: routesPath(u.cfg),
		Reload: 2 * time.Second, Concurrency: 64, Limits: u.cfg.Limits, Metrics: u.obs.metrics, Seal: u.seal, Fast: u.cfg.Fast, Logger: u.log})
	if err != nil {
		return err
	}
	u.sys.services.Add(service.Back, service.Func("router", r.Run))
	if r.Lane() != nil {
		u.sys.lanes = append(u.sys.lanes, r.Lane())
	}
	u.sys.Services = append(u.sys.Services, fmt.Sprintf("router (pipeline: %s)", strings.Join(r.Stages(), " → ")))
	return nil
}

// deadLetters builds the dead-letter processor.
func (u *upper) deadLetters() error {
	_, db, err := u.conn("dead-letters", bus.RoleRouter)
	if err != nil {
		return err
	}
	d, err := NewDeadLetters(db, u.cfg.Instance+"-dead-letters", u.cfg.Limits, u.obs.metrics, u.log)
	if err != nil {
		return err
	}
	u.sys.services.Add(service.Back, service.Func("dead-letter processor", d.Run))
	u.sys.Services = append(u.sys.Services, "dead-letter processor (hermes dlq ls)")
	return nil
}

// eraser builds the eraser, the one service that purges the record (as owners ask).
func (u *upper) eraser() error {
	_, eb, err := u.conn("eraser", bus.RoleEraser)
	if err != nil {
		return err
	}
	e, err := NewEraser(eb, u.log)
	if err != nil {
		return err
	}
	u.sys.services.Add(service.Back, service.Func("eraser", e.Run))
	u.sys.Services = append(u.sys.Services, "eraser (erases what owners ask: DELETE /v1/memory, hermes memory erasure)")
	return nil
}

// audit builds the audit service, when a database is named for it.
func (u *upper) audit() error {
	if u.cfg.Audit.DSN == "" {
		return nil
	}
	_, ab, err := u.conn("audit", bus.RoleAuditor)
	if err != nil {
		return err
	}
	s, err := u.cfg.Audit.service(ab, audit.NewMetrics(u.obs.reg), u.log)
	if err != nil {
		return err
	}
	u.sys.services.Add(service.Back, s)
	u.sys.Services = append(u.sys.Services, "audit (the record projected into PostgreSQL)")
	return nil
}

// workers builds the tool workers; the first holds the MCP servers (one program each).
func (u *upper) workers() error {
	cfg := u.cfg
	for i := range cfg.ToolWorkers {
		name := "toolworker"
		if i > 0 {
			name = fmt.Sprintf("toolworker-%d", i+1)
		}
		_, wb, err := u.conn(name, bus.RoleWorker)
		if err != nil {
			return err
		}
		wc := cfg.Worker
		wc.Instance, wc.Metrics, wc.Logger = cfg.Instance+"-"+name, u.obs.metrics, u.log
		wc.NoFastLane = wc.NoFastLane || cfg.Fast.Off
		if i > 0 {
			wc.MCP = nil
		}
		w, err := NewWorker(wb, wc)
		if err != nil {
			return err
		}
		u.sys.services.Add(service.Back, service.Func(name, w.Run))
		if i > 0 {
			continue
		}
		u.sys.Services = append(u.sys.Services, fmt.Sprintf("tool worker × %d (kinds %s)", cfg.ToolWorkers, strings.Join(w.Kinds(), ", ")))
		if wc.MCP != nil {
			u.mcpWorker = w
			var names []string
			for _, srv := range wc.MCP.Servers {
				names = append(names, srv.Name)
			}
			u.sys.Services = append(u.sys.Services, "MCP servers held by the tool worker: "+strings.Join(names, ", ")+" (hermes mcp ls)")
		}
	}
	return nil
}

// gateway builds the gateway, with its doors and the services beside it, on its port, and
// the admin key it takes (made once the gateway has its port, so that a key made is a key
// shown).
func (u *upper) gateway() error {
	cfg, sys := u.cfg, u.sys
	gnc, gb, err := u.conn("gateway", bus.RoleGateway)
	if err != nil {
		return err
	}
	gc := cfg.Gateway
	gc.Instance, gc.Limits, gc.Metrics, gc.Gatherer, gc.Logger = cfg.Instance+"-gateway", cfg.Limits, u.obs.metrics, u.obs.reg, u.log
	gc.NoFastLane = gc.NoFastLane || cfg.Fast.Off
	if gc.Callers, err = CallerVerifier(gb, cfg.OIDC); err != nil {
		return err
	}
	gc.Signins = NewSignins(gb)
	chat, chatDesc, stopLLM, err := cfg.LLM.chat(u.ctx, u.obs.metrics, u.log)
	if err != nil {
		return err
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
		return err
	}
	sys.fast = g.FastLane()
	gln, err := listen(cfg.HTTPAddr, "gateway")
	if err != nil {
		return err
	}
	sys.cleanup = append(sys.cleanup, func() { gln.Close() })
	if sys.Key, err = ensureAdminKey(u.ctx, apiKeys(u.admin), cfg.KeyFile); err != nil {
		return err
	}
	sys.GatewayURL = "http://" + gln.Addr().String()
	sys.Services = append(sys.Services, "gateway")
	sys.services.Append(g.Services(gln))
	if u.mcpWorker != nil && sys.Key.Key != "" {
		u.mcpWorker.RegisterThrough(sys.GatewayURL, sys.Key.Key)
	}
	return nil
}

// meetingTools serves the demo's Go meeting tools beside the HTTP demo tools.
func (u *upper) meetingTools() error {
	if u.cfg.DemoAddr == "" {
		return nil
	}
	u.sys.services.Add(service.Back, service.Func("meeting tools", u.sys.meetingTools(u.cfg, append(slices.Clone(u.connOpts), u.roleOpts[bus.RoleWorker]...), u.log)))
	u.sys.Services = append(u.sys.Services, "meeting tools in Go, on the SDK ("+strings.Join(demotools.MeetingToolNames, ", ")+")")
	return nil
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
	if s.GatewayURL == "" {
		return errors.New("app: system not started")
	}
	return s.services.Run(ctx)
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
