package bustest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/pkg/bus"
)

// ClusterSize is the number of nodes of a Cluster.
const ClusterSize = 3

// clusterWait bounds every wait of a Cluster for leaders, peers and health.
const clusterWait = 30 * time.Second

// account is the account every client without credentials uses.
const account = server.DEFAULT_GLOBAL_ACCOUNT

// Cluster is a JetStream cluster of ClusterSize nodes in this process. Every node listens on
// loopback for clients and for routes, on ports fixed at creation, and keeps its file store in
// a test temp dir; a stopped node restarts with the same store and ports, as an operator would
// restart a server. Everything is shut down by t.Cleanup.
//
// Stop is the server's Shutdown: it steps the node's raft leaders down and flushes its store
// first. It is a clean stop, not a crash.
//
// The methods that wait (NewCluster, Wait*, Restart) fail the test with t.Fatal and must be
// called from the test's goroutine; the others are safe for concurrent use.
type Cluster struct {
	t     testing.TB
	name  string
	nodes []*Node
}

// Node is one server of a Cluster. Its methods are safe for concurrent use.
type Node struct {
	// Name is the node's server name, unique in the cluster.
	Name string
	// StoreDir is the node's JetStream store; it outlives Stop.
	StoreDir string
	// ClientPort and ClusterPort are the node's loopback ports for clients and routes.
	ClientPort, ClusterPort int

	cfg bus.ServerConfig
	mu  sync.Mutex
	srv *bus.Server // nil while stopped
}

// NewCluster starts a cluster for t and waits until it has a meta leader and every node is
// current.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	var c *Cluster
	var err error
	// Ports are picked free, then bound by the servers: another process may take one in
	// between, so try again with new ports a few times.
	for range 3 {
		if c, err = startCluster(t); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.stopAll)
	c.WaitReady()
	return c
}

func startCluster(t testing.TB) (*Cluster, error) {
	ports, err := freePorts(2 * ClusterSize)
	if err != nil {
		return nil, err
	}
	c := &Cluster{t: t, name: "hermes-test"}
	routes := make([]string, ClusterSize)
	for i := range ClusterSize {
		routes[i] = "nats-route://127.0.0.1:" + strconv.Itoa(ports[ClusterSize+i])
	}
	for i := range ClusterSize {
		n := &Node{Name: fmt.Sprintf("n%d", i+1), StoreDir: t.TempDir(), ClientPort: ports[i], ClusterPort: ports[ClusterSize+i]}
		n.cfg = bus.ServerConfig{
			Name:     n.Name,
			StoreDir: n.StoreDir,
			Listen:   "127.0.0.1:" + strconv.Itoa(n.ClientPort),
			Cluster: &bus.ClusterConfig{
				Name:   c.name,
				Listen: "127.0.0.1:" + strconv.Itoa(n.ClusterPort),
				Routes: routes,
			},
		}
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		if err := n.start(); err != nil {
			c.stopAll()
			return nil, err
		}
	}
	return c, nil
}

// Nodes returns the nodes, in order n1, n2, n3.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// URLs returns the client URL of every node, running or not.
func (c *Cluster) URLs() []string {
	urls := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		urls[i] = n.URL()
	}
	return urls
}

// URL returns every node's client URL separated by commas, as nats.Connect and
// HERMES_NATS_URL take a server list.
func (c *Cluster) URL() string { return strings.Join(c.URLs(), ",") }

// Connect opens a connection to the cluster that reconnects to whichever node runs, closed by
// t.Cleanup.
func (c *Cluster) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(c.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Provision connects and provisions the Hermes bus with cfg (set cfg.Replicas to ClusterSize
// for replicated streams and buckets).
func (c *Cluster) Provision(t testing.TB, cfg bus.Config) *bus.Bus {
	t.Helper()
	return provision(t, c.Connect(t), cfg)
}

// Running returns the nodes that run now.
func (c *Cluster) Running() []*Node {
	var out []*Node
	for _, n := range c.nodes {
		if n.Running() {
			out = append(out, n)
		}
	}
	return out
}

// MetaLeader returns the node that leads the JetStream meta group (stream and consumer
// placement), or nil while there is none or the leadership is changing hands.
func (c *Cluster) MetaLeader() *Node {
	var leader *Node
	for _, n := range c.nodes {
		if s := n.Server(); s != nil && s.JetStreamIsLeader() {
			if leader != nil {
				return nil // two claim it: an election is under way
			}
			leader = n
		}
	}
	if leader == nil {
		return nil
	}
	// The flag is set asynchronously; JSZ on the leader must agree.
	s := leader.Server()
	if s == nil {
		return nil
	}
	info, err := s.Jsz(nil)
	if err != nil || info.Meta == nil || info.Meta.Leader != leader.Name {
		return nil
	}
	return leader
}

// StreamLeader returns the node that leads stream, or nil while there is none.
func (c *Cluster) StreamLeader(stream string) *Node {
	return c.leaderBy(func(s *bus.Server) bool { return s.JetStreamIsStreamLeader(account, stream) })
}

// ConsumerLeader returns the node that leads the durable consumer of stream, or nil while
// there is none.
func (c *Cluster) ConsumerLeader(stream, consumer string) *Node {
	return c.leaderBy(func(s *bus.Server) bool { return s.JetStreamIsConsumerLeader(account, stream, consumer) })
}

func (c *Cluster) leaderBy(is func(*bus.Server) bool) *Node {
	var leader *Node
	for _, n := range c.nodes {
		if s := n.Server(); s != nil && is(s) {
			if leader != nil {
				return nil
			}
			leader = n
		}
	}
	return leader
}

// WaitReady waits until the meta group has a leader that sees every node as a peer, and every
// running node is current with it.
func (c *Cluster) WaitReady() {
	c.t.Helper()
	c.waitFor("a meta leader with every node as a peer", func() bool {
		l := c.MetaLeader()
		if l == nil {
			return false
		}
		s := l.Server()
		if s == nil || len(s.JetStreamClusterPeers()) != len(c.nodes) {
			return false
		}
		for _, n := range c.Running() {
			if s := n.Server(); s == nil || !s.JetStreamIsCurrent() {
				return false
			}
		}
		return true
	})
}

// WaitHealthy waits until every running node reports itself healthy (JetStream current, every
// stream and consumer it holds caught up), and the meta group, every stream and every consumer
// has a leader. Use it after Restart, before stopping another node or provisioning.
func (c *Cluster) WaitHealthy() {
	c.t.Helper()
	c.waitFor("every running node to be healthy and every stream and consumer to have a leader", func() bool {
		if c.MetaLeader() == nil {
			return false
		}
		for _, n := range c.Running() {
			s := n.Server()
			if s == nil {
				return false
			}
			if h := s.Healthz(nil); h.StatusCode != 200 {
				return false
			}
		}
		for stream, consumers := range c.assets() {
			if c.StreamLeader(stream) == nil {
				return false
			}
			for _, name := range consumers {
				if c.ConsumerLeader(stream, name) == nil {
					return false
				}
			}
		}
		return true
	})
}

// assets lists the streams of the clients' account, each with its durable consumers, as the
// running nodes hold them.
func (c *Cluster) assets() map[string][]string {
	out := map[string][]string{}
	for _, n := range c.Running() {
		s := n.Server()
		if s == nil {
			continue
		}
		info, err := s.Jsz(&server.JSzOptions{Account: account, Streams: true, Consumer: true, Config: true})
		if err != nil {
			continue
		}
		for _, acc := range info.AccountDetails {
			for _, sd := range acc.Streams {
				if _, ok := out[sd.Name]; !ok {
					out[sd.Name] = nil
				}
				for _, ci := range sd.Consumer {
					if ci != nil && ci.Config != nil && ci.Config.Durable != "" && !slices.Contains(out[sd.Name], ci.Name) {
						out[sd.Name] = append(out[sd.Name], ci.Name)
					}
				}
			}
		}
	}
	return out
}

// WaitMetaLeader waits until the meta group has a leader and returns it.
func (c *Cluster) WaitMetaLeader() *Node {
	c.t.Helper()
	var l *Node
	c.waitFor("a meta leader", func() bool { l = c.MetaLeader(); return l != nil })
	return l
}

// WaitStreamLeader waits until stream has a leader and returns it.
func (c *Cluster) WaitStreamLeader(stream string) *Node {
	c.t.Helper()
	var l *Node
	c.waitFor("a leader of stream "+stream, func() bool { l = c.StreamLeader(stream); return l != nil })
	return l
}

// Stop shuts n down and waits until it has stopped; its store and ports are kept for Restart.
// Stopping a stopped node does nothing.
func (c *Cluster) Stop(n *Node) { n.stop() }

// Restart starts n again with the same name, store and ports. Restarting a running node does
// nothing.
func (c *Cluster) Restart(n *Node) {
	c.t.Helper()
	if err := n.start(); err != nil {
		c.t.Fatalf("restart %s: %v", n.Name, err)
	}
}

func (c *Cluster) stopAll() {
	for _, n := range c.nodes {
		n.stop()
	}
}

func (c *Cluster) waitFor(what string, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(clusterWait)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("cluster: timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// URL returns the node's client URL, also while it is stopped.
func (n *Node) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(n.ClientPort) }

// Server returns the running server, or nil while the node is stopped.
func (n *Node) Server() *bus.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv
}

// Running reports whether the node runs.
func (n *Node) Running() bool { return n.Server() != nil }

func (n *Node) String() string { return n.Name }

// start starts the node unless it runs. Start and stop are called from one goroutine (the
// test's); the lock only guards srv for readers.
func (n *Node) start() error {
	if n.Running() {
		return nil
	}
	s, err := bus.StartServer(n.cfg)
	if err != nil {
		return fmt.Errorf("cluster node %s: %w", n.Name, err)
	}
	n.mu.Lock()
	n.srv = s
	n.mu.Unlock()
	return nil
}

func (n *Node) stop() {
	n.mu.Lock()
	s := n.srv
	n.srv = nil
	n.mu.Unlock()
	if s != nil {
		s.Close()
	}
}

// freePorts returns n distinct loopback ports free at the time of the call. On Linux they are
// taken below the kernel's ephemeral range, which it hands out as source ports of outgoing
// connections: a port from that range could be given to some connection while its node is
// stopped, and the node could not restart on it.
func freePorts(n int) ([]int, error) {
	lo, hi := 0, 0 // 0: let the kernel pick
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var elo, ehi int
		if _, err := fmt.Sscan(string(b), &elo, &ehi); err == nil && elo > 12000 {
			lo, hi = 10000, elo-1
		}
	}
	seen := map[int]bool{}
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			return nil, fmt.Errorf("cluster: no %d free loopback ports found", n)
		}
		p := 0
		if hi > 0 {
			p = lo + rand.IntN(hi-lo+1)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		port := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		if !seen[port] {
			seen[port] = true
			ports = append(ports, port)
		}
	}
	return ports, nil
}
