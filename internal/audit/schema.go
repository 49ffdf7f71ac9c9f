package audit

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/hermesbus/hermes/pkg/protocol"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migration is one step of the schema: the file NNNN_name.sql is version NNNN.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations are the schema's steps, in order.
func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, e := range entries {
		num, name, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("audit: migration file %s is not NNNN_name.sql", e.Name())
		}
		sql, err := migrationFiles.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: name, sql: string(sql)})
	}
	slices.SortFunc(out, func(a, b migration) int { return a.version - b.version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("audit: migration %d is missing (found %d)", i+1, m.version)
		}
	}
	return out, nil
}

// SchemaVersion is the version of the schema this Hermes writes: its last migration.
func SchemaVersion() int {
	m, err := migrations()
	if err != nil {
		panic(err) // embedded at build time; TestMigrationsAreNumbered keeps them in order
	}
	return len(m)
}

// migrationLock is the advisory lock the migrations run under: audit services starting
// together migrate one after another.
const migrationLock = 0x4845524d4553 // "HERMES"

// Migrate brings the database's schema to SchemaVersion: each missing migration runs in a
// transaction of its own, which also records it in hermes_audit_schema, under an advisory
// lock. A database whose schema is newer than this Hermes knows is refused (an older audit
// service would write rows the newer schema does not expect), and so is one whose encoding is
// not UTF8 (ErrEncoding). It returns the version found
// and the version now.
func Migrate(ctx context.Context, pool *pgxpool.Pool) (from, to int, err error) {
	steps, err := migrations()
	if err != nil {
		return 0, 0, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(migrationLock)); err != nil {
		return 0, 0, fmt.Errorf("audit: lock the schema: %w", err)
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", int64(migrationLock))
	}()
	var encoding string
	if err := conn.QueryRow(ctx, "SHOW server_encoding").Scan(&encoding); err != nil {
		return 0, 0, fmt.Errorf("audit: read the database's encoding: %w", err)
	}
	if encoding != "UTF8" {
		return 0, 0, fmt.Errorf("%w: it is %s; create the database WITH ENCODING 'UTF8'", ErrEncoding, protocol.Shorten(encoding, 64))
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS hermes_audit_schema (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return 0, 0, fmt.Errorf("audit: create the schema's version table: %w", err)
	}
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM hermes_audit_schema").Scan(&from); err != nil {
		return 0, 0, fmt.Errorf("audit: read the schema's version: %w", err)
	}
	if from > len(steps) {
		return from, from, fmt.Errorf("%w: the database is at version %d, this Hermes knows %d", ErrSchemaNewer, from, len(steps))
	}
	for _, m := range steps[from:] {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO hermes_audit_schema (version, name) VALUES ($1, $2)", m.version, m.name)
			return err
		})
		if err != nil {
			return from, m.version - 1, fmt.Errorf("audit: migration %d (%s): %w", m.version, m.name, err)
		}
	}
	return from, len(steps), nil
}
