package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

const migrateUsage = `hermes migrate [flags]

Finds what earlier versions of Hermes left on the bus and this version neither reads nor
finishes — the hermes-intake and hermes-responses buckets, the consumers tool-<tool> of the
layout before action kinds, serial requests waiting in hermes-sessions (wait.<request_id>),
results kept in hermes-calls (<request_id>.<tool_call_id>) — and removes it once no work is
held there. Responses recorded the earlier way (in hermes-responses, or on the record under
hermes.response.<session>) are first recorded again where this version reads them, so those
requests stay answered. Run it with the earlier version still running, before rolling this
one out: what is pending is work that version finishes. Running it again is harmless.

Exit status: 0 nothing of the earlier layouts is left (removed now, or there was none), 1 work
is still pending in it (it is listed; nothing is removed), 2 trouble (bad flags, NATS
unreachable, a removal failed)`

// What earlier versions of Hermes left on the bus, by the names they gave it. This version
// builds none of these: only hermes migrate reads them, to remove them.
const (
	// earlierIntake held one entry per request_id an earlier gateway accepted (JSON,
	// earlierIntakeEntry), before plans were recorded at intake.
	earlierIntake = "hermes-intake"
	// earlierResponses held each request's response (key: the request_id), before responses
	// were recorded on the record alone.
	earlierResponses = "hermes-responses"
	// earlierToolConsumerPrefix starts the consumer of each tool's calls before action kinds:
	// tool-<tool>, filtering hermes.tool.<tool>.*.
	earlierToolConsumerPrefix = "tool-"
	// earlierWaitPrefix starts the hermes-sessions key under which a serial request waited
	// for its predecessor's response (wait.<request_id>), before the parking lot.
	earlierWaitPrefix = "wait."
	// earlierResultKeys match the results kept in hermes-calls (<request_id>.<tool_call_id>)
	// before results were recorded on the record alone; a plan's key has one token.
	earlierResultKeys = "*.*"
	// earlierResponseSubjects match the responses recorded on the record under the session
	// alone (hermes.response.<session>).
	earlierResponseSubjects = "hermes.response.*"
)

// earlierToolFilter is the filter of the consumer earlierToolConsumerPrefix+tool.
func earlierToolFilter(tool string) string { return "hermes.tool." + tool + ".*" }

// carriedMsgID is the stream message id of a response recorded again where this version reads
// it: not the response's own, which the duplicate window may still hold for its first
// recording.
func carriedMsgID(msgID string) string { return msgID + ":migrated" }

// earlierIntakeEntry is what of an earlierIntake entry hermes migrate reads.
type earlierIntakeEntry struct {
	SessionID string `json:"session_id"`
}

// maxNamed bounds the requests named per consumer of calls not run.
const maxNamed = 5

// RunMigrate removes from a bus what earlier versions of Hermes left on it: hermes migrate
// (migrateUsage says what, and when to run it). It connects as hermes provision does and opens
// what this version provisions without changing it.
//
// It first records again, on hermes.response.<request_id>.<session>, every response an earlier
// version recorded only in hermes-responses or under hermes.response.<session> (the same
// bytes, once: an expected last subject sequence of 0), so that the requests it answered stay
// answered — read back, and a repeated request_id answered from its first run. Then it looks
// for work still held in the earlier layouts, which this version does not finish:
//
//   - calls waiting in, or delivered from and not acknowledged by, a consumer tool-<tool>: they
//     would never run, and their requests never be answered;
//   - a serial request waiting in hermes-sessions (wait.<request_id>) for its predecessor's
//     response: it would never run;
//   - a result kept in hermes-calls (<request_id>.<tool_call_id>) of a request not answered:
//     the request would never be answered;
//   - a request in hermes-intake with neither a plan nor a response: accepted by an earlier
//     gateway and not taken by a router yet; a router still takes it, but until then it can be
//     neither looked up nor cancelled.
//
// Nothing of these is carried over: calls and waiting requests were dispatched in the earlier
// layout (under another subject, without the plan or parking place this version would need),
// and a result kept in a bucket is not sealed as this version's readers may require. While
// any is pending it removes nothing, names each and exits 1; with --discard-pending it
// removes them all the same, naming what is given up. Once nothing is pending it deletes the
// consumers, the keys of the earlier layouts (and hermes-tools' keys without a kind) and the
// two buckets. The record's messages are kept: they are its history, and age out with it.
func RunMigrate(ctx context.Context, args []string, env Env) error {
	fs := newFlagSet("migrate", migrateUsage, env.Stderr)
	var c common
	c.register(fs, "migrate")
	discard := fs.Bool("discard-pending", false, "remove the earlier layouts even though work is pending in them: the work listed is lost")
	dryRun := fs.Bool("dry-run", false, "report only: record no response again, remove nothing")
	trouble := func(err error) error { return &ExitError{Code: 2, Err: fmt.Errorf("migrate: %w", err)} }
	log, err := parse(fs, args, env, &c.logLevel)
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	if err != nil {
		return trouble(err)
	}
	cfg := c.busConfig()
	cfg.OpenOnly = true // what this version provisions is opened as it is, never changed here
	opts, err := c.natsAuth.cliOptions()
	if err != nil {
		return trouble(err)
	}
	nc, b, err := Connect(ctx, c.natsURL, c.instance, cfg, log, opts...)
	if err != nil {
		return trouble(err)
	}
	defer nc.Close()
	m := &migration{b: b, dryRun: *dryRun, answered: map[string]bool{}}
	if err := m.find(ctx); err != nil {
		return trouble(err)
	}
	if err := m.carry(ctx); err != nil {
		return trouble(err)
	}
	out, flush := buffered(env.Stdout)
	defer func() { _ = flush() }()
	where := nc.ConnectedUrlRedacted()
	if m.none() && m.carried == 0 && len(m.blocked) == 0 {
		fmt.Fprintf(out, "Nothing of an earlier Hermes is left on %s: nothing to do.\n", where)
		return nil
	}
	fmt.Fprintf(out, "Earlier versions of Hermes left on %s:\n", where)
	m.writeFound(out)
	m.writeCarried(out)
	if err := m.findPending(ctx); err != nil {
		return trouble(err)
	}
	if len(m.pending) > 0 {
		head := "Work still pending there (this version does not finish it):"
		if *discard {
			head = "Given up (--discard-pending):"
		}
		fmt.Fprintln(out, head)
		for _, p := range m.pending {
			fmt.Fprintf(out, "  %s\n", p)
		}
		if !*discard {
			_ = flush()
			return &ExitError{Code: 1, Err: fmt.Errorf("migrate: %d pending, nothing removed: run hermes migrate again once the earlier version has finished this work, or with --discard-pending to give it up", len(m.pending))}
		}
	}
	if m.dryRun {
		fmt.Fprintln(out, "Dry run: nothing recorded again, nothing removed.")
		return nil
	}
	if err := m.remove(ctx, out); err != nil {
		return trouble(err)
	}
	fmt.Fprintf(out, "Nothing of an earlier Hermes is left on %s.\n", where)
	return nil
}

// migration is what hermes migrate found of the earlier layouts on a bus, and did with it.
type migration struct {
	b      *bus.Bus
	dryRun bool

	// intake and responses are the earlier buckets; nil when there is none.
	intake, responses jetstream.KeyValue
	intakeKeys        []string
	responseKeys      []string
	consumers         []earlierConsumer
	toolKeys          []string // hermes-tools keys without a kind
	waitKeys          []string // hermes-sessions wait.<request_id>
	resultKeys        []string // hermes-calls <request_id>.<tool_call_id>
	// recorded counts the messages on earlierResponseSubjects in the record: kept (they are
	// its history), and recorded again where this version reads them.
	recorded uint64

	// answered holds the requests whose response an earlier version recorded (read in
	// hermes-responses or on the record), by request_id.
	answered map[string]bool
	// carried counts the responses recorded again (with dryRun: to record again), there
	// those found recorded already, and blocked those whose subject holds something else
	// first.
	carried, there int
	blocked        []string
	// unreadable counts responses of the earlier layouts that decode to no response.
	unreadable int
	pending    []string
}

// earlierConsumer is a consumer tool-<tool> and the calls it holds.
type earlierConsumer struct {
	name, tool string
	// waiting calls were never delivered; inFlight ones were and are not acknowledged.
	waiting, inFlight uint64
	// requests names those of the first waiting calls (at most maxNamed).
	requests []string
}

// none reports whether nothing of the earlier layouts is left to remove (the record's messages
// are never removed).
func (m *migration) none() bool {
	return m.intake == nil && m.responses == nil && len(m.consumers) == 0 && len(m.toolKeys) == 0 &&
		len(m.waitKeys) == 0 && len(m.resultKeys) == 0
}

// find looks for each thing the earlier layouts left.
func (m *migration) find(ctx context.Context) error {
	var err error
	if m.intake, m.intakeKeys, err = earlierBucket(ctx, m.b.JS, earlierIntake); err != nil {
		return err
	}
	if m.responses, m.responseKeys, err = earlierBucket(ctx, m.b.JS, earlierResponses); err != nil {
		return err
	}
	list := m.b.Stream.ListConsumers(ctx)
	for info := range list.Info() {
		tool, ok := strings.CutPrefix(info.Name, earlierToolConsumerPrefix)
		if !ok || info.Config.FilterSubject != earlierToolFilter(tool) {
			continue
		}
		c := earlierConsumer{name: info.Name, tool: tool, waiting: info.NumPending, inFlight: uint64(info.NumAckPending)}
		if c.requests, err = m.waitingRequests(ctx, info); err != nil {
			return err
		}
		m.consumers = append(m.consumers, c)
	}
	if err := list.Err(); err != nil {
		return fmt.Errorf("list the consumers of %s: %w", protocol.StreamName, err)
	}
	tools, err := keysOf(ctx, m.b.Tools)
	if err != nil {
		return err
	}
	m.toolKeys = slices.DeleteFunc(tools, func(k string) bool { return strings.Contains(k, ".") })
	if m.waitKeys, err = keysOf(ctx, m.b.Sessions, earlierWaitPrefix+"*"); err != nil {
		return err
	}
	if m.resultKeys, err = keysOf(ctx, m.b.Calls, earlierResultKeys); err != nil {
		return err
	}
	if slices.Contains(m.b.Stream.CachedInfo().Config.Subjects, earlierResponseSubjects) {
		info, err := m.b.Stream.Info(ctx, jetstream.WithSubjectFilter(earlierResponseSubjects))
		if err != nil {
			return fmt.Errorf("count the responses on %s: %w", earlierResponseSubjects, err)
		}
		for _, n := range info.State.Subjects {
			m.recorded += n
		}
	}
	return nil
}

// waitingRequests names the requests of the first calls info's consumer has not delivered yet.
func (m *migration) waitingRequests(ctx context.Context, info *jetstream.ConsumerInfo) ([]string, error) {
	var out []string
	seq := info.Delivered.Stream + 1
	for range min(info.NumPending, maxNamed) {
		raw, err := m.b.Stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(info.Config.FilterSubject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read the calls of consumer %s: %w", info.Name, err)
		}
		if msg, err := protocol.Unmarshal(raw.Data); err == nil && msg.RequestID != "" {
			out = append(out, msg.RequestID)
		}
		seq = raw.Sequence + 1
	}
	return out, nil
}

// earlierLayouts names the buckets and consumers of earlier versions' layouts on b's bus, for
// a hint to run hermes migrate (which finds everything else).
func earlierLayouts(ctx context.Context, b *bus.Bus) ([]string, error) {
	var out []string
	for _, bucket := range []string{earlierIntake, earlierResponses} {
		switch _, err := b.JS.KeyValue(ctx, bucket); {
		case err == nil:
			out = append(out, "bucket "+bucket)
		case !errors.Is(err, jetstream.ErrBucketNotFound):
			return nil, fmt.Errorf("look up bucket %s: %w", bucket, err)
		}
	}
	names := b.Stream.ConsumerNames(ctx)
	for name := range names.Name() {
		if strings.HasPrefix(name, earlierToolConsumerPrefix) {
			out = append(out, "consumer "+name)
		}
	}
	if err := names.Err(); err != nil {
		return nil, fmt.Errorf("list the consumers of %s: %w", protocol.StreamName, err)
	}
	return out, nil
}

// earlierBucket opens bucket and lists its keys; nil when there is no such bucket.
func earlierBucket(ctx context.Context, js jetstream.JetStream, bucket string) (jetstream.KeyValue, []string, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("look up bucket %s: %w", bucket, err)
	}
	keys, err := keysOf(ctx, kv)
	return kv, keys, err
}

// keysOf lists the keys of kv (those filters match, when given), sorted.
func keysOf(ctx context.Context, kv jetstream.KeyValue, filters ...string) ([]string, error) {
	if len(filters) == 0 {
		filters = []string{">"}
	}
	list, err := kv.ListKeysFiltered(ctx, filters...)
	if err != nil {
		return nil, fmt.Errorf("list the keys of %s: %w", kv.Bucket(), err)
	}
	var keys []string
	for k := range list.Keys() {
		keys = append(keys, k)
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("list the keys of %s: %w", kv.Bucket(), ctx.Err())
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil
}

func (m *migration) writeFound(out io.Writer) {
	if m.intake != nil {
		fmt.Fprintf(out, "  bucket %s: %d request(s) accepted by an earlier gateway\n", earlierIntake, len(m.intakeKeys))
	}
	if m.responses != nil {
		fmt.Fprintf(out, "  bucket %s: %d response(s)\n", earlierResponses, len(m.responseKeys))
	}
	for _, c := range m.consumers {
		fmt.Fprintf(out, "  consumer %s (%s): %d call(s) waiting, %d in flight\n", c.name, earlierToolFilter(c.tool), c.waiting, c.inFlight)
	}
	if len(m.toolKeys) > 0 {
		fmt.Fprintf(out, "  %s: %d tool(s) listed without an action kind (%s)\n", bus.BucketTools, len(m.toolKeys), strings.Join(m.toolKeys, ", "))
	}
	if len(m.waitKeys) > 0 {
		fmt.Fprintf(out, "  %s: %d serial request(s) waiting (%s)\n", bus.BucketSessions, len(m.waitKeys), strings.Join(m.waitKeys, ", "))
	}
	if len(m.resultKeys) > 0 {
		fmt.Fprintf(out, "  %s: %d result(s) kept beside the plans\n", bus.BucketCalls, len(m.resultKeys))
	}
}

// carry records again, where this version reads them, the responses of the earlier layouts:
// those of hermes-responses, then those on the record under the session alone. With dryRun it
// only counts them.
func (m *migration) carry(ctx context.Context) error {
	for _, key := range m.responseKeys {
		v, ok, err := stillKept(ctx, m.responses, earlierResponses, key)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if err := m.carryOne(ctx, v); err != nil {
			return err
		}
	}
	if m.recorded == 0 {
		return nil
	}
	cons, err := m.b.Stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{earlierResponseSubjects}})
	if err != nil {
		return fmt.Errorf("read the responses on %s: %w", earlierResponseSubjects, err)
	}
	// As many as were counted (no Hermes writes there any more), in batches that each end as
	// soon as what they ask for is there.
	for seen := uint64(0); seen < m.recorded; {
		batch, err := cons.Fetch(int(min(m.recorded-seen, 256)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fmt.Errorf("read the responses on %s: %w", earlierResponseSubjects, err)
		}
		n, left := 0, uint64(1)
		for msg := range batch.Messages() {
			n++
			if md, err := msg.Metadata(); err == nil {
				left = md.NumPending
			}
			if err := m.carryOne(ctx, msg.Data()); err != nil {
				return err
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("read the responses on %s: %w", earlierResponseSubjects, err)
		}
		if n == 0 || left == 0 {
			return nil // fewer than counted: the record's limits dropped some meanwhile
		}
		seen += uint64(n)
	}
	return nil
}

// carryOne records data, a response of an earlier layout, on its request's subject unless
// something is there already.
func (m *migration) carryOne(ctx context.Context, data []byte) error {
	msg, err := protocol.Unmarshal(data)
	if err != nil || msg.Type != protocol.TypeResponse || msg.MsgID == "" ||
		protocol.CheckID("request_id", msg.RequestID) != nil || protocol.CheckID("session_id", msg.SessionID) != nil {
		m.unreadable++
		return nil
	}
	if _, err := msg.DecodeResponse(); err != nil {
		m.unreadable++
		return nil
	}
	if m.answered[msg.RequestID] {
		return nil // found twice (in the bucket and on the record)
	}
	m.answered[msg.RequestID] = true
	if m.dryRun {
		switch answered, err := m.b.Answered(ctx, msg.RequestID, msg.SessionID); {
		case err != nil:
			return err
		case answered:
			m.there++
		default:
			m.carried++
		}
		return nil
	}
	hdr := nats.Header{}
	hdr.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	_, err = m.b.NewPublisher(msg.Sender).PublishAs(ctx, protocol.SubjectResponse(msg.RequestID, msg.SessionID), msg, data, carriedMsgID(msg.MsgID), hdr)
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
		m.carried++ // or by an earlier run, within the duplicate window: stored once
		return nil
	case !errors.As(err, &apiErr) || (apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence && apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequenceConstant):
		return fmt.Errorf("record the response of %s again: %w", msg.RequestID, err)
	}
	// Its subject holds something: its response (recorded by this version, or by an earlier
	// run), or something else put there first.
	switch answered, err := m.b.Answered(ctx, msg.RequestID, msg.SessionID); {
	case err != nil:
		return err
	case answered:
		m.there++
	default:
		m.blocked = append(m.blocked, msg.RequestID)
	}
	return nil
}

func (m *migration) writeCarried(out io.Writer) {
	if len(m.answered) == 0 && m.unreadable == 0 {
		return
	}
	done := "recorded again"
	if m.dryRun {
		done = "to record again"
	}
	fmt.Fprintf(out, "Responses of earlier versions (in %s, or on %s in stream %s, which keeps them): %d %s on %s, %d there already\n",
		earlierResponses, earlierResponseSubjects, protocol.StreamName, m.carried, done, protocol.SubjectResponse("<request_id>", "<session>"), m.there)
	if len(m.blocked) > 0 {
		fmt.Fprintf(out, "  not recorded, their subject holding something else first: %s\n", strings.Join(m.blocked, ", "))
	}
	if m.unreadable > 0 {
		fmt.Fprintf(out, "  %d message(s) there decode to no response: left as they are\n", m.unreadable)
	}
}

// findPending lists the work held in the earlier layouts.
func (m *migration) findPending(ctx context.Context) error {
	for _, c := range m.consumers {
		if c.waiting+c.inFlight == 0 {
			continue
		}
		named := ""
		if len(c.requests) > 0 {
			named = " (requests " + strings.Join(c.requests, ", ")
			if uint64(len(c.requests)) < c.waiting+c.inFlight {
				named += ", …"
			}
			named += ")"
		}
		m.pending = append(m.pending, fmt.Sprintf("consumer %s: %d call(s) of %s not run%s: they would never run, nor their requests be answered",
			c.name, c.waiting+c.inFlight, c.tool, named))
	}
	for _, key := range m.waitKeys {
		what := "a serial request"
		if e, err := m.b.Sessions.Get(ctx, key); err == nil {
			if w, err := protocol.Unmarshal(e.Value()); err == nil {
				what = fmt.Sprintf("serial request %s (session %s)", w.RequestID, w.SessionID)
			}
		} else if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // woken since it was listed
		} else {
			return fmt.Errorf("read %s %s: %w", bus.BucketSessions, key, err)
		}
		after := strings.TrimPrefix(key, earlierWaitPrefix)
		m.pending = append(m.pending, fmt.Sprintf("%s %s: %s waits for %s's response: it would never run", bus.BucketSessions, key, what, after))
	}
	for _, key := range m.resultKeys {
		rid, call, _ := strings.Cut(key, ".")
		done, err := m.isAnswered(ctx, rid, "")
		if err != nil {
			return err
		}
		if !done {
			m.pending = append(m.pending, fmt.Sprintf("%s %s: the result of call %s of request %s, which is not answered: it would never be", bus.BucketCalls, key, call, rid))
		}
	}
	for _, rid := range m.intakeKeys {
		v, ok, err := stillKept(ctx, m.intake, earlierIntake, rid)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		var in earlierIntakeEntry
		_ = json.Unmarshal(v, &in) // an entry that does not decode names no session
		done, err := m.isAnswered(ctx, rid, in.SessionID)
		if err != nil {
			return err
		}
		if done {
			continue
		}
		switch _, err := m.b.Plan(ctx, rid); {
		case err == nil:
			continue // planned: found and cancelled by its plan
		case !errors.Is(err, bus.ErrNotFound) && !bus.IsPermanent(err):
			return err
		}
		m.pending = append(m.pending, fmt.Sprintf("%s %s: request %s (session %s), accepted by an earlier gateway, not taken by a router yet: until one takes it, it could be neither looked up nor cancelled",
			earlierIntake, rid, rid, orDash(in.SessionID)))
	}
	return nil
}

// isAnswered reports whether requestID has a response: one an earlier layout recorded, or one
// on the record where this version reads it.
func (m *migration) isAnswered(ctx context.Context, requestID, session string) (bool, error) {
	if m.answered[requestID] {
		return true, nil
	}
	if protocol.CheckID("request_id", requestID) != nil {
		return false, nil
	}
	if protocol.CheckID("session_id", session) != nil {
		session = ""
	}
	return m.b.Answered(ctx, requestID, session)
}

// remove deletes the earlier layouts, saying what it removed.
func (m *migration) remove(ctx context.Context, out io.Writer) error {
	for _, c := range m.consumers {
		if err := m.b.Stream.DeleteConsumer(ctx, c.name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("delete consumer %s: %w", c.name, err)
		}
		fmt.Fprintf(out, "Removed consumer %s.\n", c.name)
	}
	for _, keys := range []struct {
		kv   jetstream.KeyValue
		keys []string
	}{{m.b.Tools, m.toolKeys}, {m.b.Sessions, m.waitKeys}, {m.b.Calls, m.resultKeys}} {
		for _, key := range keys.keys {
			if err := keys.kv.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
				return fmt.Errorf("delete %s %s: %w", keys.kv.Bucket(), key, err)
			}
		}
		if len(keys.keys) > 0 {
			fmt.Fprintf(out, "Removed %d key(s) of %s.\n", len(keys.keys), keys.kv.Bucket())
		}
	}
	for _, bucket := range []struct {
		name  string
		there bool
	}{{earlierIntake, m.intake != nil}, {earlierResponses, m.responses != nil}} {
		if !bucket.there {
			continue
		}
		if err := m.b.JS.DeleteKeyValue(ctx, bucket.name); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("delete bucket %s: %w", bucket.name, err)
		}
		fmt.Fprintf(out, "Removed bucket %s.\n", bucket.name)
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// stillKept reads key of bucket, listed earlier: its value, or ok false when it is gone since
// (the bucket's TTL).
func stillKept(ctx context.Context, kv jetstream.KeyValue, bucket, key string) (v []byte, ok bool, err error) {
	e, err := kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("read %s %s: %w", bucket, key, err)
	}
	return e.Value(), true, nil
}
