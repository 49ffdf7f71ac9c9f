package bench_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/audit"
	"github.com/hermesbus/hermes/internal/audit/pgtest"
	"github.com/hermesbus/hermes/internal/bench"
	"github.com/hermesbus/hermes/pkg/bus"
)

// auditRows waits (up to two minutes) until the audit wrote n answered requests, and returns
// when it saw them.
// TestMain stops the audit benchmarks' PostgreSQL, if one was started, once they end.
func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Close()
	os.Exit(code)
}

func auditRows(b *testing.B, db *pgxpool.Pool, prefix string, n int) time.Time {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var got int
		if err := db.QueryRow(context.Background(), `SELECT count(*) FROM hermes_requests WHERE request_id LIKE $1 AND status IS NOT NULL`, prefix+"%").Scan(&got); err == nil && got >= n {
			return time.Now()
		}
		if time.Now().After(deadline) {
			b.Fatalf("the audit wrote %d of %d requests in two minutes", got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// recordMessages is how many messages the record's streams hold.
func recordMessages(b *testing.B, sys *app.System) uint64 {
	b.Helper()
	nc, ab, err := app.Connect(context.Background(), sys.ClientURL, "bench-admin", bus.Config{NoProvision: true}, nil, seedOptions(b, sys, bus.RoleAdmin)...)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	var n uint64
	for _, s := range ab.Streams {
		info, err := s.Info(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		n += info.State.Msgs
	}
	return n
}

func seedOptions(b *testing.B, sys *app.System, role bus.Role) []nats.Option {
	b.Helper()
	creds := bus.Credentials{NKeyFile: sys.Seeds[role], Inbox: bus.RoleInbox(role)}
	if role == bus.RoleAdmin {
		creds.Inbox = ""
	}
	opts, err := creds.Options()
	if err != nil {
		b.Fatal(err)
	}
	return opts
}

// BenchmarkAuditCatchUp measures how fast the audit projects a record it is behind on: b.N
// requests of one echo call are answered with no audit running, then the audit starts, and the
// time until every request has its row gives the records it wrote a second.
func BenchmarkAuditCatchUp(b *testing.B) {
	dsn := pgtest.Shared(b).Database(b)
	sys := runSystem(b, app.SystemConfig{Instance: "bench", NATSListen: "127.0.0.1:0", Worker: app.WorkerConfig{Concurrency: 64}}, "echo", "{}")
	prefix := fmt.Sprintf("cu%d-%d", os.Getpid(), runs.Add(1))
	run(b, 16, (&bench.Hermes{Client: bench.NewClient(64), URL: sys.GatewayURL, Key: sys.Key.Key, Tool: "echo", Calls: 1, Args: `{"q":"x"}`, RunID: prefix}).Do)
	b.StopTimer()
	msgs := recordMessages(b, sys)
	nc, ab, err := app.Connect(context.Background(), sys.ClientURL, "bench-audit", bus.Config{NoProvision: true}, nil, seedOptions(b, sys, bus.RoleAuditor)...)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	db, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	began := time.Now()
	wg.Go(func() { _ = (&audit.Service{Bus: ab, DSN: dsn}).Run(ctx) })
	took := auditRows(b, db, prefix, b.N).Sub(began)
	cancel()
	wg.Wait()
	b.ReportMetric(float64(msgs)/took.Seconds(), "records/s")
	b.ReportMetric(float64(b.N)/took.Seconds(), "requests/s")
}

// BenchmarkAuditSteady measures the audit beside a loaded Hermes (hermes up --audit-postgres):
// b.N requests of one echo call from 16 clients, with the audit's lag read from /metrics every
// 100 ms — its largest in messages and in seconds — and how long after the last answer the
// last row was written; audit=off is the same load without it, for the ratio.
func BenchmarkAuditSteady(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("audit=%v", map[bool]string{false: "off", true: "on"}[on]), func(b *testing.B) {
			cfg := app.SystemConfig{Instance: "bench", Worker: app.WorkerConfig{Concurrency: 64}}
			var db *pgxpool.Pool
			if on {
				cfg.Audit.DSN = pgtest.Shared(b).Database(b)
				var err error
				if db, err = pgxpool.New(context.Background(), cfg.Audit.DSN); err != nil {
					b.Fatal(err)
				}
				defer db.Close()
			}
			sys := runSystem(b, cfg, "echo", "{}")
			prefix := fmt.Sprintf("st%d-%d", os.Getpid(), runs.Add(1))
			var maxMsgs, maxSecs float64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				t := time.NewTicker(100 * time.Millisecond)
				defer t.Stop()
				for on {
					m, s := scrapeLag(sys)
					maxMsgs, maxSecs = max(maxMsgs, m), max(maxSecs, s)
					select {
					case <-stop:
						return
					case <-t.C:
					}
				}
			})
			run(b, 16, (&bench.Hermes{Client: bench.NewClient(64), URL: sys.GatewayURL, Key: sys.Key.Key, Tool: "echo", Calls: 1, Args: `{"q":"x"}`, RunID: prefix}).Do)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			if on {
				answered := time.Now()
				last := auditRows(b, db, prefix, b.N)
				b.ReportMetric(maxMsgs, "max-lag-msgs")
				b.ReportMetric(maxSecs, "max-lag-s")
				b.ReportMetric(float64(last.Sub(answered).Milliseconds()), "drain-ms")
			}
			close(stop)
			wg.Wait()
		})
	}
}

// scrapeLag reads the audit's lag from the system's /metrics: messages unwritten (summed over
// the streams) and the oldest held, in seconds.
func scrapeLag(sys *app.System) (msgs, secs float64) {
	req, _ := http.NewRequest(http.MethodGet, sys.GatewayURL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+sys.Key.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range strings.Split(string(body), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(name, "hermes_audit_lag_messages{"):
			msgs += v
		case strings.HasPrefix(name, "hermes_audit_lag_seconds{"):
			secs = max(secs, v)
		}
	}
	return msgs, secs
}
