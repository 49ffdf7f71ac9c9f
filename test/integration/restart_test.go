package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// natsProcess is `hermes nats` run as a child process on a fixed port and store directory, so
// that it can be SIGKILLed and started again where it was.
type natsProcess struct {
	t      *testing.T
	addr   string // host:port, the same across restarts
	dir    string // the JetStream store, the same across restarts
	sync   string // the store's sync policy: interval or always
	starts int
	proc   *child
}

// startNATS starts `hermes nats --sync <policy>` on a free loopback port with its store in a test
// temp dir.
func startNATS(t *testing.T, policy string) *natsProcess {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	n := &natsProcess{t: t, addr: addr, dir: t.TempDir(), sync: policy}
	n.start()
	return n
}

// URL is the server's client URL.
func (n *natsProcess) URL() string { return "nats://" + n.addr }

// start runs `hermes nats --listen <addr> --data <dir> --sync <policy>` and waits until it
// accepts clients.
func (n *natsProcess) start() {
	n.t.Helper()
	n.starts++
	name := fmt.Sprintf("nats-%d", n.starts)
	args := []string{"--listen", n.addr, "--data", n.dir, "--sync", n.sync}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "HERMES_IT_CHILD=nats", "HERMES_IT_ARGS="+strings.Join(args, "\x1f"))
	c := &child{t: n.t, name: name, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(c.done) }()
	n.t.Cleanup(func() {
		c.kill()
		if n.t.Failed() {
			n.t.Logf("output of %s:\n%s", name, c.out.String())
		}
	})
	n.proc = c
	waitFor(n.t, name+" to accept clients", func() bool {
		select {
		case <-c.done:
			n.t.Fatalf("%s exited: %s", name, c.out.String())
		default:
		}
		return strings.Contains(c.out.String(), "listening on")
	})
}

// kill SIGKILLs the server: nothing flushed, no deferred cleanup.
func (n *natsProcess) kill() { n.proc.kill() }

// consumerState is when a durable consumer was created and how far it had acked.
type consumerState struct {
	created time.Time
	acked   uint64 // ack floor, stream sequence
}

// consumers returns the state of every consumer of the record stream.
func (s *system) consumers() map[string]consumerState {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := s.js.Stream(ctx, protocol.StreamName)
	if err != nil {
		s.t.Fatal(err)
	}
	out := map[string]consumerState{}
	list := stream.ListConsumers(ctx)
	for info := range list.Info() {
		out[info.Name] = consumerState{created: info.Created, acked: info.AckFloor.Stream}
	}
	if err := list.Err(); err != nil {
		s.t.Fatal(err)
	}
	return out
}

// TestNATSRestartedUnderLoad: the NATS server, a separate process, is SIGKILLed while several
// clients drive requests through an in-process gateway, routers and tool workers, and is started
// again on the same port and store after a pause, under each sync policy. Every service
// reconnects by itself; clients retry with the same request_id on errors, 503s and timeouts.
// Every request is answered, none twice; every call has exactly one recorded result; the durable
// consumers resume where they were rather than start over or skip what was pending.
func TestNATSRestartedUnderLoad(t *testing.T) {
	long(t, "NATS restarted under load")
	for _, policy := range []string{"interval", "always"} {
		t.Run("sync="+policy, func(t *testing.T) { natsRestartedUnderLoad(t, policy, false) })
	}
	// Read-only calls, on the fast lane: what it answered is on the record once, as the
	// durable path's answers are.
	t.Run("fast lane", func(t *testing.T) { natsRestartedUnderLoad(t, "interval", true) })
}

func natsRestartedUnderLoad(t *testing.T, policy string, fast bool) {
	nats := startNATS(t, policy)
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s := start(t, options{natsURL: nats.URL(), routers: 2, workers: 2, logger: logger,
		bus: bus.Config{AckWait: 2 * time.Second}})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("service logs:\n%s", logs.String())
		}
	})

	const clients, perClient = 8, 30
	const n = clients * perClient
	reqs := make([][]map[string]any, clients)
	for c := range reqs {
		for i := range perClient {
			id := fmt.Sprintf("nr_%d_%02d", c, i)
			a, b := "echo", "record"
			if fast {
				a, b = "read_echo", "read_record"
			}
			reqs[c] = append(reqs[c], request(id, "",
				call("a", a, map[string]any{"delay_ms": 40, "i": i}),
				call("b", b, map[string]any{"delay_ms": 20, "c": c, "i": i})))
		}
	}
	// Each client sends its requests one after another, each until answered.
	var answered atomic.Int64
	runs := make([]clientRun, n)
	deadline := time.Now().Add(45 * time.Second)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, req := range reqs[c] {
				runs[c*perClient+i] = s.persistentClient(req, time.Second, deadline)
				answered.Add(1)
			}
		}()
	}

	waitFor(t, "a third of the requests to be answered", func() bool { return answered.Load() >= n/3 })
	before := s.consumers()
	nats.kill()
	killedAt := answered.Load()
	time.Sleep(time.Second) // the outage: pacing the fault, not synchronisation
	nats.start()
	restartedAt := answered.Load()
	after := s.consumers() // as the restarted server found them, give or take the first acks
	wg.Wait()

	counts := s.classify(runs)
	report(t, "nats server (sync "+policy+") killed and restarted under load", n, counts)
	t.Logf("answered before the kill: %d, during the outage: %d, after the restart: %d",
		killedAt, restartedAt-killedAt, int64(n)-restartedAt)
	if fast {
		answeredFast, declined := s.fastCounts()
		t.Logf("the fast lane answered %d requests and declined %d", answeredFast, declined)
		if answeredFast == 0 {
			t.Errorf("the fast lane answered no request")
		}
	}
	if counts[outcomeOK]+counts[outcomeResolved] != n {
		t.Fatalf("not every request was answered exactly once: %v", counts)
	}
	if counts[outcomeResolved] == 0 {
		t.Errorf("no client saw an error: the kill did not hit requests in flight")
	}
	if restartedAt >= n {
		t.Errorf("every request was answered before the restart: nothing ran after it")
	}

	// Exactly one result per call and one response per request in the record.
	results, responses := map[string]int{}, map[string]int{}
	for _, m := range s.record() {
		switch m.Type {
		case protocol.TypeToolResult:
			results[m.RequestID]++
		case protocol.TypeResponse:
			responses[m.RequestID]++
		}
	}
	rerun := 0
	for _, list := range reqs {
		for _, req := range list {
			id := req["request_id"].(string)
			if results[id] != 2 || responses[id] != 1 {
				t.Errorf("%s: %d results and %d responses recorded, want 2 and 1", id, results[id], responses[id])
			}
			if len(s.recorder.tries(id+"/b")) > 1 {
				rerun++
			}
		}
	}

	// The durable consumers are the same ones (not re-created) and resume from their stored ack
	// floor, not from the start of the stream. The floor is a little behind: the server writes
	// consumer state shortly after the acks, so the last ones before the kill are delivered
	// again (and not run twice). Nothing pending was skipped: no request is lost above.
	names := slices.Sorted(maps.Keys(before))
	for _, name := range names {
		b := before[name]
		a, ok := after[name]
		switch {
		case !ok:
			t.Errorf("consumer %s is gone after the restart", name)
		case !a.created.Equal(b.created):
			t.Errorf("consumer %s was re-created after the restart (created %v, was %v)", name, a.created, b.created)
		case b.acked > 0 && a.acked == 0:
			t.Errorf("consumer %s starts over after the restart: ack floor 0, was %d", name, b.acked)
		}
		if b.acked > 0 {
			t.Logf("consumer %s: ack floor %d before the kill, %d after the restart", name, b.acked, a.acked)
		}
	}
	seen := map[string]int{} // what clients saw before their answer
	for _, run := range runs {
		for _, f := range run.failures {
			if !strings.HasPrefix(f, "HTTP ") {
				f = "client timeout or connection error"
			}
			seen[f]++
		}
	}
	log := logs.String()
	t.Logf("clients saw: %v; tool calls run again: %d", seen, rerun)
	t.Logf("services logged: %d disconnects, %d reconnects; "+
		"%d requests and %d calls delivered again after the restart and not run twice",
		strings.Count(log, "nats disconnected"), strings.Count(log, "nats reconnected"),
		strings.Count(log, "request seen before"), strings.Count(log, "call already has a result"))
}

// TestGatewayAnswersWhileNATSRestarts: while its NATS server is gone, the gateway answers a new
// request at once with a 503 that names the problem, having accepted nothing; a request
// published before gets 504 when its wait runs out, never a success it cannot vouch for. Once
// the server is back, both run, once each.
func TestGatewayAnswersWhileNATSRestarts(t *testing.T) {
	long(t, "NATS restart")
	nats := startNATS(t, "interval")
	s := start(t, options{natsURL: nats.URL(), workers: 1, bus: bus.Config{AckWait: 2 * time.Second}})
	s.route(request("down_before", "", call("a", "echo", map[string]any{})))
	inFlightReq := request("down_in_flight", "", call("a", "record", map[string]any{"delay_ms": 300}))
	inFlight := s.postAsync(inFlightReq, "?timeout=1s")
	waitFor(t, "the call to start", func() bool { return len(s.recorder.tries("down_in_flight/a")) == 1 })
	nats.kill()
	waitFor(t, "the gateway to report itself not ready", func() bool {
		resp, err := http.Get(s.base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})

	during := request("down_during", "", call("a", "echo", map[string]any{}))
	status, hdr, body := s.post(during, "?timeout=1s")
	var e apiError
	_ = json.Unmarshal(body, &e)
	if status != http.StatusServiceUnavailable || e.Error.Code != protocol.CodeBusUnavailable ||
		!strings.Contains(e.Error.Message, "not connected to NATS") || hdr.Get("Retry-After") == "" {
		t.Errorf("POST while NATS is down: HTTP %d, Retry-After %q: %s", status, hdr.Get("Retry-After"), body)
	}
	resp, err := http.Get(s.base + "/v1/requests/down_before")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("GET /v1/requests while NATS is down: HTTP %d", resp.StatusCode)
	}
	a := <-inFlight
	_ = json.Unmarshal(a.body, &e)
	if a.status != http.StatusGatewayTimeout || e.Error.Code != protocol.CodeTimeout {
		t.Errorf("request in flight when NATS went down: HTTP %d: %s", a.status, a.body)
	}

	nats.start()
	s.waitReady()
	// The 503 accepted nothing: no plan appears once the connection is back.
	_, b := s.connect()
	if _, err := b.Plan(context.Background(), "down_during"); !errors.Is(err, bus.ErrNotFound) {
		t.Errorf("the request refused with 503 left a plan (err %v)", err)
	}
	for _, req := range []map[string]any{during, inFlightReq} {
		runs := []clientRun{s.persistentClient(req, 5*time.Second, time.Now().Add(30*time.Second))}
		if counts := s.classify(runs); counts[outcomeOK] != 1 {
			t.Errorf("%s after the restart: %v", req["request_id"], counts)
		}
	}
}

// apiError is the gateway's JSON error body.
type apiError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}
