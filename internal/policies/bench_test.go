package policies

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/policy"
)

// The policy stage's cost per call: a tool with no policy, one with allowed_roles only, and
// one with a rate limit counted in the windows' bucket of an embedded NATS server (each call
// let through: the clock moves a little more than the rate's spacing between calls, so the
// window always holds about its rate's count of calls, and each call reads and writes it).
func BenchmarkStage(b *testing.B) {
	s := bustest.NewServer(b)
	bb := s.Provision(b, bus.Config{Buckets: Buckets()})
	roles := mustPolicy(b, `{"allowed_roles":["admin","manager"]}`)
	rate := mustPolicy(b, `{"rate_limit":"100/min"}`)
	cases := []struct {
		name string
		rule *Rule
	}{
		{"no_policy", nil},
		{"allowed_roles", &Rule{Tool: "t", Policy: roles, Source: SourcePolicy, Version: 1}},
		{"rate_limit_nats_kv", &Rule{Tool: "t", Policy: rate, Source: SourcePolicy, Version: 1}},
	}
	for _, c := range cases {
		// One clock for every run of the case: the bucket keeps the windows of earlier runs.
		now := time.Now()
		step := time.Minute/100 + time.Millisecond
		b.Run(c.name, func(b *testing.B) {
			st := &Stage{Rules: rules{"t": c.rule}, Windows: &Windows{KV: bb.Bucket(WindowsBucket), Now: func() time.Time { return now }}}
			j := stageJob(b, "r", "admin", "t", `{}`)
			j.Msg.Caller.ID = "key:" + c.name // a window of its own
			call := j.Calls[0]
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if c.rule != nil && c.rule.Policy.RateLimit != nil {
					j.Msg.RequestID = "r" + strconv.Itoa(i) // each a call of its own
					now = now.Add(step)
				}
				call.Policy, call.Result = nil, nil
				if _, err := st.Process(b.Context(), j); err != nil {
					b.Fatal(err)
				}
				if !call.Pending() || (c.rule != nil && call.Policy == nil) {
					b.Fatalf("call %d not let through: %+v", i, call.Result)
				}
			}
		})
	}
}

// The shared rate limit across two routers: two connections to one server, each router with
// windows of its own on the same bucket, calls goroutines at once (half through each) against
// a window of rate configured. Each round is a fresh window; what the windows let through is
// reported against what is configured (allowed/configured: 1 at most, and it must never be
// more), with the calls that gave up under contention (ErrContended, decided again later by a
// router) per round.
func BenchmarkSharedRateLimitTwoRouters(b *testing.B) {
	for _, c := range []struct{ calls, configured int }{{40, 10}, {200, 50}} {
		b.Run(fmt.Sprintf("calls=%d/rate=%d_per_min", c.calls, c.configured), func(b *testing.B) {
			s := bustest.NewServer(b)
			first := s.Provision(b, bus.Config{Buckets: Buckets()})
			second := s.Provision(b, bus.Config{Buckets: Buckets()})
			routers := []*Windows{{KV: first.Bucket(WindowsBucket)}, {KV: second.Bucket(WindowsBucket)}}
			rate := policy.Rate{Count: c.configured, Per: time.Minute}
			var allowed, contended, rounds int64
			for round := 0; b.Loop(); round++ {
				key := "bench.round" + strconv.Itoa(round)
				var ok, gaveUp atomic.Int64
				var wg sync.WaitGroup
				start := make(chan struct{})
				for i := range c.calls {
					wg.Go(func() {
						<-start
						let, _, err := routers[i%2].Take(b.Context(), key, rate, CallID(key, strconv.Itoa(i)))
						switch {
						case err == ErrContended:
							gaveUp.Add(1)
						case err != nil:
							b.Error(err)
						case let:
							ok.Add(1)
						}
					})
				}
				close(start)
				wg.Wait()
				if n := ok.Load(); n > int64(c.configured) {
					b.Fatalf("round %d: %d calls let through; the rate is %d", round, n, c.configured)
				}
				allowed += ok.Load()
				contended += gaveUp.Load()
				rounds++
			}
			b.ReportMetric(float64(allowed)/float64(rounds*int64(c.configured)), "allowed/configured")
			b.ReportMetric(float64(contended)/float64(rounds), "contended/round")
		})
	}
}
