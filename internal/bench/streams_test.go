package bench_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
)

// BenchmarkStreamStores measures how many messages JetStream stores per second when the same
// load — publishers on their own connections, each awaiting its acknowledgement, every message
// with a Nats-Msg-Id and a subject of its own as the record's results and responses have — goes
// to one stream or is spread over several by a hash of its session. The server stores each
// stream's messages on one goroutine (its internal loop), so one stream is one queue however
// many cores there are: stores/s that grow with streams at the same GOMAXPROCS show it.
//
//	go test -run '^$' -bench StreamStores -cpu 1,2 ./internal/bench
func BenchmarkStreamStores(b *testing.B) {
	for _, sync := range []bool{false, true} {
		for _, streams := range []int{1, 4} {
			b.Run(fmt.Sprintf("sync_always=%t/streams=%d", sync, streams), func(b *testing.B) { benchStreamStores(b, sync, streams) })
		}
	}
}

func benchStreamStores(b *testing.B, syncAlways bool, streams int) {
	srv, err := bus.StartServer(bus.ServerConfig{StoreDir: b.TempDir(), SyncAlways: syncAlways})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const conns, perConn = 4, 16
	jss := make([]jetstream.JetStream, conns)
	for i := range jss {
		nc, err := nats.Connect("", srv.ConnectOption())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		if jss[i], err = jetstream.New(nc); err != nil {
			b.Fatal(err)
		}
	}
	for s := range streams {
		if _, err := jss[0].CreateStream(ctx, jetstream.StreamConfig{Name: fmt.Sprintf("P%d", s),
			Subjects: []string{fmt.Sprintf("p%d.>", s)}, Duplicates: 2 * time.Minute}); err != nil {
			b.Fatal(err)
		}
	}
	payload := make([]byte, 300)
	var n atomic.Int64
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for c := range conns * perConn {
		js := jss[c%conns]
		wg.Go(func() {
			for {
				i := n.Add(1)
				if i > int64(b.N) {
					return
				}
				subj := fmt.Sprintf("p%d.result.r%d.s%d", i%int64(streams), i, i%97)
				if _, err := js.Publish(ctx, subj, payload, jetstream.WithMsgID(subj),
					jetstream.WithExpectLastSequencePerSubject(0)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "stores/s")
}
