package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/examples"
	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/bench"
	"github.com/hermesbus/hermes/internal/gateway"
	"github.com/hermesbus/hermes/internal/routes"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/retry"
)

// benchRow is one line of the benchmark report.
type benchRow struct {
	Scenario    string `json:"scenario"`
	Target      string `json:"target"`
	Sync        string `json:"sync"`
	Concurrency int    `json:"concurrency"`
	Workers     int    `json:"worker_processes,omitempty"`
	bench.Stats
	// CPU time per request of the Hermes processes outside this one (worker processes).
	WorkerCPUms float64 `json:"worker_cpu_ms_per_request,omitempty"`
}

// benchStart is the cold start and memory of one binary.
type benchStart struct {
	Binary  string  `json:"binary"`
	ReadyMS float64 `json:"exec_to_ready_ms"`
	IdleMiB float64 `json:"idle_rss_mib"`
}

type benchReport struct {
	Machine string       `json:"machine"`
	Started time.Time    `json:"started"`
	Rows    []benchRow   `json:"rows"`
	Starts  []benchStart `json:"cold_starts,omitempty"`
	// PeakMiB is the peak RSS of the I/O scenario's worker processes and of this process.
	WorkerPeakMiB float64 `json:"worker_peak_rss_mib,omitempty"`
	SelfPeakMiB   float64 `json:"bench_process_peak_rss_mib"`
	// StoredPerRequest is how many messages a 1-call request adds to the streams and
	// key-value buckets together, over StoredRequests sequential requests.
	StoredPerRequest float64  `json:"stored_messages_per_request,omitempty"`
	StoredRequests   int      `json:"stored_requests,omitempty"`
	Notes            []string `json:"notes,omitempty"`
}

// RunBench measures Hermes against the same tool called directly: hermes bench.
func RunBench(ctx context.Context, args []string, env Env) error {
	fs := newFlagSet("bench", "hermes bench [flags]", env.Stderr)
	duration := fs.Duration("duration", 10*time.Second, "measured time of each run")
	warmup := fs.Duration("warmup", 2*time.Second, "unmeasured time before each run")
	concs := fs.String("concurrency", "1,16,64", "client counts, comma-separated")
	calls := fs.String("calls", "1,3", "tool calls per request, comma-separated")
	syncs := fs.String("sync", "interval", "store sync policies to run: interval, always, or interval,always")
	ioWorkers := fs.String("io-workers", "1,2,4", "tool worker processes for the I/O-bound scenario; empty to skip it")
	ioClients := fs.Int("io-clients", 128, "clients of the I/O-bound scenario")
	ioWorkerConc := fs.Int("io-worker-concurrency", 8, "concurrency of each tool worker process in the I/O-bound scenario")
	ioDelay := fs.Int("io-delay-ms", 20, "how long the I/O-bound tool takes")
	coldStart := fs.Bool("cold-start", true, "measure each binary's exec-to-ready time and idle memory")
	stored := fs.Int("stored-requests", 100, "sequential 1-call requests over which to count the messages each stores; 0 to skip")
	withDirect := fs.Bool("direct", true, "call the demo tool directly too, the floor each Hermes row is compared with (false leaves it out: to profile Hermes alone)")
	laneList := fs.String("lanes", "fast,durable", "how the in-process Hermes takes the load, comma-separated: fast (read-only calls on the fast lane) and durable (the fast lane off)")
	perClient := fs.Bool("session-per-client", false, "send each client's requests in one session (as chats do) instead of each in a session of its own")
	role := fs.String("role", "user", "the role of the key the load is sent with (a user's requests are checked against the sessions of others, an operator's and admin's are not)")
	url := fs.String("url", "", "an external gateway to drive instead of an in-process Hermes (with HERMES_API_KEY or --key-file's key)")
	var key keyFlag
	key.register(fs)
	directURL := fs.String("direct-url", "", "with --url: the tool URL to call directly (echo)")
	jsonOut := fs.String("json", "", "write the report as JSON to this file")
	mdOut := fs.String("markdown", "", "write the report as Markdown to this file")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of this process (clients, gateway, router, worker, NATS) to this file")
	mutexProfile := fs.String("mutexprofile", "", "write a profile of this process's contended locks (where goroutines waited for a mutex someone held) to this file")
	blockProfile := fs.String("blockprofile", "", "write a profile of where this process's goroutines blocked (locks, channels, selects) to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	concList, err := intList(*concs)
	if err != nil {
		return fmt.Errorf("--concurrency: %w", err)
	}
	callList, err := intList(*calls)
	if err != nil {
		return fmt.Errorf("--calls: %w", err)
	}
	workerList, err := intList(*ioWorkers)
	if err != nil {
		return fmt.Errorf("--io-workers: %w", err)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	startProfiles, stopProfiles, err := contentionProfiles(*mutexProfile, *blockProfile)
	if err != nil {
		return err
	}
	defer func() {
		if err := stopProfiles(); err != nil {
			fmt.Fprintln(env.Stderr, "hermes bench:", err)
		}
	}()
	rep := &benchReport{Machine: machine(), Started: time.Now().UTC()}
	load := func(c int) bench.Load { return bench.Load{Concurrency: c, Warmup: *warmup, Duration: *duration} }
	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	progress := func(r benchRow) {
		rep.Rows = append(rep.Rows, r)
		fmt.Fprintf(env.Stderr, "%-34s %-7s c=%-3d %8.0f req/s  p50 %6.2f ms  p99 %6.2f ms  errors %d\n",
			r.Scenario, r.Target, r.Concurrency, r.RPS, r.P50, r.P99, r.Errors)
	}
	if *url != "" {
		if *directURL == "" {
			return fmt.Errorf("--url needs --direct-url, the echo tool's URL to compare with")
		}
		k, err := key.key()
		if err != nil {
			return err
		}
		if err := runMain(ctx, *url, k, *directURL, "external", *perClient, callList, concList, load, runID, []lane{{name: "h", target: "hermes"}}, progress); err != nil {
			return err
		}
	} else {
		for _, sync := range strings.Split(*syncs, ",") {
			always, err := syncPolicy(sync)
			if err != nil {
				return err
			}
			sys, stop, err := benchSystem(ctx, always, 1, 64)
			if err != nil {
				return err
			}
			if err := benchKey(ctx, sys, *role); err != nil {
				stop()
				return err
			}
			if *stored > 0 && rep.StoredRequests == 0 {
				if rep.StoredPerRequest, err = storedPerRequest(ctx, sys, *stored, runID); err != nil {
					stop()
					return err
				}
				rep.StoredRequests = *stored
				fmt.Fprintf(env.Stderr, "stored messages per 1-call request: %.2f (over %d requests)\n", rep.StoredPerRequest, *stored)
			}
			lanes, check := benchLanes(sys, *laneList)
			startProfiles()
			directURL := sys.DemoURL + "/v1/echo"
			if !*withDirect {
				directURL = ""
			}
			err = runMain(ctx, sys.GatewayURL, sys.Key.Key, directURL, sync, *perClient, callList, concList, load, runID+sync, lanes, progress)
			if err == nil && check != nil {
				var note string
				if note, err = check(ctx); err == nil {
					rep.Notes = append(rep.Notes, note)
					fmt.Fprintln(env.Stderr, note)
				}
			}
			stop()
			if err != nil {
				return err
			}
		}
		if len(workerList) > 0 {
			peak, err := runIO(ctx, workerList, *ioClients, *ioWorkerConc, *ioDelay, load, runID, progress)
			if err != nil {
				return err
			}
			rep.WorkerPeakMiB = peak
		}
		if *coldStart {
			if rep.Starts, err = measureStarts(ctx); err != nil {
				rep.Notes = append(rep.Notes, "cold start not measured: "+err.Error())
			}
		}
	}
	_, rep.SelfPeakMiB = bench.SelfMemory()
	md := rep.markdown()
	fmt.Fprint(env.Stdout, md)
	if *mdOut != "" {
		if err := os.WriteFile(*mdOut, []byte(md), 0o644); err != nil {
			return err
		}
	}
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// runMain runs the 1-call and 3-call scenarios at each concurrency, direct then Hermes, calling
// the gateway with key. A scenario where every request failed ends it with the first error: what
// it would report measures nothing.
func runMain(ctx context.Context, gw, key, direct, sync string, perClient bool, calls, concs []int, load func(int) bench.Load, runID string, lanes []lane, add func(benchRow)) error {
	// direct == "": no direct call (--direct=false).
	for _, n := range calls {
		name := fmt.Sprintf("%d call", n)
		if n > 1 {
			name = fmt.Sprintf("%d parallel calls", n)
		}
		for _, c := range concs {
			client := bench.NewClient(c * n)
			var all []bench.Stats
			if direct != "" {
				d := bench.Drive(ctx, load(c), (&bench.Direct{Client: client, URL: direct, Calls: n, Args: "{}"}).Do)
				add(benchRow{Scenario: name, Target: "direct", Sync: sync, Concurrency: c, Stats: d})
				all = append(all, d)
			}
			for _, l := range lanes {
				if l.set != nil {
					l.set()
				}
				h := &bench.Hermes{Client: client, URL: gw, Key: key, Tool: "echo", Calls: n, Args: "{}",
					RunID: fmt.Sprintf("%s-%s-%d-%d", runID, l.name, n, c), SessionPerClient: perClient, Keep: l.keep}
				st := bench.Drive(ctx, load(c), h.Do)
				add(benchRow{Scenario: name, Target: l.target, Sync: sync, Concurrency: c, Stats: st})
				all = append(all, st)
			}
			for _, st := range all {
				if st.Requests == 0 && st.Errors > 0 {
					return fmt.Errorf("bench: %s at %d clients: every request failed: %s", name, c, st.FirstError)
				}
			}
		}
	}
	return nil
}

// lane is one way the bench sends Hermes its load: the fast lane, or the durable path alone.
type lane struct {
	name, target string
	// set makes the system take the load this way (nil: as it is).
	set func()
	// keep, when set, is given each answered request's id, session and number of calls.
	keep func(requestID, session string, calls int)
}

// storedPerRequest counts the messages a 1-call request stores in sys's streams and buckets,
// over n sequential requests, after a few that create what the first calls of a tool do.
func storedPerRequest(ctx context.Context, sys *System, n int, runID string) (float64, error) {
	nc, err := nats.Connect(sys.ClientURL, nats.Name("hermes-bench"), sys.userOption(bus.RoleAdmin))
	if err != nil {
		return 0, fmt.Errorf("bench: connect to count stored messages: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	h := &bench.Hermes{Client: bench.NewClient(1), URL: sys.GatewayURL, Key: sys.Key.Key, Tool: "echo", Calls: 1, Args: "{}", RunID: runID + "-warm"}
	for i := range 5 {
		if err := h.Do(ctx, 0, i); err != nil {
			return 0, fmt.Errorf("bench: warm-up request: %w", err)
		}
	}
	h.RunID = runID + "-stored"
	return bench.StoredPerRequest(ctx, js, n, h.Do)
}

// benchKey makes the key the load of sys is sent with: one of role (sys.Key, the admin key,
// for admin).
func benchKey(ctx context.Context, sys *System, role string) error {
	r, err := auth.ParseRole(role)
	if err != nil || r == auth.RoleAdmin {
		return err
	}
	nc, b, err := Connect(ctx, sys.ClientURL, "hermes-bench-keys", bus.Config{OpenOnly: true}, nil, sys.userOption(bus.RoleAdmin))
	if err != nil {
		return err
	}
	defer nc.Close()
	key, _, err := apiKeys(b).Create(ctx, auth.NewKey{Name: "bench-" + role, Role: r, CreatedBy: "hermes bench"})
	if err == nil {
		sys.Key = SystemKey{Key: key}
	}
	return err
}

// benchSystem starts an in-process Hermes on loopback with a fresh store.
func benchSystem(ctx context.Context, syncAlways bool, workers, workerConc int) (*System, func(), error) {
	dir, err := os.MkdirTemp("", "hermes-bench-")
	if err != nil {
		return nil, nil, err
	}
	data, _ := examples.Files.ReadFile("routes.yaml")
	table, err := routes.Parse("examples/routes.yaml", data)
	if err != nil {
		return nil, nil, err
	}
	sys, err := StartSystem(ctx, SystemConfig{DataDir: dir, SyncAlways: syncAlways, NATSListen: "127.0.0.1:0",
		HTTPAddr: "127.0.0.1:0", DemoAddr: "127.0.0.1:0", Routes: table, ToolWorkers: workers,
		Worker: WorkerConfig{Concurrency: workerConc}, Instance: "bench",
		// One caller drives all the load: no per-caller limit may shape what is measured.
		Gateway: gateway.Config{CallerLimits: admission.CallerLimits{RequestsPerSecond: -1, Waiting: -1, Streams: -1,
			Budget: submit.Budget{Bytes: -1}}}})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = sys.Run(rctx); close(done) }()
	stop := func() { cancel(); <-done; os.RemoveAll(dir) }
	if err := waitReady(ctx, sys.GatewayURL); err != nil {
		stop()
		return nil, nil, err
	}
	return sys, stop, nil
}

func waitReady(ctx context.Context, base string) error {
	err := retry.Do(ctx, retry.Fixed(20*time.Millisecond), time.Now().Add(30*time.Second), func() error {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		return nil
	}, nil)
	if err != nil {
		return fmt.Errorf("bench: %s not ready: %w", base, err)
	}
	return nil
}

// runIO drives an I/O-bound tool through 1, 2, 4… tool worker processes of fixed concurrency.
func runIO(ctx context.Context, workers []int, clients, workerConc, delayMS int, load func(int) bench.Load, runID string, add func(benchRow)) (float64, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	args := fmt.Sprintf(`{"delay_ms":%d}`, delayMS)
	name := fmt.Sprintf("echo %d ms, workers of %d", delayMS, workerConc)
	peak := 0.0
	for _, n := range workers {
		sys, stop, err := benchSystem(ctx, false, 0, workerConc)
		if err != nil {
			return 0, err
		}
		demo := strings.TrimPrefix(sys.DemoURL, "http://")
		var procs []*bench.Process
		for i := range n {
			p, err := bench.StartProcess(self, []string{"toolworker", "--nats", sys.ClientURL, "--nats-nkey", sys.Seeds[bus.RoleWorker], "--no-provision", "--instance", fmt.Sprintf("bench-worker-%d", i+1),
				"--tools", "echo", "--concurrency", strconv.Itoa(workerConc), "--resolve", demoToolsAddr + "=" + demo}, `"serving tool"`, 30*time.Second)
			if err != nil {
				stop()
				return 0, err
			}
			procs = append(procs, p)
		}
		cpu0 := time.Duration(0)
		for _, p := range procs {
			cpu0 += p.CPU()
		}
		h := bench.Drive(ctx, load(clients), (&bench.Hermes{Client: bench.NewClient(clients), URL: sys.GatewayURL, Key: sys.Key.Key, Tool: "echo", Calls: 1,
			Args: args, RunID: fmt.Sprintf("%s-io-%d", runID, n)}).Do)
		cpu := time.Duration(0)
		for _, p := range procs {
			cpu += p.CPU()
			_, pk := p.Memory()
			peak = max(peak, pk)
		}
		row := benchRow{Scenario: name, Target: "hermes", Sync: "interval", Concurrency: clients, Workers: n, Stats: h}
		if h.Requests > 0 {
			row.WorkerCPUms = float64(cpu-cpu0) / float64(time.Millisecond) / float64(h.Requests)
		}
		add(row)
		for _, p := range procs {
			p.Stop()
		}
		stop()
	}
	return peak, nil
}

// measureStarts execs each binary against a running NATS and times it until it is ready.
func measureStarts(ctx context.Context) ([]benchStart, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	sys, stop, err := benchSystem(ctx, false, 0, 8)
	if err != nil {
		return nil, err
	}
	defer stop()
	dir, _ := os.MkdirTemp("", "hermes-bench-up-")
	defer os.RemoveAll(dir)
	type run struct {
		name, bin string
		args      []string
		ready     string
	}
	var runs []run
	for _, r := range []run{
		{"router", "", []string{"router", "--nats", sys.ClientURL, "--nats-nkey", sys.Seeds[bus.RoleRouter], "--no-provision", "--instance", "cold-router"}, `"router running"`},
		{"toolworker", "", []string{"toolworker", "--nats", sys.ClientURL, "--nats-nkey", sys.Seeds[bus.RoleWorker], "--no-provision", "--instance", "cold-worker"}, `"tool worker running"`},
		{"gateway", "", []string{"gateway", "--nats", sys.ClientURL, "--nats-nkey", sys.Seeds[bus.RoleGateway], "--no-provision", "--instance", "cold-gateway", "--http", "127.0.0.1:0"}, `"gateway listening"`},
	} {
		runs = append(runs, run{"hermes " + r.name, self, r.args, r.ready})
		// The dedicated binary (cmd/router, ...), as deployed, when it was built beside this one.
		if bin := filepath.Join(filepath.Dir(self), r.name); bin != self {
			if st, err := os.Stat(bin); err == nil && st.Mode().IsRegular() {
				runs = append(runs, run{r.name + " (own binary)", bin, r.args[1:], r.ready})
			}
		}
	}
	runs = append(runs, run{"hermes up (embedded NATS, all services)", self,
		[]string{"up", "--data", dir, "--http", "127.0.0.1:0", "--demo-tools", "127.0.0.1:0", "--nats-listen", ""}, "Hermes is up."})
	var out []benchStart
	for _, r := range runs {
		best := time.Duration(0)
		var idle float64
		for range 3 { // best of three: the page cache is warm for all but the first
			p, err := bench.StartProcess(r.bin, r.args, r.ready, 30*time.Second)
			if err != nil {
				return nil, err
			}
			if best == 0 || p.Ready < best {
				best = p.Ready
			}
			time.Sleep(2 * time.Second) // idle, then read its memory
			idle, _ = p.Memory()
			p.Stop()
		}
		out = append(out, benchStart{Binary: r.name, ReadyMS: float64(best) / float64(time.Millisecond), IdleMiB: idle})
	}
	return out, nil
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func machine() string {
	model := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				model = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
				break
			}
		}
	}
	return fmt.Sprintf("%s/%s, %d CPUs, %s, %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), model, runtime.Version())
}

func (r *benchReport) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Machine: %s. Started %s.\n\n", r.Machine, r.Started.Format(time.RFC3339))
	fmt.Fprintf(&b, "| scenario | target | sync | clients | req/s | p50 ms | p90 ms | p99 ms | p99.9 ms | errors | CPU ms/req |\n")
	fmt.Fprintf(&b, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var direct *benchRow
	for i := range r.Rows {
		row := &r.Rows[i]
		scen := row.Scenario
		if row.Workers > 0 {
			scen = fmt.Sprintf("%s ×%d", scen, row.Workers)
		}
		cpu := fmt.Sprintf("%.3f", row.CPUms)
		if row.WorkerCPUms > 0 {
			cpu = fmt.Sprintf("%.3f + %.3f workers", row.CPUms, row.WorkerCPUms)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %.0f | %.2f | %.2f | %.2f | %.2f | %d | %s |\n", scen, row.Target, row.Sync,
			row.Concurrency, row.RPS, row.P50, row.P90, row.P99, row.P999, row.Errors, cpu)
		if row.Target == "direct" {
			direct = row
		} else if direct != nil && direct.Scenario == row.Scenario && direct.Concurrency == row.Concurrency && direct.Sync == row.Sync {
			fmt.Fprintf(&b, "| ↳ Hermes vs direct | | | | ×%.2f | +%.2f | +%.2f | +%.2f | +%.2f | | +%.3f |\n",
				safeDiv(row.RPS, direct.RPS), row.P50-direct.P50, row.P90-direct.P90, row.P99-direct.P99, row.P999-direct.P999, row.CPUms-direct.CPUms)
		}
	}
	var io []benchRow
	for _, row := range r.Rows {
		if row.Workers > 0 {
			io = append(io, row)
		}
	}
	if len(io) > 1 {
		fmt.Fprintf(&b, "\nI/O-bound scaling: ")
		for _, row := range io {
			fmt.Fprintf(&b, "%d worker(s) ×%.2f  ", row.Workers, safeDiv(row.RPS, io[0].RPS))
		}
		fmt.Fprintf(&b, "(throughput relative to 1 worker; worker peak RSS %.1f MiB)\n", r.WorkerPeakMiB)
	}
	if r.StoredRequests > 0 {
		fmt.Fprintf(&b, "\nStored messages per 1-call request (streams and buckets together, over %d sequential requests): %.2f\n",
			r.StoredRequests, r.StoredPerRequest)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "\nNote: %s\n", n)
	}
	if len(r.Starts) > 0 {
		fmt.Fprintf(&b, "\n| binary | exec → ready (best of 3) | idle RSS |\n|---|---:|---:|\n")
		for _, s := range r.Starts {
			fmt.Fprintf(&b, "| %s | %.1f ms | %.1f MiB |\n", s.Binary, s.ReadyMS, s.IdleMiB)
		}
	}
	return b.String()
}

func safeDiv(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// benchLanes are the ways names (fast, durable) the bench sends sys its load, and the check
// that every request the fast lane answered is on the record, to run after the load (nil when
// the fast lane is not among them).
func benchLanes(sys *System, names string) ([]lane, func(context.Context) (string, error)) {
	fast := sys.FastLane()
	var lanes []lane
	var mu sync.Mutex
	type answered struct {
		rid, session string
		calls        int
	}
	var kept []answered
	withFast := false
	for _, n := range strings.Split(names, ",") {
		switch strings.TrimSpace(n) {
		case "fast":
			if fast == nil {
				continue
			}
			withFast = true
			lanes = append(lanes, lane{name: "f", target: "fast lane", set: func() { fast.SetEnabled(true) },
				keep: func(rid, session string, calls int) {
					mu.Lock()
					kept = append(kept, answered{rid, session, calls})
					mu.Unlock()
				}})
		case "durable":
			lanes = append(lanes, lane{name: "d", target: "durable", set: func() {
				if fast != nil {
					fast.SetEnabled(false)
				}
			}})
		}
	}
	if !withFast {
		return lanes, nil
	}
	check := func(ctx context.Context) (string, error) {
		// The writers drain first: the record of the last answers is written just after them.
		deadline := time.Now().Add(30 * time.Second)
		for {
			waiting := int64(0)
			for _, l := range sys.Lanes() {
				waiting += l.Writer().Waiting()
			}
			if waiting == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		nc, b, err := Connect(ctx, sys.ClientURL, "hermes-bench-check", bus.Config{OpenOnly: true}, nil, sys.userOption(bus.RoleAdmin))
		if err != nil {
			return "", err
		}
		defer nc.Close()
		mu.Lock()
		all := slices.Clone(kept)
		mu.Unlock()
		var missing, checked atomic.Int64
		var firstMissing atomic.Value
		work := make(chan answered)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for a := range work {
					checked.Add(1)
					ok := true
					if _, _, err := b.Response(ctx, a.rid, a.session); err != nil {
						ok = false
					}
					ids := make([]string, a.calls)
					for i := range ids {
						ids[i] = fmt.Sprintf("c%d", i)
					}
					if got, err := b.Results(ctx, a.rid, a.session, ids, nil, 0); err != nil || len(got) != len(ids) {
						ok = false
					}
					if !ok {
						missing.Add(1)
						firstMissing.CompareAndSwap(nil, a.rid)
					}
				}
			}()
		}
		perSession := map[string]uint64{}
		for _, a := range all {
			perSession[a.session]++
			work <- a
		}
		close(work)
		wg.Wait()
		// Each session's requests, counted on the subjects requests are recorded on: the fast
		// lane's, and the partitions' (where the durable path records those it declined).
		stored := map[string]uint64{}
		for k, s := range b.Streams {
			info, err := s.Info(ctx, jetstream.WithSubjectFilter(protocol.FilterRequestsIn(k)))
			if err != nil {
				return "", err
			}
			maps.Copy(stored, info.State.Subjects)
		}
		for session, n := range perSession {
			have := stored[b.Layout().SubjectFastRecordedRequest(session)] + stored[b.StoredSubjectRequest(session)]
			if have < n {
				missing.Add(int64(n - have))
				firstMissing.CompareAndSwap(nil, "a request of session "+session)
			}
		}
		var answered, declined int64
		for _, l := range sys.Lanes() {
			a, d := l.Counts()
			answered, declined = answered+a, declined+d
		}
		note := fmt.Sprintf("record check: %d requests answered in the fast-lane runs, %d missing from the record (request, results or response); routers answered %d on the fast lane and declined %d (the durable path took those)",
			checked.Load(), missing.Load(), answered, declined)
		if m := firstMissing.Load(); m != nil {
			note += fmt.Sprintf(" (first missing: %s)", m)
		}
		return note, nil
	}
	return lanes, check
}

// contentionProfiles records contended mutexes (every fifth contention event) and blocking
// (about one event per 10 µs blocked) where a file is named for them, from start on (after the
// embedded NATS server started: it sets the block profile's rate itself); stop writes each
// profile to its file, stops recording, and says which could not be written.
func contentionProfiles(mutexFile, blockFile string) (start func(), stop func() error, err error) {
	for _, f := range []string{mutexFile, blockFile} {
		if f == "" {
			continue
		}
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			return nil, nil, err
		}
	}
	start = func() {
		if mutexFile != "" {
			runtime.SetMutexProfileFraction(5)
		}
		if blockFile != "" {
			runtime.SetBlockProfileRate(int((10 * time.Microsecond).Nanoseconds()))
		}
	}
	return start, func() error {
		var errs []error
		for _, p := range []struct{ name, file string }{{"mutex", mutexFile}, {"block", blockFile}} {
			if p.file != "" {
				if err := writeProfile(p.name, p.file); err != nil {
					errs = append(errs, fmt.Errorf("the %s profile: %w", p.name, err))
				}
			}
		}
		runtime.SetMutexProfileFraction(0)
		runtime.SetBlockProfileRate(0)
		return errors.Join(errs...)
	}, nil
}

// writeProfile writes the runtime profile name to file.
func writeProfile(name, file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
