package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/internal/fastlane"
	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/internal/router"
	"github.com/hermesbus/hermes/internal/service"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// common holds the flags every service shares.
type common struct {
	natsURL  string
	natsAuth natsAuth
	// cli: a command-line tool, which connects as hermes up's admin when given no credentials
	// (natsAuth.cliOptions).
	cli         bool
	instance    string
	logLevel    string
	metricsAddr string
	replicas    int
	stateTTL    time.Duration
	// recordMaxMsgs bounds the record (bus.Config.MaxMsgs).
	recordMaxMsgs int64
	limits        protocol.Limits
	deadLetters   bool
	noProvision   bool
	recordBytes   int64
	// partitions is what --partitions said; 0 when it was not given (DefaultPartitions).
	partitions int
	// streams is what --streams said; 0 when it was not given (1, or the record's).
	streams    int
	deadBytes  int64
	stateBytes int64
	// seals are the service's --seal-key and --trusted-seals (registerSeals).
	seals sealFlags
	// sealKey is the key --seal-key named, read as the service starts (nil: none).
	sealKey *router.SealKey
	// trust is what --trusted-seals named, read as the service starts.
	trust trust
}

// registerSeals gives a service of role the flags --seal-key and --trusted-seals.
func (c *common) registerSeals(fs *flag.FlagSet, role bus.Role) { c.seals.register(fs, role) }

func (c *common) register(fs *flag.FlagSet, role string) {
	fs.StringVar(&c.natsURL, "nats", envOr(bus.EnvURL, bus.DefaultURL), "NATS server URL (env "+bus.EnvURL+")")
	c.natsAuth.register(fs, serviceRoles[role])
	fs.StringVar(&c.instance, "instance", defaultInstance(role), "name of this instance in the messages it sends")
	fs.StringVar(&c.metricsAddr, "metrics", os.Getenv("HERMES_METRICS"), "serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9464 (env HERMES_METRICS); the gateway and hermes up also serve /metrics on their HTTP port")
	fs.StringVar(&c.logLevel, "log-level", envOr("HERMES_LOG_LEVEL", "info"), "debug, info, warn or error (env HERMES_LOG_LEVEL)")
	fs.IntVar(&c.replicas, "replicas", 1, "replicas of the stream and KV buckets (3 on a cluster)")
	fs.DurationVar(&c.stateTTL, "state-ttl", 24*time.Hour, "how long claims and serial order are kept (applies when the buckets are first created)")
	fs.Int64Var(&c.recordMaxMsgs, "record-max-msgs", -1, "most messages the record keeps, -1 for no limit (applies when the stream is first created); bounds the server's memory for the record's subjects; gateways refuse new requests at 90 % of it")
	c.limits.MaxToolCalls = protocol.DefaultLimits.MaxToolCalls
	fs.Func("max-tool-calls", fmt.Sprintf("most tool calls one request may carry, 1 to %d (default %d)", protocol.MaxElements, protocol.DefaultLimits.MaxToolCalls), func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > protocol.MaxElements {
			return fmt.Errorf("must be a number from 1 to %d (what one bus message may hold)", protocol.MaxElements)
		}
		c.limits.MaxToolCalls = n
		return nil
	})
	fs.Int64Var(&c.recordBytes, "record-max-bytes", bus.DefaultRecordMaxBytes, "most bytes the record keeps (applies when the stream is first created); gateways refuse new requests at 90 % of it, so that accepted ones finish; -1 for no limit")
	fs.Int64Var(&c.deadBytes, "dead-letters-max-bytes", 1<<30, "most bytes the dead-letter stream keeps, oldest dropped beyond (applies when first created)")
	fs.Int64Var(&c.stateBytes, "state-max-bytes", 512<<20, "most bytes each state bucket (plans, claims, serial order, owners) keeps (applies when first created); gateways refuse new requests at 90 % of the plans'")
	fs.Func("partitions", fmt.Sprintf("partitions the record spreads requests over by session, 1 to %d: how many requests the deployment routes at once "+
		"(applies when the stream is first created; hermes provision --partitions changes it); default 4 per core of this machine, at least %d (%d here)",
		protocol.MaxRequestPartitions, protocol.DefaultRequestPartitions, bus.DefaultPartitions()), func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > protocol.MaxRequestPartitions {
			return fmt.Errorf("must be a number from 1 to %d", protocol.MaxRequestPartitions)
		}
		c.partitions = n
		return nil
	})
	fs.Func("streams", fmt.Sprintf("streams the record is kept in, 1 to %d, each session whole in one: on a cluster, their leaders spread the storing over the nodes "+
		"(applies when the record is first created; the partitions must be a multiple of it); default 1", protocol.MaxRecordStreams), func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > protocol.MaxRecordStreams {
			return fmt.Errorf("must be a number from 1 to %d", protocol.MaxRecordStreams)
		}
		c.streams = n
		return nil
	})
	fs.BoolVar(&c.noProvision, "no-provision", os.Getenv("HERMES_NO_PROVISION") == "true",
		"create or change no stream, bucket or fixed consumer: they were set up by hermes provision, and this service may lack the right to (env HERMES_NO_PROVISION=true)")
	fs.IntVar(&c.limits.MaxArgumentsBytes, "max-arguments-bytes", protocol.DefaultLimits.MaxArgumentsBytes, "largest arguments of one call, in bytes")
	fs.IntVar(&c.limits.MaxIntentBytes, "max-intent-bytes", protocol.DefaultLimits.MaxIntentBytes, "largest intent, in bytes")
}

// serviceRoles are the NATS roles of the services, by the name register is given: each
// connects with its role's inbox unless --nats-inbox says otherwise.
var serviceRoles = map[string]bus.Role{"router": bus.RoleRouter, "dead-letters": bus.RoleRouter, "toolworker": bus.RoleWorker, "gateway": bus.RoleGateway, "eraser": bus.RoleEraser, "audit": bus.RoleAuditor}

func (c *common) busConfig() bus.Config {
	return bus.Config{Replicas: c.replicas, StateTTL: c.stateTTL, MaxMsgs: c.recordMaxMsgs, NoProvision: c.noProvision,
		MaxBytes: c.recordBytes, DeadLetterMaxBytes: c.deadBytes, StateMaxBytes: c.stateBytes, Partitions: c.partitions, Streams: c.streams}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// defaultInstance is role-host-pid: unique per process, readable in logs.
func defaultInstance(role string) string {
	host, _ := os.Hostname()
	host = sanitize(host)
	if host == "" {
		host = "host"
	}
	return fmt.Sprintf("%s-%s-%d", role, host, os.Getpid())
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == '.':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// newFlagSet returns a flag set that reports errors instead of exiting.
func newFlagSet(name, usage string, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: %s\n\nFlags:\n", usage)
		fs.PrintDefaults()
	}
	return fs
}

// listFlag collects a comma-separated or repeated flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// resolveFlag collects host:port=host:port pairs.
type resolveFlag map[string]string

func (r resolveFlag) String() string {
	var parts []string
	for k, v := range r {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

func (r resolveFlag) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		from, to, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok || from == "" || to == "" {
			return fmt.Errorf("want host:port=host:port, got %q", p)
		}
		r[from] = to
	}
	return nil
}

// dial connects to the configured NATS server and provisions the bus.
// dialAsCLI parses a command-line tool's flags and connects as it (as hermes up's admin when
// given no credentials: cliOptions).
func (c *common) dialAsCLI(ctx context.Context, fs *flag.FlagSet, args []string, env Env) (*nats.Conn, *bus.Bus, error) {
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	log, err := newLogger(env.Stderr, c.logLevel)
	if err != nil {
		return nil, nil, err
	}
	c.cli = true
	return c.dial(ctx, log)
}

func (c *common) dial(ctx context.Context, log *slog.Logger) (*nats.Conn, *bus.Bus, error) {
	options := c.natsAuth.options
	if c.cli {
		options = c.natsAuth.cliOptions
	}
	opts, err := options()
	if err != nil {
		return nil, nil, err
	}
	return Connect(ctx, c.natsURL, c.instance, c.busConfig(), log, opts...)
}

// natsAuth holds how a command authenticates to NATS: the flags every command that connects
// takes.
type natsAuth struct{ c bus.Credentials }

// Environment variables of the NATS credential flags.
const (
	envNATSNKey  = "HERMES_NATS_NKEY"
	envNATSCreds = "HERMES_NATS_CREDS"
	envNATSInbox = "HERMES_NATS_INBOX"
)

// register adds the credential flags; a service of role connects with role's inbox by
// default (bus.RoleInbox), a command-line tool ("" for role) with none.
func (a *natsAuth) register(fs *flag.FlagSet, role bus.Role) {
	inbox := ""
	if role != "" {
		inbox = bus.RoleInbox(role)
	}
	fs.StringVar(&a.c.NKeyFile, "nats-nkey", os.Getenv(envNATSNKey), "file holding the nkey seed of this service's NATS user (hermes nats-auth writes one per user; hermes up keeps its own in DATA/nats) (env "+envNATSNKey+")")
	fs.StringVar(&a.c.CredsFile, "nats-creds", os.Getenv(envNATSCreds), "NATS user credentials file (JWT and seed), for servers in operator mode (env "+envNATSCreds+")")
	fs.StringVar(&a.c.CAFile, "nats-ca", os.Getenv("HERMES_NATS_CA"), "CA certificate that verifies the NATS server's, for TLS (env HERMES_NATS_CA)")
	fs.StringVar(&a.c.CertFile, "nats-cert", os.Getenv("HERMES_NATS_CERT"), "client certificate for NATS servers that verify clients (env HERMES_NATS_CERT; with --nats-key)")
	fs.StringVar(&a.c.KeyFile, "nats-key", os.Getenv("HERMES_NATS_KEY"), "key of --nats-cert (env HERMES_NATS_KEY)")
	fs.StringVar(&a.c.Inbox, "nats-inbox", envOr(envNATSInbox, inbox), "reply-subject prefix the NATS user's permissions name: a service role's _INBOX_<role> (each service's default), a worker made with nats-auth --worker NAME's or an external client's _INBOX_<NAME> (env "+envNATSInbox+")")
}

func (a *natsAuth) options() ([]nats.Option, error) { return a.c.Options() }

// defaultAdminSeed is where hermes up, run from the same directory with its default --data,
// keeps its admin user's seed.
var defaultAdminSeed = filepath.Join("hermes-data", "nats", string(bus.RoleAdmin)+".nk")

// cliOptions are options for a command-line tool: as given, or, when no credentials are,
// as the admin user of a hermes up run from this directory (its seed found in
// hermes-data/nats), so that hermes tail, replay, keys and dlq work beside it as they are.
func (a *natsAuth) cliOptions() ([]nats.Option, error) {
	if a.c.NKeyFile == "" && a.c.CredsFile == "" {
		if _, err := os.Stat(defaultAdminSeed); err == nil {
			c := a.c
			c.NKeyFile = defaultAdminSeed
			return c.Options()
		}
	}
	return a.c.Options()
}

// natsTarget is --nats and the credential flags, for the command-line tools.
type natsTarget struct {
	url  string
	auth natsAuth
}

// natsFlags registers --nats (default def, overridden by the environment when def is not
// empty) and the credential flags.
func natsFlags(fs *flag.FlagSet, def, usage string) *natsTarget {
	t := &natsTarget{}
	if def != "" {
		def = envOr(bus.EnvURL, def)
	}
	fs.StringVar(&t.url, "nats", def, usage)
	t.auth.register(fs, "")
	return t
}

// registerDeadLetters adds --dead-letters, on by default where def says.
func (c *common) registerDeadLetters(fs *flag.FlagSet, def bool) {
	fs.BoolVar(&c.deadLetters, "dead-letters", def, "also run the dead-letter processor in this process (any number may run; they share the work)")
}

// runService runs one Hermes service until ctx is done: it sets up metrics and trace export
// (named name), connects to NATS (provisioning unless told not to), builds the service's list
// with build, adds the dead-letter processor (--dead-letters) and the metrics listener
// (--metrics-addr) to it, logs running with build's attributes, and runs the list.
func (c *common) runService(ctx context.Context, name, running string, log *slog.Logger,
	build func(nc *nats.Conn, b *bus.Bus, obs *observer) (services *service.List, attrs []any, err error)) error {
	obs, err := observe(ctx, name)
	if err != nil {
		return err
	}
	defer obs.close()
	nc, b, err := c.dial(ctx, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	if c.seals.registered {
		k, t, err := c.seals.load()
		if err != nil {
			return err
		}
		if err := c.seals.apply(b, k, t, log); err != nil {
			return err
		}
		c.sealKey, c.trust = k, t
	}
	services, attrs, err := build(nc, b, obs)
	if err != nil {
		return err
	}
	if c.deadLetters {
		d, err := NewDeadLetters(b, c.instance, c.limits, obs.metrics, log)
		if err != nil {
			return err
		}
		services.Add(service.Back, service.Func("dead-letter processor", d.Run))
	}
	if c.metricsAddr != "" {
		// Bound before anything runs, so a taken port fails at once.
		ln, err := listen(c.metricsAddr, "metrics")
		if err != nil {
			return err
		}
		defer ln.Close() // should the services never start (one fails its validation)
		log.Info("metrics", "url", "http://"+ln.Addr().String()+"/metrics")
		services.Add(service.Back, service.Func("metrics", func(ctx context.Context) error {
			if err := metrics.Serve(ctx, ln, obs.reg); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		}))
	}
	log.Info(running, append(attrs, "instance", c.instance, "dead_letters", c.deadLetters, "nats", nc.ConnectedUrlRedacted(),
		"services", services.Names())...)
	return services.Run(ctx)
}

// one is a list of one service, in the back phase.
func one(s service.Service) *service.List {
	var l service.List
	l.Add(service.Back, s)
	return &l
}

// envInt is the integer in environment variable name, or def when it is unset; a value that
// is not an integer is def too here, and refused by badEnvInts.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// badEnvInts names the first of the variables set to something that is not an integer.
func badEnvInts(names ...string) error {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			if _, err := strconv.Atoi(v); err != nil {
				return fmt.Errorf("%s=%q: not an integer", n, v)
			}
		}
	}
	return nil
}

// fastFlags are the fast lane's flags: --fast-lane on every service that takes part (router,
// tool worker, gateway, hermes up), and the router's --fast-wait and --fast-buffer.
type fastFlags struct {
	on     bool
	wait   time.Duration
	buffer int
}

// register registers --fast-lane, and with router the router's flags too.
func (f *fastFlags) register(fs *flag.FlagSet, router bool) {
	fs.BoolVar(&f.on, "fast-lane", envOr("HERMES_FAST_LANE", "true") != "false",
		"answer requests whose calls only read on the fast lane: over request/reply, recorded right after the answer (env HERMES_FAST_LANE; false: every request takes the durable path)")
	if router {
		fs.DurationVar(&f.wait, "fast-wait", fastlane.DefaultCallWait, "how long a router waits for a worker's answer on the fast lane before the request takes the durable path")
		fs.IntVar(&f.buffer, "fast-buffer", fastlane.DefaultBuffer, "answered requests whose record may wait to be written at once; beyond it requests take the durable path")
	}
}

// router is the router's side of the flags.
func (f *fastFlags) router() (FastLaneConfig, error) {
	switch {
	case f.wait < 10*time.Millisecond || f.wait > time.Minute:
		return FastLaneConfig{}, fmt.Errorf("--fast-wait %s: give 10ms to 1m", f.wait)
	case f.buffer < 1 || f.buffer > 1_000_000:
		return FastLaneConfig{}, fmt.Errorf("--fast-buffer %d: give 1 to 1000000", f.buffer)
	}
	return FastLaneConfig{Off: !f.on, CallWait: f.wait, Buffer: f.buffer}, nil
}
