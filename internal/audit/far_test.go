package audit

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/hermesbus/hermes/internal/audit/pgtest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// farProxy forwards TCP to target, delaying each chunk the server sends by delay: a
// database a few milliseconds away.
func farProxy(t *testing.T, target string, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				s, err := net.Dial("tcp", target)
				if err != nil {
					c.Close()
					return
				}
				go func() { _, _ = io.Copy(s, c); s.Close() }()
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 {
						time.Sleep(delay)
						if _, werr := c.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				c.Close()
			}()
		}
	}()
	return ln.Addr().String()
}

// farBatch is a batch of n records, tool starts of n calls, every one whose index is refused
// is made one the database refuses (its request id starts "refused-": see refuseSome).
func farBatch(t *testing.T, n int, refused func(int) bool) []Record {
	r := newRecords(t)
	for i := range n {
		req := fmt.Sprintf("req-%d", i)
		if refused(i) {
			req = fmt.Sprintf("refused-%d", i)
		}
		r.add("hermes.event.tool_started.sess-1", protocol.TypeToolStarted, req, "sess-1",
			protocol.ToolStarted{ToolCallID: "c1", Name: "t", Attempt: 1, StartedAt: r.at})
	}
	return r.recs
}

// refuseSome makes the database refuse the steps of requests whose id starts "refused-" (a
// constraint of the test's: what the projection writes holds no value PostgreSQL refuses).
func refuseSome(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `ALTER TABLE hermes_steps ADD CONSTRAINT test_refused CHECK (request_id NOT LIKE 'refused-%')`); err != nil {
		t.Fatal(err)
	}
}

// Records PostgreSQL refuses become audit_errors rows, and the rest of their batch is written,
// through a database some milliseconds away, with a full batch: it is written again in halves,
// each transaction bounded on its own — not one record at a time (500 transactions of three
// round trips each), and not within one try's bound (many refused records take longer).
func TestRefusedRecordsInAFullBatchOfAFarDatabase(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		refused func(int) bool
		want    int
	}{
		{"one", func(i int) bool { return i == DefaultBatch/2 }, 1},
		{"one in 16", func(i int) bool { return i%16 == 7 }, DefaultBatch / 16},
	} {
		t.Run(c.name, func(t *testing.T) {
			if testing.Short() && c.want > 1 {
				t.Skip("some 15 s")
			}
			srv := pgtest.Shared(t)
			dsn := srv.Database(t)
			u, _ := url.Parse(dsn)
			ctx := context.Background()
			pool, err := pgxpool.New(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			if _, _, err := Migrate(ctx, pool); err != nil {
				t.Fatal(err)
			}
			refuseSome(t, pool)
			proxied := *u
			proxied.Host = farProxy(t, u.Host, 6*time.Millisecond)
			conn, err := pgx.Connect(ctx, proxied.String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			st := &store{redriven: protocol.SubjectRedrivenResult}
			recs := farBatch(t, DefaultBatch, c.refused)
			wctx, cancel := context.WithTimeout(ctx, tryTimeout) // as projector.try
			defer cancel()
			began := time.Now()
			w, err := st.write(wctx, conn, recs)
			t.Logf("%+v, %v, in %s", w, err, time.Since(began).Round(time.Millisecond))
			if err != nil || w.failed != c.want || w.projected != DefaultBatch-c.want {
				t.Fatalf("written %+v (%v), want %d refused and the rest written", w, err, c.want)
			}
			var steps, errs int
			_ = pool.QueryRow(ctx, `SELECT count(*) FROM hermes_steps`).Scan(&steps)
			_ = pool.QueryRow(ctx, `SELECT count(*) FROM hermes_audit_errors WHERE reason LIKE 'the database refused its rows: SQLSTATE 23514%'`).Scan(&errs)
			if steps != DefaultBatch-c.want || errs != c.want {
				t.Fatalf("%d steps and %d error rows, want %d and %d", steps, errs, DefaultBatch-c.want, c.want)
			}
		})
	}
}
