package audit

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/hermesbus/hermes/internal/audit/pgtest"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

func TestMain(m *testing.M) {
	code := bustest.Main(m) // under -short, the parallel tests run four at once per CPU
	pgtest.Close()
	os.Exit(code)
}

// testStore is a store writing through a pool.
type testStore struct {
	*store
	db DB
}

func (s *testStore) write(ctx context.Context, recs []Record) (written, error) {
	return s.store.write(ctx, s.db, recs)
}

// newStore makes an empty database for t, migrated, and a store on it.
func newStore(t testing.TB, trust Trust) (*testStore, *pgxpool.Pool) {
	t.Helper()
	dsn := pgtest.Shared(t).Database(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, _, err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return &testStore{store: &store{trust: trust, redriven: protocol.SubjectRedrivenResult}, db: pool}, pool
}

// records builds the record's messages in order, as a stream stores them.
type records struct {
	t    testing.TB
	seq  uint64
	recs []Record
	at   time.Time
}

func newRecords(t testing.TB) *records {
	return &records{t: t, at: time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)}
}

// add records payload as a message of type typ of request req (session sess) on subject.
func (r *records) add(subject string, typ protocol.Type, req, sess string, payload any, edit ...func(*protocol.Message)) *protocol.Message {
	r.t.Helper()
	m, err := protocol.NewMessage(typ, payload)
	if err != nil {
		r.t.Fatal(err)
	}
	r.seq++
	r.at = r.at.Add(time.Second)
	m.MsgID, m.RequestID, m.SessionID, m.CreatedAt = string(typ)+":"+req+":"+time.Duration(r.seq).String(), req, sess, r.at
	m.Sender = protocol.Sender{Role: protocol.RoleRouter, Instance: "r1"}
	for _, e := range edit {
		e(m)
	}
	data, err := protocol.Marshal(m)
	if err != nil {
		r.t.Fatal(err)
	}
	r.recs = append(r.recs, Record{Stream: protocol.StreamName, Seq: r.seq, Subject: subject, Data: data, Stored: r.at})
	return m
}

func (r *records) raw(subject string, data []byte) {
	r.seq++
	r.recs = append(r.recs, Record{Stream: protocol.StreamName, Seq: r.seq, Subject: subject, Data: data, Stored: r.at})
}

const secret = "s3cr3t-hunter2-DO-NOT-STORE"

// demo is one request of two calls (one refused by policy and approved), its response, a
// blueprint run, a coordination grant and a model's decision; every argument and result plants
// the secret.
func demo(r *records, sign func(*protocol.Message)) {
	caller := &protocol.Caller{ID: "key:k1", Name: "billing app", Role: "app", User: "alice"}
	withCaller := func(m *protocol.Message) { m.Caller = caller }
	args := json.RawMessage(`{"policy_no":"` + secret + `","card":{"number":"` + secret + `"}}`)
	req := protocol.Request{RequestID: "req-1", SessionID: "sess-1", Intent: "renew a policy", ToolCalls: []protocol.ToolCall{
		{ToolCallID: "c1", Name: "get_policy", Arguments: args},
		{ToolCallID: "c2", Name: "send_email", Arguments: json.RawMessage(`{"to":["` + secret + `@example.com"]}`)},
	}}
	r.add("hermes.request.3.sess-1", protocol.TypeRequest, "req-1", "sess-1", req, withCaller)
	grant := &protocol.Grant{Tx: protocol.TxID("req-1", "policy:"+secret), Fence: 7, Resource: "policy:" + secret}
	r.add("hermes.tool_http.get_policy.sess-1", protocol.TypeToolCall, "req-1", "sess-1", protocol.Dispatch{
		Call: req.ToolCalls[0], Route: "policies", Action: protocol.Action{Kind: protocol.ActionHTTP, TimeoutMS: 1000, Retry: protocol.RetryPolicy{MaxAttempts: 3, BackoffFactor: 2, InitialIntervalMS: 10, MaxIntervalMS: 100}, HTTP: &protocol.HTTPAction{URL: "http://127.0.0.1:1/p"}},
		Contract: &protocol.ContractRef{Name: "get_policy", Version: 2, Revision: 5},
		Policy:   &protocol.PolicyDecision{Decision: protocol.PolicyAllowed, Source: "policy", Version: 1},
		Grant:    grant,
	}, withCaller)
	r.add("hermes.event.coordination.sess-1", protocol.TypeCoordination, "req-1", "sess-1", protocol.CoordinationEvent{
		Op: protocol.CoordGranted, ToolCallID: "c1", Tool: "get_policy", Resource: grant.Resource, Tx: grant.Tx, Fence: 7, At: r.at})
	started := r.at.Add(500 * time.Millisecond)
	r.add("hermes.event.tool_started.sess-1", protocol.TypeToolStarted, "req-1", "sess-1", protocol.ToolStarted{ToolCallID: "c1", Name: "get_policy", Attempt: 1, StartedAt: started})
	r.add("hermes.event.tool_started.sess-1", protocol.TypeToolStarted, "req-1", "sess-1", protocol.ToolStarted{ToolCallID: "c1", Name: "get_policy", Attempt: 2, StartedAt: started.Add(time.Second), Retrying: "TOOL_HTTP_5XX"})
	r.add("hermes.result.req-1:c1.sess-1", protocol.TypeToolResult, "req-1", "sess-1", protocol.ToolResult{
		ToolCallID: "c1", Name: "get_policy", Status: protocol.ResultOK, Attempts: 2, ExecutionTimeMS: 42, Route: "policies", ContractVersion: 2, Grant: grant,
		Content: json.RawMessage(`[{"policy_no":"` + secret + `","status":"active"},{"policy_no":"x","status":"lapsed","effective_date":"2026-01-01"}]`),
	}, withCaller, sign)
	r.add("hermes.event.policy.sess-1", protocol.TypePolicy, "req-1", "sess-1", protocol.PolicyEvent{ToolCallID: "c2", Tool: "send_email",
		Decision: protocol.PolicyDecision{Decision: protocol.PolicyParked, Rule: "confirm_required", Source: "policy", Version: 3, ApprovalID: "apr-1"}, At: r.at})
	r.add("hermes.event.policy.sess-1", protocol.TypePolicy, "req-1", "sess-1", protocol.PolicyEvent{ToolCallID: "c2", Tool: "send_email",
		Decision: protocol.PolicyDecision{Decision: protocol.PolicyApproved, Source: "policy", Version: 3, ApprovalID: "apr-1", By: "oidc:https://id.example#bob"}, At: r.at.Add(time.Minute)})
	r.add("hermes.result.req-1:c2.sess-1", protocol.TypeToolResult, "req-1", "sess-1", protocol.ToolResult{
		ToolCallID: "c2", Name: "send_email", Status: protocol.ResultError, Attempts: 1, ErrorCode: "TOOL_ERROR", ErrorOrigin: protocol.OriginTool,
		Content: json.RawMessage(`"mailbox ` + secret + ` is full"`),
	}, withCaller, sign)
	r.add("hermes.response.req-1.sess-1", protocol.TypeResponse, "req-1", "sess-1", protocol.Response{RequestID: "req-1", SessionID: "sess-1",
		Status: protocol.StatusPartialSuccess}, withCaller)
	r.add("hermes.event.blueprint.bpr-run1", protocol.TypeBlueprintStep, "bpr-run1-1", "bpr-run1", protocol.BlueprintStep{RunID: "run1", Blueprint: "renewal", Version: 1,
		Step: "1", Tool: "get_policy", Status: "running", At: r.at})
	r.add("hermes.event.blueprint.bpr-run1", protocol.TypeBlueprintStep, "bpr-run1-1", "bpr-run1", protocol.BlueprintStep{RunID: "run1", Blueprint: "renewal", Version: 1,
		Step: "1", Tool: "get_policy", Status: "succeeded", DurationMS: 900, Condition: &protocol.StepCondition{Expr: "$.status == 'active'", Result: true,
			Values: json.RawMessage(`{"$.status":"` + secret + `"}`)}, At: r.at.Add(time.Second)})
	r.add("hermes.event.blueprint.bpr-run1", protocol.TypeBlueprintStep, "bpr-run1", "bpr-run1", protocol.BlueprintStep{RunID: "run1", Blueprint: "renewal", Version: 1,
		Status: "succeeded", DurationMS: 1200, At: r.at.Add(2 * time.Second)})
	r.add("hermes.event.llm.sess-1", protocol.TypeLLMDecision, "run-9-1", "sess-1", protocol.LLMDecision{Run: "run-9", Turn: 1, Backend: "scripted", Model: "m1",
		Input: "my card is " + secret, Messages: []protocol.LLMMessage{{Role: "user", Content: secret}}, Offered: []string{"get_policy", "send_email"},
		Prefiltered: true, Candidates: []protocol.LLMCandidate{{Name: "get_policy", Score: 2.5}},
		Chosen:   []protocol.LLMCall{{ID: "c1", Name: "get_policy", Arguments: `{"policy_no":"` + secret + `"}`}},
		Warnings: []protocol.LLMWarning{{Kind: protocol.WarnMissingArgument, Tool: "get_policy", Field: "date", Message: "the value " + secret}},
		Usage:    protocol.LLMUsage{Prompt: 100, Completion: 20, Total: 120}, LatencyMS: 33})
	r.add("hermes.event.summary.sess-1", protocol.TypeLLMSummary, "sess-1", "sess-1", protocol.LLMSummary{Through: 3, Messages: 2, New: 2, Text: "they said " + secret})
}

// dump is every row of every audit table as text, in a fixed order.
func dump(t *testing.T, pool *pgxpool.Pool, skip ...string) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	for _, table := range []string{"hermes_requests", "hermes_steps", "hermes_policy_decisions", "hermes_approvals", "hermes_blueprint_runs",
		"hermes_blueprint_steps", "hermes_coordination", "hermes_llm_decisions", "hermes_retries", "hermes_audit_errors", "hermes_audit_progress"} {
		rows, err := pool.Query(ctx, "SELECT row_to_json(x)::text FROM "+table+" x ORDER BY row_to_json(x)::text")
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(table + "\n")
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			for _, k := range skip {
				var row map[string]any
				_ = json.Unmarshal([]byte(s), &row)
				delete(row, k)
				out, _ := json.Marshal(row)
				s = string(out)
			}
			b.WriteString(s + "\n")
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
	}
	return b.String()
}

func write(t *testing.T, s *testStore, recs []Record) written {
	t.Helper()
	w, err := s.write(context.Background(), recs)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestProjectionKeepsWhatHappenedAndNoValue(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, nil)
	r := newRecords(t)
	demo(r, func(*protocol.Message) {})
	if w := write(t, s, r.recs); w.failed != 0 || w.projected != len(r.recs) {
		t.Fatalf("written %+v of %d records", w, len(r.recs))
	}
	all := dump(t, pool)
	if strings.Contains(all, secret) || strings.Contains(all, "hunter2") {
		t.Fatalf("a value reached the database:\n%s", all)
	}
	ctx := context.Background()
	var (
		status, caller, user, intent string
		calls                        int
	)
	if err := pool.QueryRow(ctx, `SELECT status, caller_id, end_user, intent, calls FROM hermes_requests WHERE request_id = 'req-1'`).
		Scan(&status, &caller, &user, &intent, &calls); err != nil {
		t.Fatal(err)
	}
	if status != "partial_success" || caller != "key:k1" || user != "alice" || intent != "renew a policy" || calls != 2 {
		t.Errorf("request row: %s %s %s %q %d", status, caller, user, intent, calls)
	}
	var (
		tool, st, tx    string
		attempts        int
		fence           int64
		startT, endT    time.Time
		resSum, argsSum string
		contractVersion int
	)
	if err := pool.QueryRow(ctx, `SELECT tool_name, status, attempts, start_time, end_time, result_summary::text, arguments_summary::text, tx, fence, contract_version
		FROM hermes_steps WHERE request_id = 'req-1' AND tool_call_id = 'c1'`).Scan(&tool, &st, &attempts, &startT, &endT, &resSum, &argsSum, &tx, &fence, &contractVersion); err != nil {
		t.Fatal(err)
	}
	if tool != "get_policy" || st != "ok" || attempts != 2 || !startT.Before(endT) || fence != 7 || !protocol.ValidTx(tx) || contractVersion != 2 {
		t.Errorf("step c1: %s %s %d %s..%s tx %s fence %d v%d", tool, st, attempts, startT, endT, tx, fence, contractVersion)
	}
	var res Digest
	if err := json.Unmarshal([]byte(resSum), &res); err != nil {
		t.Fatal(err)
	}
	if res.Kind != "array" || res.Count != 2 || strings.Join(res.Fields, ",") != "effective_date,policy_no,status" {
		t.Errorf("result summary %s", resSum)
	}
	var approvedBy, apStatus, apTool string
	if err := pool.QueryRow(ctx, `SELECT decided_by, status, tool_name FROM hermes_approvals WHERE approval_id = 'apr-1'`).Scan(&approvedBy, &apStatus, &apTool); err != nil {
		t.Fatal(err)
	}
	if approvedBy != "oidc:https://id.example#bob" || apStatus != "approved" || apTool != "send_email" {
		t.Errorf("approval: %s %s %s", approvedBy, apStatus, apTool)
	}
	var runStatus, stepStatus, cond string
	if err := pool.QueryRow(ctx, `SELECT r.status, s.status, s.condition FROM hermes_blueprint_runs r JOIN hermes_blueprint_steps s USING (run_id) WHERE run_id = 'run1'`).
		Scan(&runStatus, &stepStatus, &cond); err != nil {
		t.Fatal(err)
	}
	if runStatus != "succeeded" || stepStatus != "succeeded" || cond != "$.status == 'active'" {
		t.Errorf("blueprint: run %s step %s cond %s", runStatus, stepStatus, cond)
	}
	var chosen string
	var offered []string
	if err := pool.QueryRow(ctx, `SELECT chosen::text, offered FROM hermes_llm_decisions WHERE run = 'run-9' AND turn = 1`).Scan(&chosen, &offered); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(chosen, `"policy_no"`) || len(offered) != 2 {
		t.Errorf("decision: chosen %s offered %v", chosen, offered)
	}
	var retried string
	if err := pool.QueryRow(ctx, `SELECT error_code FROM hermes_retries WHERE request_id = 'req-1' AND tool_call_id = 'c1' AND attempt = 2`).Scan(&retried); err != nil || retried != "TOOL_HTTP_5XX" {
		t.Errorf("retry: %q %v", retried, err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM hermes_policy_decisions`).Scan(&n); err != nil || n != 3 {
		t.Errorf("policy decisions: %d (%v), want allowed, parked, approved", n, err)
	}
}

func TestReplayLeavesTheSameRows(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, nil)
	r := newRecords(t)
	demo(r, func(*protocol.Message) {})
	write(t, s, r.recs)
	once := dump(t, pool, "updated_at")
	// Again, whole; then in batches of three, as a crash between commit and ack redelivers.
	write(t, s, r.recs)
	for i := 0; i < len(r.recs); i += 3 {
		write(t, s, r.recs[i:min(i+3, len(r.recs))])
	}
	if twice := dump(t, pool, "updated_at"); twice != once {
		t.Fatalf("replay changed the rows:\nonce:\n%s\ntwice:\n%s", once, twice)
	}
}

func TestUndecodableRecordsBecomeErrorRows(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, nil)
	r := newRecords(t)
	r.raw("hermes.request.1.x", []byte("\x00\xffnot msgpack"))
	r.add("hermes.tool_http.t.sess-2", protocol.TypeToolCall, "req-2", "sess-2", map[string]any{"call": "no"})
	r.add("hermes.request.1.sess-2", protocol.TypeRequest, "req-2", "sess-2", protocol.Request{RequestID: "req-2", SessionID: "sess-2",
		ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: "t", Arguments: json.RawMessage(`{}`)}}})
	w := write(t, s, r.recs)
	if w.failed != 2 || w.projected != 1 {
		t.Fatalf("written %+v", w)
	}
	rows, err := pool.Query(context.Background(), `SELECT seq, reason FROM hermes_audit_errors ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var reasons []string
	for rows.Next() {
		var seq int64
		var reason string
		if err := rows.Scan(&seq, &reason); err != nil {
			t.Fatal(err)
		}
		reasons = append(reasons, reason)
	}
	if len(reasons) != 2 || !strings.HasPrefix(reasons[0], "undecodable message") || !strings.HasPrefix(reasons[1], "undecodable tool_call.v1") {
		t.Fatalf("reasons %q", reasons)
	}
	var seq int64
	if err := pool.QueryRow(context.Background(), `SELECT seq FROM hermes_audit_progress WHERE stream = 'HERMES'`).Scan(&seq); err != nil || seq != 3 {
		t.Fatalf("progress %d %v", seq, err)
	}
}

// keys trusts results sealed by a key of its own, the way a bus does.
type keys protocol.ResultKeys

func (k keys) ResultKeys() protocol.ResultKeys { return protocol.ResultKeys(k) }
func (k keys) VerifyResult(m *protocol.Message, res *protocol.ToolResult, tool string) error {
	return protocol.ResultKeys(k).VerifyResult(m, res, tool)
}

// newSendEmailOnlyStore is newStore trusting two keys: hermes's (priv), with every tool, and a
// worker's named meeting (toolPriv), with send_email only.
func newSendEmailOnlyStore(t *testing.T) (s *testStore, pool *pgxpool.Pool, priv, toolPriv ed25519.PrivateKey) {
	t.Helper()
	pub, priv, _ := ed25519.GenerateKey(nil)
	toolPub, toolPriv, _ := ed25519.GenerateKey(nil)
	s, pool = newStore(t, keys{"hermes": {Key: pub}, "meeting": {Key: toolPub, Tools: []string{"send_email"}}})
	return s, pool, priv, toolPriv
}

func TestAForgedResultDoesNotCount(t *testing.T) {
	t.Parallel()
	s, pool, priv, toolPriv := newSendEmailOnlyStore(t)
	r := newRecords(t)
	demo(r, func(m *protocol.Message) { m.SealResult(priv, "hermes") })
	// Before the real results: a worker key trusted with send_email only claims get_policy's
	// call, and then a result nobody sealed.
	forged := protocol.ToolResult{ToolCallID: "c1", Name: "send_email", Status: protocol.ResultError, ErrorCode: "FORGED", Content: json.RawMessage(`{}`)}
	var real []Record
	real, r.recs = r.recs, nil
	r.seq = 100
	r.add("hermes.result.req-1:c1.sess-1", protocol.TypeToolResult, "req-1", "sess-1", forged, func(m *protocol.Message) { m.SealResult(toolPriv, "meeting") })
	r.add("hermes.result.req-1:c1.sess-1", protocol.TypeToolResult, "req-1", "sess-1", forged)
	// The dispatch is written in an earlier batch, the forgeries after it, then the rest.
	write(t, s, real[:2])
	if w := write(t, s, r.recs); w.failed != 2 {
		t.Fatalf("forgeries written %+v", w)
	}
	write(t, s, real[2:])
	var st string
	var code *string
	if err := pool.QueryRow(context.Background(), `SELECT status, error_code FROM hermes_steps WHERE request_id = 'req-1' AND tool_call_id = 'c1'`).Scan(&st, &code); err != nil {
		t.Fatal(err)
	}
	if st != "ok" || code != nil {
		t.Fatalf("step c1 is %s %v: a forged result counted", st, code)
	}
	var n int
	_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM hermes_audit_errors WHERE reason LIKE 'a result that does not count%'`).Scan(&n)
	if n != 2 {
		t.Fatalf("%d error rows for the forgeries", n)
	}
}

func TestADeadAnswerGivesWayToTheRedrivenCallsResult(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, nil)
	r := newRecords(t)
	r.add("hermes.result.req-3:c1.sess-3", protocol.TypeToolResult, "req-3", "sess-3", protocol.ToolResult{ToolCallID: "c1", Name: "t",
		Status: protocol.ResultError, ErrorCode: "DEAD_LETTER", Content: json.RawMessage(`"gave up"`)}, func(m *protocol.Message) { m.Sender.Role = protocol.RoleDeadLetter })
	r.add("hermes.result.req-3:c1.sess-3", protocol.TypeToolResult, "req-3", "sess-3", protocol.ToolResult{ToolCallID: "c1", Name: "t",
		Status: protocol.ResultOK, Attempts: 1, Content: json.RawMessage(`{}`)})
	// Re-driven for another round of aggregation: the same result again, never counted twice.
	r.add(protocol.SubjectRedrivenResult("sess-3"), protocol.TypeToolResult, "req-3", "sess-3", protocol.ToolResult{ToolCallID: "c1", Name: "t",
		Status: protocol.ResultError, ErrorCode: "OTHER", Content: json.RawMessage(`{}`)})
	write(t, s, r.recs[:1])
	write(t, s, r.recs[1:])
	var st string
	var dead bool
	if err := pool.QueryRow(context.Background(), `SELECT status, dead_answer FROM hermes_steps WHERE request_id = 'req-3'`).Scan(&st, &dead); err != nil {
		t.Fatal(err)
	}
	if st != "ok" || dead {
		t.Fatalf("step %s dead %v", st, dead)
	}
}

func TestMigrateIsOnceAndRefusesANewerSchema(t *testing.T) {
	t.Parallel()
	_, pool := newStore(t, nil)
	ctx := context.Background()
	from, to, err := Migrate(ctx, pool)
	if err != nil || from != SchemaVersion() || to != SchemaVersion() {
		t.Fatalf("again: %d → %d, %v", from, to, err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO hermes_audit_schema (version, name) VALUES ($1, 'from the future')`, SchemaVersion()+1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Migrate(ctx, pool); !errors.Is(err, ErrSchemaNewer) {
		t.Fatalf("a newer schema: %v", err)
	}
}

func TestMigrationsAreNumbered(t *testing.T) {
	t.Parallel()
	m, err := migrations()
	if err != nil || len(m) == 0 {
		t.Fatal(m, err)
	}
}

func TestMigrateRefusesADatabaseNotInUTF8(t *testing.T) {
	t.Parallel()
	srv := pgtest.Shared(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, srv.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE latin_audit ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"); err != nil {
		t.Fatal(err)
	}
	// Dropped while admin is open (defers run last in, first out; a cleanup would run after
	// admin.Close, and drop nothing).
	defer func() { _, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS latin_audit WITH (FORCE)") }()
	pool, err := pgxpool.New(ctx, srv.DSN("latin_audit"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	_, _, err = Migrate(ctx, pool)
	if !errors.Is(err, ErrEncoding) || !strings.Contains(err.Error(), "SQL_ASCII") {
		t.Fatalf("Migrate on a SQL_ASCII database: %v, want ErrEncoding naming it", err)
	}
	var tables int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'hermes_%'").Scan(&tables); err != nil || tables != 0 {
		t.Fatalf("%d tables made in a database refused (%v)", tables, err)
	}
}
