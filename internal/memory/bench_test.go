package memory

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
)

// The memory benchmark (BENCHMARKS.md): 100,000 fragments over 10,000 owners (ten each: the
// seed's preferences and contexts, about 60 bytes of value), then lookups of random owners —
// the List a turn's recall makes — from the bus, and from a warm hot tier. Reports the
// lookups' p50 and p99, the bucket's bytes, and the hot tier's heap per fragment.
//
//	go test ./internal/memory -run '^$' -bench Memory -benchtime 20000x
func BenchmarkMemoryLookup(b *testing.B) {
	const owners, perOwner = 10_000, 10
	srv := bustest.NewServer(b)
	bb := srv.Provision(b, bus.Config{Buckets: Buckets(0)})
	kv := bb.Bucket(Bucket)
	ctx := context.Background()
	now := time.Now().UTC()
	name := func(i int) string { return fmt.Sprintf("key:bench%05d#user%05d", i, i) }
	for i := range owners {
		en := entry{Owner: name(i)}
		for j := range perOwner {
			v, _ := json.Marshal(map[string]any{"store": fmt.Sprintf("store-%d", j), "city": "北京", "district": "朝阳区"})
			en.Fragments = append(en.Fragments, Fragment{Type: "user_preference", Key: fmt.Sprintf("pref_%d", j), Value: v,
				Lifespan: "30d", Version: 1, CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(30 * 24 * time.Hour)})
		}
		data, _ := json.Marshal(&en)
		if _, err := kv.Create(ctx, key(en.Owner), data); err != nil {
			b.Fatal(err)
		}
	}
	st, err := kv.Status(ctx)
	if err != nil {
		b.Fatal(err)
	}
	lookups := func(b *testing.B, s *Store) {
		r := rand.New(rand.NewPCG(1, 2))
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			o := name(r.IntN(owners))
			t0 := time.Now()
			fs, err := s.List(ctx, o, Query{})
			lat = append(lat, time.Since(t0))
			if err != nil || len(fs) != perOwner {
				b.Fatalf("%s: %d fragments, %v", o, len(fs), err)
			}
		}
		b.StopTimer()
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		b.ReportMetric(float64(st.Bytes())/float64(owners*perOwner), "bucket-B/fragment")
	}
	b.Run("bus", func(b *testing.B) { lookups(b, &Store{KV: kv, JS: bb.JS}) })
	b.Run("hot", func(b *testing.B) {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		s := &Store{KV: kv, JS: bb.JS, Cache: &Cache{Max: owners}}
		if err := s.Cache.Run(cctx, kv, nil); err != nil {
			b.Fatal(err)
		}
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		for i := range owners { // warm: every owner held
			if _, err := s.List(ctx, name(i), Query{}); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		if _, _, n := s.Cache.Stats(); n != owners {
			b.Fatalf("%d owners held", n)
		}
		lookups(b, s)
		b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc)/float64(owners*perOwner), "heap-B/fragment")
		b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc)/(1<<20), "heap-MiB")
	})
}
