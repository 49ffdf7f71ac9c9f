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

// farBatch is a batch of n records, tool starts of n-1 calls and, at poison, one whose time
// PostgreSQL cannot hold (year 300000: timestamp out of range).
func farBatch(t *testing.T, n, poison int) []Record {
	r := newRecords(t)
	for i := range n {
		at := r.at
		if i == poison {
			at = time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)
		}
		r.add("hermes.event.tool_started.sess-1", protocol.TypeToolStarted, fmt.Sprintf("req-%d", i), "sess-1",
			protocol.ToolStarted{ToolCallID: "c1", Name: "t", Attempt: 1, StartedAt: at})
	}
	return r.recs
}

// A record PostgreSQL refuses becomes an audit_errors row within one try (10 s) of a full batch,
// through a database some milliseconds away: the batch is written again in halves, not one
// record at a time (500 transactions of three round trips each would not finish).
func TestARefusedRecordInAFullBatchOfAFarDatabase(t *testing.T) {
	srv := pgtest.Shared(t)
	dsn := srv.Database(t)
	u, _ := url.Parse(dsn)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	proxied := *u
	proxied.Host = farProxy(t, u.Host, 6*time.Millisecond)
	conn, err := pgx.Connect(ctx, proxied.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	st := &store{redriven: protocol.SubjectRedrivenResult}
	recs := farBatch(t, DefaultBatch, DefaultBatch/2)
	for try := range 2 {
		wctx, cancel := context.WithTimeout(ctx, tryTimeout) // as projector.try
		began := time.Now()
		w, err := st.write(wctx, conn, recs)
		cancel()
		t.Logf("try %d: %+v, %v, in %s", try, w, err, time.Since(began).Round(time.Millisecond))
		if err != nil {
			t.Errorf("try %d: the batch with one poison record is not written within a try (%v): commit retries it forever", try, err)
		}
		if conn.IsClosed() {
			conn, err = pgx.Connect(ctx, proxied.String())
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}
