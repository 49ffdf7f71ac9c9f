package audit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Trust checks the seals of recorded results (bus.Bus): a result counts for its call only when
// a key trusted for the call's tool sealed it. Without keys every result counts.
type Trust interface {
	ResultKeys() protocol.ResultKeys
	VerifyResult(m *protocol.Message, res *protocol.ToolResult, tool string) error
}

// DB is what the audit writes through: a connection (the one that holds its stream's lock), or
// a pool.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

var (
	_ DB = (*pgx.Conn)(nil)
	_ DB = (*pgxpool.Pool)(nil)
)

// store writes the projections of records into PostgreSQL.
type store struct {
	trust Trust
	// redriven is where a session's re-driven results are published (protocol.Layout).
	redriven func(session string) string
	// noIntent leaves requests' intents out.
	noIntent bool
}

// written says what a batch became.
type written struct {
	// projected counts the records projected; failed those that became audit_errors rows.
	projected, failed int
}

// isolateTries is how often a record is written alone before a healthy database's refusal of
// it is taken for its own.
const isolateTries = 3

// write projects recs and writes them through db in one transaction, with each stream's
// progress. When the batch fails and the database answers (a value it refuses, a key too long
// for its index, a number out of range: the record's own doing), each record is written alone,
// and one refused isolateTries times becomes an audit_errors row with the reason; so no record
// stops its stream. When the database does not answer, the error is returned and nothing of
// the batch is written, to be tried again.
func (s *store) write(ctx context.Context, db DB, recs []Record) (written, error) {
	ps := make([]projection, len(recs))
	for i, r := range recs {
		ps[i] = project(r, s.redriven, s.noIntent)
	}
	if err := s.settleResults(ctx, db, ps); err != nil {
		return written{}, err
	}
	err := writeAll(ctx, db, ps)
	if err != nil {
		if !refused(err) || !healthy(ctx, db) {
			return written{}, err // the database's trouble, not the records': tried again
		}
		// Some record is refused. It is found by halves, each transaction bounded on its own:
		// ctx's bound is for a batch, and finding several such records in a database some
		// milliseconds away takes longer (the service keeps the batch its own meanwhile).
		if err := isolate(context.WithoutCancel(ctx), db, ps); err != nil {
			return written{}, err
		}
	}
	return count(ps), nil
}

// writeAll writes ps in one transaction.
func writeAll(ctx context.Context, db DB, ps []projection) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return send(ctx, tx, ps) })
}

// isolateTimeout bounds each transaction, and each check of the database's health, while a
// batch's refused records are looked for.
const isolateTimeout = 10 * time.Second

// bounded runs f with base bounded by isolateTimeout.
func bounded(base context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(base, isolateTimeout)
	defer cancel()
	return f(ctx)
}

// isolate writes ps, which the database refused as one transaction while it answered, in
// halves, in order, splitting each half it refuses again, until a record it refuses stands
// alone and becomes an error row: some 2·log2(len(ps)) transactions for each such record, not
// one per record.
func isolate(base context.Context, db DB, ps []projection) error {
	isHealthy := func() bool {
		ctx, cancel := context.WithTimeout(base, isolateTimeout)
		defer cancel()
		return healthy(ctx, db)
	}
	if len(ps) > 1 {
		mid := len(ps) / 2
		for _, half := range [][]projection{ps[:mid], ps[mid:]} {
			err := bounded(base, func(ctx context.Context) error { return writeAll(ctx, db, half) })
			if err == nil {
				continue
			}
			if !refused(err) || !isHealthy() {
				return err
			}
			if err := isolate(base, db, half); err != nil {
				return err
			}
		}
		return nil
	}
	var err error
	for range isolateTries - 1 { // alone, a passing conflict is got past
		if err = bounded(base, func(ctx context.Context) error { return writeAll(ctx, db, ps) }); err == nil {
			return nil
		}
		if !refused(err) || !isHealthy() {
			return err
		}
	}
	ps[0] = ps[0].failed(refusal(err))
	if err := bounded(base, func(ctx context.Context) error { return writeAll(ctx, db, ps) }); err != nil {
		return fmt.Errorf("audit: record the error of %s %d: %w", ps[0].rec.Stream, ps[0].rec.Seq, err)
	}
	return nil
}

// refused reports whether err is the database refusing what it was sent — a value out of its
// range, a constraint, a limit — or the driver unable to send it, rather than the database's
// own trouble (a timeout, a deadlock, a restart, a full disk), which a later try gets past.
func refused(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		var conn *pgconn.ConnectError
		return !errors.As(err, &conn) && !pgconn.Timeout(err) && !errors.Is(err, context.DeadlineExceeded) &&
			!errors.Is(err, context.Canceled) && !pgconn.SafeToRetry(err)
	}
	switch pe.Code[:2] {
	case "22", "23", "54": // data exception, integrity constraint, program limit
		return true
	}
	return false
}

// refusal says why the database refused a record's rows without quoting them: PostgreSQL's
// messages, and the driver's, quote the value they refused.
func refusal(err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return "the database refused its rows: the driver could not send one of its values"
	}
	out := "the database refused its rows: SQLSTATE " + pe.Code
	for _, f := range []struct{ name, v string }{{"table", pe.TableName}, {"column", pe.ColumnName}, {"constraint", pe.ConstraintName}} {
		if f.v != "" {
			out += ", " + f.name + " " + protocol.Shorten(f.v, 64)
		}
	}
	return out
}

// healthy reports whether the database answers through db: a write that failed while it does
// was refused for what it holds (or lost a passing conflict, which a try alone gets past).
func healthy(ctx context.Context, db DB) bool {
	_, err := db.Exec(ctx, "SELECT 1")
	return err == nil
}

func count(ps []projection) written {
	var w written
	for _, p := range ps {
		if len(p.stmts) == 1 && p.stmts[0].sql == sqlError {
			w.failed++
		} else {
			w.projected++
		}
	}
	return w
}

// send sends the statements of ps, and the progress they make per stream, in one round trip.
func send(ctx context.Context, tx pgx.Tx, ps []projection) error {
	var b pgx.Batch
	type mark struct {
		seq    uint64
		stored time.Time
	}
	progress := map[string]mark{}
	for _, p := range ps {
		for _, st := range p.stmts {
			b.Queue(st.sql, st.args...)
		}
		m := progress[p.rec.Stream]
		if p.rec.Seq > m.seq {
			m.seq = p.rec.Seq
		}
		if p.rec.Stored.After(m.stored) {
			m.stored = p.rec.Stored
		}
		progress[p.rec.Stream] = m
	}
	for stream, m := range progress {
		b.Queue(sqlProgress, stream, int64(m.seq), ts(m.stored))
	}
	return tx.SendBatch(ctx, &b).Close()
}

// callKey names a call of a request.
type callKey struct{ request, call string }

// settleResults decides which results count (their seals), turning the others into
// audit_errors rows. A result sealed by a key trusted with some tools only is checked against
// its call's tool as the dispatch named it: in the batch, or in the rows written before.
func (s *store) settleResults(ctx context.Context, db DB, ps []projection) error {
	keys := s.trust != nil && s.trust.ResultKeys() != nil
	tools := map[callKey]string{}
	var need []callKey
	if keys {
		for _, p := range ps {
			for _, st := range p.stmts {
				if st.sql == sqlDispatch || st.sql == sqlCall {
					tools[callKey{st.args[0].(string), st.args[1].(string)}] = st.args[2].(string)
				}
			}
		}
		for _, p := range ps {
			if r := p.result; r != nil {
				k := callKey{r.msg.RequestID, r.res.ToolCallID}
				if _, ok := tools[k]; !ok {
					need = append(need, k)
				}
			}
		}
	}
	if len(need) > 0 {
		reqs, calls := make([]string, len(need)), make([]string, len(need))
		for i, k := range need {
			reqs[i], calls[i] = k.request, k.call
		}
		rows, err := db.Query(ctx, sqlToolsOf, reqs, calls)
		if err != nil {
			return fmt.Errorf("audit: read the tools of results' calls: %w", err)
		}
		for rows.Next() {
			var k callKey
			var tool *string
			if err := rows.Scan(&k.request, &k.call, &tool); err != nil {
				rows.Close()
				return err
			}
			if tool != nil {
				tools[k] = *tool
			}
		}
		if rows.Close(); rows.Err() != nil {
			return fmt.Errorf("audit: read the tools of results' calls: %w", rows.Err())
		}
	}
	for i := range ps {
		r := ps[i].result
		if r == nil {
			continue
		}
		if keys {
			tool, known := tools[callKey{r.msg.RequestID, r.res.ToolCallID}]
			if signer, ok := s.trust.ResultKeys().Signer(r.msg); !known && ok && !signer.AnyTool() {
				ps[i] = ps[i].failed("a result that does not count for its call: its call's tool is unknown (its request is not in the audit), " +
					"and key " + protocol.Shorten(r.msg.Seal.KeyID, 64) + " may seal results of some tools only")
				continue
			}
			if err := s.trust.VerifyResult(r.msg, r.res, tool); err != nil {
				ps[i] = ps[i].failed("a result that does not count for its call: " + err.Error())
				continue
			}
		}
		ps[i].counted(r)
		ps[i].result = nil
	}
	return nil
}
