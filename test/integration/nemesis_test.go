package integration

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

var (
	soak        = flag.Duration("soak", 0, "run TestNemesis this long with a fault every few seconds (default: a short run for CI)")
	nemesisSeed = flag.Uint64("seed", 0, "seed of TestNemesis's fault schedule (default: from the clock; the test logs it)")
)

// TestNemesis is the fault-injection suite: clients send uniquely identified requests in
// several sessions (many in flight per session; two sessions serial) while a seeded nemesis injects one fault at a
// time — a tool worker or a router SIGKILLed, the NATS server SIGKILLed and restarted, a
// recorded message published again under a new id, a poisoned message — and heals it. Then
// everything drains and every request is classified (ok / lost / duplicated /
// indeterminate-then-resolved), each must have exactly one response, and every session's
// requests must have been dispatched in the order they were accepted.
//
//	go test ./test/integration -run TestNemesis -soak 10m -seed 42
func TestNemesis(t *testing.T) {
	long(t, "nemesis")
	server := startNATS(t, "interval")
	// Partitions other than the default: the routers it spawns read the record's number.
	s := start(t, options{natsURL: server.URL(), routers: -1, workers: 0, bus: bus.Config{AckWait: 2 * time.Second, Partitions: 7}})
	runNemesis(t, s, &nemesis{nats: server})
}

// TestNemesisCluster is TestNemesis on a 3-node cluster with 3 replicas, where the server fault
// is a node stopped (a record stream's leader, the meta leader or another) and restarted. The
// record is kept in 3 streams, whose leaders spread over the nodes.
func TestNemesisCluster(t *testing.T) {
	long(t, "nemesis on a cluster")
	c := bustest.NewCluster(t)
	s := start(t, options{natsURL: c.URL(), routers: -1, workers: 0,
		bus: bus.Config{Replicas: bustest.ClusterSize, AckWait: 2 * time.Second, Partitions: 6, Streams: 3}})
	runNemesis(t, s, &nemesis{cluster: c})
}

func runNemesis(t *testing.T, s *system, n *nemesis) {
	seed := *nemesisSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("nemesis seed %d (rerun: go test ./test/integration -run TestNemesis -seed %d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x4e454d45))
	run, every := 12*time.Second, 2*time.Second
	if *soak > 0 {
		run, every = *soak, 4*time.Second
	}

	s.poisoned = "nem_poison"
	n.t, n.s, n.rng, n.counts = t, s, rng, map[string]int{}
	pl := &policyLoad{s: s}
	pl.apply()
	bl := &blueprintLoad{s: s}
	bl.apply()
	n.routers = []*child{n.spawnRouter(), n.spawnRouter()}
	n.workers = []*child{n.spawnWorker(), n.spawnWorker()}
	waitFor(t, "the routers and workers to start", func() bool {
		for _, c := range append(append([]*child{}, n.routers...), n.workers...) {
			if !strings.Contains(c.out.String(), "running") {
				return false
			}
		}
		return true
	})

	const sessions = 6
	stop := make(chan struct{})
	policyDone := pl.start(stop)
	blueprintDone := bl.start(stop)
	results := make([][]clientRun, sessions)
	var wg sync.WaitGroup
	for i := range sessions {
		// The first two sessions are serial: each request waits for the previous one's response.
		wg.Go(func() { results[i] = s.sessionClient(fmt.Sprintf("nem_s%d", i), i < 2, stop, rng.Uint64()) })
	}
	end := time.Now().Add(run)
	for time.Now().Before(end) {
		time.Sleep(every) // pacing the faults, not synchronisation
		n.inject()
	}
	close(stop)
	stopped := time.Now()
	wg.Wait()
	<-policyDone
	<-blueprintDone
	t.Logf("the clients collected their answers %v after the load stopped", time.Since(stopped).Round(time.Second))

	var runs []clientRun
	for _, r := range results {
		runs = append(runs, r...)
	}
	counts := s.classify(runs) // drains first
	report(t, "nemesis", len(runs), counts)
	t.Logf("faults injected: %v", n.counts)
	if counts[outcomeOK]+counts[outcomeResolved] != len(runs) {
		t.Fatalf("not every request was answered exactly once: %v", counts)
	}
	tls := s.timelines()
	for i := range sessions {
		checkSessionOrder(t, fmt.Sprintf("nem_s%d", i), tls)
	}
	pl.check()
	bl.check()
	if got := len(s.deadLetters()); got < n.counts["poison"] {
		t.Errorf("%d poisoned messages but %d dead letters", n.counts["poison"], got)
	}
}

// nemesis injects one fault at a time into a system whose routers, workers and NATS server are
// child processes, and heals it before returning.
type nemesis struct {
	t                *testing.T
	s                *system
	nats             *natsProcess     // the server, a child process; or
	cluster          *bustest.Cluster // a cluster of in-process nodes
	rng              *rand.Rand
	routers, workers []*child
	spawned          int
	counts           map[string]int
}

func (n *nemesis) spawnRouter() *child {
	n.spawned++
	return n.s.spawn("router", fmt.Sprintf("nem-router-%d", n.spawned), "--routes", "testdata/routes.yaml")
}

func (n *nemesis) spawnWorker() *child {
	n.spawned++
	return n.s.spawn("toolworker", fmt.Sprintf("nem-worker-%d", n.spawned), n.s.workerArgs()...)
}

func (n *nemesis) inject() {
	server := "kill-server"
	if n.cluster != nil {
		server = "stop-node"
	}
	faults := []string{"kill-worker", "kill-router", server, "duplicate", "poison", "give-up-result"}
	f := faults[n.rng.IntN(len(faults))]
	n.counts[f]++
	switch f {
	case "kill-worker":
		i := n.rng.IntN(len(n.workers))
		n.workers[i].kill()
		n.workers[i] = n.spawnWorker()
	case "kill-router":
		i := n.rng.IntN(len(n.routers))
		n.routers[i].kill()
		n.routers[i] = n.spawnRouter()
	case "stop-node": // one node of three (perhaps a leader): stopped, then back
		running := n.cluster.Running()
		node := running[n.rng.IntN(len(running))]
		n.cluster.Stop(node)
		time.Sleep(time.Second) // the outage
		n.cluster.Restart(node)
		n.cluster.WaitHealthy()
	case "kill-server":
		n.nats.kill()
		time.Sleep(time.Second) // the outage
		n.nats.start()
	case "duplicate":
		n.duplicate()
	case "give-up-result":
		if !n.giveUpResult() {
			n.counts[f]--
		}
	case "poison":
		l := n.s.admin.Layout()
		subjects := []string{l.SubjectRequest("nem_poison"), l.SubjectToolCall(protocol.ActionHTTP, "echo", "nem_poison"), l.SubjectRedrivenResult("nem_poison")}
		garbage := [][]byte{[]byte("not msgpack"), {0xdd, 0xff, 0xff, 0xff, 0xff}, {}, {0x91, 0x91, 0x91}}
		msg := &nats.Msg{Subject: subjects[n.rng.IntN(len(subjects))], Data: garbage[n.rng.IntN(len(garbage))]}
		if _, err := n.s.js.PublishMsg(n.s.ctx, msg); err != nil {
			n.counts["poison"]--
			n.t.Logf("poison publish: %v (the server may be restarting)", err)
		}
	}
}

// giveUpResult takes results from the routers' consumer and terminates them — as the server
// gives up a result the routers failed to aggregate on every delivery — until it has done so to
// two (a request's given-up result, and perhaps its copy or its sibling: given up twice). It
// hands back anything else at once. It reports whether it gave any up.
func (n *nemesis) giveUpResult() bool {
	stream := protocol.RecordStream(n.rng.IntN(n.s.admin.Layout().Streams()))
	cons, err := n.s.js.Consumer(n.s.ctx, stream, bus.ConsumerRouterResults)
	if err != nil {
		n.t.Logf("give-up-result: %v (the server may be restarting)", err)
		return false
	}
	given := 0
	deadline := time.Now().Add(3 * time.Second)
	for given < 2 && time.Now().Before(deadline) {
		batch, err := cons.Fetch(4, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			continue
		}
		for msg := range batch.Messages() {
			m, err := protocol.Unmarshal(msg.Data())
			if err == nil && m.Type == protocol.TypeToolResult && strings.HasPrefix(m.SessionID, "nem_s") && given < 2 {
				if msg.Term() == nil {
					given++
				}
				continue
			}
			_ = msg.Nak()
		}
	}
	return given > 0
}

// duplicate publishes a recorded request, tool call or result again under a new message id, as
// a redelivery after a late ack or a client's retry past the duplicate window would.
func (n *nemesis) duplicate() {
	var picks []int
	stored := n.s.stored()
	for i, raw := range stored {
		if m, err := protocol.Unmarshal(raw.Data); err == nil && strings.HasPrefix(m.SessionID, "nem_s") &&
			(m.Type == protocol.TypeRequest || m.Type == protocol.TypeToolCall || m.Type == protocol.TypeToolResult) {
			picks = append(picks, i)
		}
	}
	if len(picks) == 0 {
		return
	}
	raw := stored[picks[n.rng.IntN(len(picks))]]
	m, _ := protocol.Unmarshal(raw.Data)
	subject := raw.Subject
	if m.Type == protocol.TypeRequest {
		subject = protocol.SubjectRequest(m.SessionID) // the stored subject carries the partition
	}
	if m.Type == protocol.TypeToolResult {
		// A result's own subject is written once; a copy goes where a re-drive puts one.
		subject = protocol.SubjectRedrivenResult(m.SessionID)
	}
	m.MsgID += fmt.Sprintf(":nemesis-%d", n.counts["duplicate"])
	pub := n.s.admin.NewPublisher(m.Sender) // to the stream that keeps the session
	if _, err := pub.Publish(n.s.ctx, subject, m); err != nil {
		n.t.Logf("duplicate publish: %v (the server may be restarting)", err)
	}
}

// sessionClient sends requests of session one after another, each as soon as the previous was
// accepted (so several are in flight), until stop; then it collects every answer. Each request
// is posted with the same request_id until accepted, and polled until answered.
func (s *system) sessionClient(session string, serial bool, stop <-chan struct{}, seed uint64) []clientRun {
	rng := rand.New(rand.NewPCG(seed, 1))
	client := &http.Client{Timeout: 10 * time.Second}
	var runs []clientRun
	for k := 0; ; k++ {
		select {
		case <-stop:
			return s.collect(session, client, runs)
		default:
		}
		id := fmt.Sprintf("%s_%03d", session, k)
		req := request(id, "", call("a", "echo", map[string]any{"delay_ms": rng.IntN(30), "k": k}),
			call("b", "record", map[string]any{"delay_ms": rng.IntN(20), "k": k}))
		req["session_id"] = session
		if serial {
			req["serial"] = true
		}
		data, _ := json.Marshal(req)
		run := clientRun{id: id}
		for {
			run.posts++
			resp, err := client.Post(s.base+"/v1/route?timeout=20ms", "application/json", bytes.NewReader(data))
			if err != nil {
				run.failures = append(run.failures, err.Error())
				time.Sleep(100 * time.Millisecond)
				continue
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				run.answers = append(run.answers, body)
				break
			}
			if resp.StatusCode == http.StatusGatewayTimeout {
				break // accepted; answered later
			}
			run.failures = append(run.failures, fmt.Sprintf("HTTP %d", resp.StatusCode))
			time.Sleep(100 * time.Millisecond)
		}
		runs = append(runs, run)
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
	}
}

// collect polls GET /v1/requests/{id} until every accepted request is answered, or until a
// minute passes without an answer: a serial session's client sends faster than its requests
// can run one after another, so the longer the run, the longer its backlog takes to drain —
// slow is not lost, but no progress for a minute is. Giving up, it still asks once for each
// request left, so that only the unanswered count as lost.
func (s *system) collect(session string, client *http.Client, runs []clientRun) []clientRun {
	waiting := 0
	for i := range runs {
		if len(runs[i].answers) == 0 {
			waiting++
		}
	}
	started := time.Now()
	deadline := started.Add(time.Minute)
	for i := range runs {
		for len(runs[i].answers) == 0 {
			if s.answer(client, &runs[i]) {
				deadline = time.Now().Add(time.Minute)
			} else if time.Now().After(deadline) {
				break
			} else {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	s.t.Logf("session %s: %d requests, %d not answered within their post's wait, the last collected %v after the load stopped",
		session, len(runs), waiting, time.Since(started).Round(time.Second))
	return runs
}

// answer asks for run's response once and keeps it; it reports whether it got one.
func (s *system) answer(client *http.Client, run *clientRun) bool {
	resp, err := client.Get(s.base + "/v1/requests/" + run.id)
	if err != nil {
		return false
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	run.answers = append(run.answers, body)
	return true
}

// checkSessionOrder fails the test unless session's requests were dispatched in the order the
// stream first accepted them, each answered once.
func checkSessionOrder(t *testing.T, session string, tls map[string]*sessionTimeline) {
	t.Helper()
	tl := tls[session]
	if tl == nil {
		t.Fatalf("session %s: nothing recorded", session)
	}
	seen := map[string]bool{}
	var order []string
	for _, id := range tl.accepted {
		if !seen[id] {
			seen[id] = true
			order = append(order, id)
		}
	}
	dispatched := append([]string(nil), order...)
	sort.SliceStable(dispatched, func(i, j int) bool { return tl.dispatched[dispatched[i]] < tl.dispatched[dispatched[j]] })
	for i := range order {
		if order[i] != dispatched[i] {
			t.Fatalf("session %s: accepted order %v, dispatched %v", session, order[max(0, i-2):min(len(order), i+3)], dispatched[max(0, i-2):min(len(order), i+3)])
		}
		if tl.responses[order[i]] != 1 {
			t.Fatalf("session %s: %s has %d responses", session, order[i], tl.responses[order[i]])
		}
	}
}
