package bench

import (
	"context"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Load is how a scenario is driven.
type Load struct {
	// Concurrency is the number of clients, each sending its next request when the last one
	// was answered.
	Concurrency int
	// Warmup runs before measuring; Duration is measured.
	Warmup, Duration time.Duration
}

// Stats summarises one measured run.
type Stats struct {
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	Seconds  float64 `json:"seconds"`
	RPS      float64 `json:"rps"`
	// Latencies in milliseconds.
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p999_ms"`
	Max  float64 `json:"max_ms"`
	// CPUms is this process's CPU time per request in milliseconds (clients included).
	CPUms float64 `json:"cpu_ms_per_request"`
	// FirstError is the first error seen, if any.
	FirstError string `json:"first_error,omitempty"`
}

// Do sends request number seq of client and reports whether it succeeded.
type Do func(ctx context.Context, client, seq int) error

// Drive runs do from Concurrency clients: Warmup unmeasured, then Duration measured.
func Drive(ctx context.Context, l Load, do Do) Stats {
	if l.Concurrency < 1 {
		l.Concurrency = 1
	}
	var mu sync.Mutex
	var lat []time.Duration
	st := Stats{}
	measuring := make(chan struct{})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range l.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]time.Duration, 0, 4096)
			errs, first := 0, ""
			on := false
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					mu.Lock()
					lat = append(lat, mine...)
					st.Errors += errs
					if st.FirstError == "" {
						st.FirstError = first
					}
					mu.Unlock()
					return
				default:
				}
				if !on {
					select {
					case <-measuring:
						on = true
					default:
					}
				}
				t0 := time.Now()
				err := do(ctx, c, seq)
				d := time.Since(t0)
				if !on {
					continue
				}
				if err != nil {
					errs++
					if first == "" {
						first = err.Error()
					}
					continue
				}
				mine = append(mine, d)
			}
		}()
	}
	sleep(ctx, l.Warmup)
	cpu0 := cpuTime()
	t0 := time.Now()
	close(measuring)
	sleep(ctx, l.Duration)
	close(stop)
	elapsed := time.Since(t0)
	cpu := cpuTime() - cpu0
	wg.Wait()
	slices.Sort(lat)
	st.Requests = len(lat)
	st.Seconds = elapsed.Seconds()
	st.RPS = float64(st.Requests) / st.Seconds
	st.P50, st.P90, st.P99, st.P999 = pct(lat, 0.50), pct(lat, 0.90), pct(lat, 0.99), pct(lat, 0.999)
	if len(lat) > 0 {
		st.Max = ms(lat[len(lat)-1])
		st.CPUms = ms(cpu) / float64(st.Requests)
	}
	return st
}

func pct(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p)
	return ms(sorted[i])
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// cpuTime is this process's user + system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
