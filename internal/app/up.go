package app

import (
	"context"
	"fmt"
	"os"
	"strings"

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

	sys, err := StartSystem(ctx, SystemConfig{
		NATSURL: c.natsURL, DataDir: *data, SyncAlways: syncAlways, NATSListen: *natsListen,
		HTTPAddr: gf.addr, DemoAddr: *demoAddr, Routes: table, RoutesPath: *routesPath, WatchRoutes: isFile,
		ToolWorkers: 1, Worker: wf.config(""), Gateway: gf.config("", c.limits), Bus: c.busConfig(),
		Limits: c.limits, Instance: c.instance, Logger: log,
	})
	if err != nil {
		return err
	}
	demoDesc := "not started (--demo-tools \"\")"
	if sys.DemoURL != "" {
		demoDesc = sys.DemoURL
	}
	printBanner(env, sys.GatewayURL, demoDesc, sys.NATSDescription, desc, len(table.ToolNames()))
	err = sys.Run(ctx)
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
