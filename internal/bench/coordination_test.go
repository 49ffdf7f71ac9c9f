package bench_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/bench"
	"github.com/hermesbus/hermes/pkg/worker"
)

// State coordination's cost: the echo tool under a contract that names a resource
// (resource_key "k:{key}"), so each call waits for, holds and gives back its turn on that key.
//
//   - CoordinatedCallSerial against Request1CallSerial: the coordination stage's cost per call,
//     one client, one after another.
//   - OneKey16Clients against ManyKeys16Clients: 16 clients changing one key (every call waits
//     its turn: the key's throughput) against 16 clients each on a key of its own, and
//     Plain16Clients, the same load without coordination.
func BenchmarkCoordinatedCallSerial(b *testing.B) {
	sys := coordinatedSystem(b)
	h := &bench.Hermes{Client: bench.NewClient(1), URL: sys.GatewayURL, Key: sys.Key.Key, Tool: "echo", Calls: 1, Args: `{"key":"one"}`,
		RunID: fmt.Sprintf("cs%d-%d", os.Getpid(), runs.Add(1))}
	b.ResetTimer()
	for i := range b.N {
		if err := h.Do(context.Background(), 0, i); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOneKey16Clients(b *testing.B) { benchKeys(b, false) }

// Plain16Clients is ManyKeys16Clients' baseline: the same 16 clients, echo without a resource.
func BenchmarkPlain16Clients(b *testing.B) { benchHermes(b, 1, 16/max(1, runtimeProcs())) }

func BenchmarkManyKeys16Clients(b *testing.B) { benchKeys(b, true) }

func benchKeys(b *testing.B, keyPerClient bool) {
	sys := coordinatedSystem(b)
	id := fmt.Sprintf("ck%d-%d", os.Getpid(), runs.Add(1))
	client := bench.NewClient(16)
	hermesFor := map[bool]func(c int) *bench.Hermes{
		false: func(int) *bench.Hermes {
			return &bench.Hermes{Client: client, URL: sys.GatewayURL, Key: sys.Key.Key, Tool: "echo", Calls: 1, Args: `{"key":"shared"}`, RunID: id}
		},
		true: func(c int) *bench.Hermes {
			return &bench.Hermes{Client: client, URL: sys.GatewayURL, Key: sys.Key.Key, Tool: "echo", Calls: 1, Args: fmt.Sprintf(`{"key":"k%d"}`, c), RunID: id}
		},
	}
	run(b, 16/max(1, runtimeProcs()), func(ctx context.Context, c, seq int) error {
		return hermesFor[keyPerClient](c).Do(ctx, c, seq)
	})
}

// coordinatedSystem runs Hermes with the echo tool's calls serialized per key.
func coordinatedSystem(b *testing.B) *app.System {
	dir := b.TempDir()
	contract := "name: echo\neffects: idempotent\nresource_key: \"k:{key}\"\ninput_schema:\n  key: {type: string, required: true}\n"
	if err := os.WriteFile(filepath.Join(dir, "echo.yaml"), []byte(contract), 0o600); err != nil {
		b.Fatal(err)
	}
	return runSystem(b, app.SystemConfig{Instance: "bench", Contracts: dir, Worker: app.WorkerConfig{Concurrency: 64, Pools: worker.Pools{}}}, "echo", `{"key":"warm"}`)
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
