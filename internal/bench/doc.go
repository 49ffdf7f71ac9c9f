// Package bench measures Hermes as a user would: many clients posting requests to the
// gateway for a fixed time after a warm-up, and, in the same run, the same tool called
// directly over HTTP — the floor for this work — so Hermes is reported as a ratio to it.
// It reports throughput, latency percentiles, errors and CPU time per request, and measures
// cold start and memory of the binaries. `hermes bench` drives it; BENCHMARKS.md holds results.
package bench
