package grpcexec

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"

	"github.com/hermesbus/hermes/pkg/worker/egress"
)

// maxConns is how many connections are kept open: past it, the least recently used one no call
// holds is closed as another is made (so it is passed only while more than that many are in use).
const maxConns = 256

// maxHeaderListBytes bounds the metadata (status message and details included) a server may
// send with an answer.
const maxHeaderListBytes = 1 << 20

// connKey names a connection: where, and how it is secured.
type connKey struct {
	target     string
	tls        bool
	serverName string
}

// conn is one kept connection to a gRPC server.
type conn struct {
	cc *grpc.ClientConn
	// refused is the last dial the destination rules refused, for naming the failure.
	refused atomic.Pointer[error]
	inUse   int    // calls holding it; guarded by conns.mu
	used    uint64 // last use, by conns.clock; guarded by conns.mu
}

// conns keeps one connection per target and security, each reconnecting by itself.
type conns struct {
	dial  func(ctx context.Context, network, addr string) (net.Conn, error)
	roots *x509.CertPool

	mu    sync.Mutex
	clock uint64
	open  map[connKey]*conn
}

// get returns k's connection, made when there is none; release it with put.
func (cs *conns) get(k connKey) (*conn, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.clock++
	if c, ok := cs.open[k]; ok {
		c.inUse++
		c.used = cs.clock
		return c, nil
	}
	if len(cs.open) >= maxConns {
		cs.evictLocked()
	}
	c := &conn{}
	creds := insecure.NewCredentials()
	if k.tls {
		creds = credentials.NewTLS(&tls.Config{ServerName: k.serverName, RootCAs: cs.roots, MinVersion: tls.VersionTLS12})
	}
	// passthrough: the target is dialed as written (through --resolve and the destination
	// rules), and is the :authority the server sees, as an HTTP route's host is its Host.
	cc, err := grpc.NewClient("passthrough:///"+k.target,
		grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			nc, err := cs.dial(ctx, "tcp", addr)
			switch {
			case errors.Is(err, egress.ErrDestinationRefused):
				c.refused.Store(&err)
			default:
				c.refused.Store(nil)
			}
			return nc, err
		}),
		grpc.WithUserAgent("hermes-toolworker"),
		grpc.WithStatsHandler(answered{}),
		grpc.WithMaxHeaderListSize(maxHeaderListBytes),
	)
	if err != nil {
		return nil, err
	}
	c.cc, c.inUse, c.used = cc, 1, cs.clock
	cs.open[k] = c
	return c, nil
}

// hold takes one more hold on c, which get returned.
func (cs *conns) hold(c *conn) {
	cs.mu.Lock()
	c.inUse++
	cs.mu.Unlock()
}

// put releases a hold get or hold took.
func (cs *conns) put(c *conn) {
	cs.mu.Lock()
	c.inUse--
	cs.mu.Unlock()
}

// evictLocked closes the least recently used connection no call holds.
func (cs *conns) evictLocked() {
	var (
		oldest connKey
		found  *conn
	)
	for k, c := range cs.open {
		if c.inUse == 0 && (found == nil || c.used < found.used) {
			oldest, found = k, c
		}
	}
	if found != nil {
		delete(cs.open, oldest)
		found.cc.Close()
	}
}

// close closes every connection.
func (cs *conns) close() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for k, c := range cs.open {
		c.cc.Close()
		delete(cs.open, k)
	}
}

// answered marks, in a call's context, whether the server's status arrived: a failure then is
// the server's answer, not a connection that failed or a deadline Hermes set.
type answered struct{}

type answeredKey struct{}

// sawStatus is set when a call's trailers (its status) came from the server; header when its
// headers did (the server began to answer).
type sawStatus struct{ v, header atomic.Bool }

func withAnswerMark(ctx context.Context) (context.Context, *sawStatus) {
	s := &sawStatus{}
	return context.WithValue(ctx, answeredKey{}, s), s
}

func (answered) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (answered) HandleRPC(ctx context.Context, s stats.RPCStats) {
	m, ok := ctx.Value(answeredKey{}).(*sawStatus)
	if !ok {
		return
	}
	switch s.(type) {
	case *stats.InTrailer:
		m.v.Store(true)
	case *stats.InHeader:
		m.header.Store(true)
	}
}

func (answered) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (answered) HandleConn(context.Context, stats.ConnStats) {}
