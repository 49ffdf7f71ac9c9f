package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/internal/demotools"
	"github.com/hermesbus/hermes/pkg/bus"
)

// demoToolsAddr is where examples/routes.yaml expects the demo tools.
const demoToolsAddr = "127.0.0.1:8081"

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
	routesPath := fs.String("routes", envOr("HERMES_ROUTES", defaultRoutes), "routes file (env HERMES_ROUTES)")
	data := fs.String("data", "hermes-data", "JetStream store directory of the embedded server")
	natsListen := fs.String("nats-listen", "", "also let local clients reach the embedded server at this address, e.g. 127.0.0.1:4222")
	sync := fs.String("sync", "interval", "store sync policy of the embedded server: interval or always")
	demoAddr := fs.String("demo-tools", demoToolsAddr, "listen address of the demo tools; empty to run none")
	log, err := parse(fs, args, env, &c.logLevel)
	if err != nil {
		return err
	}
	syncAlways, err := syncPolicy(*sync)
	if err != nil {
		return err
	}
	table, desc, isFile, err := loadRoutes(*routesPath)
	if err != nil {
		return err
	}

	// NATS: embedded unless --nats names a server.
	var connOpts []nats.Option
	natsDesc := ""
	if c.natsURL == "" {
		s, err := bus.StartServer(bus.ServerConfig{StoreDir: *data, Listen: *natsListen, SyncAlways: syncAlways})
		if err != nil {
			return err
		}
		defer s.Close()
		connOpts = append(connOpts, s.ConnectOption())
		abs, _ := filepath.Abs(*data)
		natsDesc = fmt.Sprintf("embedded, JetStream store in %s (sync %s)", abs, *sync)
		if *natsListen != "" {
			natsDesc += ", clients at " + s.ClientURL()
		}
	} else {
		natsDesc = bus.Redact(c.natsURL)
	}

	var fns []func(context.Context) error
	demoDesc := "not started (--demo-tools \"\")"
	if *demoAddr != "" {
		ln, err := listen(*demoAddr, "demo tools")
		if err != nil {
			return err
		}
		fns = append(fns, func(ctx context.Context) error { return demotools.Serve(ctx, ln, log.With("service", "demo-tools")) })
		if got := ln.Addr().String(); got != demoToolsAddr {
			// Routes name 127.0.0.1:8081: dial where the demo tools really are.
			if _, set := wf.resolve[demoToolsAddr]; !set {
				wf.resolve[demoToolsAddr] = got
			}
		}
		demoDesc = "http://" + ln.Addr().String()
	}

	// One connection per service, as separate processes would have.
	conn := func(name string) (*nats.Conn, *bus.Bus, error) {
		return connect(ctx, c.natsURL, c.instance+"-"+name, c.busConfig(), log, connOpts...)
	}
	rnc, rb, err := conn("router")
	if err != nil {
		return err
	}
	defer rnc.Close()
	r, err := newRouter(rb, c.instance+"-router", table, 64, c.limits, log)
	if err != nil {
		return err
	}
	wnc, wb, err := conn("toolworker")
	if err != nil {
		return err
	}
	defer wnc.Close()
	w, err := newWorker(wb, wf.config(c.instance+"-toolworker"), log)
	if err != nil {
		return err
	}
	gnc, gb, err := conn("gateway")
	if err != nil {
		return err
	}
	defer gnc.Close()
	g, err := newGateway(gnc, gb, gf.config(c.instance+"-gateway", c.limits), log)
	if err != nil {
		return err
	}
	gln, err := listen(gf.addr, "gateway")
	if err != nil {
		return err
	}
	rs := &routerService{r: r, path: *routesPath, watch: isFile, reload: 2 * time.Second, log: log}
	fns = append(fns, rs.Run, w.Run)

	base := "http://" + gln.Addr().String()
	printBanner(env, base, demoDesc, natsDesc, desc, len(table.ToolNames()))
	// Ctrl-C: the gateway stops taking requests and lets those in flight finish while the
	// router, worker and demo tools still run; then they stop, then NATS.
	err = runLayers(ctx, func(ctx context.Context) error { return g.Run(ctx, gln) }, fns...)
	fmt.Fprintln(env.Stdout, "Hermes stopped.")
	return err
}

func printBanner(env Env, base, demo, natsDesc, routesDesc string, tools int) {
	var b strings.Builder
	fmt.Fprintf(&b, "Hermes is up.\n")
	fmt.Fprintf(&b, "  gateway     %s   POST /v1/route · GET /v1/requests/{id} · /healthz · /readyz\n", base)
	fmt.Fprintf(&b, "  demo tools  %s\n", demo)
	fmt.Fprintf(&b, "  NATS        %s\n", natsDesc)
	fmt.Fprintf(&b, "  routes      %s (%d tools)\n\n", routesDesc, tools)
	fmt.Fprintf(&b, "Try:\n")
	fmt.Fprintf(&b, "  curl -s %s/v1/route -H 'Content-Type: application/json' -d @examples/request.json\n", base)
	fmt.Fprintf(&b, "  go run ./cmd/hermes route --url %s -f examples/request-parallel.json\n\n", base)
	fmt.Fprintf(&b, "Ctrl-C stops.\n")
	fmt.Fprint(env.Stdout, b.String())
}
