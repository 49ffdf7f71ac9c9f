package audit

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/hermesbus/hermes/internal/audit/pgtest"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// A database that takes the connection and never answers (a host gone silent): a try of a
// batch ends within its bound, so the batch is held (InProgress) between tries and stays this
// audit's.
func TestATryOfASilentDatabaseEnds(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // never answered
		}
	}()
	cfg, err := pgx.ParseConfig("postgres://hermes@" + ln.Addr().String() + "/audit?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	p := &projector{Service: &Service{}, conn: cfg, st: &store{}, name: "HERMES"}
	r := newRecords(t)
	load(r, 1, "x")
	start := time.Now()
	if _, err := p.try(context.Background(), r.recs); err == nil {
		t.Fatal("a silent database took the batch")
	}
	if took := time.Since(start); took > tryTimeout {
		t.Fatalf("the try took %s", took)
	}
}

// The service end to end on a bus: it migrates, reads the record through its consumer in
// batches, writes them, goes on with what is recorded later, and stops when told.
func TestServiceProjectsTheRecordAsItGrows(t *testing.T) {
	t.Parallel()
	dsn := pgtest.Shared(t).Database(t)
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{Partitions: 4})
	ctx := context.Background()
	publish := func(recs []Record) {
		t.Helper()
		for _, r := range recs {
			subject := r.Subject
			if rest, ok := strings.CutPrefix(subject, "hermes.request."); ok { // the stream picks the partition
				subject = protocol.SubjectRequest(rest[strings.LastIndexByte(rest, '.')+1:])
			}
			if _, err := b.JS.Publish(ctx, subject, r.Data); err != nil {
				t.Fatalf("publish %s: %v", r.Subject, err)
			}
		}
	}
	r := newRecords(t)
	demo(r, func(*protocol.Message) {})
	publish(r.recs)

	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- (&Service{Bus: b, DSN: dsn, Batch: 4, Linger: 10 * time.Millisecond}).Run(runCtx) }()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rows := func(q string) int {
		var n int
		if err := pool.QueryRow(ctx, q).Scan(&n); err != nil {
			return -1 // not migrated yet
		}
		return n
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !ok(); {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor("the demo's request, steps and model's turn", func() bool {
		return rows("SELECT count(*) FROM hermes_requests WHERE status = 'partial_success'") == 1 &&
			rows("SELECT count(*) FROM hermes_steps") == 2 && rows("SELECT count(*) FROM hermes_llm_decisions") == 1
	})
	later := newRecords(t)
	later.add("hermes.request.1.sess-2", protocol.TypeRequest, "req-2", "sess-2", protocol.Request{RequestID: "req-2", SessionID: "sess-2",
		ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: "get_policy", Arguments: json.RawMessage(`{}`)}}})
	publish(later.recs)
	waitFor("a request recorded later", func() bool {
		return rows("SELECT count(*) FROM hermes_requests WHERE request_id = 'req-2'") == 1
	})
	// Its consumer deleted (an operator's mistake, a restream): it makes it again, reads the
	// record from its start, and what it writes again changes nothing.
	if err := b.Streams[0].DeleteConsumer(ctx, bus.ConsumerAudit); err != nil {
		t.Fatal(err)
	}
	again := newRecords(t)
	again.seq = 100
	again.add("hermes.request.1.sess-3", protocol.TypeRequest, "req-3", "sess-3", protocol.Request{RequestID: "req-3", SessionID: "sess-3",
		ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: "get_policy", Arguments: json.RawMessage(`{}`)}}})
	publish(again.recs)
	waitFor("a request recorded once its consumer was deleted", func() bool {
		return rows("SELECT count(*) FROM hermes_requests WHERE request_id = 'req-3'") == 1
	})
	if n := rows("SELECT count(*) FROM hermes_requests"); n != 3 {
		t.Fatalf("%d requests, want 3", n)
	}
	if n := rows("SELECT count(*) FROM hermes_audit_errors"); n != 0 {
		t.Fatalf("%d audit errors", n)
	}
	var seq int64
	if err := pool.QueryRow(ctx, "SELECT seq FROM hermes_audit_progress WHERE stream = $1", protocol.StreamName).Scan(&seq); err != nil || seq != int64(len(r.recs)+2) {
		t.Fatalf("progress %d (%v), want %d", seq, err, len(r.recs)+2)
	}
	stop()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return once stopped")
	}
}

// parseDSN's errors must not carry the password, whatever shape the connection string has
// (libpq accepts blanks around '=' and escaped quotes in values).
func TestAConnectionStringsErrorHidesItsPassword(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"host=localhost password = hunter2 sslmode=bogus",
		"host=localhost password='a\\'hunter2' sslmode=bogus",
		"host=localhost password=hunter2 sslmode=bogus",
		"postgres://u:hunter2@localhost/db?sslmode=bogus",
		"postgres://u:hunter2%zz@localhost/db",
	} {
		err := CheckDSN(dsn)
		if err == nil {
			t.Errorf("%q: accepted", dsn)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%q: the error shows the password: %v", dsn, err)
		}
	}
}
