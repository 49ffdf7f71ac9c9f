package bench_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/bench"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/worker"
)

// BenchmarkClusterPartitions runs 1-call requests down the durable path of Hermes on a 3-node
// JetStream cluster on loopback (3 replicas: every store waits for a quorum, so a request holds
// its partition longer than on one server) with 16 and with 64 request partitions, from
// 32×GOMAXPROCS clients, beside the same load on one embedded server:
//
//	go test -run '^$' -bench ClusterPartitions -benchtime 5s ./internal/bench
func BenchmarkClusterPartitions(b *testing.B) {
	for _, cluster := range []bool{false, true} {
		for _, partitions := range []int{16, 64} {
			b.Run(fmt.Sprintf("server=%s/partitions=%d", serverName(cluster), partitions), func(b *testing.B) {
				durableOn(b, cluster, bus.Config{Partitions: partitions}, "cp")
			})
		}
	}
}

// serverName names the server a cluster benchmark runs on.
func serverName(cluster bool) string {
	if cluster {
		return "cluster3"
	}
	return "one"
}

// durableOn runs 1-call requests from 32×GOMAXPROCS clients down the durable path of Hermes
// with the record set up as bc, on a 3-node cluster on loopback (3 replicas) or one embedded
// server; prefix names the benchmark's requests.
func durableOn(b *testing.B, cluster bool, bc bus.Config, prefix string) {
	cfg := app.SystemConfig{Instance: "bench", Worker: app.WorkerConfig{Concurrency: 64, Pools: worker.Pools{}},
		Fast: app.FastLaneConfig{Off: true}, Bus: bc}
	if cluster {
		c := bustest.NewCluster(b)
		cfg.NATSURL, cfg.Bus.Replicas = c.URL(), bustest.ClusterSize
	}
	sys := runSystem(b, cfg, "echo", "{}")
	run(b, 32, (&bench.Hermes{Client: bench.NewClient(64), URL: sys.GatewayURL, Key: sys.Key.Key, Tool: "echo", Calls: 1, Args: "{}",
		RunID: fmt.Sprintf("%s%d-%d", prefix, os.Getpid(), runs.Add(1))}).Do)
}

// BenchmarkClusterStreams compares a record of one stream with one of several — each stream its
// own store loop and, on the cluster, its own Raft group whose leader may be another node — on
// one server and on a 3-node cluster, with the same 24 request partitions: 1-call requests from
// 32×GOMAXPROCS clients over the durable path.
func BenchmarkClusterStreams(b *testing.B) {
	for _, cluster := range []bool{false, true} {
		for _, streams := range []int{1, 3} {
			b.Run(fmt.Sprintf("server=%s/streams=%d", serverName(cluster), streams), func(b *testing.B) {
				durableOn(b, cluster, bus.Config{Partitions: 24, Streams: streams}, "cs")
			})
		}
	}
}
