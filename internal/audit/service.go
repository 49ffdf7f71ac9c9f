package audit

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/retry"
)

// Defaults of a Service.
const (
	DefaultBatch  = 500
	DefaultLinger = 50 * time.Millisecond
)

// Service projects the record into PostgreSQL: the audit's durable consumer of each record
// stream (bus.ConsumerAudit) delivers every message, in the stream's order; the messages are
// written in batches, one transaction each, and acknowledged once it commits, so a crash
// loses nothing (what was not acknowledged comes again, and writing it again changes
// nothing). While the database is unreachable it says so, holds the batch it read for a few
// tries, gives it back, and tries to connect again with backoff: the record goes on without it,
// and it catches up when the database returns.
// Any number may run against one database: one writes each stream at a time (the stream's
// advisory lock), the others stand by and take over when it stops.
type Service struct {
	// Bus reads the record (connected as the bus role auditor) and checks results' seals.
	Bus *bus.Bus
	// DSN is PostgreSQL's connection string, a URL or key=value pairs; its password, if it
	// holds one, is never logged (PGPASSWORD and ~/.pgpass are read as libpq reads them).
	DSN string
	// Batch bounds the messages of one transaction (default DefaultBatch); Linger is how long
	// a batch waits to fill once its first message is in (default DefaultLinger).
	Batch  int
	Linger time.Duration
	// NoIntents leaves the intent of every request out of hermes_requests. Otherwise a
	// native request's intent is kept as its caller wrote it (at most MaxIntentBytes), as the
	// seed's table has it; a chat's or MCP's never (a person's words).
	NoIntents bool
	// Metrics, when set, hears the audit's figures (NewMetrics).
	Metrics *Metrics
	Logger  *slog.Logger
}

// Name names the service.
func (s *Service) Name() string { return "audit" }

// Validate says what is wrong with s's configuration: the database's address is parsed, not
// dialled (an unreachable database is waited for).
func (s *Service) Validate() error {
	if s.Bus == nil {
		return errors.New("audit: Bus is required")
	}
	if s.Batch < 0 || s.Batch > 10000 {
		return fmt.Errorf("audit: a batch of %d messages: give 1 to 10000 (0: %d)", s.Batch, DefaultBatch)
	}
	if s.Linger < 0 {
		return fmt.Errorf("audit: linger %s is negative", s.Linger)
	}
	_, err := s.poolConfig()
	return err
}

func (s *Service) poolConfig() (*pgxpool.Config, error) {
	cfg, err := parseDSN(s.DSN)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 2 // migrations; each stream writes through a connection of its own
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	return cfg, nil
}

// CheckDSN says what is wrong with a PostgreSQL connection string, if anything, without
// dialling it (and without its password).
func CheckDSN(dsn string) error {
	_, err := parseDSN(dsn)
	return err
}

func parseDSN(dsn string) (*pgxpool.Config, error) {
	if dsn == "" {
		return nil, errors.New("audit: no PostgreSQL connection string (--postgres, or HERMES_AUDIT_POSTGRES)")
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("audit: the PostgreSQL connection string: %s", parseProblem(err))
	}
	return cfg, nil
}

// parseProblem says what pgx found wrong with a connection string without quoting the string:
// its masking of passwords is best effort (a blank around '=', a URL it cannot parse).
func parseProblem(err error) string {
	var pce *pgconn.ParseConfigError
	if !errors.As(err, &pce) {
		return "cannot be parsed"
	}
	bare := *pce
	bare.ConnString = ""
	msg := bare.Error() // "cannot parse ``: MSG" or "cannot parse ``: MSG (INNER)"
	if inner := errors.Unwrap(pce); inner != nil {
		msg = strings.TrimSuffix(msg, " ("+inner.Error()+")")
		var ue *url.Error
		var ne *strconv.NumError
		switch {
		case errors.As(inner, &ue): // it quotes the URL
			msg += " (" + ue.Err.Error() + ")"
		case errors.As(inner, &ne): // a number's field: a port, a timeout
			msg += " (" + ne.Err.Error() + ")"
		case !strings.ContainsAny(inner.Error(), "\"'`"): // quoting nothing of the string
			msg += " (" + inner.Error() + ")"
		}
	}
	return "cannot be parsed: " + strings.TrimPrefix(msg, "cannot parse ``: ")
}

// Where names the database a configuration connects to, without its password.
func Where(cfg *pgxpool.Config) string {
	c := cfg.ConnConfig
	return fmt.Sprintf("postgres://%s@%s:%d/%s", c.User, c.Host, c.Port, c.Database)
}

// Run projects the record until ctx ends. It returns an error only for what waiting cannot
// mend: a configuration it cannot use, a database whose schema is newer than it knows.
func (s *Service) Run(ctx context.Context) error {
	if err := s.Validate(); err != nil {
		return err
	}
	log := s.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := s.Metrics
	if m == nil {
		m = NewMetrics(nil)
	}
	cfg, _ := s.poolConfig()
	where := Where(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg) // connects when first used
	if err != nil {
		return fmt.Errorf("audit: %s: %w", where, err)
	}
	defer pool.Close()
	for n := 0; ; n++ {
		from, to, err := Migrate(ctx, pool)
		if err == nil {
			m.Up.Set(1)
			log.Info("audit database ready", "db", where, "schema_was", from, "schema", to)
			break
		}
		m.Up.Set(0)
		if errors.Is(err, ErrSchemaNewer) || errors.Is(err, ErrEncoding) {
			return err
		}
		d := backoff(n)
		log.Warn("audit database unreachable; trying again", "db", where, "in", d.String(), "err", err)
		if !retry.Sleep(ctx, d) {
			return nil
		}
	}
	st := &store{trust: s.Bus, redriven: s.Bus.Layout().SubjectRedrivenResult, noIntent: s.NoIntents}
	var wg sync.WaitGroup
	for k := range s.Bus.Streams {
		name := s.Bus.Streams[k].CachedInfo().Config.Name
		p := &projector{Service: s, k: k, name: name, st: st, m: m, log: log.With("stream", name), where: where, conn: cfg.ConnConfig}
		wg.Go(func() { p.run(ctx) })
	}
	wg.Wait()
	return nil
}

// backoff is the wait before try n+1 of something that failed n+1 times: 1 s doubling to 30 s.
func backoff(n int) time.Duration {
	return min(time.Second<<min(n, 5), 30*time.Second)
}

// projector projects one record stream. It writes through a connection of its own that holds
// the stream's advisory lock (lockKey): of the audits that share a database, one writes each
// stream at a time, in the stream's order, and the others stand by.
type projector struct {
	*Service
	k     int
	name  string // the stream's
	st    *store
	m     *Metrics
	log   *slog.Logger
	where string
	// conn configures the connections it writes through; db is the one that holds the lock,
	// nil when none does.
	conn *pgx.ConnConfig
	db   *pgx.Conn
	// consumer is the stream's audit consumer, once found (for the lag).
	consumer atomic.Pointer[jetstream.Consumer]
	// holding is the stored time (Unix nanoseconds) of the oldest message held unwritten; 0
	// when none is. wrote is when the last batch was written.
	holding, wrote atomic.Int64
}

// The advisory lock of a stream: lockClass ("HRMS") and the stream's FNV-1a hash.
const lockClass = 0x48524d53

func lockKey(stream string) int32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(stream))
	return int32(h.Sum32())
}

// Stand-by and try bounds.
const (
	// standBy is how often an audit that another holds a stream's lock against asks again.
	standBy = 5 * time.Second
	// tryTimeout bounds one write of a batch (connecting included): well within the
	// consumer's ack wait, so a batch held through a slow database stays this audit's.
	tryTimeout = 10 * time.Second
)

// lock makes sure p writes through a live connection that holds the stream's lock: false when
// another audit holds it (p stands by), an error when the database cannot be reached.
func (p *projector) lock(ctx context.Context) (bool, error) {
	if p.db != nil && !p.db.IsClosed() {
		return true, nil
	}
	p.unlock()
	ctx, cancel := context.WithTimeout(ctx, tryTimeout)
	defer cancel()
	db, err := pgx.ConnectConfig(ctx, p.conn)
	if err != nil {
		return false, err
	}
	for _, set := range keepalives {
		_, _ = db.Exec(ctx, set)
	}
	var got bool
	if err := db.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, $2)", int32(lockClass), lockKey(p.name)).Scan(&got); err != nil || !got {
		_ = db.Close(ctx)
		return false, err
	}
	p.db = db
	return true, nil
}

// keepalives tell the server to notice a client gone silent within about half a minute, so
// that the stream's lock a projector holds does not outlive it for the operating system's
// default of some two hours. Set once connected, not at the start (a pooler such as PgBouncer
// refuses startup parameters it does not know), and let fail: an older server lacks the last.
var keepalives = []string{"SET tcp_keepalives_idle = 15", "SET tcp_keepalives_interval = 5", "SET tcp_keepalives_count = 3", "SET tcp_user_timeout = 30000"}

// unlock closes p's connection, which gives its lock back.
func (p *projector) unlock() {
	if p.db != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = p.db.Close(ctx)
		cancel()
		p.db = nil
	}
}

func (p *projector) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { p.watchLag(ctx) })
	defer wg.Wait()
	defer p.unlock()
	standing := false
	for n := 0; ctx.Err() == nil; n++ {
		began := time.Now().UnixNano()
		got, err := p.lock(ctx)
		if err == nil && !got {
			if !standing {
				p.log.Info("audit: another audit writes this stream; standing by", "db", p.where)
				standing = true
			}
			if !retry.Sleep(ctx, standBy) {
				return
			}
			n = -1
			continue
		}
		if standing && got {
			p.log.Info("audit: writing this stream", "db", p.where)
			standing = false
		}
		if err == nil {
			var c jetstream.Consumer
			if c, err = p.Bus.AuditConsumer(ctx, p.k); err == nil {
				p.consumer.Store(&c)
				err = p.consume(ctx, c)
			}
		}
		if ctx.Err() != nil {
			return
		}
		if p.wrote.Load() > began {
			n = 0 // it wrote since it last began: a first failure again
		}
		d := backoff(n)
		p.log.Warn("audit: projecting stopped; starting again", "in", d.String(), "err", err)
		if !retry.Sleep(ctx, d) {
			return
		}
	}
}

// errLockLost says another audit took the stream over while this one could not reach the
// database: the batch it held is given back.
var errLockLost = errors.New("audit: another audit writes this stream now")

// consume fetches batches from c and writes them until ctx ends, the consumer fails, or
// another audit takes the stream over. A batch is fetched only once the one before is written:
// nothing waits unheld in a buffer.
func (p *projector) consume(ctx context.Context, c jetstream.Consumer) error {
	size := p.Batch
	if size <= 0 {
		size = DefaultBatch
	}
	linger := p.Linger
	if linger <= 0 {
		linger = DefaultLinger
	}
	batch := make([]jetstream.Msg, 0, size)
	for {
		// The first message of a batch is waited for as long as it takes (in turns of 30 s);
		// the rest for linger at most (all at once when the stream holds them).
		batch = batch[:0]
		for len(batch) == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			turn, cancel := context.WithTimeout(ctx, 30*time.Second) // Fetch takes a context or a wait, not both
			first, err := c.Fetch(1, jetstream.FetchContext(turn))   // a Fetch of more waits for all of them
			if err != nil {
				cancel()
				return err
			}
			for msg := range first.Messages() {
				batch = append(batch, msg)
			}
			cancel()
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err := first.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
				return err // the consumer deleted, or the connection lost: opened again
			}
			if len(batch) == 0 {
				// A turn with nothing: the consumer must still be there (a pull on one
				// deleted meanwhile may wait unanswered).
				if _, err := c.Info(ctx); err != nil {
					return err
				}
			}
		}
		if len(batch) < size {
			more, err := c.Fetch(size-len(batch), jetstream.FetchMaxWait(linger))
			if err == nil {
				for msg := range more.Messages() {
					batch = append(batch, msg)
				}
			}
		}
		if err := p.commit(ctx, batch); err != nil {
			return err
		}
	}
}

// commit writes batch until it is written, then acknowledges it. A write is let finish when ctx
// ends during it; after that, or when another audit took the stream over meanwhile, the batch
// is left (delivered again) and the reason returned.
func (p *projector) commit(ctx context.Context, batch []jetstream.Msg) error {
	recs := make([]Record, 0, len(batch))
	for _, msg := range batch {
		r := Record{Stream: p.name, Subject: msg.Subject(), Data: msg.Data()}
		if md, err := msg.Metadata(); err == nil {
			r.Seq, r.Stored = md.Sequence.Stream, md.Timestamp
		}
		recs = append(recs, r)
	}
	p.holding.Store(recs[0].Stored.UnixNano())
	defer p.holding.Store(0)
	for n := 0; ; n++ {
		start := time.Now()
		held := keepHeld(batch)
		w, err := p.try(ctx, recs)
		held()
		if err == nil {
			p.m.Batches.WithLabelValues("ok").Observe(time.Since(start).Seconds())
			p.m.Up.Set(1)
			p.m.Records.WithLabelValues("projected").Add(float64(w.projected))
			p.m.Records.WithLabelValues("error").Add(float64(w.failed))
			if w.failed > 0 {
				p.log.Warn("audit: records it could not project are in hermes_audit_errors", "count", w.failed)
			}
			if n > 0 {
				p.log.Info("audit database takes writes again", "db", p.where)
			}
			for _, msg := range batch {
				_ = msg.Ack() // lost: delivered again, and written again to no effect
			}
			// The lag as this batch leaves it: what the stream holds beyond it, and how old
			// its oldest message was when its row was written.
			name := p.name
			if md, err := batch[len(batch)-1].Metadata(); err == nil {
				p.m.Lag.WithLabelValues(name).Set(float64(md.NumPending))
			}
			p.m.LagSeconds.WithLabelValues(name).Set(time.Since(recs[0].Stored).Seconds())
			p.wrote.Store(time.Now().UnixNano())
			return nil
		}
		p.m.Batches.WithLabelValues("retry").Observe(time.Since(start).Seconds())
		giveBack := func() {
			for _, msg := range batch {
				_ = msg.Nak() // delivered again: to the audit that writes the stream then
			}
		}
		if errors.Is(err, errLockLost) {
			giveBack()
			return err
		}
		if ctx.Err() != nil {
			giveBack()
			return ctx.Err()
		}
		if n+1 >= holdTries {
			// Held no longer: an audit standing by, which may reach the database, takes the
			// stream over and this batch with it; this one tries again later, from its lock.
			giveBack()
			p.unlock()
			return fmt.Errorf("audit: %d tries to write a batch failed; gave it back: %w", holdTries, err)
		}
		p.m.Up.Set(0)
		// At most a third of the consumer's ack wait (30 s) between tries: the batch is held
		// meanwhile, kept from being delivered to another audit.
		d := min(backoff(n), 8*time.Second)
		p.log.Warn("audit: writing to the database failed; trying again", "db", p.where, "messages", len(batch), "in", d.String(), "err", err)
		for _, msg := range batch {
			_ = msg.InProgress()
		}
		if !retry.Sleep(ctx, d) {
			giveBack()
			return ctx.Err()
		}
	}
}

// keepHeld tells the consumer every 10 s, until the function it returns is called, that batch is
// still being written (a try that looks for refused records may outlast the ack wait).
func keepHeld(batch []jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				for _, msg := range batch {
					_ = msg.InProgress()
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// holdTries is how many tries of a batch an audit makes before it gives the batch back (7 s of
// waits between them, each try at most tryTimeout).
const holdTries = 4

// try writes recs once, through the connection that holds the stream's lock, within
// tryTimeout (looking for records the database refuses, each transaction within it); a write
// begun is let finish when ctx ends. errLockLost: another audit holds the lock now.
func (p *projector) try(ctx context.Context, recs []Record) (written, error) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tryTimeout)
	defer cancel()
	got, err := p.lock(wctx)
	switch {
	case err != nil:
		return written{}, err
	case !got:
		return written{}, errLockLost
	}
	w, err := p.st.write(wctx, p.db, recs)
	if err != nil && (p.db.IsClosed() || wctx.Err() != nil) {
		p.unlock() // a connection cut, or one that does not answer: the next try dials anew
	}
	return w, err
}

// watchLag reads the consumer's backlog every few seconds, for the metrics.
func (p *projector) watchLag(ctx context.Context) {
	name := p.name
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		backlog := -1.0 // unknown
		if c := p.consumer.Load(); c != nil {
			ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
			if info, err := (*c).Info(ictx); err == nil {
				backlog = float64(info.NumPending) + float64(info.NumAckPending)
				p.m.Lag.WithLabelValues(name).Set(backlog)
			}
			cancel()
		}
		if held := p.holding.Load(); held > 0 {
			p.m.LagSeconds.WithLabelValues(name).Set(time.Since(time.Unix(0, held)).Seconds())
		} else if backlog == 0 && time.Since(time.Unix(0, p.wrote.Load())) > 2*time.Second {
			p.m.LagSeconds.WithLabelValues(name).Set(0) // nothing held, nothing left: caught up
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
