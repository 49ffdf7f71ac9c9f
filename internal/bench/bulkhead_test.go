package bench_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/bench"
	"github.com/hermesbus/hermes/pkg/worker"
)

// Two tools reached as their contracts say, both the demo echo: a heavy one (H) and a light
// one (L).
const (
	heavyContract = "name: heavy_report\nreach: {http: {url: \"http://127.0.0.1:8081/v1/echo\", timeout_ms: 30000}}\nexecution_policy: {resource_level: H}\n"
	lightContract = "name: light_lookup\nreach: {http: {url: \"http://127.0.0.1:8081/v1/echo\"}}\nexecution_policy: {resource_level: L}\n"
)

func startPools(b *testing.B, pools worker.Pools) *app.System {
	b.Helper()
	dir := b.TempDir()
	for name, doc := range map[string]string{"heavy.yaml": heavyContract, "light.yaml": lightContract} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(doc), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	return startSystemWith(b, dir, pools)
}

// benchPools times b.N light calls, one after another, while heavy clients keep every heavy
// slot busy with 2-second calls (heavy > 0), and reports their p50 and p99.
func benchPools(b *testing.B, pools worker.Pools, heavy int) {
	sys := startPools(b, pools)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	slow := &bench.Hermes{Client: bench.NewClient(heavy + 1), URL: sys.GatewayURL, Key: sys.Key.Key, Tool: "heavy_report", Calls: 1,
		Args: `{"delay_ms":2000}`, RunID: fmt.Sprintf("h%d-%d", os.Getpid(), runs.Add(1))}
	for c := range heavy {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := 0; ctx.Err() == nil; seq++ {
				_ = slow.Do(ctx, c, seq)
			}
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	if heavy > 0 {
		time.Sleep(500 * time.Millisecond) // the heavy calls take their slots
	}
	quick := &bench.Hermes{Client: bench.NewClient(1), URL: sys.GatewayURL, Key: sys.Key.Key, Tool: "light_lookup", Calls: 1, Args: "{}",
		RunID: fmt.Sprintf("l%d-%d", os.Getpid(), runs.Add(1))}
	timed(b, func(i int) error { return quick.Do(context.Background(), 0, i) })
}

// Bulkheads (L 64, M 32, H 4): the light tool's calls with every heavy slot held, and idle.
func BenchmarkBulkheadsIdle(b *testing.B)  { benchPools(b, worker.Pools{H: 4}, 0) }
func BenchmarkBulkheadsHFull(b *testing.B) { benchPools(b, worker.Pools{H: 4}, 16) }

// One shared pool of 8 for every level (no bulkheads): the same.
func BenchmarkSharedPoolIdle(b *testing.B)  { benchPools(b, worker.Pools{Shared: 8}, 0) }
func BenchmarkSharedPoolHFull(b *testing.B) { benchPools(b, worker.Pools{Shared: 8}, 16) }
