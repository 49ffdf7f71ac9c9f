package app

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/hermesbus/hermes/examples"
	"github.com/hermesbus/hermes/internal/audit"
	"github.com/hermesbus/hermes/internal/demotools"
	"github.com/hermesbus/hermes/pkg/bus"
)

// demoToolsAddr and demoGRPCAddr are where examples/routes.yaml expects the demo tools and
// their gRPC service.
const (
	demoToolsAddr = "127.0.0.1:8081"
	demoGRPCAddr  = "127.0.0.1:8090"
)

// natsListenAddr is where hermes up lets local clients (hermes tail, replay, dlq, more workers)
// reach its embedded server by default: where they look for NATS by default.
const natsListenAddr = "127.0.0.1:4222"

// RunUp runs the whole system in one process: hermes up.
func RunUp(ctx context.Context, args []string, env Env) error {
	fs := newFlagSet("up", "hermes up [flags]", env.Stderr)
	var c common
	c.register(fs, "hermes")
	natsURL := fs.Lookup("nats")
	natsURL.DefValue, natsURL.Usage = "", "use this NATS server instead of the embedded one"
	c.natsURL = os.Getenv(bus.EnvURL)
	var gf gatewayFlags
	gf.register(fs)
	var wf workerFlags
	wf.register(fs)
	var ff fastFlags
	ff.register(fs, true)
	var af auditFlags
	af.register(fs, "audit-postgres")
	routesPath := fs.String("routes", envOr("HERMES_ROUTES", defaultRoutes), "routes file (env HERMES_ROUTES)")
	data := fs.String("data", "hermes-data", "JetStream store directory of the embedded server, and where the admin key is kept (admin.key)")
	natsListen := fs.String("nats-listen", natsListenAddr, "where local clients (hermes tail, replay, dlq, more workers) reach the embedded server; if the default is taken, a free loopback port; \"\" for in-process clients only")
	sync := fs.String("sync", "interval", "store sync policy of the embedded server: interval or always")
	demoAddr := fs.String("demo-tools", demoToolsAddr, "listen address of the demo tools; empty to run none")
	demoGRPC := fs.String("demo-grpc", demoGRPCAddr, "listen address of the demo tools' gRPC service (customer.ProfileService, with reflection); empty to run none")
	contracts := fs.String("contracts", envOr("HERMES_CONTRACTS", defaultContracts), "directory of tools' contracts to register at start (default: the demo tools', when they run), unless someone else registered, changed or removed the tool's since (env HERMES_CONTRACTS; empty: none)")
	policyFile := fs.String("policies", envOr("HERMES_POLICIES", ""), "policy file applied at start to each tool it names that never had a policy (default: the seed's, examples/tool-policies.yaml, when the demo tools run; \"none\": none) (env HERMES_POLICIES)")
	blueprintsFrom := fs.String("blueprints", envOr("HERMES_BLUEPRINTS", ""), "blueprint file or directory of them (*.json, *.yaml) registered at start, each whose name never had a blueprint (default: examples/blueprints, when the demo tools run; \"none\": none) (env HERMES_BLUEPRINTS)")
	trustedSeals := fs.String("trusted-seals", os.Getenv("HERMES_TRUSTED_SEALS"), "file of public seal keys trusted beside hermes up's own (hermes seal-key prints them): other routers' keys, whose calls the workers here run, and workers' keys, whose results of the tools named count (env HERMES_TRUSTED_SEALS)")
	log, err := parse(fs, args, env, &c.logLevel)
	if err != nil {
		return err
	}
	var trusted trust
	if *trustedSeals != "" {
		if trusted, err = readTrust(*trustedSeals); err != nil {
			return err
		}
	}
	syncAlways, err := syncPolicy(*sync)
	if err != nil {
		return err
	}
	table, desc, isFile, err := loadRoutes(*routesPath)
	if err != nil {
		return err
	}
	listenAt, taken := *natsListen, ""
	if c.natsURL == "" {
		if listenAt, taken, err = checkNATSListen(*natsListen, flagGiven(fs, "nats-listen")); err != nil {
			return err
		}
	}

	wc, err := wf.config("")
	if err != nil {
		return err
	}
	grpcTaken := ""
	if *demoAddr != "" && *demoGRPC != "" && !flagGiven(fs, "demo-grpc") {
		// The default address taken (by another program, say) gives way to a free port:
		// the worker dials it for the routes' 127.0.0.1:8090.
		if ln, err := net.Listen("tcp", *demoGRPC); err != nil {
			grpcTaken, *demoGRPC = *demoGRPC, "127.0.0.1:0"
		} else {
			ln.Close()
		}
	}
	if *demoAddr != "" && gf.llm.mode == "" && gf.llm.file == "" && gf.llm.baseURL == "" {
		gf.llm.mode = "scripted" // the demo's model beside the demo tools: nothing to install
	}
	if mem, err := examples.Files.ReadFile("memory.yaml"); err == nil {
		gf.llm.memoryDefault = mem // the seed's memory filters and intent decay
	}
	if *demoAddr == "" && !flagGiven(fs, "contracts") && os.Getenv("HERMES_CONTRACTS") == "" {
		*contracts = "" // the demo tools' contracts, without the demo tools, only if asked for
	}
	var startPolicies []byte
	switch {
	case *policyFile == "none":
	case *policyFile != "":
		if startPolicies, err = os.ReadFile(*policyFile); err != nil {
			return fmt.Errorf("--policies: %w", err)
		}
	case *demoAddr != "":
		if startPolicies, err = examples.Files.ReadFile("tool-policies.yaml"); err != nil {
			return err
		}
	}
	startBlueprints, err := readStartBlueprints(*blueprintsFrom, *demoAddr != "")
	if err != nil {
		return err
	}
	if af.DSN != "" {
		if err := audit.CheckDSN(af.DSN); err != nil {
			return fmt.Errorf("--audit-postgres: %w", err)
		}
	}
	fast, err := ff.router()
	if err != nil {
		return err
	}
	sys, err := StartSystem(ctx, SystemConfig{Fast: fast,
		NATSURL: c.natsURL, NATSAuth: c.natsAuth.c, DataDir: *data, SyncAlways: syncAlways, NATSListen: listenAt,
		HTTPAddr: gf.addr, DemoAddr: *demoAddr, DemoGRPCAddr: *demoGRPC, Routes: table, RoutesPath: *routesPath, WatchRoutes: isFile,
		ToolWorkers: 1, Worker: wc, Gateway: gf.config("", c.limits), Bus: c.busConfig(),
		Limits: c.limits, Instance: c.instance, Logger: log, KeyFile: filepath.Join(*data, adminKeyFile), OIDC: gf.oidc,
		Contracts: *contracts, Policies: startPolicies, Blueprints: startBlueprints, LLM: gf.llm, Trust: trusted, Audit: af.AuditConfig,
	})
	if err != nil {
		return err
	}
	demoDesc := "not started (--demo-tools \"\")"
	if sys.DemoURL != "" {
		demoDesc = sys.DemoURL
		if sys.DemoGRPC != "" {
			demoDesc += ", gRPC " + demotools.ProfileService + " at " + sys.DemoGRPC
			if grpcTaken != "" {
				demoDesc += " (" + grpcTaken + " is taken)"
			}
		}
	}
	natsDesc := sys.NATSDescription
	if taken != "" {
		natsDesc += " (" + taken + " is taken)"
	}
	printBanner(env, sys, demoDesc, natsDesc, desc, len(table.ToolNames()))
	err = sys.Run(ctx)
	fmt.Fprintln(env.Stdout, "Hermes stopped.")
	return err
}

// checkNATSListen makes sure the embedded server can listen at addr before it is started (the
// server itself would only log the failure and time out). The default address, when taken,
// gives way to a free loopback port, and taken names it; an address given explicitly must be
// free.
func checkNATSListen(addr string, explicit bool) (listenAt, taken string, err error) {
	if addr == "" {
		return "", "", nil
	}
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		ln.Close()
		return addr, "", nil
	}
	if explicit {
		return "", "", fmt.Errorf("--nats-listen %s: %w (is another hermes up or NATS server running? pick another address, or \"\" for in-process clients only)", addr, err)
	}
	return "127.0.0.1:0", addr, nil
}

func printBanner(env Env, sys *System, demo, natsDesc, routesDesc string, tools int) {
	base, clientURL := sys.GatewayURL, sys.ClientURL
	var b strings.Builder
	fmt.Fprintf(&b, "Hermes is up.\n")
	fmt.Fprintf(&b, "  gateway     %s   POST /v1/route · GET|DELETE /v1/requests/{id} · /healthz · /readyz\n", base)
	fmt.Fprintf(&b, "  web UI      %s/   sessions and their tool calls, live (sign in with a key)\n", base)
	fmt.Fprintf(&b, "  demo tools  %s\n", demo)
	if sys.LLM != "" {
		fmt.Fprintf(&b, "  agent loop  %s/v1/chat/completions (OpenAI-compatible; model \"hermes\")\n              asking %s\n", base, sys.LLM)
	}
	fmt.Fprintf(&b, "  NATS        %s\n", natsDesc)
	nkey := ""
	if admin := sys.Seeds[bus.RoleAdmin]; admin != "" {
		fmt.Fprintf(&b, "  NATS users  admin, gateway, router, toolworker, eraser, auditor, client: each allowed only what its role needs;\n              their nkey seeds in %s (--nats-nkey)\n", filepath.Dir(admin))
		nkey = " --nats-nkey " + admin
	}
	fmt.Fprintf(&b, "  routes      %s (%d tools)\n", routesDesc, tools)
	if sys.Policies != "" {
		fmt.Fprintf(&b, "  policies    %s (hermes policies ls; hermes approvals ls)\n", sys.Policies)
	}
	if sys.Blueprints != "" {
		fmt.Fprintf(&b, "  blueprints  %s (hermes blueprints ls; hermes blueprints run NAME --input JSON)\n", sys.Blueprints)
	}
	if sys.Contracts != "" {
		fmt.Fprintf(&b, "  contracts   %s: arguments and answers checked (hermes tools ls)\n", sys.Contracts)
	}
	bc := sys.Bus
	fmt.Fprintf(&b, "  storage     record ≤ %s (requests refused at 90 %%), dead letters ≤ %s, state ≤ %s per bucket, parked ≤ %s\n",
		sizeText(bc.MaxBytes), sizeText(bc.DeadLetterMaxBytes), sizeText(bc.StateMaxBytes), sizeText(bc.ParkedMaxBytes))
	fmt.Fprintf(&b, "  services    %s\n", strings.Join(sys.Services, "\n              "))
	k := sys.Key
	switch {
	case k.Made && toTerminal(env.Stdout):
		fmt.Fprintf(&b, "  admin key   %s\n              shown this once; kept in %s (mode 0600), where hermes route and cancel find it\n\n", k.Key, k.Path)
	case k.Made:
		// The output is kept (a log, a pipe, a file): the key is not written where whoever
		// reads the log would find it.
		fmt.Fprintf(&b, "  admin key   made and kept in %s (mode 0600), not shown: this output is no terminal;\n"+
			"              read it with cat %s (hermes route and cancel find it there)\n\n", k.Path, k.Path)
	case k.Key != "":
		fmt.Fprintf(&b, "  admin key   in %s (hermes route and cancel find it there)\n\n", k.Path)
	default:
		fmt.Fprintf(&b, "  admin key   none: %s\n\n", k.Problem)
	}
	keyFile := k.Path
	if keyFile == "" {
		keyFile = defaultKeyFile
	}
	flagKey := ""
	if keyFile != defaultKeyFile {
		flagKey = " --key-file " + keyFile
	}
	fmt.Fprintf(&b, "Try:\n")
	if k.Key == "" {
		nats := "--nats " + bus.Redact(clientURL) + nkey
		if clientURL == "" {
			nats = "(with --nats-listen, against its NATS)"
		}
		fmt.Fprintf(&b, "  export HERMES_API_KEY=$(go run ./cmd/hermes keys create --name me --role admin %s)\n", nats)
		fmt.Fprintf(&b, "  curl -s %s/v1/route -H \"Authorization: Bearer $HERMES_API_KEY\" -H 'Content-Type: application/json' -d @examples/request.json\n", base)
		fmt.Fprintf(&b, "  go run ./cmd/hermes route --url %s -f examples/request-parallel.json\n\n", base)
	} else {
		fmt.Fprintf(&b, "  curl -s %s/v1/route -H \"Authorization: Bearer $(cat %s)\" -H 'Content-Type: application/json' -d @examples/request.json\n", base, keyFile)
		fmt.Fprintf(&b, "  go run ./cmd/hermes route --url %s%s -f examples/request-parallel.json\n", base, flagKey)
		if sys.LLM != "" {
			fmt.Fprintf(&b, "  curl -s %s/v1/chat/completions -H \"Authorization: Bearer $(cat %s)\" -H 'Content-Type: application/json' -d @examples/chat/meeting.json\n", base, keyFile)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "Watch:\n")
	if clientURL == "" {
		fmt.Fprintf(&b, "  (hermes tail and replay need NATS clients: start with --nats-listen %s)\n\n", natsListenAddr)
	} else {
		u := bus.Redact(clientURL)
		fmt.Fprintf(&b, "  go run ./cmd/hermes tail --nats %s%s\n", u, nkey)
		fmt.Fprintf(&b, "  go run ./cmd/hermes replay --nats %s%s --session sess_demo_parallel\n", u, nkey)
		if sys.LLM != "" {
			fmt.Fprintf(&b, "  go run ./cmd/hermes replay --nats %s%s --session sess_demo_chat\n", u, nkey)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "Ctrl-C stops.\n")
	fmt.Fprint(env.Stdout, b.String())
}

// toTerminal reports whether w is a terminal, where a person reads what is printed rather than
// a log keeping it.
func toTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isTerminal(f)
}

// sizeText is n bytes for people; "no limit" when n is negative.
func sizeText(n int64) string {
	switch {
	case n < 0:
		return "no limit"
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

// flagGiven reports whether the command line set the flag name.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}
