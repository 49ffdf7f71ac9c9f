package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hermesbus/hermes/examples"
	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/audit"
	"github.com/hermesbus/hermes/internal/audit/pgtest"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// auditSecret is planted in calls' arguments (and so in the echo tool's results): it must
// never reach the audit's database.
const auditSecret = "audit-secret-4111111111111111"

// query runs sql and returns its rows as text, one line per row.
func query(t *testing.T, db *pgxpool.Pool, sql string, args ...any) []string {
	t.Helper()
	return pgtest.Rows(t, db, sql, args...)
}

// auditDump is every row the audit wrote, as text, in a fixed order, without the times of the
// audit's own bookkeeping.
func auditDump(t *testing.T, db *pgxpool.Pool) string {
	t.Helper()
	var b strings.Builder
	for _, table := range []string{"hermes_requests", "hermes_steps", "hermes_retries", "hermes_policy_decisions", "hermes_approvals",
		"hermes_blueprint_runs", "hermes_blueprint_steps", "hermes_coordination", "hermes_llm_decisions", "hermes_audit_errors"} {
		rows := query(t, db, "SELECT (to_jsonb(x) - 'seen_at')::text AS r FROM "+table+" x ORDER BY r")
		b.WriteString(table + "\n" + strings.Join(rows, "\n") + "\n")
	}
	return b.String()
}

func openDB(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	db, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return db
}

// dbCount is the one number sql answers.
func dbCount(t *testing.T, db *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		if strings.Contains(err.Error(), "does not exist") {
			return -1 // not migrated yet
		}
		t.Fatalf("%v\n%s", err, sql)
	}
	return n
}

// TestAuditTrailOfADemoRun runs Hermes as hermes up --audit-postgres does, with the seed's
// policies, and checks what the audit wrote: a row per request and per call, the retry, the
// approval and who gave it; no value of any argument or result; the README's five queries; the
// same rows after the whole record is read again; a record it cannot read as a row of
// hermes_audit_errors; the lag in /metrics.
func TestAuditTrailOfADemoRun(t *testing.T) {
	t.Parallel()
	dsn := pgtest.Shared(t).Database(t)
	policies, _ := examples.Files.ReadFile("tool-policies.yaml")
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	sys, err := app.StartSystem(ctx, app.SystemConfig{DataDir: dir, HTTPAddr: "127.0.0.1:0", DemoAddr: "127.0.0.1:0", NATSListen: "127.0.0.1:0",
		Routes: exampleRoutes(t), ToolWorkers: 1, Worker: app.WorkerConfig{Concurrency: 8}, Instance: "audit-it", KeyFile: filepath.Join(dir, "admin.key"),
		Policies: policies, Audit: app.AuditConfig{DSN: dsn, Linger: 10 * time.Millisecond}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = sys.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	do := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, sys.GatewayURL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+sys.Key.Key)
		resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	route := func(id string, calls ...map[string]any) *protocol.Response {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"request_id": id, "session_id": "audit-demo", "intent": "audit demo", "tool_calls": calls})
		code, out := do("POST", "/v1/route?wait=20s", string(body))
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", id, code, out)
		}
		return decodeResponse(t, []byte(out))
	}
	// A call retried once, with the secret in its arguments, which the echo answers back.
	r1 := route("audit-1", call("e1", "echo", map[string]any{"card": auditSecret, "fail_times": 1}), call("e2", "echo", map[string]any{"note": "second " + auditSecret}))
	if res := result(t, r1, "e1"); res.Status != protocol.ResultOK || res.Attempts != 2 || !strings.Contains(string(res.Content), auditSecret) {
		t.Fatalf("the retried echo: %+v %s", res, res.Content)
	}
	// A call no route takes.
	if res := result(t, route("audit-2", call("n1", "no_such_tool", map[string]any{"x": auditSecret})), "n1"); res.ErrorCode != protocol.CodeNoRoute {
		t.Fatalf("the unrouted call: %+v", res)
	}
	// A call the seed's policy parks for approval, approved by its requester.
	book, _ := examples.Files.ReadFile("request-meeting_book.json")
	var bookReq map[string]any
	_ = json.Unmarshal(book, &bookReq)
	bookReq["request_id"], bookReq["session_id"] = "audit-3", "audit-demo"
	body, _ := json.Marshal(bookReq)
	code, out := do("POST", "/v1/route?wait=20s", string(body))
	parked := result(t, decodeResponse(t, []byte(out)), "call_book_1")
	if code != http.StatusOK || parked.ErrorCode != protocol.CodeApprovalRequired || parked.Policy == nil || parked.Policy.ApprovalID == "" {
		t.Fatalf("meeting_book: %d %s", code, out)
	}
	approval := parked.Policy.ApprovalID
	if code, out := do("POST", "/v1/approvals/"+approval+"/approve", `{"reason":"book it"}`); code != http.StatusOK {
		t.Fatalf("approve: %d %s", code, out)
	}

	db := openDB(t, dsn)
	waitForWithin(t, "the audit to write every request, call and the approval", 30*time.Second, func() bool {
		return dbCount(t, db, `SELECT count(*) FROM hermes_requests WHERE request_id IN ('audit-1', 'audit-2', 'audit-3', $1) AND status IS NOT NULL`, approval) == 4 &&
			dbCount(t, db, `SELECT count(*) FROM hermes_steps WHERE request_id LIKE 'audit-%' AND status IS NOT NULL`) == 4 &&
			dbCount(t, db, `SELECT count(*) FROM hermes_approvals WHERE approval_id = $1 AND status = 'approved'`, approval) == 1
	})
	all := auditDump(t, db)
	if strings.Contains(all, auditSecret) || strings.Contains(all, "4111111111111111") {
		t.Fatalf("a value reached the audit's database:\n%s", all)
	}
	if got := query(t, db, `SELECT caller_id, calls, status FROM hermes_requests WHERE request_id = 'audit-1'`); len(got) != 1 || !strings.HasPrefix(got[0], "key:") || !strings.HasSuffix(got[0], "| 2 | success") {
		t.Errorf("audit-1's row: %q", got)
	}

	// The README's queries, as an operator runs them.
	queries := pgtest.READMEQueries(t, "../../README.md")
	results := map[string][]string{}
	for name, sql := range queries {
		sql = strings.ReplaceAll(sql, ":'request_id'", "'audit-1'")
		results[name] = query(t, db, sql)
		t.Logf("%s:\n  %s", name, strings.Join(results[name], "\n  "))
	}
	has := func(name, want string) {
		t.Helper()
		for _, row := range results[name] {
			if strings.Contains(row, want) {
				return
			}
		}
		t.Errorf("%s: no row with %q in %q", name, want, results[name])
	}
	has("failure rate by tool, last 24 h", "no_such_tool | 1 | 1 | 100")
	has("failure rate by tool, last 24 h", "echo | 2 | 0 | 0")
	has("the slowest steps", "audit-1")
	has("one request's steps", "e1 | echo | echo | ok")
	has("one request's steps", "e2 | echo | echo | ok")
	has("who approved what", "approved | meeting_book | confirm_required | audit-3 | call_book_1 | key:")
	has("retries by error code", "echo | 1 | 1")
	if len(results["one request's steps"]) != 2 {
		t.Errorf("one request's steps: %q", results["one request's steps"])
	}

	// The lag, in /metrics.
	waitFor(t, "the audit's lag in /metrics", func() bool {
		_, m := do("GET", "/metrics", "")
		return strings.Contains(m, `hermes_audit_lag_messages{stream="HERMES"} 0`) && strings.Contains(m, "hermes_audit_database_up 1")
	})

	// A record it cannot read becomes a row, and the audit goes on.
	admin := upAdmin(t, sys)
	if _, err := admin.JS.Publish(context.Background(), protocol.SubjectEvent(protocol.EventToolStarted, "audit-demo"), []byte("not a message")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the undecodable record's row", func() bool {
		return dbCount(t, db, `SELECT count(*) FROM hermes_audit_errors WHERE subject = $1 AND reason LIKE 'undecodable message%'`,
			protocol.SubjectEvent(protocol.EventToolStarted, "audit-demo")) == 1
	})

	// The whole record read again leaves the same rows.
	before := auditDump(t, db)
	if err := admin.Streams[0].DeleteConsumer(context.Background(), bus.ConsumerAudit); err != nil {
		t.Fatal(err)
	}
	last := dbCount(t, db, `SELECT seq FROM hermes_audit_progress WHERE stream = 'HERMES'`)
	start := time.Now()
	waitForWithin(t, "the audit to read the record again", 60*time.Second, func() bool {
		c, err := admin.Streams[0].Consumer(context.Background(), bus.ConsumerAudit)
		if err != nil {
			return false
		}
		info, err := c.Info(context.Background())
		return err == nil && info.Delivered.Stream >= uint64(last) && info.NumPending == 0 && info.NumAckPending == 0
	})
	t.Logf("the record (%d messages) read again in %s", last, time.Since(start).Round(time.Millisecond))
	if after := auditDump(t, db); after != before {
		t.Fatalf("reading the record again changed the rows:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// upAdmin connects to a started system's NATS as its admin.
func upAdmin(t *testing.T, sys *app.System) *bus.Bus {
	t.Helper()
	creds := bus.Credentials{NKeyFile: sys.Seeds[bus.RoleAdmin]}
	opts, err := creds.Options()
	if err != nil {
		t.Fatal(err)
	}
	nc, b, err := app.Connect(context.Background(), sys.ClientURL, "audit-test-admin", bus.Config{NoProvision: true}, nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return b
}

// TestAuditSurvivesKillsAndADatabaseRestart runs hermes audit as a process of its own while
// requests keep coming (two streams, so both its consumers work), SIGKILLs it three times in
// the middle of its batches, and stops its database for a while under the load. Afterwards
// every request the record holds has its row, with its response and its two steps, none twice,
// and nothing became an error row.
func TestAuditSurvivesKillsAndADatabaseRestart(t *testing.T) {
	long(t, "audit under kills and a database restart")
	pg, err := pgtest.New() // of its own: it is stopped under load
	if err != nil {
		pgtest.Unavailable(t, err)
	}
	t.Cleanup(pg.Close)
	dsn := pg.Database(t)
	s := start(t, options{workers: 2, bus: bus.Config{Streams: 2, Partitions: 16}})
	audit := func(name string) *child {
		return s.spawn("audit", name, "--postgres", dsn, "--audit-batch", "20", "--audit-linger", "5ms")
	}
	a := audit("audit-1")
	db := openDB(t, dsn)
	const total = 300
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for i := range total {
			session := fmt.Sprintf("kill-%d", i%12)
			s.publishRequests(session, []*protocol.Request{{RequestID: fmt.Sprintf("k-%03d", i), Intent: "load",
				ToolCalls: []protocol.ToolCall{
					{ToolCallID: "a", Name: "echo", Arguments: json.RawMessage(`{"card":"` + auditSecret + `"}`)},
					{ToolCallID: "b", Name: "echo", Arguments: json.RawMessage(`{"n":` + fmt.Sprint(i) + `}`)},
				}}})
			time.Sleep(20 * time.Millisecond)
		}
	}()
	written := func() int {
		return dbCount(t, db, `SELECT count(*) FROM hermes_requests WHERE request_id LIKE 'k-%'`)
	}
	kill := func(after int) {
		t.Helper()
		waitForWithin(t, fmt.Sprintf("%d requests written", after), 60*time.Second, func() bool { return written() >= after })
		a.kill()
		t.Logf("audit killed with %d requests written", written())
	}
	kill(20)
	a = audit("audit-2")
	kill(60)
	a = audit("audit-3")
	waitForWithin(t, "more written", 60*time.Second, func() bool { return written() >= 90 })
	answered := func() int {
		n := 0
		for _, raw := range s.stored() {
			if m, err := protocol.Unmarshal(raw.Data); err == nil && m.Type == protocol.TypeResponse {
				n++
			}
		}
		return n
	}
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	before := answered()
	t.Logf("database stopped with %d requests answered", before)
	// Requests keep coming, and are answered: nothing waits for the audit.
	waitForWithin(t, "requests answered while the database is away", 30*time.Second, func() bool { return answered() >= before+50 })
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("database started again; %d requests answered meanwhile", answered()-before)
	waitForWithin(t, "the audit to say the database was away", 30*time.Second, func() bool {
		return strings.Contains(a.out.String(), "trying again")
	})
	kill(200)
	a = audit("audit-4")
	<-sent
	s.waitResponses(total)
	waitForWithin(t, "every request and call written", 90*time.Second, func() bool {
		return dbCount(t, db, `SELECT count(*) FROM hermes_requests WHERE request_id LIKE 'k-%' AND status = 'success' AND calls = 2`) == total &&
			dbCount(t, db, `SELECT count(*) FROM hermes_steps WHERE request_id LIKE 'k-%' AND status = 'ok' AND start_time IS NOT NULL`) == 2*total
	})
	// Each request once, each call once: the keys say so; the record says which.
	var recorded []string
	for _, raw := range s.stored() {
		if m, err := protocol.Unmarshal(raw.Data); err == nil && m.Type == protocol.TypeRequest {
			recorded = append(recorded, m.RequestID)
		}
	}
	slices.Sort(recorded)
	rows := query(t, db, `SELECT request_id FROM hermes_requests WHERE request_id LIKE 'k-%' ORDER BY request_id`)
	if !slices.Equal(rows, recorded) || len(rows) != total {
		t.Fatalf("%d rows for %d recorded requests", len(rows), len(recorded))
	}
	if n := dbCount(t, db, `SELECT count(*) FROM hermes_audit_errors`); n != 0 {
		t.Fatalf("%d error rows: %q", n, query(t, db, `SELECT reason FROM hermes_audit_errors`))
	}
	if all := auditDump(t, db); strings.Contains(all, auditSecret) {
		t.Fatal("a value reached the audit's database")
	}
	for k := range 2 {
		if n := dbCount(t, db, `SELECT count(*) FROM hermes_audit_progress WHERE stream = $1 AND seq > 0`, protocol.RecordStream(k)); n != 1 {
			t.Errorf("no progress of stream %d", k)
		}
	}
}

// TestAuditWaitsForItsDatabase starts the audit with credentials the database refuses: it
// says so (never the password), tries again with backoff, and catches up once the database
// lets it in; the requests meanwhile are answered as ever.
func TestAuditWaitsForItsDatabase(t *testing.T) {
	t.Parallel()
	pg := pgtest.Shared(t)
	dsn := pg.Database(t)
	db := openDB(t, dsn)
	role := fmt.Sprintf("ghost_%d", time.Now().UnixNano())
	s := start(t, options{workers: 1})
	_, b := s.connectAs(bus.RoleAuditor)
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	svc := &audit.Service{Bus: b, DSN: strings.Replace(dsn, "postgres@", role+":pw-hunter2@", 1), Linger: 5 * time.Millisecond,
		Metrics: audit.NewMetrics(reg), Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	for i := range 5 {
		s.publishRequests("wait-db", []*protocol.Request{{RequestID: fmt.Sprintf("w-%d", i), Intent: "t",
			ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: "echo", Arguments: json.RawMessage(`{}`)}}}})
	}
	s.waitResponses(5)
	waitFor(t, "the audit to say it cannot get in", func() bool {
		return strings.Contains(logs.String(), "audit database unreachable; trying again") && strings.Contains(logs.String(), role)
	})
	if strings.Contains(logs.String(), "pw-hunter2") {
		t.Fatalf("the password is in the log:\n%s", logs.String())
	}
	if up := testutil.ToFloat64(svc.Metrics.Up); up != 0 {
		t.Fatalf("hermes_audit_database_up %v while refused", up)
	}
	if _, err := db.Exec(context.Background(), "CREATE ROLE "+role+" LOGIN SUPERUSER"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE IF EXISTS "+role) })
	waitForWithin(t, "the audit to catch up", 60*time.Second, func() bool {
		return dbCount(t, db, `SELECT count(*) FROM hermes_requests WHERE request_id LIKE 'w-%' AND status = 'success'`) == 5
	})
	if up := testutil.ToFloat64(svc.Metrics.Up); up != 1 {
		t.Fatalf("hermes_audit_database_up %v once in", up)
	}
}
