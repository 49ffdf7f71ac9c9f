package bus

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/retry"
)

// HeaderRestreamed, on a message Restream moved to another stream of the record, names where it
// was stored before and when: <stream>:<sequence>@<RFC 3339 time>.
const HeaderRestreamed = "Hermes-Restreamed"

// Restreamed is what Restream did.
type Restreamed struct {
	// Before and After are the numbers of streams.
	Before, After int
	// Sessions and Messages count the sessions moved to another stream, and their messages.
	Sessions, Messages int
}

// restreamCopyWait bounds the wait for the acknowledgement of one copied message.
const restreamCopyWait = 10 * time.Second

// Restream changes how many streams the record is kept in to n (1 to
// protocol.MaxRecordStreams): the migration hermes provision --streams runs.
//
// Sessions move to other streams, so it is refused while any service reads the record (a
// durable consumer of a record stream or of the dead letters has a pull waiting) or while
// anything waits to be handled (a durable consumer holds messages not yet acknowledged): stop
// every gateway first, let the routers, workers, summarizers and dead-letter processors finish,
// then stop them. The request partitions must be a multiple of n.
//
// Each moved session's messages are copied, in order, to the stream that keeps it now (each
// with HeaderRestreamed; the store time is the copy's), the durable consumers of the streams
// that received copies are deleted (they held nothing: the services create them again, at the
// end of their streams), the record's first stream is told the new number — from then on every
// process that opens the record uses it — and the moved sessions are purged from where they were;
// streams beyond n, emptied, are deleted. A moved message's sequence changes (a client resuming a
// session's events from a sequence seen before starts again). Run again after a failure, it goes
// on where it stopped: a session partly copied is copied from where its copy ends.
func (b *Bus) Restream(ctx context.Context, n int) (Restreamed, error) {
	done := Restreamed{Before: b.layout.Streams(), After: n}
	to, err := protocol.NewLayout(n)
	if err != nil {
		return done, fmt.Errorf("bus: %w", err)
	}
	if err := to.CheckPartitions(b.Partitions()); err != nil {
		return done, fmt.Errorf("bus: %w: give --partitions with --streams", err)
	}
	if n == done.Before {
		return done, nil
	}
	if err := b.quiet(ctx); err != nil {
		return done, err
	}
	// What each stream will receive, so that the byte limits make room for it while the
	// record's total stays what it was.
	incoming := map[int]int64{}
	for k, s := range b.Streams {
		err := b.eachMoving(ctx, s, k, to, func(msg jetstream.Msg, _ *jetstream.MsgMetadata, _ string, there int) error {
			incoming[there] += msgBytes(msg)
			return nil
		})
		if err != nil {
			return done, err
		}
	}
	total, err := b.recordLimits(ctx)
	if err != nil {
		return done, err
	}
	if err := b.makeRoom(ctx, to, total, incoming); err != nil {
		return done, err
	}
	// Every stream of both layouts, stream k at index k.
	streams := append([]jetstream.Stream(nil), b.Streams...)
	for k := len(streams); k < n; k++ {
		cfg := recordStreamConfig(b.cfg, to, k, b.Partitions())
		cfg.MaxBytes, cfg.MaxMsgs = roomFor(total.bytes, n, 0, incoming[k]), total.share(total.msgs, n)
		s, err := ensureStream(ctx, b.JS, true, cfg, new([]string))
		if err != nil {
			return done, err
		}
		streams = append(streams, s)
	}
	moved := make([]map[string]bool, len(b.Streams)) // by the stream they leave
	received := map[int]bool{}
	for k := range b.Streams {
		moved[k] = map[string]bool{}
		msgs, err := b.restreamFrom(ctx, streams, k, to, moved[k])
		done.Messages += msgs
		if err != nil {
			return done, err
		}
		for session := range moved[k] {
			received[to.StreamOf(session)] = true
		}
		done.Sessions += len(moved[k])
	}
	// The consumers of streams that were here before and received copies would take the
	// copies for new work: they held nothing, and are made again at the streams' ends.
	for k := range received {
		if k < len(b.Streams) {
			if err := dropDurables(ctx, streams[k]); err != nil {
				return done, err
			}
		}
	}
	if err := b.tellStreams(ctx, to); err != nil {
		return done, err
	}
	for k, sessions := range moved {
		for session := range sessions {
			for _, f := range b.layout.FilterSession(session) {
				if err := streams[k].Purge(ctx, jetstream.WithPurgeSubject(f)); err != nil {
					return done, fmt.Errorf("bus: remove session %s from stream %s: %w", session, protocol.RecordStream(k), err)
				}
			}
		}
	}
	for k := n; k < len(b.Streams); k++ {
		if err := b.JS.DeleteStream(ctx, protocol.RecordStream(k)); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return done, fmt.Errorf("bus: delete stream %s, emptied: %w", protocol.RecordStream(k), err)
		}
	}
	// The record's limits shared by its streams again.
	for k := range min(n, len(streams)) {
		if err := setLimits(ctx, b.JS, streams[k], total.share(total.bytes, n), total.share(total.msgs, n)); err != nil {
			return done, err
		}
	}
	return done, nil
}

// limits are the record's limits, all its streams together (-1: none).
type limits struct{ bytes, msgs int64 }

// share is a stream's share of limit among n streams.
func (limits) share(limit int64, n int) int64 {
	if limit <= 0 {
		return limit
	}
	return max(limit/int64(n), 1)
}

// recordLimits adds up the byte and message limits of the record's streams.
func (b *Bus) recordLimits(ctx context.Context) (limits, error) {
	var l limits
	for _, s := range b.Streams {
		info, err := s.Info(ctx)
		if err != nil {
			return l, fmt.Errorf("bus: read stream %s: %w", s.CachedInfo().Config.Name, err)
		}
		for _, p := range []struct {
			total *int64
			have  int64
		}{{&l.bytes, info.Config.MaxBytes}, {&l.msgs, info.Config.MaxMsgs}} {
			switch {
			case *p.total < 0:
			case p.have <= 0:
				*p.total = -1
			default:
				*p.total += p.have
			}
		}
	}
	return l, nil
}

// roomFor is the byte limit of a stream of a record of n streams that holds used bytes and will
// receive incoming: its share of total, or what it will hold, whichever is more.
func roomFor(total int64, n int, used, incoming int64) int64 {
	if total <= 0 {
		return total
	}
	return max(total/int64(n), used+incoming+1<<20)
}

// makeRoom sets the byte limits of the record's streams for a restream to layout to: each that
// stays its share of total or what it will hold, whichever is more; each that goes, what it holds.
func (b *Bus) makeRoom(ctx context.Context, to protocol.Layout, total limits, incoming map[int]int64) error {
	if total.bytes <= 0 {
		return nil
	}
	// Those that shrink first: the server counts what every stream may hold.
	for pass := range 2 {
		for k, s := range b.Streams {
			info, err := s.Info(ctx)
			if err != nil {
				return fmt.Errorf("bus: read stream %s: %w", protocol.RecordStream(k), err)
			}
			room := int64(info.State.Bytes) + 1<<20
			if k < to.Streams() {
				room = roomFor(total.bytes, to.Streams(), int64(info.State.Bytes), incoming[k])
			}
			if (room < info.Config.MaxBytes) != (pass == 0) {
				continue
			}
			if err := setLimits(ctx, b.JS, s, room, info.Config.MaxMsgs); err != nil {
				return err
			}
		}
	}
	return nil
}

// setLimits sets stream s's byte and message limits.
func setLimits(ctx context.Context, js jetstream.JetStream, s jetstream.Stream, bytes, msgs int64) error {
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("bus: read stream %s: %w", s.CachedInfo().Config.Name, err)
	}
	cfg := info.Config
	if cfg.MaxBytes == bytes && cfg.MaxMsgs == msgs {
		return nil
	}
	cfg.MaxBytes, cfg.MaxMsgs = bytes, msgs
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("bus: set stream %s's limits to %d bytes, %d messages: %w%s", cfg.Name, bytes, msgs, err, storageHint(err))
	}
	return nil
}

// quiet returns an error naming the first durable consumer of the record (or of the dead
// letters) that a service reads, or that holds messages not yet handled.
func (b *Bus) quiet(ctx context.Context) error {
	for i := range idleChecks {
		if i > 0 && !retry.Sleep(ctx, idleGap) {
			return ctx.Err()
		}
		for _, s := range append(append([]jetstream.Stream(nil), b.Streams...), b.DLQ) {
			list := s.ListConsumers(ctx)
			for info := range list.Info() {
				if info.Config.Durable == "" {
					continue // a reader's own (hermes tail, a web page's events)
				}
				name := s.CachedInfo().Config.Name
				if info.NumWaiting > 0 {
					return fmt.Errorf("bus: a service reads consumer %s of stream %s: stop every Hermes service before changing the record's streams", info.Name, name)
				}
				if waiting := holding(info); waiting > 0 {
					return fmt.Errorf("bus: consumer %s of stream %s holds %d messages not yet handled: stop the gateways, let the other services finish, stop them, then change the record's streams", info.Name, name, waiting)
				}
			}
			if err := list.Err(); err != nil {
				return fmt.Errorf("bus: list the consumers of stream %s: %w", s.CachedInfo().Config.Name, err)
			}
		}
	}
	return nil
}

// eachMoving calls f with each message of record stream k whose session layout to keeps in
// another stream, in order, with that stream's index.
func (b *Bus) eachMoving(ctx context.Context, s jetstream.Stream, k int, to protocol.Layout, f func(msg jetstream.Msg, md *jetstream.MsgMetadata, session string, there int) error) error {
	name := protocol.RecordStream(k)
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("bus: read stream %s: %w", name, err)
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return fmt.Errorf("bus: read stream %s: %w", name, err)
	}
	defer func() {
		if ci := cons.CachedInfo(); ci != nil {
			_ = b.JS.DeleteConsumer(context.WithoutCancel(ctx), name, ci.Name)
		}
	}()
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("bus: read stream %s: %w", name, err)
	}
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return fmt.Errorf("bus: read stream %s: %w", name, err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("bus: read stream %s: %w", name, err)
		}
		subject := msg.Subject()
		session := subject[strings.LastIndexByte(subject, '.')+1:]
		if there := to.StreamOf(session); there != k {
			if err := f(msg, md, session, there); err != nil {
				return err
			}
		}
		if md.NumPending == 0 || md.Sequence.Stream >= last {
			return nil
		}
	}
}

// restreamFrom copies the messages of stream k whose sessions layout to keeps elsewhere to
// their streams, in order, noting each session in moved, and returns how many it copied. A
// session's messages already in its new stream (a run cut short before) are not copied again:
// its copy goes on from there.
func (b *Bus) restreamFrom(ctx context.Context, streams []jetstream.Stream, k int, to protocol.Layout, moved map[string]bool) (int, error) {
	skip := map[string]uint64{} // per moved session: its messages already copied, not yet skipped
	copied := 0
	err := b.eachMoving(ctx, streams[k], k, to, func(msg jetstream.Msg, md *jetstream.MsgMetadata, session string, there int) error {
		if !moved[session] {
			moved[session] = true
			n, err := countSession(ctx, streams[there], to, session)
			if err != nil {
				return err
			}
			skip[session] = n
		}
		if skip[session] > 0 {
			skip[session]--
			return nil
		}
		if err := b.copyTo(ctx, msg, md, to, session); err != nil {
			return err
		}
		copied++
		return nil
	})
	return copied, err
}

// msgBytes is about what a stream counts of msg against its byte limit.
func msgBytes(msg jetstream.Msg) int64 {
	n := len(msg.Subject()) + len(msg.Data()) + 64
	for k, vs := range msg.Headers() {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return int64(n) + int64(len(HeaderRestreamed)) + 64
}

// countSession is how many messages of session stream s holds, as layout to names them.
func countSession(ctx context.Context, s jetstream.Stream, to protocol.Layout, session string) (uint64, error) {
	var n uint64
	for _, f := range to.FilterSession(session) {
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(f))
		if err != nil {
			return 0, fmt.Errorf("bus: count session %s's messages in stream %s: %w", session, s.CachedInfo().Config.Name, err)
		}
		for _, c := range info.State.Subjects {
			n += c
		}
	}
	return n, nil
}

// copyTo publishes msg (of session) again to the stream layout to keeps the session in, with its
// headers and HeaderRestreamed. A request is published where requests enter (its stream adds the
// partition, the same number of them).
func (b *Bus) copyTo(ctx context.Context, msg jetstream.Msg, md *jetstream.MsgMetadata, to protocol.Layout, session string) error {
	subject := to.Place(msg.Subject(), session)
	if c := protocol.CanonicalSubject(msg.Subject()); strings.HasPrefix(c, protocol.PrefixRequests) && !strings.HasPrefix(c, protocol.PrefixRequests+"fast.") {
		subject = to.SubjectRequest(session)
	}
	out := &nats.Msg{Subject: subject, Data: msg.Data(), Header: nats.Header{}}
	maps.Copy(out.Header, msg.Headers())
	from := md.Stream + ":" + strconv.FormatUint(md.Sequence.Stream, 10)
	out.Header.Set(HeaderRestreamed, from+"@"+md.Timestamp.UTC().Format(time.RFC3339Nano))
	// An id of its own: the stream it goes to may have stored a message under the original's
	// id within its duplicate window (where the session was before), and a copy of this copy
	// must not be dropped for it; the same copy made again (a run cut short) is.
	if id := out.Header.Get(jetstream.MsgIDHeader); id != "" {
		base, _, _ := strings.Cut(id, ":restream:")
		out.Header.Set(jetstream.MsgIDHeader, base+":restream:"+from)
	}
	pctx, cancel := context.WithTimeout(ctx, restreamCopyWait)
	defer cancel()
	if _, err := b.JS.PublishMsg(pctx, out); err != nil {
		return fmt.Errorf("bus: copy message %d of stream %s to %s: %w", md.Sequence.Stream, md.Stream, subject, err)
	}
	return nil
}

// dropDurables deletes the durable consumers of stream s.
func dropDurables(ctx context.Context, s jetstream.Stream) error {
	list := s.ListConsumers(ctx)
	var names []string
	for info := range list.Info() {
		if info.Config.Durable != "" {
			names = append(names, info.Name)
		}
	}
	if err := list.Err(); err != nil {
		return fmt.Errorf("bus: list the consumers of stream %s: %w", s.CachedInfo().Config.Name, err)
	}
	for _, name := range names {
		if err := s.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("bus: delete consumer %s of stream %s: %w", name, s.CachedInfo().Config.Name, err)
		}
	}
	return nil
}

// tellStreams writes layout to's number of streams in the record's first stream: from then on,
// every process that opens the record uses it.
func (b *Bus) tellStreams(ctx context.Context, to protocol.Layout) error {
	info, err := b.Stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("bus: read stream %s: %w", protocol.StreamName, err)
	}
	cfg := info.Config
	want := recordStreamConfig(b.cfg, to, 0, b.Partitions())
	cfg.Metadata = maps.Clone(cfg.Metadata)
	if cfg.Metadata == nil {
		cfg.Metadata = map[string]string{}
	}
	delete(cfg.Metadata, metaStreams)
	maps.Copy(cfg.Metadata, want.Metadata)
	cfg.Description = want.Description
	if _, err := b.JS.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("bus: keep the record in %d streams: %w", to.Streams(), err)
	}
	return nil
}
