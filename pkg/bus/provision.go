package bus

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Durable consumer names.
const (
	ConsumerRouterResults = "router-results"
	// ConsumerDeadLetters reads the advisories of messages given up on by any Hermes consumer.
	ConsumerDeadLetters = "dead-letters"
	// ConsumerTimers reads the timers that went off, to wake what was parked for them.
	ConsumerTimers = "park-timers"
	// ConsumerClients reads the requests external NATS clients publish
	// (protocol.ClientStreamName), shared by every gateway, one at a time: a session's requests
	// are submitted in the order they were published.
	ConsumerClients = "gateway-clients"
	// ConsumerSummarizer reads the model's decisions (hermes.event.llm.*) for the summarizer,
	// shared by every process that runs one.
	ConsumerSummarizer = "summarizer"
)

// KV buckets.
const (
	// BucketCalls holds each request's plan (key <request_id>), written with Create when the
	// request is accepted (or by the first router to take a request published without one).
	// Plans live as long as the record keeps a request's results and response, so a reused
	// request_id is recognised for as long as its first run can be read back.
	BucketCalls = "hermes-calls"
	// BucketTools lists the tools that have a consumer (key protocol.KeyTool: <kind>.<tool>).
	BucketTools = "hermes-tools"
	// BucketClaims is the call ledger: which worker runs each call (key
	// <request_id>.<tool_call_id>), renewed while it runs, and the last failure of the call.
	BucketClaims = "hermes-claims"
	// BucketSessions orders serial requests: per session the last serial request accepted
	// (protocol.KeySerialTail) and per serial request its predecessor (KeySerialPrev).
	BucketSessions = "hermes-sessions"
	// BucketParked holds the messages parked until something wakes them (package park), under
	// protocol.KeyParked. It has no TTL: a parked message leaves only when it is woken.
	BucketParked = "hermes-parked"
	// BucketContracts holds tools' contracts (package registry), one key per tool, each
	// registration a revision: the last ContractHistory versions stay readable.
	BucketContracts = "hermes-contracts"
)

// KVStream names the stream JetStream keeps a key-value bucket in.
func KVStream(bucket string) string { return "KV_" + bucket }

// KVSubject is the subject under which bucket keeps key, in its stream.
func KVSubject(bucket, key string) string { return "$KV." + bucket + "." + key }

// RequestConsumer names the durable consumer of request partition p (0 ≤ p < Bus.Partitions),
// shared by every router. It has at most one message in flight, so
// a partition's requests are handled one after another, in stream order, even across routers
// and redeliveries.
func RequestConsumer(p int) string { return requestConsumerPrefix + strconv.Itoa(p) }

const requestConsumerPrefix = "router-requests-"

// ToolConsumer names the durable consumer shared by every worker running tool's calls of
// kind: tool_<kind>-<tool> (no kind holds '-').
func ToolConsumer(kind, tool string) string { return "tool_" + kind + "-" + tool }

// Config sizes the stream, the KV buckets and the consumers. The zero value is usable: see
// the defaults on each field.
type Config struct {
	// Replicas of the stream and buckets: 1 on one server, 3 in a cluster. Default 1.
	Replicas int
	// MaxAge of the record. Default 7 days.
	MaxAge time.Duration
	// MaxBytes of the record. At the limit new messages are refused (nothing stored is
	// dropped, work not yet done included): the gateway stops accepting requests before, at
	// IntakeStopsAt of it, so that accepted ones can still finish. -1: no limit. Default
	// DefaultRecordMaxBytes.
	MaxBytes int64
	// DeadLetterMaxBytes bounds the dead-letter stream (oldest dropped beyond it). Default
	// 1 GiB.
	DeadLetterMaxBytes int64
	// StateMaxBytes bounds each state bucket (plans, claims, serial order); full, it refuses
	// new entries. Default 512 MiB.
	StateMaxBytes int64
	// MaxMsgs of the record; oldest messages are discarded beyond it. The server keeps every
	// subject of a stream in memory (about 190 bytes each), and each request adds subjects of
	// its own (its response, each call's result), so this bounds that memory whatever the
	// request rate — but the record is also the work queue: beyond the limit, requests, calls
	// and results not yet handled are dropped too, and wait for an answer forever. Default
	// unlimited (-1): the record is bounded by MaxAge, its memory by the request rate.
	MaxMsgs int64
	// DuplicateWindow within which a republished Nats-Msg-Id is dropped. It must cover the
	// longest retry horizon. Default 10 minutes.
	DuplicateWindow time.Duration
	// StateTTL is how long claims and serial order are kept in KV. Plans, and so request ids,
	// are kept an hour longer than the longer of StateTTL and MaxAge: a repeated request_id is
	// answered from its first run for as long as the record keeps that run. Default 24 hours.
	StateTTL time.Duration
	// AckWait is the fixed ack deadline of every consumer; long handlers signal progress.
	// Default 30 s.
	AckWait time.Duration
	// MaxDeliver bounds deliveries of one message by a consumer. Default 20.
	MaxDeliver int
	// MaxAckPending bounds unacked messages of one consumer across all its workers. Default 1024.
	MaxAckPending int
	// DeadLetterMaxAge is how long dead letters are kept. Default 30 days.
	DeadLetterMaxAge time.Duration
	// ParkedMaxBytes bounds the parked messages; parking more fails (and is retried) rather
	// than drop one. Default 1 GiB.
	ParkedMaxBytes int64
	// OpenOnly makes Provision open what exists and create or change nothing, failing when
	// something is missing: for clients (the command line) that must not shape a deployment
	// with their own settings.
	OpenOnly bool
	// NoProvision makes Provision open the streams, buckets and fixed consumers as OpenOnly
	// does — they are set up beforehand, by hermes provision, so services run without the
	// right to create or change them — while the bus still creates each tool's consumer as
	// routes name new tools (EnsureToolConsumer).
	NoProvision bool
	// Buckets are the application's own buckets, provisioned with Hermes' (Bucket).
	Buckets []Bucket
	// Partitions is how many partitions the record spreads requests over, by session, when it
	// is first created (1 to protocol.MaxRequestPartitions): how many requests the deployment
	// routes at once. An existing record keeps its own (a difference is reported in Drift);
	// Repartition changes it. Default DefaultPartitions, rounded up to a multiple of Streams.
	Partitions int
	// Streams is how many streams the record is kept in when it is first created (1 to
	// protocol.MaxRecordStreams; protocol.Layout): each session whole in one, sessions spread
	// over them, so that on a cluster their leaders, and the work of storing, spread over the
	// nodes. Partitions must be a multiple of it. An existing record keeps its own (a
	// difference is reported in Drift); Restream changes it. Default 1.
	Streams int
}

// DefaultPartitions sizes the request partitions to this process's cores (GOMAXPROCS, which
// follows a container's CPU limit): 4 per core, at least protocol.DefaultRequestPartitions and
// at most protocol.MaxRequestPartitions. A partition routes one request at a time; measured on
// two cores with the CPU saturated (BENCHMARKS.md, "Throughput and cores"), about 1.9
// partitions per core are busy (355 requests a second per core, each holding its partition
// 5.4 ms), so 4 per core leave room; more cost throughput, each partition being a consumer the
// server keeps up (and, on a cluster, a replicated one).
func DefaultPartitions() int {
	return min(protocol.MaxRequestPartitions, max(protocol.DefaultRequestPartitions, 4*runtime.GOMAXPROCS(0)))
}

// DefaultRecordMaxBytes is the record's byte limit where none is configured.
const DefaultRecordMaxBytes = 8 << 30

// IntakeStopsAt is the share of a byte limit (of the record, or of the plans' bucket) at which
// gateways stop accepting requests: what is left lets accepted requests finish.
const IntakeStopsAt = 0.9

// ContractHistory is how many versions of a tool's contract stay readable (JetStream's most).
const ContractHistory = 64

// Byte limits of the small buckets and the timers: far above what they hold, a bound all the
// same.
const (
	smallBucketMaxBytes = 16 << 20
	contractsMaxBytes   = 256 << 20
	timersMaxBytes      = 256 << 20
)

// StoreBytes is what the streams and buckets of cfg may hold together on one server (each node
// of a cluster holds its replica): what its JetStream file store (max_file_store) must allow, at
// least.
func StoreBytes(cfg Config) int64 {
	cfg = cfg.withDefaults()
	total := int64(timersMaxBytes) + cfg.ParkedMaxBytes + 3*cfg.StateMaxBytes + smallBucketMaxBytes + contractsMaxBytes + clientsMaxBytes
	for _, b := range cfg.Buckets {
		total += b.MaxBytes
	}
	for _, n := range []int64{cfg.MaxBytes, cfg.DeadLetterMaxBytes} {
		if n > 0 {
			total += n
		}
	}
	return total
}

// intakeMargin is how much longer plans, and so request ids, are remembered than what the
// record keeps of their request: longer than any request runs.
const intakeMargin = time.Hour

// advisorySubjects are the advisories the server publishes when a consumer of one of the
// record's streams gives a message up; the dead-letter stream captures them, so none is lost
// while no processor runs.
func advisorySubjects(l protocol.Layout) []string {
	var out []string
	for k := range l.Streams() {
		out = append(out,
			"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."+protocol.RecordStream(k)+".*",
			"$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED."+protocol.RecordStream(k)+".*")
	}
	return out
}

// WithDefaults returns c with the defaults of its zero fields filled in.
func WithDefaults(c Config) Config { return c.withDefaults() }

func (c Config) withDefaults() Config {
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 7 * 24 * time.Hour
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultRecordMaxBytes
	}
	if c.DeadLetterMaxBytes == 0 {
		c.DeadLetterMaxBytes = 1 << 30
	}
	if c.StateMaxBytes == 0 {
		c.StateMaxBytes = 512 << 20
	}
	if c.MaxMsgs == 0 {
		c.MaxMsgs = -1
	}
	if c.DuplicateWindow <= 0 {
		c.DuplicateWindow = 10 * time.Minute
	}
	if c.StateTTL <= 0 {
		c.StateTTL = 24 * time.Hour
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.ParkedMaxBytes <= 0 {
		c.ParkedMaxBytes = 1 << 30
	}
	if c.MaxDeliver <= 0 {
		c.MaxDeliver = 20
	}
	if c.MaxAckPending <= 0 {
		c.MaxAckPending = 1024
	}
	if c.DeadLetterMaxAge <= 0 {
		c.DeadLetterMaxAge = 30 * 24 * time.Hour
	}
	if c.Partitions == 0 {
		// A multiple of the streams (each partition lies in one): rounded up, or down where
		// up is beyond the most.
		s := max(c.Streams, 1)
		c.Partitions = DefaultPartitions()
		if c.Partitions%s != 0 {
			c.Partitions += s - c.Partitions%s
		}
		if c.Partitions > protocol.MaxRequestPartitions {
			c.Partitions = protocol.MaxRequestPartitions - protocol.MaxRequestPartitions%s
		}
	}
	return c
}

// Bus is a provisioned connection to Hermes' stream, consumers and buckets. It is safe for
// concurrent use.
type Bus struct {
	JS jetstream.JetStream
	// Stream is the record's first stream (protocol.StreamName), its only one on a record of
	// one stream; Streams are all of them, stream k at index k (protocol.Layout).
	Stream   jetstream.Stream
	Streams  []jetstream.Stream
	DLQ      jetstream.Stream
	Calls    jetstream.KeyValue
	Tools    jetstream.KeyValue
	Claims   jetstream.KeyValue
	Sessions jetstream.KeyValue
	Parked   jetstream.KeyValue
	// Contracts is the tools' contracts bucket (BucketContracts).
	Contracts jetstream.KeyValue
	// ParkedStream is the stream under Parked: removing an entry by its revision there
	// leaves no delete marker behind.
	ParkedStream jetstream.Stream
	// Timers is the stream of timers (protocol.TimerStreamName).
	Timers jetstream.Stream
	// Clients is the stream external clients' requests wait in (protocol.ClientStreamName);
	// nil on a bus set up before it existed.
	Clients jetstream.Stream
	// Drift lists how the existing streams differ from this process's configuration; they are
	// kept as they are, and the process should say so.
	Drift []string
	cfg   Config
	// buckets are the application's buckets (Config.Buckets), by name.
	buckets map[string]jetstream.KeyValue
	// auth seals the results this bus records and checks those it reads.
	auth resultAuth
	// partitions is how many partitions the record spreads requests over (its transform's), as
	// last read (RefreshPartitions).
	partitions atomic.Int32
	// layout is how the record keeps sessions in its streams.
	layout protocol.Layout
	// onRestreamStep, set by tests, hears of each step of Restream (restreamStep).
	onRestreamStep func(step string) error
}

// Layout is how the record keeps sessions in its streams: the subjects of a session's
// messages, and the stream that holds them.
func (b *Bus) Layout() protocol.Layout { return b.layout }

// StreamOf returns the record stream that holds session's messages.
func (b *Bus) StreamOf(session string) jetstream.Stream { return b.Streams[b.layout.StreamOf(session)] }

// metaStreams, in the first record stream's metadata, says how many streams the record has
// when it has more than one.
const metaStreams = "hermes.record.streams"

// RecordLayout reads how many streams the record has, and so its layout, from its first
// stream's configuration (protocol.StreamName).
func RecordLayout(cfg jetstream.StreamConfig) (protocol.Layout, error) {
	v, ok := cfg.Metadata[metaStreams]
	if !ok {
		return protocol.Layout{}, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return protocol.Layout{}, fmt.Errorf("bus: stream %s says it is one of %q streams: not a number", cfg.Name, v)
	}
	l, err := protocol.NewLayout(n)
	if err != nil {
		return l, fmt.Errorf("bus: stream %s: %w", cfg.Name, err)
	}
	return l, nil
}

// recordStreamConfig is the configuration of record stream k of a record laid out as l, its
// requests spread over n partitions.
func recordStreamConfig(cfg Config, l protocol.Layout, k, n int) jetstream.StreamConfig {
	src, dest := protocol.RequestTransformIn(k, n)
	rsrc, rdest := protocol.LiveResponseRepublishIn(k)
	desc := "Hermes: the record of every message of every session"
	var meta map[string]string
	if s := l.Streams(); s > 1 {
		desc = fmt.Sprintf("Hermes: the record, stream %d of %d (each session whole in one)", k+1, s)
		if k == 0 {
			meta = map[string]string{metaStreams: strconv.Itoa(s)}
		}
	}
	share := func(limit int64) int64 { // the record's limits, shared by its streams
		if limit <= 0 {
			return limit
		}
		return max(limit/int64(l.Streams()), 1)
	}
	return jetstream.StreamConfig{
		Name:             protocol.RecordStream(k),
		Description:      desc,
		Subjects:         protocol.StreamSubjectsOf(k),
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: src, Destination: dest},
		Retention:        jetstream.LimitsPolicy,
		Storage:          jetstream.FileStorage,
		Discard:          jetstream.DiscardNew,
		MaxAge:           cfg.MaxAge,
		MaxBytes:         share(cfg.MaxBytes),
		MaxMsgs:          share(cfg.MaxMsgs),
		MaxMsgSize:       8 << 20,
		Duplicates:       cfg.DuplicateWindow,
		Replicas:         cfg.Replicas,
		// Batch reads of a request's results (Results) are direct gets; each checks that
		// the replica answering has the result it was asked about.
		AllowDirect: true,
		// Every response stored is announced to the callers awaiting it; one that lost to
		// an earlier response is not stored, so never seen.
		RePublish: &jetstream.RePublish{Source: rsrc, Destination: rdest},
		Metadata:  meta,
	}
}

// Partitions returns how many partitions the record spreads requests over: as the stream was
// provisioned (or last read, RefreshPartitions), whatever this process was configured with.
func (b *Bus) Partitions() int { return int(b.partitions.Load()) }

// StoredSubjectRequest is the subject the record stores session's requests under.
func (b *Bus) StoredSubjectRequest(session string) string {
	return b.layout.StoredSubjectRequest(session, b.Partitions())
}

// Provision creates or updates the record stream and the KV buckets, and creates the router's
// consumers if they do not exist. It is idempotent and safe to run from every process at start.
//
// What Hermes versions that kept state elsewhere left on the bus — the hermes-intake and
// hermes-responses buckets, a consumer per tool named tool-<tool>, requests waiting in
// hermes-sessions — is neither read nor changed here: this version does not finish the work
// held there. Such a bus should be migrated (hermes migrate), which reports that work and
// removes what it is held in once it is done.
func Provision(ctx context.Context, js jetstream.JetStream, cfg Config) (*Bus, error) {
	explicitPartitions, explicitStreams := cfg.Partitions != 0, cfg.Streams != 0
	if cfg.Streams < 0 || cfg.Streams > protocol.MaxRecordStreams {
		return nil, fmt.Errorf("bus: %d record streams: there must be 1 to %d", cfg.Streams, protocol.MaxRecordStreams)
	}
	var drift []string
	// How many streams: as the record has them, or as configured for a new one.
	layout, err := protocol.NewLayout(max(cfg.Streams, 1))
	if err != nil {
		return nil, fmt.Errorf("bus: %w", err)
	}
	// keep makes the record's layout the one used, saying so where this process was configured
	// otherwise.
	keep := func(have protocol.Layout) {
		if explicitStreams && have.Streams() != layout.Streams() {
			drift = append(drift, fmt.Sprintf("the record is kept in %d streams, this process was configured with %d (kept as it is: hermes provision --streams changes it, once every service is stopped)",
				have.Streams(), layout.Streams()))
		}
		layout = have
	}
	if first, err := js.Stream(ctx, protocol.StreamName); err == nil {
		have, err := RecordLayout(first.CachedInfo().Config)
		if err != nil {
			return nil, err
		}
		keep(have)
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("bus: provision stream %s: %w", protocol.StreamName, err)
	}
	cfg.Streams = layout.Streams()
	cfg = cfg.withDefaults()
	if err := checkBuckets(cfg.Buckets); err != nil {
		return nil, err
	}
	if cfg.Partitions < 1 || cfg.Partitions > protocol.MaxRequestPartitions {
		return nil, fmt.Errorf("bus: %d request partitions: there must be 1 to %d", cfg.Partitions, protocol.MaxRequestPartitions)
	}
	if err := layout.CheckPartitions(cfg.Partitions); err != nil && explicitPartitions {
		return nil, fmt.Errorf("bus: %w", err)
	}
	// What provisioning creates, it creates only without OpenOnly and NoProvision; what the
	// bus creates later (tool consumers), only without OpenOnly.
	runCfg := cfg
	cfg.OpenOnly = cfg.OpenOnly || cfg.NoProvision
	stream, err := ensureStream(ctx, js, !cfg.OpenOnly, recordStreamConfig(cfg, layout, 0, cfg.Partitions), &drift)
	if err != nil {
		return nil, err
	}
	// The record's layout is its first stream's, whoever created it: another process may have,
	// with another number of streams, since it was looked at above.
	made, err := RecordLayout(stream.CachedInfo().Config)
	if err != nil {
		return nil, err
	}
	keep(made)
	runCfg.Streams = layout.Streams()
	src, dest := protocol.RequestTransform(cfg.Partitions)
	dlq, err := ensureStream(ctx, js, !cfg.OpenOnly, jetstream.StreamConfig{
		Name:        protocol.DLQStreamName,
		Description: "Hermes: dead letters, and the advisories that name them",
		Subjects:    append([]string{protocol.FilterDeadLetters}, advisorySubjects(layout)...),
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Discard:     jetstream.DiscardOld,
		MaxAge:      cfg.DeadLetterMaxAge,
		MaxBytes:    cfg.DeadLetterMaxBytes,
		Duplicates:  cfg.DuplicateWindow,
		Replicas:    cfg.Replicas,
	}, &drift)
	if err != nil {
		return nil, err
	}
	// Timers: one schedule per wake key (a later one replaces it); the server turns it into a
	// message on its due subject at its time, which is removed once consumed (work queue). A
	// key woken before its time has its schedule removed too, so there are never more timers
	// than parking places, and those are bounded (BucketParked).
	timers, err := ensureStream(ctx, js, !cfg.OpenOnly, jetstream.StreamConfig{
		Name:              protocol.TimerStreamName,
		Description:       "Hermes: when parked messages are due to be woken",
		Subjects:          protocol.TimerSubjects(),
		Retention:         jetstream.WorkQueuePolicy,
		Storage:           jetstream.FileStorage,
		Duplicates:        2 * time.Minute,
		AllowMsgSchedules: true,
		MaxBytes:          timersMaxBytes,
		Replicas:          cfg.Replicas,
	}, &drift)
	if err != nil {
		return nil, fmt.Errorf("%w (timers need NATS 2.12 or later)", err)
	}
	partitions, ok := recordPartitions(stream.CachedInfo().Config)
	if !ok {
		return nil, fmt.Errorf("bus: stream %s spreads requests over no partitions Hermes knows (its subject transform is %s): give it %s -> %s (nats stream edit), then run hermes provision",
			protocol.StreamName, transformText(stream.CachedInfo().Config), src, dest)
	}
	if explicitPartitions && partitions != cfg.Partitions {
		drift = append(drift, fmt.Sprintf("stream %s spreads requests over %d partitions, this process was configured with %d (kept as it is: hermes provision --partitions %d changes it, once the routers are stopped)",
			protocol.StreamName, partitions, cfg.Partitions, cfg.Partitions))
	}
	if err := layout.CheckPartitions(partitions); err != nil {
		return nil, fmt.Errorf("bus: stream %s: %w", protocol.StreamName, err)
	}
	if st, err := restreamOf(stream.CachedInfo().Config); err != nil {
		return nil, err
	} else if st != nil {
		drift = append(drift, fmt.Sprintf("the record's streams are being changed from %d to %d, unfinished (its sessions may be in either): stop every service and run hermes provision --streams %d to finish it",
			st.From, st.To, st.To))
	}
	streams := []jetstream.Stream{stream}
	for k := 1; k < layout.Streams(); k++ {
		s, err := ensureStream(ctx, js, !cfg.OpenOnly, recordStreamConfig(cfg, layout, k, partitions), &drift)
		if err != nil {
			return nil, err
		}
		if n, ok := recordPartitions(s.CachedInfo().Config); !ok || n != partitions {
			// A change of the partitions cut short (Repartition changes the first stream
			// last): the first stream's number is the record's.
			if cfg.OpenOnly {
				return nil, fmt.Errorf("bus: stream %s spreads requests over other partitions than %s (its subject transform is %s, %s's is %s): run hermes provision",
					s.CachedInfo().Config.Name, protocol.StreamName, transformText(s.CachedInfo().Config), protocol.StreamName, transformText(stream.CachedInfo().Config))
			}
			if err := spreadRequests(ctx, js, s, k, partitions); err != nil {
				return nil, err
			}
			drift = append(drift, fmt.Sprintf("stream %s spread requests over other partitions than %s: now over its %d", s.CachedInfo().Config.Name, protocol.StreamName, partitions))
		}
		streams = append(streams, s)
	}
	b := &Bus{JS: js, Stream: stream, Streams: streams, DLQ: dlq, Timers: timers, Drift: drift, cfg: cfg, layout: layout}
	b.partitions.Store(int32(partitions))
	for _, kv := range []struct {
		name       string
		ttl        time.Duration
		maxBytes   int64
		dst        *jetstream.KeyValue
		consistent bool
		history    uint8
		desc       string
	}{
		// Plans outlive what the record keeps of their request, so that a request_id reused
		// later finds nothing left of the first request.
		{BucketCalls, planTTL(cfg, stream), cfg.StateMaxBytes, &b.Calls, true, 1, "Hermes: each request's plan, written when it is accepted"},
		{BucketTools, 0, smallBucketMaxBytes, &b.Tools, false, 1, "Hermes: the tools routes name, and MCP servers' states"},
		{BucketClaims, cfg.StateTTL, cfg.StateMaxBytes, &b.Claims, true, 1, "Hermes: which worker runs which call, and which calls are finished"},
		{BucketSessions, cfg.StateTTL, cfg.StateMaxBytes, &b.Sessions, true, 1, "Hermes: each session's serial order, and the chat doors' answers"},
		// No TTL: a parked message must never be dropped while it waits (an approval may
		// take days); bounded in bytes instead, refusing new ones when full.
		{BucketParked, 0, cfg.ParkedMaxBytes, &b.Parked, true, 1, "Hermes: messages parked until what they wait for (an approval, a turn, a time)"},
		// A contract's versions are its revisions: a call routed under one finishes under it.
		{BucketContracts, 0, contractsMaxBytes, &b.Contracts, true, ContractHistory, "Hermes: the tools' contracts, each version a revision"},
	} {
		*kv.dst, err = ensureBucket(ctx, js, jetstream.KeyValueConfig{
			Bucket:      kv.name,
			Description: kv.desc,
			History:     kv.history,
			TTL:         kv.ttl,
			MaxBytes:    kv.maxBytes,
			Storage:     jetstream.FileStorage,
			Replicas:    cfg.Replicas,
		}, kv.consistent, false, !cfg.OpenOnly)
		if err != nil {
			return nil, err
		}
	}
	b.buckets = map[string]jetstream.KeyValue{}
	for _, a := range cfg.Buckets {
		ttl := a.TTL
		if a.AsLongAsPlans {
			ttl = planTTL(cfg, stream)
		}
		kv, err := ensureBucket(ctx, js, jetstream.KeyValueConfig{
			Bucket:         a.Name,
			Description:    a.Description,
			History:        max(1, a.History),
			TTL:            ttl,
			MaxBytes:       a.MaxBytes,
			Storage:        jetstream.FileStorage,
			Replicas:       cfg.Replicas,
			LimitMarkerTTL: a.MarkerTTL,
		}, a.Strict, a.Rollup, !cfg.OpenOnly)
		if err != nil {
			return nil, err
		}
		b.buckets[a.Name] = kv
	}
	if b.ParkedStream, err = js.Stream(ctx, KVStream(BucketParked)); err != nil {
		return nil, fmt.Errorf("bus: provision bucket %s: %w", BucketParked, err)
	}
	for k, s := range b.Streams {
		if _, err := b.ensureConsumerFilter(ctx, s, ConsumerRouterResults, protocol.FilterResultsIn(k)); err != nil {
			return nil, err
		}
	}
	if err := b.ensureRequestConsumers(ctx); err != nil {
		return nil, err
	}
	if err := b.provisionClients(ctx, js, cfg, &drift); err != nil {
		return nil, err
	}
	// A summary is tried a few times and then left to the session's next decision: the
	// summarizer decides, never the server (no decision is given up on, so none becomes a
	// dead letter).
	for k, s := range b.Streams {
		sum := b.consumer(ConsumerSummarizer, protocol.FilterEventsIn(k, protocol.EventLLM))
		sum.MaxDeliver = -1
		if _, err := b.ensureConsumerSpec(ctx, s, sum); err != nil && !errors.Is(err, ErrNotProvisioned) {
			return nil, err
		}
	}
	// An advisory is tried until it is handled: giving one up could leave a request that
	// waits on the dead message without a response. (The processor acks what it can never
	// handle.)
	dl := b.consumer(ConsumerDeadLetters, advisorySubjects(layout)...)
	dl.MaxDeliver = -1
	c, err := b.ensureConsumerSpec(ctx, b.DLQ, dl)
	if err != nil {
		return nil, err
	}
	if have := c.CachedInfo().Config; !cfg.OpenOnly && (have.MaxDeliver != -1 || !slices.Equal(have.FilterSubjects, dl.FilterSubjects)) {
		// Each record stream's advisories are read: a record given more streams adds theirs.
		have.MaxDeliver, have.FilterSubject, have.FilterSubjects = -1, "", dl.FilterSubjects
		if _, err := b.DLQ.UpdateConsumer(ctx, have); err != nil {
			return nil, fmt.Errorf("bus: let consumer %s read every record stream's advisories and retry without end: %w", ConsumerDeadLetters, err)
		}
	}
	// A work queue's consumer delivers all: what is in it is work not yet done. A timer is
	// tried until its wake-up is done; giving one up would leave what it wakes parked.
	spec := b.consumer(ConsumerTimers, protocol.FilterTimersDue)
	spec.DeliverPolicy, spec.MaxDeliver = jetstream.DeliverAllPolicy, -1
	if _, err := b.ensureConsumerSpec(ctx, b.Timers, spec); err != nil {
		return nil, err
	}
	b.cfg = runCfg
	return b, nil
}

// storageHint explains the server's refusal to reserve a stream's byte limit: the streams and
// buckets together must fit the server's JetStream file store (and the account's limits).
func storageHint(err error) string {
	if err == nil || !strings.Contains(err.Error(), "insufficient storage") {
		return ""
	}
	return " (the NATS server's max_file_store, or the account's JetStream limits, must hold the byte limits of every Hermes " +
		"stream and bucket together, about 12.4 GiB at the defaults: raise it, or lower --record-max-bytes and --state-max-bytes)"
}

// planTTL is how long plans are kept: an hour longer than the record keeps messages (as the
// stream is, whatever this process was configured with), and at least the state TTL; forever
// when the record keeps everything.
func planTTL(cfg Config, record jetstream.Stream) time.Duration {
	age := record.CachedInfo().Config.MaxAge
	if age <= 0 {
		return 0
	}
	return max(cfg.StateTTL, age) + intakeMargin
}

// Config returns the configuration the bus was provisioned with, defaults applied.
func (b *Bus) Config() Config { return b.cfg }

// Consumer returns the existing durable consumer name of the record's first stream.
func (b *Bus) Consumer(ctx context.Context, name string) (jetstream.Consumer, error) {
	return b.consumerOf(ctx, b.Stream, name)
}

// Consumers returns the existing durable consumer name of each record stream (those of the
// router's results, the summarizer's, each tool's), stream k's at index k.
func (b *Bus) Consumers(ctx context.Context, name string) ([]jetstream.Consumer, error) {
	out := make([]jetstream.Consumer, 0, len(b.Streams))
	for _, s := range b.Streams {
		c, err := b.consumerOf(ctx, s, name)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// DeadLetterConsumer returns the consumer of dead-letter advisories.
func (b *Bus) DeadLetterConsumer(ctx context.Context) (jetstream.Consumer, error) {
	return b.consumerOf(ctx, b.DLQ, ConsumerDeadLetters)
}

// Bounds of the stream external clients' requests wait in: what one client can make Hermes
// keep before a gateway takes it.
const (
	clientsMaxBytes = 64 << 20
	// clientsMaxMsgSize is the largest request a client may publish: as the gateway's default
	// body limit.
	clientsMaxMsgSize = 1 << 20
	// clientsPerSession bounds the requests waiting in one client's session.
	clientsPerSession = 256
)

// provisionClients sets up the stream external clients' requests wait in and the gateways'
// consumer of it. Both are missing where the bus was set up by a Hermes before external clients
// had users and this process may not create them: then gateways take no client's requests (and
// say so) until hermes provision runs again.
func (b *Bus) provisionClients(ctx context.Context, js jetstream.JetStream, cfg Config, drift *[]string) error {
	// A record that took clients' requests itself (Hermes for a while did) gives the subjects
	// up: two streams cannot hold them. What it recorded stays.
	if sc := b.Stream.CachedInfo().Config; !cfg.OpenOnly && slices.Contains(sc.Subjects, protocol.FilterClientRequests) {
		sc.Subjects = slices.DeleteFunc(slices.Clone(sc.Subjects), func(s string) bool { return s == protocol.FilterClientRequests })
		if _, err := js.UpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("bus: hand the clients' subjects from the record to %s: %w", protocol.ClientStreamName, err)
		}
	}
	s, err := ensureStream(ctx, js, !cfg.OpenOnly, jetstream.StreamConfig{
		Name:        protocol.ClientStreamName,
		Description: "Hermes: external NATS clients' requests, until a gateway takes them",
		Subjects:    []string{protocol.FilterClientRequests},
		// Taken once: a request a gateway acked (accepted, or refused for good) is gone.
		Retention: jetstream.WorkQueuePolicy,
		Storage:   jetstream.FileStorage,
		// Full, it refuses new requests (the client's publish fails) rather than drop waiting
		// ones; one session cannot take it all.
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		MaxMsgsPerSubject:    clientsPerSession,
		MaxBytes:             clientsMaxBytes,
		MaxMsgSize:           clientsMaxMsgSize,
		Duplicates:           2 * time.Minute,
		Replicas:             cfg.Replicas,
	}, drift)
	if errors.Is(err, ErrNotProvisioned) {
		return nil
	}
	if err != nil {
		return err
	}
	b.Clients = s
	spec := b.consumer(ConsumerClients, protocol.FilterClientRequests)
	// One at a time, whichever gateway takes it: a session's requests keep their order.
	// Tried until taken: a request waits while the store is full rather than be given up.
	spec.DeliverPolicy, spec.MaxAckPending, spec.MaxDeliver = jetstream.DeliverAllPolicy, 1, -1
	if _, err := b.ensureConsumerSpec(ctx, s, spec); err != nil && !errors.Is(err, ErrNotProvisioned) {
		return err
	}
	return nil
}

// ClientConsumer returns the consumer of external clients' requests; one that does not
// exist (a bus set up by an earlier Hermes) wraps jetstream.ErrConsumerNotFound.
func (b *Bus) ClientConsumer(ctx context.Context) (jetstream.Consumer, error) {
	s := b.Clients
	if s == nil { // perhaps provisioned since this process started
		var err error
		if s, err = b.JS.Stream(ctx, protocol.ClientStreamName); errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("bus: stream %s: %w", protocol.ClientStreamName, jetstream.ErrConsumerNotFound)
		} else if err != nil {
			return nil, fmt.Errorf("bus: stream %s: %w", protocol.ClientStreamName, err)
		}
	}
	return b.consumerOf(ctx, s, ConsumerClients)
}

// ConsumerIn returns the existing durable consumer name of record stream k.
func (b *Bus) ConsumerIn(ctx context.Context, k int, name string) (jetstream.Consumer, error) {
	if k < 0 || k >= len(b.Streams) {
		return nil, fmt.Errorf("bus: the record has no stream %d (it has %d)", k, len(b.Streams))
	}
	return b.consumerOf(ctx, b.Streams[k], name)
}

// TimerConsumer returns the consumer of timers that went off.
func (b *Bus) TimerConsumer(ctx context.Context) (jetstream.Consumer, error) {
	return b.consumerOf(ctx, b.Timers, ConsumerTimers)
}

func (b *Bus) consumerOf(ctx context.Context, stream jetstream.Stream, name string) (jetstream.Consumer, error) {
	c, err := stream.Consumer(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("bus: consumer %s: %w", name, err)
	}
	return c, nil
}

// EnsureToolConsumer makes sure the shared consumers of tool's calls of kind exist — one per
// record stream, stream k's at index k — and that the tool is listed in BucketTools, creating
// them if needed. kind must be one of protocol.Kinds and tool a valid tool name
// (protocol.CheckToolName). Call it before publishing the first such call.
func (b *Bus) EnsureToolConsumer(ctx context.Context, kind, tool string) ([]jetstream.Consumer, error) {
	if !protocol.KnownKind(kind) {
		return nil, fmt.Errorf("bus: action kind %q is not one of %v", kind, protocol.Kinds)
	}
	if err := protocol.CheckToolName("tool", tool); err != nil {
		return nil, fmt.Errorf("bus: %w", err)
	}
	name := ToolConsumer(kind, tool)
	out := make([]jetstream.Consumer, 0, len(b.Streams))
	for k, s := range b.Streams {
		c, err := b.ensureConsumer(ctx, s, name, protocol.FilterToolCallsIn(k, kind, tool))
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if _, err := b.Tools.Create(ctx, protocol.KeyTool(kind, tool), []byte(name)); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return nil, fmt.Errorf("bus: list tool %s (%s): %w", tool, kind, err)
	}
	return out, nil
}

// SetToolInFlight makes n the most calls of tool of kind in flight at once across every worker
// (its consumers' MaxAckPending). n ≤ 0 undoes a bound an earlier n set (the bus's default
// again) and leaves any other value as it is. Nothing is written when it is so already, or
// with OpenOnly.
//
// On a record of S streams each stream's consumer holds a share of n (InFlightShares), and
// together they hold n — but each at least one: a bound below S is held as S.
func (b *Bus) SetToolInFlight(ctx context.Context, kind, tool string, n int) error {
	cons, err := b.EnsureToolConsumer(ctx, kind, tool)
	if err != nil || b.cfg.OpenOnly {
		return err
	}
	shares := InFlightShares(n, len(cons))
	for k, c := range cons {
		if err := b.setInFlight(ctx, b.Streams[k], c, tool, shares[k]); err != nil {
			return err
		}
	}
	return nil
}

// InFlightShares divides a bound of n calls in flight (n ≤ 0: none) among the consumers of
// streams streams: each at least 1, together n where n ≥ streams.
func InFlightShares(n, streams int) []int {
	out := make([]int, streams)
	for k := range out {
		if n <= 0 {
			out[k] = n
			continue
		}
		out[k] = max(1, n/streams)
		if k < n%streams && n >= streams {
			out[k]++
		}
	}
	return out
}

// setInFlight makes n the MaxAckPending of tool's consumer c of stream s (SetToolInFlight).
func (b *Bus) setInFlight(ctx context.Context, s jetstream.Stream, c jetstream.Consumer, tool string, n int) error {
	have := c.CachedInfo().Config
	_, bound := have.Metadata[metaInFlight]
	switch {
	case n > 0 && have.MaxAckPending == n && bound:
		return nil
	case n > 0:
		have.MaxAckPending = n
		have.Metadata = maps.Clone(have.Metadata)
		if have.Metadata == nil {
			have.Metadata = map[string]string{}
		}
		have.Metadata[metaInFlight] = strconv.Itoa(n)
	case !bound:
		return nil // never bounded by a contract: as it was made (or as an operator set it)
	default:
		have.MaxAckPending = b.cfg.MaxAckPending
		have.Metadata = maps.Clone(have.Metadata)
		delete(have.Metadata, metaInFlight)
	}
	if _, err := s.UpdateConsumer(ctx, have); err != nil {
		return fmt.Errorf("bus: bound the calls of %s in flight to %d: %w", tool, have.MaxAckPending, err)
	}
	return nil
}

// metaInFlight marks a tool consumer whose MaxAckPending a contract's max_in_flight set.
const metaInFlight = "hermes.max_in_flight"

// consumer is the configuration of Hermes' durable consumers: deliver-new, explicit acks, the
// fixed ack deadline, never expiring; filters name what it reads.
func (b *Bus) consumer(name string, filters ...string) jetstream.ConsumerConfig {
	c := jetstream.ConsumerConfig{
		Durable:       name,
		Description:   consumerDescription(name),
		DeliverPolicy: jetstream.DeliverNewPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       b.cfg.AckWait,
		MaxDeliver:    b.cfg.MaxDeliver,
		MaxAckPending: b.cfg.MaxAckPending,
		Replicas:      b.cfg.Replicas,
	}
	if len(filters) == 1 {
		c.FilterSubject = filters[0]
	} else {
		c.FilterSubjects = filters
	}
	return c
}

// consumerDescription says what Hermes' durable consumer name is for (nats consumer ls).
func consumerDescription(name string) string {
	switch {
	case name == ConsumerRouterResults:
		return "Hermes: routers take the tools' results, and answer requests when each has its results"
	case name == ConsumerDeadLetters:
		return "Hermes: the dead-letter processor takes the advisories of messages given up on"
	case name == ConsumerTimers:
		return "Hermes: routers take the timers that went off, and wake what was parked for them"
	case name == ConsumerClients:
		return "Hermes: gateways take external clients' requests, one at a time"
	case name == ConsumerSummarizer:
		return "Hermes: the summarizer takes the model's turns, to keep long sessions short"
	case name == ConsumerAudit:
		return "Hermes: the audit service takes every message of the record, to project it into PostgreSQL"
	case strings.HasPrefix(name, "router-requests-"):
		return "Hermes: routers take the requests of partition " + strings.TrimPrefix(name, "router-requests-") + ", one at a time (each session in order)"
	case strings.HasPrefix(name, "tool_"):
		kind, tool, _ := strings.Cut(strings.TrimPrefix(name, "tool_"), "-")
		return "Hermes: tool workers take the calls of " + tool + " (" + kind + ")"
	}
	return "Hermes"
}

func (b *Bus) ensureConsumer(ctx context.Context, stream jetstream.Stream, name string, filters ...string) (jetstream.Consumer, error) {
	return b.ensureConsumerSpec(ctx, stream, b.consumer(name, filters...))
}

// ensureConsumerFilter is ensureConsumer for a consumer whose filter a newer Hermes widens:
// an existing one with other filters gets filter instead (which must match everything they
// did: nothing is left unread).
func (b *Bus) ensureConsumerFilter(ctx context.Context, stream jetstream.Stream, name, filter string) (jetstream.Consumer, error) {
	c, err := b.ensureConsumer(ctx, stream, name, filter)
	if err != nil || b.cfg.OpenOnly {
		return c, err
	}
	have := c.CachedInfo().Config
	if have.FilterSubject == filter && len(have.FilterSubjects) == 0 {
		return c, nil
	}
	have.FilterSubject, have.FilterSubjects = filter, nil
	if c, err = stream.UpdateConsumer(ctx, have); err != nil {
		return nil, fmt.Errorf("bus: widen the filter of consumer %s to %s: %w", name, filter, err)
	}
	return c, nil
}

// ensureConsumerSpec makes sure the durable consumer spec describes exists, creating it if
// not. An existing one is kept as it is.
func (b *Bus) ensureConsumerSpec(ctx context.Context, stream jetstream.Stream, spec jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	name := spec.Durable
	c, err := stream.Consumer(ctx, name)
	if err == nil {
		if have := c.CachedInfo().Config; have.Description == "" && spec.Description != "" && !b.cfg.OpenOnly {
			// Made by a Hermes that gave none: say what it is for.
			have.Description = spec.Description
			if updated, err := stream.UpdateConsumer(ctx, have); err == nil {
				c = updated
			}
		}
		if spec.MaxAckPending == 1 {
			// One message in flight is what keeps this consumer's order; a consumer made
			// otherwise would route a session's requests out of order without a word.
			if have := c.CachedInfo().Config.MaxAckPending; have != 1 {
				return nil, fmt.Errorf("bus: consumer %s allows %d messages in flight; it must allow 1 to keep each session's order: delete it (nats consumer rm %s %s) and Hermes recreates it",
					name, have, stream.CachedInfo().Config.Name, name)
			}
		}
		return c, nil
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("bus: look up consumer %s: %w", name, err)
	}
	if b.cfg.OpenOnly {
		return nil, fmt.Errorf("%w: consumer %s (run hermes provision)", ErrNotProvisioned, name)
	}
	return createConsumer(ctx, stream, spec)
}

// createConsumer creates the durable consumer spec describes in stream, or opens the one
// another process created meanwhile (kept as it is).
func createConsumer(ctx context.Context, stream jetstream.Stream, spec jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	c, err := stream.CreateConsumer(ctx, spec)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		c, err = stream.Consumer(ctx, spec.Durable) // created concurrently by another process
	}
	if err != nil {
		return nil, fmt.Errorf("bus: create consumer %s: %w", spec.Durable, err)
	}
	return c, nil
}

// ensureStream creates the stream if it does not exist. An existing stream is never changed
// here — every process provisions at start, and one started with other settings (a CLI with
// the default replicas against a cluster) must not rewrite it; differences are reported in
// drift instead.
func ensureStream(ctx context.Context, js jetstream.JetStream, create bool, want jetstream.StreamConfig, drift *[]string) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) && !create {
		return nil, fmt.Errorf("%w: stream %s (run hermes provision, or start a service without --no-provision)", ErrNotProvisioned, want.Name)
	}
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = js.Stream(ctx, want.Name) // created concurrently by another process
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bus: provision stream %s: %w%s", want.Name, err, storageHint(err))
	}
	have := s.CachedInfo().Config
	if !create {
		return s, nil // opened as it is: its settings are the deployment's, not this process's
	}
	if missing := missingSubjects(have.Subjects, want.Subjects); len(missing) > 0 {
		// Subjects of a newer Hermes (e.g. calls of new action kinds) are added: without them
		// its messages would reach no stream. Nothing is ever removed.
		have.Subjects = append(have.Subjects, missing...)
		if s, err = js.UpdateStream(ctx, have); err != nil {
			return nil, fmt.Errorf("bus: add subjects %v to stream %s: %w", missing, want.Name, err)
		}
		have = s.CachedInfo().Config
		*drift = append(*drift, fmt.Sprintf("stream %s: added the subjects %v", want.Name, missing))
	}
	if (want.AllowDirect && !have.AllowDirect) || (want.RePublish != nil && (have.RePublish == nil || *have.RePublish != *want.RePublish)) {
		// A record from before results and responses were kept on the stream alone gets
		// direct reads and the announcement of stored responses, which Hermes now needs.
		have.AllowDirect, have.RePublish = want.AllowDirect || have.AllowDirect, want.RePublish
		if s, err = js.UpdateStream(ctx, have); err != nil {
			return nil, fmt.Errorf("bus: let stream %s announce its responses and serve direct reads: %w", want.Name, err)
		}
		have = s.CachedInfo().Config
		*drift = append(*drift, fmt.Sprintf("stream %s: now serves direct reads and announces stored responses on %s", want.Name, want.RePublish.Destination))
	}
	if want.SubjectTransform != nil && have.SubjectTransform == nil {
		// A record from before per-session order gets the partitioning transform, or requests
		// would reach no router. One that has it keeps it: its number of partitions changes
		// only through Repartition.
		have.SubjectTransform = want.SubjectTransform
		if s, err = js.UpdateStream(ctx, have); err != nil {
			return nil, fmt.Errorf("bus: add the request partitions to stream %s: %w", want.Name, err)
		}
		*drift = append(*drift, fmt.Sprintf("stream %s: added the subject transform %s -> %s (requests partitioned by session)",
			want.Name, want.SubjectTransform.Source, want.SubjectTransform.Destination))
	}
	*drift = append(*drift, streamDrift(s.CachedInfo().Config, want)...)
	return s, nil
}

// missingSubjects returns the subjects of want that have lacks.
func missingSubjects(have, want []string) []string {
	var out []string
	for _, w := range want {
		if !slices.Contains(have, w) {
			out = append(out, w)
		}
	}
	return out
}

func streamDrift(have, want jetstream.StreamConfig) []string {
	var d []string
	add := func(field string, h, w any) {
		d = append(d, fmt.Sprintf("stream %s has %s %v, this process was configured with %v (kept as it is)", want.Name, field, h, w))
	}
	if have.Replicas != want.Replicas {
		add("replicas", have.Replicas, want.Replicas)
	}
	if have.MaxAge != want.MaxAge {
		add("max age", have.MaxAge, want.MaxAge)
	}
	if have.Duplicates != want.Duplicates {
		add("duplicate window", have.Duplicates, want.Duplicates)
	}
	if want.MaxMsgs != 0 && have.MaxMsgs != want.MaxMsgs {
		add("message limit", have.MaxMsgs, want.MaxMsgs)
	}
	return d
}

// ensureBucket opens the bucket, creating it if it does not exist. On a replicated bucket that
// Hermes reads back right after writing (state), direct gets are turned off: followers may
// answer a direct get before they have a write, and aggregation must see every result.
func ensureBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig, consistent, rollup, create bool) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) && !create {
		return nil, fmt.Errorf("%w: bucket %s (run hermes provision)", ErrNotProvisioned, cfg.Bucket)
	}
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			kv, err = js.KeyValue(ctx, cfg.Bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bus: provision bucket %s: %w%s", cfg.Bucket, err, storageHint(err))
	}
	if !create {
		return kv, nil
	}
	s, err := js.Stream(ctx, KVStream(cfg.Bucket))
	if err != nil {
		return nil, fmt.Errorf("bus: provision bucket %s: %w", cfg.Bucket, err)
	}
	if sc := s.CachedInfo().Config; sc.MaxAge > 0 && (cfg.TTL == 0 || sc.MaxAge < cfg.TTL) {
		// Keys must now live longer (plans as long as the record): never shortened here.
		sc.MaxAge = cfg.TTL
		if s, err = js.UpdateStream(ctx, sc); err != nil {
			return nil, fmt.Errorf("bus: keep bucket %s's keys for %s: %w", cfg.Bucket, cfg.TTL, err)
		}
	}
	if sc := s.CachedInfo().Config; sc.Description == "" && cfg.Description != "" {
		// Made by a Hermes that gave none: say what it holds (nats kv ls, stream info).
		sc.Description = cfg.Description
		if s, err = js.UpdateStream(ctx, sc); err != nil {
			return nil, fmt.Errorf("bus: describe bucket %s: %w", cfg.Bucket, err)
		}
	}
	if sc := s.CachedInfo().Config; sc.AllowRollup && !rollup {
		// A roll-up (Nats-Rollup: all on any key) empties a whole bucket: whoever may write one
		// key could. No service purges a key of these buckets, so none may roll them up.
		sc.AllowRollup = false
		if s, err = js.UpdateStream(ctx, sc); err != nil {
			return nil, fmt.Errorf("bus: refuse roll-ups on bucket %s: %w", cfg.Bucket, err)
		}
	}
	if !consistent {
		return kv, nil
	}
	if sc := s.CachedInfo().Config; sc.Replicas > 1 && (sc.AllowDirect || sc.MirrorDirect) {
		sc.AllowDirect, sc.MirrorDirect = false, false
		if _, err := js.UpdateStream(ctx, sc); err != nil {
			return nil, fmt.Errorf("bus: turn off direct gets on bucket %s: %w", cfg.Bucket, err)
		}
		if kv, err = js.KeyValue(ctx, cfg.Bucket); err != nil { // rebind: gets now go to the leader
			return nil, fmt.Errorf("bus: provision bucket %s: %w", cfg.Bucket, err)
		}
	}
	return kv, nil
}
