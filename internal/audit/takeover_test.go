package audit

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/hermesbus/hermes/internal/audit/pgtest"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// cutProxy forwards TCP to target until cut: then its listener and every connection it
// carries are closed (the database restarted, and this audit's route to it lost).
type cutProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			go func() { _, _ = io.Copy(c, s); c.Close() }()
		}
	}()
	t.Cleanup(p.cut)
	return p
}

func (p *cutProxy) cut() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Audit A writes the stream; its route to the database is lost (its session, and so the
// stream's lock, ends). Audit B, standing by, takes the stream over and writes what is recorded
// later; the batch A had fetched when it lost the database is given back after A's few tries
// and written by B, while A still runs.
func TestAnAuditThatLostItsDatabaseGivesItsBatchBack(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("takes half a minute")
	}
	dsn := pgtest.Shared(t).Database(t)
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{Partitions: 4})
	ctx := context.Background()

	host := strings.TrimPrefix(dsn, "postgres://postgres@")
	host = host[:strings.IndexByte(host, '/')]
	proxy := newCutProxy(t, host)
	dsnA := strings.Replace(dsn, host, proxy.ln.Addr().String(), 1)

	publish := func(req string) {
		t.Helper()
		r := newRecords(t)
		r.add("x", protocol.TypeRequest, req, "sess-"+req, protocol.Request{RequestID: req, SessionID: "sess-" + req,
			ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: "get_policy", Arguments: json.RawMessage(`{}`)}}})
		if _, err := b.JS.Publish(ctx, protocol.SubjectRequest("sess-"+req), r.recs[0].Data); err != nil {
			t.Fatal(err)
		}
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	has := func(req string) bool {
		var n int
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM hermes_requests WHERE request_id = $1", req).Scan(&n)
		return n == 1
	}
	waitFor := func(what string, d time.Duration, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(d); !ok(); {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	logger := func(who string) *slog.Logger {
		return slog.New(slog.NewTextHandler(t.Output(), nil)).With("audit", who)
	}

	ctxA, stopA := context.WithCancel(ctx)
	doneA := make(chan struct{})
	go func() {
		defer close(doneA)
		_ = (&Service{Bus: b, DSN: dsnA, Logger: logger("A")}).Run(ctxA)
	}()
	defer func() { stopA(); <-doneA }()
	publish("req-1")
	waitFor("A to write req-1", 30*time.Second, func() bool { return has("req-1") })

	ctxB, stopB := context.WithCancel(ctx)
	doneB := make(chan struct{})
	go func() {
		defer close(doneB)
		_ = (&Service{Bus: b, DSN: dsn, Logger: logger("B")}).Run(ctxB)
	}()
	defer func() { stopB(); <-doneB }()

	// A's session ends: the locks are free, and A cannot reach the database any more. A's
	// pull, waiting, takes req-2 (and perhaps req-3) before B, which asks for the lock every
	// 5 s, takes the stream over.
	proxy.cut()
	publish("req-2")
	publish("req-3")
	waitFor("B to write req-3", 30*time.Second, func() bool { return has("req-3") })

	// Within A's tries of it (some 7 s), well before the consumer's ack wait would give it to B.
	waitFor("B to write req-2, which A had fetched", 25*time.Second, func() bool { return has("req-2") })
}
