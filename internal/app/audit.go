package app

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/internal/audit"
	"github.com/hermesbus/hermes/internal/service"
	"github.com/hermesbus/hermes/pkg/bus"
)

// AuditConfig configures the audit service (package audit): hermes audit, and hermes up
// --audit-postgres. Without a DSN none runs.
type AuditConfig struct {
	// DSN is PostgreSQL's connection string.
	DSN string
	// Batch and Linger are audit.Service's (0: its defaults).
	Batch  int
	Linger time.Duration
	// NoIntents is audit.Service's.
	NoIntents bool
}

// auditFlags are AuditConfig's flags.
type auditFlags struct{ AuditConfig }

// register adds the flags; dsnFlag names the connection string's ("postgres" for hermes audit,
// "audit-postgres" for hermes up).
func (f *auditFlags) register(fs *flag.FlagSet, dsnFlag string) {
	fs.StringVar(&f.DSN, dsnFlag, os.Getenv("HERMES_AUDIT_POSTGRES"), "PostgreSQL connection string (postgres://user@host:5432/db, or key=value pairs) the audit projects the record into; "+
		"its password is better given by PGPASSWORD or ~/.pgpass than here (env HERMES_AUDIT_POSTGRES)")
	fs.IntVar(&f.Batch, "audit-batch", audit.DefaultBatch, "most messages the audit writes in one transaction")
	fs.DurationVar(&f.Linger, "audit-linger", audit.DefaultLinger, "how long the audit waits for a batch to fill once its first message is in")
	fs.BoolVar(&f.NoIntents, "audit-no-intents", false, "keep no request's intent in hermes_requests (by default a native request's is kept as its caller wrote it, at most 512 bytes; a chat's or MCP's never)")
}

// service builds the audit service on b (connected as the bus role auditor).
func (f *AuditConfig) service(b *bus.Bus, m *audit.Metrics, log *slog.Logger) (*audit.Service, error) {
	s := &audit.Service{Bus: b, DSN: f.DSN, Batch: f.Batch, Linger: f.Linger, NoIntents: f.NoIntents, Metrics: m, Logger: orDiscard(log).With("service", "audit")}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return s, nil
}

// RunAudit runs the audit service alone: hermes audit --postgres DSN. Any number may run
// against one database: they share the audit's consumers.
func RunAudit(ctx context.Context, args []string, env Env) error {
	fs := newFlagSet("audit", "hermes audit --postgres DSN [flags]", env.Stderr)
	var c common
	c.register(fs, "audit")
	var f auditFlags
	f.register(fs, "postgres")
	trusted := fs.String("trusted-seals", os.Getenv("HERMES_TRUSTED_SEALS"), "file of trusted public seal keys (hermes seal-key prints them), as the routers have it: "+
		"a result counts for its call only when a key trusted for its tool sealed it, and the others become rows of hermes_audit_errors (env HERMES_TRUSTED_SEALS)")
	log, err := parse(fs, args, env, &c.logLevel)
	if err != nil {
		return err
	}
	if f.DSN == "" {
		return fmt.Errorf("hermes audit: --postgres (or HERMES_AUDIT_POSTGRES) names the database to write to")
	}
	if err := audit.CheckDSN(f.DSN); err != nil {
		return err
	}
	var t trust
	if *trusted != "" {
		if t, err = readTrust(*trusted); err != nil {
			return err
		}
	}
	return c.runService(ctx, "hermes-audit", "audit running", log, func(_ *nats.Conn, b *bus.Bus, obs *observer) (*service.List, []any, error) {
		if t.results != nil {
			b.TrustResults(t.results)
		} else {
			log.Warn("results' seals are not checked: give --trusted-seals (the routers' file) to keep results no trusted key sealed out of the audit")
		}
		s, err := f.service(b, audit.NewMetrics(obs.reg), log)
		if err != nil {
			return nil, nil, err
		}
		return one(s), []any{"batch", f.Batch}, nil
	})
}
