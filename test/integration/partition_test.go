package integration

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// netlab is a small network of Linux network namespaces, each joined to a bridge in the test's
// own namespace by a veth pair: processes started in them reach each other, and the test's
// process, only over those links, so a link can really be cut (set down) or one destination
// made unreachable from one namespace (a blackhole route) and healed again.
type netlab struct {
	t      *testing.T
	id     string // prefix of every name the lab makes
	bridge string
	subnet string // first three octets
	hostIP string // the bridge's address, where the test's own servers listen
	next   int
	veth   map[string]string // namespace → its link's end on the bridge
	ips    map[string]string // namespace → its address
}

// newNetlab makes the lab's bridge, or skips the test where namespaces cannot be made (not
// root, no iproute2, not Linux).
func newNetlab(t *testing.T) *netlab {
	t.Helper()
	if runtime.GOOS != "linux" || os.Geteuid() != 0 {
		t.Skip("network partitions need Linux network namespaces and root to make them; skipped (run as root to cut real links)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("network partitions need iproute2's ip command; skipped")
	}
	pid := os.Getpid()
	l := &netlab{t: t, id: fmt.Sprintf("hp%d", pid%100000), subnet: fmt.Sprintf("10.213.%d", pid%250+1),
		veth: map[string]string{}, ips: map[string]string{}}
	l.bridge, l.hostIP = l.id+"br", l.subnet+".1"
	if out, err := exec.Command("ip", "link", "add", l.bridge, "type", "bridge").CombinedOutput(); err != nil {
		t.Skipf("network partitions need to make a bridge (%v: %s); skipped", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() {
		for ns := range l.veth {
			_ = exec.Command("ip", "netns", "del", ns).Run()
		}
		_ = exec.Command("ip", "link", "del", l.bridge).Run()
	})
	l.ip("addr", "add", l.hostIP+"/24", "dev", l.bridge)
	l.ip("link", "set", l.bridge, "up")
	return l
}

// ip runs ip with args, failing the test on an error.
func (l *netlab) ip(args ...string) {
	l.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// add makes a namespace joined to the bridge and returns its name and address.
func (l *netlab) add(name string) (string, string) {
	l.t.Helper()
	l.next++
	ns, host, peer := l.id+"-"+name, fmt.Sprintf("%s%dh", l.id, l.next), fmt.Sprintf("%s%dn", l.id, l.next)
	addr := fmt.Sprintf("%s.%d", l.subnet, 10+l.next)
	l.ip("netns", "add", ns)
	l.veth[ns], l.ips[ns] = host, addr
	l.ip("link", "add", host, "type", "veth", "peer", "name", peer)
	l.ip("link", "set", peer, "netns", ns)
	l.ip("link", "set", host, "master", l.bridge)
	l.ip("link", "set", host, "up")
	l.ip("netns", "exec", ns, "ip", "addr", "add", addr+"/24", "dev", peer)
	l.ip("netns", "exec", ns, "ip", "link", "set", peer, "up")
	l.ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
	return ns, addr
}

// cut sets ns's link down (nothing in or out), or up again.
func (l *netlab) cut(ns string, down bool) {
	state := "up"
	if down {
		state = "down"
	}
	l.ip("link", "set", l.veth[ns], state)
}

// block makes addrs unreachable from ns (blackhole routes), or reachable again.
func (l *netlab) block(ns string, on bool, addrs ...string) {
	verb := "add"
	if !on {
		verb = "del"
	}
	for _, a := range addrs {
		l.ip("netns", "exec", ns, "ip", "route", verb, "blackhole", a+"/32")
	}
}

// spawnIn starts `hermes <command> args...` as a child process in namespace ns.
func (s *system) spawnIn(ns, command, name string, args ...string) *child {
	s.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0])
	cmd.Env = append(os.Environ(), "HERMES_IT_CHILD="+command, "HERMES_IT_ARGS="+strings.Join(args, "\x1f"))
	c := &child{t: s.t, name: name, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(c.done) }()
	s.t.Cleanup(func() {
		c.kill()
		if s.t.Failed() {
			s.t.Logf("output of %s:\n%s", name, c.out.String())
		}
	})
	return c
}

// fencedChanger is a tool (POST /change {"key", "hold_ms"}) that keeps, per key, the highest
// fencing token it has seen and refuses lower ones at the start and at the commit, as a tool
// that changes state under Hermes must; it records what it committed and any overlap.
type fencedChanger struct {
	mu        sync.Mutex
	highest   map[string]uint64
	inFlight  map[string]int
	overlaps  int
	stale     int
	committed map[string][]commit // key → commits in order
	addr      string
}

type commit struct {
	fence uint64
	tx    string
	idem  string
}

func newFencedChanger(t *testing.T, host string) *fencedChanger {
	c := &fencedChanger{highest: map[string]uint64{}, inFlight: map[string]int{}, committed: map[string][]commit{}}
	ln, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(c)
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	c.addr = ln.Addr().String()
	return c
}

func (c *fencedChanger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var args struct {
		Key    string `json:"key"`
		HoldMS int    `json:"hold_ms"`
	}
	_ = json.NewDecoder(r.Body).Decode(&args)
	var fence uint64
	_, _ = fmt.Sscan(r.Header.Get(protocol.HeaderFence), &fence)
	refuse := func() {
		c.stale++
		w.WriteHeader(http.StatusConflict)
		_, _ = fmt.Fprint(w, `{"error_code":"STALE_FENCE","message":"a newer turn changed this key"}`)
	}
	c.mu.Lock()
	if fence < c.highest[args.Key] {
		refuse()
		c.mu.Unlock()
		return
	}
	c.highest[args.Key] = fence
	c.inFlight[args.Key]++
	if c.inFlight[args.Key] > 1 {
		c.overlaps++
	}
	c.mu.Unlock()
	time.Sleep(time.Duration(args.HoldMS) * time.Millisecond)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inFlight[args.Key]--
	if fence < c.highest[args.Key] {
		refuse()
		return
	}
	c.committed[args.Key] = append(c.committed[args.Key], commit{fence: fence, tx: r.Header.Get(protocol.HeaderTx), idem: r.Header.Get("Idempotency-Key")})
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"key":%q,"fence":%d}`, args.Key, fence)
}

// partitionCut is how long each cut lasts: the short form (CI) cuts for a few seconds; the long
// form (-partition.cut 45s) outlasts the calls' leases and the clients' ping timeouts, so
// turns lapse and pass on while a cut-off call may still reach the tool.
var partitionCut = flag.Duration("partition.cut", 6*time.Second, "how long each network partition of TestPartitionsKeepChangesSerialized lasts")

// TestPartitionsKeepChangesSerialized runs a three-node cluster, two routers and two tool
// workers each in a network namespace of its own, and cuts real links while concurrent
// requests change a few shared keys, calls park for approval and are approved, and blueprint
// runs go: one node isolated, a router cut from the record stream's leader, a worker cut from
// every node mid-call. Afterwards the record and the tool say: no two changes of one key
// overlapped, the fencing tokens of each key rose with every turn, every request was answered
// once; every approved call ran once and the shared rate held; every blueprint run ended with
// each step's call run once.
func TestPartitionsKeepChangesSerialized(t *testing.T) {
	lab := newNetlab(t)
	long(t, "runs a cluster in network namespaces and cuts links")
	const keys = 3
	hold := 150 * time.Millisecond
	var nodes, nodeIPs, routes []string
	for i := range 3 {
		ns, ip := lab.add(fmt.Sprintf("n%d", i+1))
		nodes, nodeIPs = append(nodes, ns), append(nodeIPs, ip)
		routes = append(routes, "nats-route://"+ip+":6222")
	}
	urls := make([]string, len(nodeIPs))
	for i, ip := range nodeIPs {
		urls[i] = "nats://" + ip + ":4222"
	}
	natsURL := strings.Join(urls, ",")
	// The nodes are started as children before the system: start provisions against them.
	boot := &system{t: t}
	for i, ns := range nodes {
		boot.spawnIn(ns, "nats", fmt.Sprintf("nats-%d", i+1), "--name", fmt.Sprintf("n%d", i+1), "--listen", nodeIPs[i]+":4222",
			"--cluster-listen", nodeIPs[i]+":6222", "--routes", strings.Join(routes, ","), "--data", t.TempDir())
	}
	ch := newFencedChanger(t, lab.hostIP)
	routesFile := writeRoutes(t, fmt.Sprintf(`
  - name: change
    match:
      tool_name: change
    action:
      http:
        url: http://%s/change
        method: POST
        timeout_ms: 10000
`, ch.addr))
	waitForWithin(t, "the cluster to serve JetStream", time.Minute, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		nc, err := bus.Connect(ctx, natsURL, "partition-probe", nil)
		if err != nil {
			return false
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return false
		}
		_, err = js.AccountInfo(ctx)
		return err == nil
	})
	s := start(t, options{routesFile: routesFile, routers: -1, workers: 0, natsURL: natsURL, listenHost: lab.hostIP,
		bus: bus.Config{Replicas: 3, AckWait: 2 * time.Second}})
	// The nemesis' loads on approvals and blueprints run beside the changes: approved calls
	// run once, the shared rate holds, every run ends with each step's call run once.
	pl, bl := &policyLoad{s: s}, &blueprintLoad{s: s}
	pl.apply()
	bl.apply()
	k, err := registry.Parse([]byte(changeContract))
	if err != nil {
		t.Fatal(err)
	}
	_, b := s.connect()
	if _, _, err := registry.NewStore(b.Contracts).Register(s.ctx, k, []byte(changeContract), "test"); err != nil {
		t.Fatal(err)
	}
	var routers, workers []string
	var services []*child
	for i := range 2 {
		ns, _ := lab.add(fmt.Sprintf("r%d", i+1))
		routers = append(routers, ns)
		services = append(services, s.spawnIn(ns, "router", fmt.Sprintf("router-%d", i+1), "--nats", natsURL, "--instance", fmt.Sprintf("router-%d", i+1), "--routes", routesFile))
		ns, _ = lab.add(fmt.Sprintf("w%d", i+1))
		workers = append(workers, ns)
		services = append(services, s.spawnIn(ns, "toolworker", fmt.Sprintf("worker-%d", i+1),
			append([]string{"--nats", natsURL, "--instance", fmt.Sprintf("worker-%d", i+1)}, s.workerArgs()...)...))
	}
	// Every service up before any cut: one still setting up when its link is cut gives up.
	for _, c := range services {
		waitForWithin(t, c.name+" running", time.Minute, func() bool {
			out := c.out.String()
			return strings.Contains(out, `"msg":"router running"`) || strings.Contains(out, `"msg":"tool worker running"`)
		})
	}

	l := &load{s: s, client: &http.Client{Timeout: 15 * time.Second}, deadline: time.Now().Add(4*time.Minute + 3**partitionCut), stop: make(chan struct{})}
	for c := range 6 {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for n := 0; ; n++ {
				select {
				case <-l.stop:
					return
				default:
				}
				id := fmt.Sprintf("part_%d_%03d", c, n)
				run := l.request(request(id, "change", call("c1", "change", map[string]any{"key": fmt.Sprintf("k%d", (c+n)%keys), "hold_ms": hold.Milliseconds()})))
				l.mu.Lock()
				l.runs = append(l.runs, run)
				l.mu.Unlock()
			}
		}()
	}
	l.waitAnswered(t, 6, "the load before any cut")
	stopLoads := make(chan struct{})
	policyDone, blueprintDone := pl.start(stopLoads), bl.start(stopLoads)
	type step struct {
		name      string
		cut, heal func()
		cutFor    time.Duration
	}
	leaderIP := func() string {
		ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
		defer cancel()
		st, err := s.js.Stream(ctx, protocol.StreamName)
		if err != nil || st.CachedInfo().Cluster == nil {
			t.Fatalf("the record stream's leader: %v", err)
		}
		leader := st.CachedInfo().Cluster.Leader
		i := slices.Index([]string{"n1", "n2", "n3"}, leader)
		if i < 0 {
			t.Fatalf("leader %q", leader)
		}
		return nodeIPs[i]
	}
	var blocked string
	steps := []step{
		{name: "one node isolated", cutFor: *partitionCut,
			cut: func() { lab.cut(nodes[0], true) }, heal: func() { lab.cut(nodes[0], false) }},
		{name: "a router cut from the stream leader", cutFor: *partitionCut,
			cut:  func() { blocked = leaderIP(); lab.block(routers[0], true, blocked) },
			heal: func() { lab.block(routers[0], false, blocked) }},
		{name: "a worker cut from every node mid-call", cutFor: *partitionCut,
			cut: func() { lab.block(workers[0], true, nodeIPs...) }, heal: func() { lab.block(workers[0], false, nodeIPs...) }},
	}
	var table []string
	for _, st := range steps {
		before := l.answered.Load()
		st.cut()
		time.Sleep(st.cutFor)
		during := l.answered.Load() - before
		st.heal()
		l.waitAnswered(t, 6, "the load after healing: "+st.name)
		table = append(table, fmt.Sprintf("| %s | %s | %d answered during the cut |", st.name, st.cutFor, during))
	}
	close(stopLoads)
	<-policyDone
	<-blueprintDone
	runs, _ := l.finish()
	// Every request answered once, its one call ok.
	counts, fenced := s.classify(runs), 0
	if counts[outcomeOK]+counts[outcomeResolved] != len(runs) {
		t.Fatalf("not every request was answered exactly once: %v", counts)
	}
	for _, r := range runs {
		if len(r.answers) == 0 {
			t.Fatalf("%s never answered: %v", r.id, r.failures)
		}
		res := result(t, decodeResponse(t, r.answers[len(r.answers)-1]), "c1")
		switch {
		case res.Status == protocol.ResultOK && res.Grant != nil:
		case res.ToolErrorCode == "STALE_FENCE" && res.Grant != nil:
			// Its turn passed on before it reached the tool (a cut outlasted its lease):
			// the tool's fencing refused it, and the caller is told.
			fenced++
		default:
			t.Fatalf("%s: %+v (%s)", r.id, res, res.Content)
		}
	}
	// The tool: no overlap; per key, fences never fall, an equal fence only for the same turn
	// (a retry of one call), and each call committed once or retried under the same turn.
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.overlaps != 0 {
		t.Fatalf("%d changes overlapped at the tool", ch.overlaps)
	}
	commits := 0
	for key, cs := range ch.committed {
		commits += len(cs)
		for i := 1; i < len(cs); i++ {
			if cs[i].fence < cs[i-1].fence || cs[i].fence == cs[i-1].fence && cs[i].idem != cs[i-1].idem {
				t.Fatalf("%s: commit %d (fence %d, %s) after fence %d (%s)", key, i, cs[i].fence, cs[i].idem, cs[i-1].fence, cs[i-1].idem)
			}
		}
	}
	// The record: each resource's grants in the order recorded carry rising fences.
	last := map[string]uint64{}
	grants := 0
	for _, e := range s.coordinationEvents() {
		if e.Op != protocol.CoordGranted {
			continue
		}
		grants++
		if e.Fence <= last[e.Resource] {
			t.Fatalf("%s: grant of fence %d recorded after fence %d", e.Resource, e.Fence, last[e.Resource])
		}
		last[e.Resource] = e.Fence
	}
	pl.check()
	bl.check()
	t.Logf("partitions, %d requests on %d keys (hold %s): overlaps 0, stale fences refused %d (%d requests answered so), commits %d, grants on the record %d\n| cut | for | load |\n|---|---|---|\n%s",
		len(runs), keys, hold, ch.stale, fenced, commits, grants, strings.Join(table, "\n"))
}

// writeRoutes writes testdata/routes.yaml with extra rules appended, and returns its path.
func writeRoutes(t *testing.T, extra string) string {
	t.Helper()
	base, err := os.ReadFile("testdata/routes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := t.TempDir() + "/routes.yaml"
	if err := os.WriteFile(p, append(base, extra...), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
