package bench_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermesbus/hermes/examples"
	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/bench"
	"github.com/hermesbus/hermes/internal/routes"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/worker"
)

// startSystem runs an in-process Hermes with the example routes for b.
func startSystem(b *testing.B) *app.System { return startSystemWith(b, "", worker.Pools{}) }

// startSystemWith runs it with the contracts of directory contracts registered ("" none) and
// the worker's bulkheads sized by pools.
func startSystemWith(b *testing.B, contracts string, pools worker.Pools) *app.System {
	return runSystem(b, app.SystemConfig{Instance: "bench", Contracts: contracts, Worker: app.WorkerConfig{Concurrency: 64, Pools: pools}}, "echo", "{}")
}

// runSystem runs cfg in-process — the example routes, the demo tools, one tool worker, no
// caller limits, where cfg does not say otherwise — until b ends, once tool answered args
// through it (within a minute).
func runSystem(b *testing.B, cfg app.SystemConfig, tool, args string) *app.System {
	b.Helper()
	data, _ := examples.Files.ReadFile("routes.yaml")
	table, err := routes.Parse("examples/routes.yaml", data)
	if err != nil {
		b.Fatal(err)
	}
	cfg.DataDir, cfg.HTTPAddr, cfg.DemoAddr, cfg.Routes, cfg.ToolWorkers = b.TempDir(), "127.0.0.1:0", "127.0.0.1:0", table, 1
	cfg.Gateway.CallerLimits = admission.CallerLimits{RequestsPerSecond: -1, Waiting: -1, Streams: -1, Budget: submit.Budget{Bytes: -1}}
	ctx, cancel := context.WithCancel(context.Background())
	sys, err := app.StartSystem(ctx, cfg)
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = sys.Run(ctx); close(done) }()
	b.Cleanup(func() { cancel(); <-done })
	h := &bench.Hermes{Client: bench.NewClient(1), URL: sys.GatewayURL, Key: sys.Key.Key, Tool: tool, Calls: 1, Args: args, RunID: "warm"}
	deadline := time.Now().Add(time.Minute)
	for i := 0; h.Do(ctx, 0, i) != nil; i++ { // ready once a request goes through
		if time.Now().After(deadline) {
			b.Fatalf("%s never answered through Hermes", tool)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return sys
}

var runs atomic.Int64

// run drives do from parallelism×GOMAXPROCS clients for b.N requests in all.
func run(b *testing.B, parallelism int, do bench.Do) {
	var client atomic.Int64
	b.SetParallelism(parallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c, seq := int(client.Add(1)), 0
		for pb.Next() {
			if err := do(context.Background(), c, seq); err != nil {
				b.Error(err)
				return
			}
			seq++
		}
	})
}

func benchHermes(b *testing.B, calls, parallelism int) {
	sys := startSystem(b)
	run(b, parallelism, (&bench.Hermes{Client: bench.NewClient(64), URL: sys.GatewayURL, Key: sys.Key.Key, Tool: "echo", Calls: calls, Args: "{}",
		RunID: fmt.Sprintf("b%d-%d", os.Getpid(), runs.Add(1))}).Do)
}

func benchDirect(b *testing.B, calls, parallelism int) {
	sys := startSystem(b)
	run(b, parallelism, (&bench.Direct{Client: bench.NewClient(64 * calls), URL: sys.DemoURL + "/v1/echo", Calls: calls, Args: "{}"}).Do)
}

// Parallelism is per GOMAXPROCS: 1 gives one client per CPU, 32 gives 64 clients on 2 CPUs.
func BenchmarkHermes1Call(b *testing.B)     { benchHermes(b, 1, 1) }
func BenchmarkDirect1Call(b *testing.B)     { benchDirect(b, 1, 1) }
func BenchmarkHermes1CallC64(b *testing.B)  { benchHermes(b, 1, 32) }
func BenchmarkDirect1CallC64(b *testing.B)  { benchDirect(b, 1, 32) }
func BenchmarkHermes3CallsC64(b *testing.B) { benchHermes(b, 3, 32) }
func BenchmarkDirect3CallsC64(b *testing.B) { benchDirect(b, 3, 32) }

// The seed's order_query, 64 clients, without a contract and under the seed's (arguments
// checked by the router, the answer by the worker): the same tool, the same answer.
func benchOrderQuery(b *testing.B, contracts string) {
	sys := startSystemWith(b, contracts, worker.Pools{})
	run(b, 32, (&bench.Hermes{Client: bench.NewClient(64), URL: sys.GatewayURL, Key: sys.Key.Key, Tool: "order_query", Calls: 1,
		Args: `{"order_id":"ORD202603120042"}`, RunID: fmt.Sprintf("oq%d-%d", os.Getpid(), runs.Add(1))}).Do)
}

func BenchmarkHermesOrderQueryC64(b *testing.B) { benchOrderQuery(b, "") }
func BenchmarkHermesOrderQueryContractC64(b *testing.B) {
	benchOrderQuery(b, "../../examples/contracts")
}
