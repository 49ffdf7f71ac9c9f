package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// startOnCluster runs Hermes — two routers, two tool workers, a gateway — against a three-node
// JetStream cluster in this process: every service dials all three nodes (the URL list
// HERMES_NATS_URL would hold) and the stream, the buckets and the consumers have three
// replicas. AckWait is 2 s, as in the crash tests, so that a delivery whose ack went down with
// its consumer leader comes back within the test. The services' warnings are shown if the test
// fails.
func startOnCluster(t *testing.T) (*system, *bustest.Cluster) {
	t.Helper()
	c := bustest.NewCluster(t)
	logs := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("service warnings:\n%s", logs.String())
		}
	})
	s := start(t, options{routers: 2, workers: 2, natsURL: c.URL(),
		bus:    bus.Config{Replicas: bustest.ClusterSize, AckWait: 2 * time.Second},
		logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	return s, c
}

// Timing of the clients of the cluster tests: each POST asks the gateway to wait clusterWait
// for the response, and the client gives up on an answer clusterClientSlack later than that.
const (
	clusterWait        = time.Second
	clusterClientSlack = 4 * time.Second
	clusterClients     = 6
	// clusterRecovery bounds how long a scenario waits for requests to be answered again; the
	// clients of a scenario keep retrying for longer than the waits of its steps added up.
	clusterRecovery = 60 * time.Second
)

// attempt is one POST of a cluster client.
type attempt struct {
	id     string
	sent   time.Time
	took   time.Duration
	status int    // 0: no HTTP answer (the client timed out or the connection failed)
	code   string // error.code of a JSON error
	msg    string // error.message, or the transport error
}

// load is several clients sending requests one after another, each under a new request_id, and
// retrying the same id after any error or timeout until it is answered, as real clients do.
type load struct {
	s        *system
	client   *http.Client
	deadline time.Time // clients stop retrying then
	stop     chan struct{}
	wg       sync.WaitGroup
	answered atomic.Int64

	mu       sync.Mutex
	runs     []clientRun
	attempts []attempt
}

// startLoad starts the clients; they keep retrying unanswered requests until budget has passed.
func (s *system) startLoad(prefix string, budget time.Duration) *load {
	l := &load{s: s, client: &http.Client{Timeout: clusterWait + clusterClientSlack},
		deadline: time.Now().Add(budget), stop: make(chan struct{})}
	for c := range clusterClients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for n := 0; ; n++ {
				select {
				case <-l.stop:
					return
				default:
				}
				id := fmt.Sprintf("%s_%d_%03d", prefix, c, n)
				run := l.request(request(id, "", call("a", "echo", map[string]any{"id": id, "delay_ms": 5}),
					call("b", "echo", map[string]any{"id": id, "n": n})))
				l.mu.Lock()
				l.runs = append(l.runs, run)
				l.mu.Unlock()
				time.Sleep(10 * time.Millisecond) // pacing the load, not synchronisation
			}
		}()
	}
	return l
}

// request posts req until it is answered with a 200 or the deadline passes.
func (l *load) request(req map[string]any) clientRun {
	run := clientRun{id: req["request_id"].(string)}
	data, _ := json.Marshal(req)
	for time.Now().Before(l.deadline) {
		run.posts++
		a := attempt{id: run.id, sent: time.Now()}
		resp, err := l.client.Post(l.s.base+"/v1/route?timeout="+clusterWait.String(), "application/json", bytes.NewReader(data))
		var body []byte
		if err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			a.status = resp.StatusCode
		} else {
			a.msg = err.Error()
		}
		a.took = time.Since(a.sent)
		if a.status != 0 && a.status != http.StatusOK {
			var e struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			_ = json.Unmarshal(body, &e)
			a.code, a.msg = e.Error.Code, e.Error.Message
		}
		l.mu.Lock()
		l.attempts = append(l.attempts, a)
		l.mu.Unlock()
		if a.status == http.StatusOK {
			run.answers = append(run.answers, body)
			l.answered.Add(1)
			return run
		}
		if a.status == 0 {
			run.failures = append(run.failures, a.msg)
		} else {
			run.failures = append(run.failures, fmt.Sprintf("HTTP %d %s", a.status, a.code))
		}
		if a.status != http.StatusGatewayTimeout {
			time.Sleep(100 * time.Millisecond) // back off before retrying, as a client would
		}
	}
	return run
}

// waitAnswered waits until n more requests than now have been answered. A cluster serves again
// once its streams and consumers have elected leaders, and a NATS server's Raft election timeout
// is 4–9 s (randomised), longer on a loaded machine: hence a deadline well past waitFor's.
func (l *load) waitAnswered(t *testing.T, n int64, what string) {
	t.Helper()
	target := l.answered.Load() + n
	waitForWithin(t, what, clusterRecovery, func() bool { return l.answered.Load() >= target })
}

// finish stops new requests, waits for the clients to be answered (or to give up), and returns
// every run and every attempt.
func (l *load) finish() ([]clientRun, []attempt) {
	close(l.stop)
	l.wg.Wait()
	return l.runs, l.attempts
}

// attemptStats summarises attempts for a scenario's log line.
type attemptStats struct {
	posts, ok, busUnavailable, gatewayTimeout, other, noAnswer int
	slowest                                                    time.Duration
}

func statsOf(attempts []attempt) attemptStats {
	var st attemptStats
	for _, a := range attempts {
		st.posts++
		st.slowest = max(st.slowest, a.took)
		switch {
		case a.status == http.StatusOK:
			st.ok++
		case a.status == http.StatusServiceUnavailable && a.code == protocol.CodeBusUnavailable:
			st.busUnavailable++
		case a.status == http.StatusGatewayTimeout:
			st.gatewayTimeout++
		case a.status == 0:
			st.noAnswer++
		default:
			st.other++
		}
	}
	return st
}

func (st attemptStats) String() string {
	return fmt.Sprintf("%d posts: 200=%d 503 %s=%d 504=%d other=%d no-answer=%d, slowest %s", st.posts, st.ok,
		protocol.CodeBusUnavailable, st.busUnavailable, st.gatewayTimeout, st.other, st.noAnswer, st.slowest.Round(time.Millisecond))
}

// checkRuns classifies every request against the record and requires each to be answered
// exactly once.
func (s *system) checkRuns(t *testing.T, scenario string, runs []clientRun, attempts []attempt) {
	t.Helper()
	counts := s.classify(runs)
	report(t, scenario, len(runs), counts)
	st := statsOf(attempts)
	t.Logf("%s: %s", scenario, st)
	if counts[outcomeOK]+counts[outcomeResolved] != len(runs) {
		t.Errorf("%s: not every request was answered exactly once: %v", scenario, counts)
	}
	var unanswered []string
	for _, a := range attempts {
		switch {
		case a.status == 0:
			unanswered = append(unanswered, a.id)
		case a.status != http.StatusOK && a.status != http.StatusGatewayTimeout &&
			!(a.status == http.StatusServiceUnavailable && a.code == protocol.CodeBusUnavailable):
			t.Errorf("%s: %s got HTTP %d %s: %s", scenario, a.id, a.status, a.code, a.msg)
		}
	}
	if len(unanswered) > 0 { // the gateway answers within ?timeout (at least 1 s to accept) + 1 s
		t.Errorf("%s: %d POSTs got no answer within the client's timeout of %s: %v",
			scenario, len(unanswered), clusterWait+clusterClientSlack, unanswered)
	}
}

// leaders names the meta leader and the leaders of the record stream and of the consumers.
func leaders(c *bustest.Cluster) string {
	parts := []string{fmt.Sprintf("meta=%v", c.MetaLeader()), fmt.Sprintf("%s=%v", protocol.StreamName, c.StreamLeader(protocol.StreamName))}
	for _, name := range []string{bus.RequestConsumer(0), bus.ConsumerRouterResults, bus.ToolConsumer(protocol.ActionHTTP, "echo")} {
		parts = append(parts, fmt.Sprintf("%s=%v", name, c.ConsumerLeader(protocol.StreamName, name)))
	}
	return strings.Join(parts, " ")
}

// TestClusterStreamLeaderStops: the node leading the record stream stops under load, then comes
// back. Every request is answered exactly once.
func TestClusterStreamLeaderStops(t *testing.T) {
	long(t, "cluster")
	leaderStopsUnderLoad(t, "cluster: stream leader stopped and restarted", "csl",
		func(c *bustest.Cluster) *bustest.Node { return c.WaitStreamLeader(protocol.StreamName) })
}

// leaderStopsUnderLoad stops the node pick names under load, then restarts it, and checks that
// every request is answered exactly once.
func leaderStopsUnderLoad(t *testing.T, scenario, prefix string, pick func(*bustest.Cluster) *bustest.Node) {
	s, c := startOnCluster(t)
	leader := pick(c)
	l := s.startLoad(prefix, 4*clusterRecovery)
	l.waitAnswered(t, 30, "requests answered before the stop")
	before := leaders(c)
	c.Stop(leader)
	l.waitAnswered(t, 30, "requests answered with the leader stopped")
	during := leaders(c)
	c.Restart(leader)
	c.WaitHealthy()
	l.waitAnswered(t, 30, "requests answered after the restart")
	runs, attempts := l.finish()
	c.WaitHealthy()
	t.Logf("stopped %s; leaders before: %s; while stopped: %s", leader, before, during)
	s.checkRuns(t, scenario, runs, attempts)
}

// TestClusterMetaLeaderStops: the node leading the meta group stops under load, then comes back.
// Every request is answered exactly once.
func TestClusterMetaLeaderStops(t *testing.T) {
	long(t, "cluster")
	leaderStopsUnderLoad(t, "cluster: meta leader stopped and restarted", "cml",
		func(c *bustest.Cluster) *bustest.Node { return c.WaitMetaLeader() })
}

// TestClusterQuorumLost: two of the three nodes stop under load. Requests are refused with the
// gateway's 503 BUS_UNAVAILABLE — never a false success — and are answered again once one of
// the two is back; every request is answered exactly once in the end.
func TestClusterQuorumLost(t *testing.T) {
	long(t, "cluster")
	s, c := startOnCluster(t)
	first := c.WaitStreamLeader(protocol.StreamName)
	var second *bustest.Node
	for _, n := range c.Nodes() {
		if n != first && (second == nil || n == c.MetaLeader()) {
			second = n
		}
	}
	l := s.startLoad("cql", 4*clusterRecovery)
	l.waitAnswered(t, 30, "requests answered before the stop")
	c.Stop(first)
	c.Stop(second)
	down := time.Now()
	// Every client has been turned away (or has given up) at least once, and the gateway has
	// refused a request.
	waitFor(t, "requests refused without a quorum", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		ended, refused := 0, 0
		for _, a := range l.attempts {
			if a.sent.After(down) && a.status != http.StatusOK {
				ended++
			}
			if a.sent.After(down) && a.status == http.StatusServiceUnavailable {
				refused++
			}
		}
		return ended >= clusterClients && refused > 0
	})
	up := time.Now()
	c.Restart(second)
	l.waitAnswered(t, 30, "requests answered with two nodes of three")
	back := time.Since(up)
	runs, attempts := l.finish()
	c.WaitHealthy() // the two running nodes

	var outage []attempt
	for _, a := range attempts {
		if a.sent.After(down) && a.sent.Add(a.took).Before(up) {
			outage = append(outage, a)
		}
	}
	st := statsOf(outage)
	t.Logf("stopped %s and %s for %s; answered again %s after %s returned", first, second,
		up.Sub(down).Round(time.Millisecond), back.Round(time.Millisecond), second)
	t.Logf("cluster: without a quorum: %s", st)
	if st.busUnavailable == 0 {
		t.Errorf("no request was refused with 503 %s without a quorum", protocol.CodeBusUnavailable)
	}
	// A 200 without a quorum can only carry a response recorded before: classify checks every
	// answer against the record.
	s.checkRuns(t, "cluster: two of three nodes stopped, one restarted", runs, attempts)
}

// TestClusterDeployment: deploy/nats-cluster/*.conf describe three JetStream nodes routed to
// each other, and docker-compose.cluster.yml runs them with every Hermes service pointed at all
// three, with three replicas and flags its binary accepts.
func TestClusterDeployment(t *testing.T) {
	nodes := []string{"nats-1", "nats-2", "nats-3"}
	var routes []string
	for _, n := range nodes {
		routes = append(routes, n+":6222")
	}
	dir := madeAuth(t)
	for _, n := range nodes {
		opts := deployConf(t, "../../deploy/nats-cluster/"+n+".conf", dir)
		var got []string
		for _, u := range opts.Routes {
			got = append(got, u.Host)
		}
		if opts.ServerName != n || !opts.JetStream || opts.StoreDir != filepath.Join(dir, "data") || opts.Port != 4222 ||
			opts.Cluster.Name != "hermes" || opts.Cluster.Port != 6222 || !slices.Equal(got, routes) ||
			opts.MaxPayload != bus.MaxPayload {
			t.Errorf("%s.conf: name %q, jetstream %v in %q, port %d, cluster %q on %d, routes %v, max_payload %d",
				n, opts.ServerName, opts.JetStream, opts.StoreDir, opts.Port, opts.Cluster.Name, opts.Cluster.Port, got, opts.MaxPayload)
		}
	}

	data, err := os.ReadFile("../../docker-compose.cluster.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Command     []string          `yaml:"command"`
			Environment map[string]string `yaml:"environment"`
			Volumes     []string          `yaml:"volumes"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &compose); err != nil {
		t.Fatal(err)
	}
	var urls []string
	for _, n := range nodes {
		svc, ok := compose.Services[n]
		if !ok || !slices.Contains(svc.Volumes, "./deploy/nats-cluster/"+n+".conf:/etc/nats/nats.conf:ro") {
			t.Errorf("service %s does not run deploy/nats-cluster/%s.conf: %+v", n, n, svc)
		}
		urls = append(urls, "tls://"+n+":4222")
	}
	for _, name := range []string{"router", "toolworker", "gateway", "eraser", "audit"} {
		svc := compose.Services[name]
		if got := svc.Environment[bus.EnvURL]; got != strings.Join(urls, ",") {
			t.Errorf("%s: %s=%q, want every node", name, bus.EnvURL, got)
		}
		if i := slices.Index(svc.Command, "--replicas"); i < 0 || i+1 >= len(svc.Command) || svc.Command[i+1] != "3" {
			t.Errorf("%s: command %q has no --replicas 3", name, svc.Command)
		}
		cmd, ok := app.Commands[svc.Command[0]]
		if !ok {
			t.Fatalf("%s: no binary %q", name, svc.Command[0])
		}
		var out bytes.Buffer
		if code := app.Exec(cmd, append(svc.Command[1:], "-h"), app.Env{Stdout: &out, Stderr: &out}); code != 0 {
			t.Errorf("%s: %q is refused (exit %d):\n%s", name, svc.Command, code, out.String())
		}
	}
}

// Every command docker-compose.yml runs is one the binaries take (flags included).
func TestComposeCommandsParse(t *testing.T) {
	data, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Command []string `yaml:"command"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &compose); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"provision", "demo-tools", "router", "toolworker", "gateway", "eraser", "audit"} {
		cmd := compose.Services[name].Command
		if len(cmd) > 0 && cmd[0] == "hermes" {
			cmd = cmd[1:]
		}
		if len(cmd) == 0 {
			t.Errorf("%s: no command", name)
			continue
		}
		run, ok := app.Commands[cmd[0]]
		if !ok {
			t.Errorf("%s: no command %q", name, cmd[0])
			continue
		}
		var out bytes.Buffer
		if code := app.Exec(run, append(cmd[1:], "-h"), app.Env{Stdout: &out, Stderr: &out}); code != 0 {
			t.Errorf("%s: %q is refused (exit %d):\n%s", name, cmd, code, out.String())
		}
	}
}
