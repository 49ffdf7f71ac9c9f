package bench_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// BenchmarkRecordMemoryPerSubject measures what the NATS server keeps in memory for each
// subject of the record. Results and responses each have a subject of their own (a 1-call
// request adds two), and the server indexes every subject of a stream in memory for as long as
// the stream holds a message on it. It stores n messages (HERMES_BENCH_SUBJECTS, default one
// million) on as many subjects, then the same number on one subject, each into a fresh embedded
// server, and reports the difference of the heap each leaves, per subject:
//
//	go test -run '^$' -bench RecordMemoryPerSubject -benchtime 1x ./internal/bench
func BenchmarkRecordMemoryPerSubject(b *testing.B) {
	n := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("HERMES_BENCH_SUBJECTS")); err == nil && v > 0 {
		n = v
	}
	for b.Loop() {
		many := heapHolding(b, n, func(i int) string {
			return protocol.SubjectResult(fmt.Sprintf("req-%08d", i), "call_1", fmt.Sprintf("session-%05d", i%10_000))
		})
		one := heapHolding(b, n, func(int) string { return protocol.SubjectResult("req", "call_1", "session") })
		b.ReportMetric(float64(many-one)/float64(n), "B/subject")
		b.ReportMetric(float64(many-one)/float64(1<<20)*1e6/float64(n), "MiB/million-subjects")
	}
}

// heapHolding starts a server, stores n messages of 200 bytes on the subjects subject names,
// and returns the heap in use once they are stored, less the heap before.
func heapHolding(b *testing.B, n int, subject func(i int) string) uint64 {
	b.Helper()
	srv, err := bus.StartServer(bus.ServerConfig{StoreDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	nc, err := nats.Connect("", srv.ConnectOption())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := bus.Provision(ctx, js, bus.Config{}); err != nil {
		b.Fatal(err)
	}
	before := heapInUse()
	payload := make([]byte, 200)
	for i := range n {
		if _, err := js.PublishAsync(subject(i), payload); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		b.Fatal("publishes not acknowledged")
	}
	info, err := js.Stream(ctx, protocol.StreamName)
	if err != nil {
		b.Fatal(err)
	}
	if got := info.CachedInfo().State.Msgs; got != uint64(n) {
		b.Fatalf("stored %d messages, want %d", got, n)
	}
	return heapInUse() - min(before, heapInUse())
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
