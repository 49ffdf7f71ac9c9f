package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/demotools"
	"github.com/hermesbus/hermes/internal/gateway"
	"github.com/hermesbus/hermes/internal/service"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/hermes"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
)

// Env is what a command reads and writes besides its flags.
type Env struct {
	Stdout, Stderr io.Writer
}

// parse parses args and sets up logging; flag.ErrHelp is returned as is.
func parse(fs *flag.FlagSet, args []string, env Env, level *string) (*slog.Logger, error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (flags only; see -h)", fs.Arg(0))
	}
	return newLogger(env.Stderr, *level)
}

// RunRouter runs a router worker: hermes router / cmd/router.
func RunRouter(ctx context.Context, args []string, env Env) error {
	fs := newFlagSet("router", "router [flags]", env.Stderr)
	var c common
	c.register(fs, "router")
	c.registerDeadLetters(fs, true)
	routesPath := fs.String("routes", envOr("HERMES_ROUTES", defaultRoutes), "routes file (env HERMES_ROUTES)")
	conc := fs.Int("concurrency", 64, "results handled at once")
	reload := fs.Duration("reload", 2*time.Second, "how often to check the routes file for changes; 0 turns reload off")
	c.registerSeals(fs, bus.RoleRouter)
	var ff fastFlags
	ff.register(fs, true)
	log, err := parse(fs, args, env, &c.logLevel)
	if err != nil {
		return err
	}
	fast, err := ff.router()
	if err != nil {
		return err
	}
	table, desc, isFile, err := loadRoutes(*routesPath)
	if err != nil {
		return err
	}
	path := ""
	if isFile {
		path = *routesPath
	}
	return c.runService(ctx, "hermes-router", "router running", log, func(_ *nats.Conn, b *bus.Bus, obs *observer) (*service.List, []any, error) {
		obs.watchBacklog(b, log)
		r, err := NewRouter(b, RouterConfig{Instance: c.instance, Routes: table, Path: path, Reload: *reload, Concurrency: *conc, Seal: c.sealKey,
			Limits: c.limits, Fast: fast, Metrics: obs.metrics, Logger: log})
		if err != nil {
			return nil, nil, err
		}
		return one(service.Func("router", r.Run)), []any{"routes", desc, "rules", len(table.Rules), "pipeline", r.Stages()}, nil
	})
}

// workerFlags are the tool worker's own flags.
type workerFlags struct {
	tools       listFlag
	allowEnv    listFlag
	resolve     resolveFlag
	concurrency int
	maxResult   int64
	mcp         string
	descriptors string
	pools       worker.Pools
}

func (w *workerFlags) register(fs *flag.FlagSet) {
	w.resolve = resolveFlag{}
	fs.Var(&w.tools, "tools", "tools to serve, comma-separated (default: every routed tool, following new ones)")
	fs.Var(&w.allowEnv, "allow-env", "environment variables ${env.NAME} headers may read, comma-separated, each bound to the one origin its value may be sent to: NAME@https://host:port")
	fs.Var(w.resolve, "resolve", "dial host:port=other:port instead (like curl --resolve), comma-separated")
	fs.IntVar(&w.concurrency, "concurrency", 32, "calls of one tool running at once")
	fs.IntVar(&w.pools.L, "pool-l", envInt("HERMES_POOL_L", worker.DefaultPoolL), "calls of light tools (contract resource_level L) running at once in this worker (env HERMES_POOL_L)")
	fs.IntVar(&w.pools.M, "pool-m", envInt("HERMES_POOL_M", worker.DefaultPoolM), "calls of medium tools (resource_level M, and tools without a contract) running at once (env HERMES_POOL_M)")
	fs.IntVar(&w.pools.H, "pool-h", envInt("HERMES_POOL_H", worker.DefaultPoolH), "calls of heavy tools (resource_level H) running at once (env HERMES_POOL_H)")
	fs.Int64Var(&w.maxResult, "max-result-bytes", worker.DefaultMaxResultBytes, "largest tool answer accepted; larger ones become RESULT_TOO_LARGE")
	fs.StringVar(&w.descriptors, "grpc-descriptors", os.Getenv("HERMES_GRPC_DESCRIPTORS"), "directory of FileDescriptorSet files (protoc --include_imports --descriptor_set_out) gRPC routes may name as descriptor_set, for servers without reflection (env HERMES_GRPC_DESCRIPTORS)")
	fs.StringVar(&w.mcp, "mcp", os.Getenv("HERMES_MCP"), "file naming the MCP servers this worker holds (programs over stdio, Streamable HTTP URLs): their tools become Hermes tools (env HERMES_MCP)")
}

func (w *workerFlags) config(instance string) (WorkerConfig, error) {
	if w.descriptors != "" {
		if st, err := os.Stat(w.descriptors); err != nil || !st.IsDir() {
			return WorkerConfig{}, fmt.Errorf("--grpc-descriptors %s: not a directory", w.descriptors)
		}
	}
	cfg := WorkerConfig{Instance: instance, Tools: w.tools, AllowEnv: w.allowEnv, Resolve: w.resolve, GRPCDescriptors: w.descriptors,
		Concurrency: w.concurrency, MaxResultBytes: w.maxResult, Pools: w.pools}
	if err := badEnvInts("HERMES_POOL_L", "HERMES_POOL_M", "HERMES_POOL_H"); err != nil {
		return cfg, err
	}
	for _, p := range []struct {
		name string
		n    int
	}{{"--pool-l", w.pools.L}, {"--pool-m", w.pools.M}, {"--pool-h", w.pools.H}} {
		if p.n < 1 || p.n > 100_000 {
			return cfg, fmt.Errorf("%s %d: a pool holds 1 to 100000 calls", p.name, p.n)
		}
	}
	if w.mcp != "" {
		var err error
		if cfg.MCP, err = LoadMCPConfig(w.mcp); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// RunToolWorker runs a tool worker: hermes toolworker / cmd/toolworker.
func RunToolWorker(ctx context.Context, args []string, env Env) error {
	fs := newFlagSet("toolworker", "toolworker [flags]", env.Stderr)
	var c common
	c.register(fs, "toolworker")
	c.registerDeadLetters(fs, false)
	c.registerSeals(fs, bus.RoleWorker)
	var wf workerFlags
	wf.register(fs)
	var ff fastFlags
	ff.register(fs, false)
	gatewayURL := fs.String("gateway", os.Getenv("HERMES_URL"), "gateway where the MCP servers' tools' contracts are registered, with the API key of HERMES_API_KEY or --key-file (tools:admin) (env HERMES_URL)")
	var key keyFlag
	key.register(fs)
	log, err := parse(fs, args, env, &c.logLevel)
	if err != nil {
		return err
	}
	return c.runService(ctx, "hermes-toolworker", "tool worker running", log, func(_ *nats.Conn, b *bus.Bus, obs *observer) (*service.List, []any, error) {
		wc, err := wf.config(c.instance)
		if err != nil {
			return nil, nil, err
		}
		if len(c.trust.calls) > 0 {
			wc.TrustedSeals = c.trust.calls
		}
		wc.NoFastLane = !ff.on
		if wc.MCP != nil && *gatewayURL != "" {
			if wc.APIKey, err = key.key(); err != nil {
				return nil, nil, err
			}
			wc.Gateway = *gatewayURL
		}
		wc.Metrics, wc.Logger = obs.metrics, log
		w, err := NewWorker(b, wc)
		if err != nil {
			return nil, nil, err
		}
		return one(service.Func("tool worker", w.Run)), []any{"kinds", w.Kinds(), "tools", wf.tools.String(), "allow_env", wf.allowEnv.String()}, nil
	})
}

// gatewayFlags are the gateway's own flags.
type gatewayFlags struct {
	addr        string
	maxBody     int64
	wait        time.Duration
	publicHosts string
	callers     admission.CallerLimits
	oidc        auth.OIDCConfig
	llm         llmFlags
}

func (g *gatewayFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&g.addr, "http", envOr("HERMES_HTTP", "127.0.0.1:8080"), "HTTP listen address (env HERMES_HTTP)")
	fs.Int64Var(&g.maxBody, "max-body-bytes", 1<<20, "largest request body accepted; larger ones get 413")
	fs.DurationVar(&g.wait, "wait", 30*time.Second, "how long POST /v1/route waits for the response by default")
	fs.StringVar(&g.publicHosts, "public-host", os.Getenv("HERMES_PUBLIC_HOST"),
		"host names clients reach the gateway by, comma-separated, besides IP addresses and localhost; other Host headers get 421 (env HERMES_PUBLIC_HOST)")
	d := admission.DefaultCallerLimits
	fs.Float64Var(&g.callers.RequestsPerSecond, "caller-rate", d.RequestsPerSecond, "requests a second one caller may make (-1: no limit; 0: the default)")
	fs.IntVar(&g.callers.Burst, "caller-burst", d.Burst, "requests one caller may make at once above its rate")
	fs.IntVar(&g.callers.Waiting, "caller-waiting", d.Waiting, "requests one caller may have waiting for their response (-1: no limit; 0: the default)")
	fs.IntVar(&g.callers.Streams, "caller-streams", d.Streams, "session event streams one caller may have open (-1: no limit; 0: the default)")
	fs.Int64Var(&g.callers.Budget.Bytes, "caller-budget-bytes", d.Budget.Bytes,
		"bytes of requests one caller may have accepted by this gateway per --caller-budget-window, each request counted as 4× its size plus 16 KiB per call (-1: no budget; 0: the default)")
	fs.DurationVar(&g.callers.Budget.Window, "caller-budget-window", d.Budget.Window, "the window of --caller-budget-bytes: a caller's use drains away evenly over it")
	fs.StringVar(&g.oidc.Issuer, "oidc-issuer", os.Getenv("HERMES_OIDC_ISSUER"), "take bearer tokens (JWTs) this OpenID Connect issuer signs, besides API keys (env HERMES_OIDC_ISSUER)")
	fs.StringVar(&g.oidc.Audience, "oidc-audience", os.Getenv("HERMES_OIDC_AUDIENCE"), "the audience (client id) tokens must be for (env HERMES_OIDC_AUDIENCE)")
	fs.StringVar(&g.oidc.RoleClaim, "oidc-role-claim", envOr("HERMES_OIDC_ROLE_CLAIM", "roles"), "the claim holding the caller's role: admin, operator or user (a string or a list)")
	fs.StringVar(&g.oidc.NameClaim, "oidc-name-claim", envOr("HERMES_OIDC_NAME_CLAIM", "preferred_username"), "the claim naming the caller for people")
	fs.StringVar(&g.oidc.ActForUsersClaim, "oidc-act-for-users-claim", os.Getenv("HERMES_OIDC_ACT_FOR_USERS_CLAIM"), "a boolean claim letting the caller name end users (none when empty)")
	g.llm.register(fs)
}

func (g *gatewayFlags) config(instance string, limits protocol.Limits) gateway.Config {
	var hosts []string
	for h := range strings.SplitSeq(g.publicHosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
	}
	return gateway.Config{Instance: instance, MaxBodyBytes: g.maxBody, DefaultWait: g.wait, Limits: limits,
		PublicHosts: hosts, CallerLimits: g.callers}
}

// RunGateway runs the HTTP gateway: hermes gateway / cmd/gateway.
func RunGateway(ctx context.Context, args []string, env Env) error {
	fs := newFlagSet("gateway", "gateway [flags]", env.Stderr)
	var c common
	c.register(fs, "gateway")
	c.registerSeals(fs, bus.RoleGateway)
	c.registerDeadLetters(fs, false)
	var gf gatewayFlags
	gf.register(fs)
	var ff fastFlags
	ff.register(fs, false)
	log, err := parse(fs, args, env, &c.logLevel)
	if err != nil {
		return err
	}
	// Bound first, so a taken port fails at once; the server closes it when it stops.
	ln, err := listen(gf.addr, "gateway")
	if err != nil {
		return err
	}
	defer ln.Close()
	return c.runService(ctx, "hermes-gateway", "gateway listening", log, func(nc *nats.Conn, b *bus.Bus, obs *observer) (*service.List, []any, error) {
		gc := gf.config(c.instance, c.limits)
		gc.Metrics, gc.Gatherer, gc.Logger, gc.NoFastLane = obs.metrics, obs.reg, log, !ff.on
		callers, verr := CallerVerifier(b, gf.oidc)
		if verr != nil {
			return nil, nil, verr
		}
		gc.Callers, gc.Signins = callers, NewSignins(b)
		chat, chatDesc, stopLLM, err := gf.llm.chat(ctx, obs.metrics, log)
		if err != nil {
			return nil, nil, err
		}
		g, err := NewGateway(nc, b, gc, chat)
		if err != nil {
			stopLLM()
			return nil, nil, err
		}
		attrs := []any{"addr", "http://" + ln.Addr().String()}
		if chat != nil {
			attrs = append(attrs, "llm", chatDesc)
		}
		services := g.Services(ln)
		services.Add(service.Back, service.Func("model", func(ctx context.Context) error { <-ctx.Done(); stopLLM(); return nil }))
		return services, attrs, nil
	})
}

// RunDeadLetters runs the dead-letter processor alone: hermes dead-letters.
func RunDeadLetters(ctx context.Context, args []string, env Env) error {
	fs := newFlagSet("dead-letters", "hermes dead-letters [flags]", env.Stderr)
	var c common
	c.register(fs, "dead-letters")
	c.registerSeals(fs, bus.RoleRouter) // it records results as routers do
	log, err := parse(fs, args, env, &c.logLevel)
	if err != nil {
		return err
	}
	c.deadLetters = true // the service itself, and nothing else
	return c.runService(ctx, "hermes-dead-letters", "dead-letter processor running", log, func(*nats.Conn, *bus.Bus, *observer) (*service.List, []any, error) {
		return &service.List{}, nil, nil
	})
}

// RunNATS runs the embedded NATS server alone: hermes nats.
func RunNATS(ctx context.Context, args []string, env Env) error {
	fs := newFlagSet("nats", "hermes nats [flags]", env.Stderr)
	level := "info"
	listenAddr := fs.String("listen", "127.0.0.1:4222", "client listen address")
	data := fs.String("data", "hermes-data", "JetStream store directory")
	sync := fs.String("sync", "interval", "store sync policy: interval (fast; an acked message survives a process crash) or always (fsync before ack; survives power loss)")
	maxStore := fs.Int64("max-file-store", bus.DefaultMaxFileStore, "most bytes JetStream's file store holds (max_file_store); Hermes' streams and buckets must fit (about 12.4 GiB at their default limits)")
	name := fs.String("name", "", "this node's name, unique in its cluster (with --cluster-listen; default: a generated one)")
	clusterName := fs.String("cluster-name", "hermes", "the cluster's name, the same on every node (with --cluster-listen)")
	clusterListen := fs.String("cluster-listen", "", "host:port where this node takes routes from the other nodes of a JetStream cluster; empty: a single server")
	routesFlag := fs.String("routes", "", "with --cluster-listen: every node's route URL, comma-separated (nats-route://host:port; this node's own may be listed)")
	fs.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	log, err := parse(fs, args, env, &level)
	if err != nil {
		return err
	}
	syncAlways, err := syncPolicy(*sync)
	if err != nil {
		return err
	}
	var cluster *bus.ClusterConfig
	switch {
	case *clusterListen != "":
		if *routesFlag == "" || *name == "" {
			return &ExitError{Code: 2, Err: errors.New("nats: a cluster node needs --name and --routes (every node's nats-route://host:port)")}
		}
		cluster = &bus.ClusterConfig{Name: *clusterName, Listen: *clusterListen, Routes: strings.Split(*routesFlag, ",")}
	case *routesFlag != "":
		return &ExitError{Code: 2, Err: errors.New("nats: --routes needs --cluster-listen")}
	}
	s, err := bus.StartServer(bus.ServerConfig{Name: *name, StoreDir: *data, Listen: *listenAddr, SyncAlways: syncAlways, MaxFileStore: *maxStore,
		Cluster: cluster, Logger: log})
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "NATS with JetStream listening on %s (store %s, sync %s). Ctrl-C stops.\n", s.ClientURL(), *data, *sync)
	<-ctx.Done()
	s.Close()
	return nil
}

func syncPolicy(v string) (bool, error) {
	switch v {
	case "interval":
		return false, nil
	case "always":
		return true, nil
	}
	return false, fmt.Errorf("--sync %q: use interval or always", v)
}

// RunDemoTools runs the demo tool service alone: hermes demo-tools. Given a NATS server, it
// also serves the Go meeting tools there as a tool worker (as hermes up does), registering
// their contracts through --gateway when an API key is at hand.
func RunDemoTools(ctx context.Context, args []string, env Env) error {
	fs := newFlagSet("demo-tools", "hermes demo-tools [flags]", env.Stderr)
	level := "info"
	addr := fs.String("listen", demoToolsAddr, "HTTP listen address")
	grpcAddr := fs.String("grpc-listen", demoGRPCAddr, "listen address of the gRPC service customer.ProfileService (with server reflection); empty to run none")
	natsURL := fs.String("nats", os.Getenv(bus.EnvURL), "NATS server URL: also serve the Go meeting tools ("+strings.Join(demotools.MeetingToolNames, ", ")+") as a tool worker there (env "+bus.EnvURL+"); empty serves the HTTP tools alone")
	var auth natsAuth
	auth.register(fs, bus.RoleWorker)
	gatewayURL := fs.String("gateway", os.Getenv("HERMES_URL"), "gateway where the Go tools' contracts are registered, with the API key of HERMES_API_KEY or --key-file (env HERMES_URL); empty registers nothing (routes reach them with go actions)")
	var key keyFlag
	key.register(fs)
	trusted := fs.String("trusted-seals", os.Getenv("HERMES_TRUSTED_SEALS"), "file of trusted public seal keys: the Go tools run only tool calls a router's key sealed, and take a call's result only when a key trusted for its tool sealed it (env HERMES_TRUSTED_SEALS)")
	sealKey := fs.String("seal-key", os.Getenv("HERMES_SEAL_KEY"), "private key file (hermes seal-key --tools) to seal the Go tools' results with (env HERMES_SEAL_KEY)")
	fs.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	log, err := parse(fs, args, env, &level)
	if err != nil {
		return err
	}
	// The flags are read whole before anything listens: a bad one leaves nothing open.
	var mc *hermes.Config
	if *natsURL != "" {
		opts, err := auth.options()
		if err != nil {
			return err
		}
		mc = &hermes.Config{NATS: *natsURL, Options: opts, Instance: defaultInstance("demo-tools"), Logger: log.With("service", "meeting-tools")}
		if *trusted != "" {
			if mc.TrustedSeals, err = readTrustedSeals(*trusted); err != nil {
				return err
			}
		}
		if *sealKey != "" {
			k, err := readSealKey(*sealKey)
			if err != nil {
				return err
			}
			mc.SealKeyID, mc.SealKey = k.ID, k.Key
			if *trusted == "" {
				return errors.New("--seal-key needs --trusted-seals: the Go tools must know which results count, or one put on a call's subject before theirs would stand")
			}
			t, err := readTrust(*trusted)
			if err != nil {
				return err
			}
			mc.TrustedResults = t.results
		}
		if *gatewayURL != "" {
			if mc.APIKey, err = key.key(); err != nil {
				return err
			}
			if mc.APIKey != "" {
				mc.Gateway = *gatewayURL
			}
		}
	}
	ln, err := listen(*addr, "demo tools")
	if err != nil {
		return err
	}
	// The HTTP tools and, beside them, the gRPC service.
	var tools service.List
	tools.Add(service.Back, service.Func("demo tools", func(ctx context.Context) error { return demotools.Serve(ctx, ln, log.With("service", "demo-tools")) }))
	if *grpcAddr != "" {
		gln, err := listen(*grpcAddr, "demo gRPC service")
		if err != nil {
			ln.Close()
			return err
		}
		tools.Add(service.Back, service.Func("demo gRPC service", func(ctx context.Context) error {
			return demotools.ServeProfiles(ctx, gln, log.With("service", "demo-grpc"))
		}))
		fmt.Fprintf(env.Stdout, "Demo gRPC service %s listening on %s (server reflection on).\n", demotools.ProfileService, gln.Addr())
	}
	fmt.Fprintf(env.Stdout, "Demo tools listening on http://%s. Ctrl-C stops.\n", ln.Addr())
	if mc == nil {
		return tools.Run(ctx)
	}
	fmt.Fprintf(env.Stdout, "Go meeting tools served on %s.\n", bus.Redact(*natsURL))
	// The Go tools failing (their contracts refused, the bus out of reach) leaves the HTTP ones
	// serving, as hermes up does.
	tools.Add(service.Front, service.Func("meeting tools", func(ctx context.Context) error {
		if err := demotools.ServeMeetings(ctx, *mc); err != nil && ctx.Err() == nil {
			log.Error("the Go meeting tools stopped; the HTTP demo tools serve on", "err", err)
			<-ctx.Done()
		}
		return nil
	}))
	return tools.Run(ctx)
}
