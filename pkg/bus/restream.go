package bus

import (
	"context"
	"encoding/json"
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

// metaRestream, in the record's first stream's metadata, says a change of its number of streams
// is under way (restreaming, as JSON): a run cut short is finished by the next.
const metaRestream = "hermes.record.restream"

// restreaming is a change of the record's streams under way.
type restreaming struct {
	From, To int
	// Bytes and Msgs are the record's limits, all its streams together, when it began (-1:
	// none).
	Bytes, Msgs int64
	// Upto is, per source stream (by index), the last sequence its copy reads: what is
	// removed from it once copied, and no more.
	Upto []uint64 `json:",omitempty"`
	// Switched: the sessions are copied and the first stream says To; what is left is removing
	// them from where they were.
	Switched bool
}

// Restreamed is what Restream did.
type Restreamed struct {
	// Before and After are the numbers of streams.
	Before, After int
	// Sessions and Messages count the sessions moved to another stream, and the messages
	// copied; Removed the messages removed from where they were.
	Sessions, Messages, Removed int
}

// restreamWait bounds the wait for one message while a stream is read, and for the
// acknowledgement of one copied message.
const restreamWait = 10 * time.Second

// Restream changes how many streams the record is kept in to n (1 to
// protocol.MaxRecordStreams): the migration hermes provision --streams runs.
//
// Sessions move to other streams, so it is refused while any service reads the record (a
// durable consumer of a record stream, of the dead letters or of the clients' requests has a
// pull waiting) or while anything waits to be handled (a durable consumer of the record or the
// dead letters, but the audit's, holds messages not yet acknowledged): stop every gateway
// first, let the routers, workers, summarizers and dead-letter processors finish, then stop
// them and the audit (Quiet). The request partitions must be a multiple of n.
//
// The record's first stream is told first that the change is under way, then: the byte and
// message limits make room for what each stream will receive, the streams added are made with
// the record's settings, each moved session's messages are copied, in order, to the stream that
// keeps it now (each with HeaderRestreamed and an id of its own; its store time and sequence are
// the copy's), Hermes' durable consumers of the streams that received copies are deleted (they
// held nothing; the services make them again, at the streams' ends; the audit's stay, and read
// the copies too), the first stream is told the new number — from then on every process that
// opens the record uses it — the moved sessions are removed from where they were, the emptied
// streams deleted and the limits shared again. Run again after a failure at any step, it
// finishes the change begun (and only that one).
func (b *Bus) Restream(ctx context.Context, n int) (Restreamed, error) {
	first, err := b.JS.Stream(ctx, protocol.StreamName)
	if err != nil {
		return Restreamed{}, fmt.Errorf("bus: read stream %s: %w", protocol.StreamName, err)
	}
	st, err := restreamOf(first.CachedInfo().Config)
	if err != nil {
		return Restreamed{}, err
	}
	cur, err := RecordLayout(first.CachedInfo().Config)
	if err != nil {
		return Restreamed{}, err
	}
	to, err := protocol.NewLayout(n)
	if err != nil {
		return Restreamed{}, fmt.Errorf("bus: %w", err)
	}
	if st != nil && st.To != n {
		return Restreamed{Before: st.From, After: n}, fmt.Errorf("bus: the record's streams are being changed from %d to %d, unfinished: run hermes provision --streams %d to finish that first", st.From, st.To, st.To)
	}
	if st == nil && n == cur.Streams() {
		return Restreamed{Before: n, After: n}, nil
	}
	if err := to.CheckPartitions(b.Partitions()); err != nil {
		return Restreamed{Before: cur.Streams(), After: n}, fmt.Errorf("bus: %w: change the partitions too (--partitions)", err)
	}
	if err := b.Quiet(ctx); err != nil {
		return Restreamed{Before: cur.Streams(), After: n}, err
	}
	if st == nil {
		bytes, msgs, err := recordLimits(ctx, b.JS, cur)
		if err != nil {
			return Restreamed{}, err
		}
		st = &restreaming{From: cur.Streams(), To: n, Bytes: bytes, Msgs: msgs}
		if err := b.markRestream(ctx, st, cur); err != nil {
			return Restreamed{}, err
		}
	}
	r := &restreamer{b: b, st: st, base: first.CachedInfo().Config, done: Restreamed{Before: st.From, After: st.To}, into: map[string]int{}}
	r.from, _ = protocol.NewLayout(st.From)
	r.to = to
	if err := r.run(ctx); err != nil {
		return r.done, err
	}
	return r.done, nil
}

// Restreaming says which change of the record's streams is under way, unfinished (Restream
// cut short): nil when none is.
func (b *Bus) Restreaming(ctx context.Context) (*Restreamed, error) {
	first, err := b.JS.Stream(ctx, protocol.StreamName)
	if err != nil {
		return nil, fmt.Errorf("bus: read stream %s: %w", protocol.StreamName, err)
	}
	st, err := restreamOf(first.CachedInfo().Config)
	if st == nil || err != nil {
		return nil, err
	}
	return &Restreamed{Before: st.From, After: st.To}, nil
}

// RecordLayouts are the layouts the record's sessions may be kept in, read from its first
// stream's configuration: its own, and while a change of its streams is under way, the other
// one too (a session may then be in either).
func RecordLayouts(cfg jetstream.StreamConfig) ([]protocol.Layout, error) {
	l, err := RecordLayout(cfg)
	if err != nil {
		return nil, err
	}
	out := []protocol.Layout{l}
	st, err := restreamOf(cfg)
	if err != nil || st == nil {
		return out, err
	}
	other := st.To
	if other == l.Streams() {
		other = st.From
	}
	ol, err := protocol.NewLayout(other)
	if err != nil {
		return nil, fmt.Errorf("bus: %w", err)
	}
	return append(out, ol), nil
}

// restreamStep is called after each step of Restream a run may be cut short at ("copied" a
// message, "switched" the number): tests end a run there (Bus.onRestreamStep).
func (b *Bus) restreamStep(step string) error {
	if b.onRestreamStep == nil {
		return nil
	}
	return b.onRestreamStep(step)
}

// restreamer carries out one change of the record's streams.
type restreamer struct {
	b        *Bus
	st       *restreaming
	from, to protocol.Layout
	// base is the first stream's configuration: the record's settings, for the streams added.
	base jetstream.StreamConfig
	done Restreamed
	// into counts the copies this run stored, by stream name.
	into map[string]int
}

func (r *restreamer) run(ctx context.Context) error {
	if !r.st.Switched {
		if err := r.copyAll(ctx); err != nil {
			return err
		}
		// Nothing may read the record, nor have been stored in a source since its copy was
		// bounded (it would be neither copied nor removed).
		if err := r.b.quiet(ctx, false); err != nil {
			return err
		}
		for k, upto := range r.st.Upto {
			s, err := r.b.JS.Stream(ctx, protocol.RecordStream(k))
			if err != nil {
				return fmt.Errorf("bus: read stream %s: %w", protocol.RecordStream(k), err)
			}
			// (A source that keeps sessions receives copies too: those are after it.)
			if last, want := s.CachedInfo().State.LastSeq, upto+uint64(r.into[protocol.RecordStream(k)]); last != want {
				return fmt.Errorf("bus: stream %s was written during the change (its last message is %d, %d expected): something still writes to the record; stop it and run again", protocol.RecordStream(k), last, want)
			}
		}
		r.st.Switched = true
		if err := r.b.markRestream(ctx, r.st, r.to); err != nil {
			return err
		}
		if err := r.b.restreamStep("switched"); err != nil {
			return err
		}
	}
	return r.finish(ctx)
}

// stream opens record stream k; nil when it does not exist.
func (r *restreamer) stream(ctx context.Context, k int) (jetstream.Stream, error) {
	s, err := r.b.JS.Stream(ctx, protocol.RecordStream(k))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bus: read stream %s: %w", protocol.RecordStream(k), err)
	}
	return s, nil
}

// copyAll makes room, makes the streams added and copies every moved session to its stream.
func (r *restreamer) copyAll(ctx context.Context) error {
	sources := make([]jetstream.Stream, r.from.Streams())
	for k := range sources {
		s, err := r.stream(ctx, k)
		if err != nil {
			return err
		}
		if s == nil {
			return fmt.Errorf("bus: stream %s of the record is not there", protocol.RecordStream(k))
		}
		sources[k] = s
	}
	// How far each source is copied (and later removed): as it is now.
	r.st.Upto = make([]uint64, len(sources))
	for k, s := range sources {
		info, err := s.Info(ctx)
		if err != nil {
			return fmt.Errorf("bus: read stream %s: %w", protocol.RecordStream(k), err)
		}
		r.st.Upto[k] = info.State.LastSeq
	}
	if err := r.b.markRestream(ctx, r.st, r.from); err != nil {
		return err
	}
	// What each stream will receive, so that the limits make room for it while the record's
	// total stays what it was.
	incoming := map[int][2]int64{}
	for k, s := range sources {
		err := eachMoving(ctx, r.b.JS, s, k, r.st.Upto[k], r.to, func(msg jetstream.Msg, _ *jetstream.MsgMetadata, _ string, there int) error {
			in := incoming[there]
			incoming[there] = [2]int64{in[0] + msgBytes(msg), in[1] + 1}
			return nil
		})
		if err != nil {
			return err
		}
	}
	// Those that shrink first: the server counts what every stream may hold.
	for k, s := range sources {
		if err := r.makeRoom(ctx, s, k, incoming[k], false); err != nil {
			return err
		}
	}
	targets := make([]jetstream.Stream, r.to.Streams())
	for k := range targets {
		if k < len(sources) {
			targets[k] = sources[k]
			continue
		}
		s, err := r.stream(ctx, k)
		if err != nil {
			return err
		}
		if s != nil { // made by a run cut short
			if err := r.makeRoom(ctx, s, k, incoming[k], true); err != nil {
				return err
			}
			targets[k] = s
			continue
		}
		cfg := r.streamConfig(k)
		cfg.MaxBytes = roomFor(r.st.Bytes, r.to.Streams(), 0, incoming[k][0])
		cfg.MaxMsgs = roomFor(r.st.Msgs, r.to.Streams(), 0, incoming[k][1])
		if targets[k], err = r.b.JS.CreateStream(ctx, cfg); err != nil {
			return fmt.Errorf("bus: create stream %s: %w%s", cfg.Name, err, storageHint(err))
		}
	}
	for k, s := range sources {
		if err := r.makeRoom(ctx, s, k, incoming[k], true); err != nil {
			return err
		}
	}
	// The consumers of streams that were there before and receive copies would take the
	// copies for new work: they hold nothing (Quiet), and are made again at the streams' ends.
	// The audit's are kept: they read the copies, harmlessly (hermesConsumer).
	for k := range targets {
		if incoming[k][1] > 0 {
			if err := deleteConsumers(ctx, targets[k], hermesConsumer); err != nil {
				return err
			}
		}
	}
	for k, s := range sources {
		if err := r.copyFrom(ctx, s, k, targets); err != nil {
			return err
		}
	}
	return nil
}

// streamConfig is the configuration of record stream k of the layout to: the record's settings
// (its first stream's), its own subjects.
func (r *restreamer) streamConfig(k int) jetstream.StreamConfig {
	want := recordStreamConfig(r.b.cfg, r.to, k, r.b.Partitions())
	cfg := r.base
	cfg.Name, cfg.Description, cfg.Subjects, cfg.SubjectTransform, cfg.RePublish = want.Name, want.Description, want.Subjects, want.SubjectTransform, want.RePublish
	cfg.Metadata = want.Metadata
	return cfg
}

// copyFrom copies the messages of source stream k (s) whose sessions layout to keeps elsewhere
// to their streams, in order. A session already partly copied (a run cut short) is copied from
// after the last message its copy holds.
func (r *restreamer) copyFrom(ctx context.Context, s jetstream.Stream, k int, targets []jetstream.Stream) error {
	after := map[string]uint64{} // per moved session: the last sequence here its copy holds
	source := protocol.RecordStream(k)
	return eachMoving(ctx, r.b.JS, s, k, r.st.Upto[k], r.to, func(msg jetstream.Msg, md *jetstream.MsgMetadata, session string, there int) error {
		last, seen := after[session]
		if !seen {
			var err error
			if last, err = r.b.copiedUpTo(ctx, targets[there], r.to, session, source); err != nil {
				return err
			}
			after[session] = last
			r.done.Sessions++
		}
		if md.Sequence.Stream <= last {
			return nil
		}
		stream, err := r.b.copyTo(ctx, msg, md, r.to, session)
		if err != nil {
			return err
		}
		r.into[stream]++
		r.done.Messages++
		return r.b.restreamStep("copied")
	})
}

// copiedUpTo is the sequence in stream source of the last message of session that stream s (of
// layout to) holds a copy of, read from its leader; 0 when it holds none. A session whose newest
// message there is no copy from source was written there during the change: an error.
func (b *Bus) copiedUpTo(ctx context.Context, s jetstream.Stream, to protocol.Layout, session, source string) (uint64, error) {
	name := s.CachedInfo().Config.Name
	var newest *jetstream.RawStreamMsg
	for _, f := range to.FilterSession(session) {
		raw, err := b.leaderGet(ctx, name, msgGetRequest{LastFor: f})
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("bus: read session %s's messages in stream %s: %w", session, name, err)
		}
		if newest == nil || raw.Sequence > newest.Sequence {
			newest = raw
		}
	}
	if newest == nil {
		return 0, nil
	}
	from, _, _ := strings.Cut(newest.Header.Get(HeaderRestreamed), "@")
	stream, seq, ok := strings.Cut(from, ":")
	n, err := strconv.ParseUint(seq, 10, 64)
	if !ok || stream != source || err != nil {
		return 0, fmt.Errorf("bus: stream %s holds a message of session %s that is no copy from %s (sequence %d): something wrote to the record during the change", name, session, source, newest.Sequence)
	}
	return n, nil
}

// finish removes the moved sessions from where they were, deletes the emptied streams and
// shares the limits again, then says the change is done.
func (r *restreamer) finish(ctx context.Context) error {
	for k := range r.to.Streams() {
		s, err := r.stream(ctx, k)
		if err != nil {
			return err
		}
		if s == nil {
			return fmt.Errorf("bus: stream %s of the record is not there", protocol.RecordStream(k))
		}
		// A request partition's consumer lies in the stream that holds the partition now.
		misplaced := func(name string) bool {
			p, ok := partitionOf(name)
			return ok && r.to.StreamOfPartition(p) != k
		}
		if err := deleteConsumers(ctx, s, misplaced); err != nil {
			return err
		}
	}
	for k := range r.from.Streams() {
		s, err := r.stream(ctx, k)
		if err != nil {
			return err
		}
		if s == nil {
			continue // deleted by a run cut short after
		}
		upto := uint64(0) // no bound noted: every message there now was copied
		if k < len(r.st.Upto) {
			upto = r.st.Upto[k]
		}
		removed, err := r.removeMoved(ctx, s, k, upto)
		r.done.Removed += removed
		if err != nil {
			return err
		}
		if k < r.to.Streams() {
			continue
		}
		info, err := s.Info(ctx)
		if err != nil {
			return fmt.Errorf("bus: read stream %s: %w", protocol.RecordStream(k), err)
		}
		if info.State.Msgs > 0 {
			return fmt.Errorf("bus: stream %s still holds %d messages of sessions kept elsewhere: not deleted", protocol.RecordStream(k), info.State.Msgs)
		}
		if err := r.b.JS.DeleteStream(ctx, protocol.RecordStream(k)); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("bus: delete stream %s, emptied: %w", protocol.RecordStream(k), err)
		}
	}
	// The record's limits shared by its streams again: each what it holds and an even share
	// of the room left. Each is described as what it now is; the first last, which says the
	// change is done.
	infos := make([]*jetstream.StreamInfo, r.to.Streams())
	var usedBytes, usedMsgs int64
	for k := range infos {
		s, err := r.stream(ctx, k)
		if err != nil {
			return err
		}
		if infos[k], err = s.Info(ctx); err != nil {
			return fmt.Errorf("bus: read stream %s: %w", protocol.RecordStream(k), err)
		}
		usedBytes += int64(infos[k].State.Bytes)
		usedMsgs += int64(infos[k].State.Msgs)
	}
	share := func(total, used, all int64) int64 {
		if total <= 0 {
			return total
		}
		return used + max(slack(used), (total-all)/int64(r.to.Streams()))
	}
	// Those that shrink first (the server counts what every stream may hold), then the others;
	// the first stream is told last that the change is done.
	for _, grow := range []bool{false, true} {
		for k, info := range infos {
			cfg := info.Config
			cfg.MaxBytes = share(r.st.Bytes, int64(info.State.Bytes), usedBytes)
			cfg.MaxMsgs = share(r.st.Msgs, int64(info.State.Msgs), usedMsgs)
			cfg.Description = recordStreamConfig(r.b.cfg, r.to, k, r.b.Partitions()).Description
			if growsInBytes(cfg.MaxBytes, info.Config.MaxBytes) != grow {
				continue
			}
			if err := r.setLimits(ctx, cfg); err != nil {
				return err
			}
		}
	}
	first, err := r.b.JS.Stream(ctx, protocol.StreamName)
	if err != nil {
		return fmt.Errorf("bus: read stream %s: %w", protocol.StreamName, err)
	}
	cfg := first.CachedInfo().Config
	cfg.Metadata = maps.Clone(cfg.Metadata)
	delete(cfg.Metadata, metaRestream)
	if _, err := r.b.JS.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("bus: note in %s that the change of its streams is done: %w", protocol.StreamName, err)
	}
	return nil
}

// removeMoved removes from source stream k (s) the messages of the sessions the new layout keeps
// elsewhere, and returns how many. Those stored after upto (0: none are), after their copy was
// bounded — written with the old layout after the change switched — are copied first: newer than
// any copy, they follow them.
func (r *restreamer) removeMoved(ctx context.Context, s jetstream.Stream, k int, upto uint64) (int, error) {
	info, err := s.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("bus: read stream %s: %w", protocol.RecordStream(k), err)
	}
	last := info.State.LastSeq
	if upto == 0 {
		upto = last
	}
	moved := map[string]bool{}
	removed := 0 // every message of a moved session up to last: what the purges below remove
	err = eachMoving(ctx, r.b.JS, s, k, last, r.to, func(msg jetstream.Msg, md *jetstream.MsgMetadata, session string, _ int) error {
		moved[session] = true
		removed++
		if md.Sequence.Stream <= upto {
			return nil
		}
		if _, err := r.b.copyTo(ctx, msg, md, r.to, session); err != nil {
			return err
		}
		r.done.Messages++
		return nil
	})
	if err != nil {
		return 0, err
	}
	for session := range moved {
		for _, f := range r.from.FilterSession(session) {
			if err := s.Purge(ctx, jetstream.WithPurgeSubject(f), jetstream.WithPurgeSequence(last+1)); err != nil {
				return 0, fmt.Errorf("bus: remove session %s from stream %s: %w", session, protocol.RecordStream(k), err)
			}
		}
	}
	return removed, nil
}

// Quiet returns an error naming the first durable consumer of the record, of the dead letters
// or of the clients' requests that a service reads, or of the first two that holds messages
// not yet handled: nil when every Hermes service is stopped and done.
func (b *Bus) Quiet(ctx context.Context) error { return b.quiet(ctx, true) }

// quiet is Quiet; without pending, it looks only for services reading.
func (b *Bus) quiet(ctx context.Context, pending bool) error {
	type look struct {
		s       jetstream.Stream
		pending bool // what it holds must be handled first
	}
	var looks []look
	for k := range protocol.MaxRecordStreams {
		if s, err := b.JS.Stream(ctx, protocol.RecordStream(k)); err == nil {
			looks = append(looks, look{s, true})
		} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("bus: read stream %s: %w", protocol.RecordStream(k), err)
		}
	}
	looks = append(looks, look{b.DLQ, true})
	if b.Clients != nil {
		// Clients' requests not yet taken are taken later, by gateways of the new number.
		looks = append(looks, look{b.Clients, false})
	}
	for i := range idleChecks {
		if i > 0 && !retry.Sleep(ctx, idleGap) {
			return ctx.Err()
		}
		for _, l := range looks {
			name := l.s.CachedInfo().Config.Name
			list := l.s.ListConsumers(ctx)
			for info := range list.Info() {
				if info.Config.Durable == "" {
					continue // a reader's own (hermes tail, a web page's events)
				}
				if info.NumWaiting > 0 {
					return fmt.Errorf("bus: a service reads consumer %s of stream %s: stop every Hermes service before changing the record's streams", info.Name, name)
				}
				// What Hermes' own consumers hold is work; another's (an operator's reader) is not
				// Hermes' to wait for.
				ours := hermesConsumer(info.Name) || info.Name == ConsumerDeadLetters
				if waiting := holding(info); waiting > 0 && l.pending && pending && ours {
					return fmt.Errorf("bus: consumer %s of stream %s holds messages not yet handled (%d): stop the gateways, let the other services finish, stop them, then change the record's streams", info.Name, name, waiting)
				}
			}
			if err := list.Err(); err != nil {
				return fmt.Errorf("bus: list the consumers of stream %s: %w", name, err)
			}
		}
	}
	return nil
}

// eachMoving calls f with each message of record stream k (s) up to sequence upto (0: its last
// when it begins) whose session layout to keeps in another stream, in order, with that stream's
// index.
func eachMoving(ctx context.Context, js jetstream.JetStream, s jetstream.Stream, k int, upto uint64, to protocol.Layout, f func(msg jetstream.Msg, md *jetstream.MsgMetadata, session string, there int) error) error {
	name := protocol.RecordStream(k)
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("bus: read stream %s: %w", name, err)
	}
	last := info.State.LastSeq
	if upto != 0 {
		last = min(last, upto)
	}
	if info.State.Msgs == 0 || info.State.FirstSeq > last {
		return nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return fmt.Errorf("bus: read stream %s: %w", name, err)
	}
	defer func() {
		if ci := cons.CachedInfo(); ci != nil {
			_ = js.DeleteConsumer(context.WithoutCancel(ctx), name, ci.Name)
		}
	}()
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("bus: read stream %s: %w", name, err)
	}
	defer it.Stop()
	for {
		wait, cancel := context.WithTimeout(ctx, restreamWait)
		msg, err := it.Next(jetstream.NextContext(wait))
		cancel()
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			// Nothing came: what was left to read may have aged out meanwhile.
			if ci, ierr := cons.Info(ctx); ierr == nil && ci.NumPending == 0 {
				return nil
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("bus: read stream %s: %w", name, err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("bus: read stream %s: %w", name, err)
		}
		if md.Sequence.Stream > last {
			return nil
		}
		session := protocol.SessionOfSubject(msg.Subject())
		if there := to.StreamOf(session); there != k {
			if err := f(msg, md, session, there); err != nil {
				return err
			}
		}
		if md.NumPending == 0 || md.Sequence.Stream == last {
			return nil
		}
	}
}

// copyTo publishes msg (of session) again to the stream layout to keeps the session in, with its
// headers but the server's own (an expected last sequence would be another stream's) and
// HeaderRestreamed. A request is published where requests enter (its stream adds the
// partition, the same number of them).
func (b *Bus) copyTo(ctx context.Context, msg jetstream.Msg, md *jetstream.MsgMetadata, to protocol.Layout, session string) (stream string, err error) {
	subject := to.Place(msg.Subject(), session)
	if c := protocol.CanonicalSubject(msg.Subject()); strings.HasPrefix(c, protocol.PrefixRequests) && !strings.HasPrefix(c, protocol.PrefixRequests+"fast.") {
		subject = to.SubjectRequest(session)
	}
	out := &nats.Msg{Subject: subject, Data: msg.Data(), Header: nats.Header{}}
	for k, v := range msg.Headers() {
		if !strings.HasPrefix(k, "Nats-") || k == jetstream.MsgIDHeader {
			out.Header[k] = v
		}
	}
	from := md.Stream + ":" + strconv.FormatUint(md.Sequence.Stream, 10)
	out.Header.Set(HeaderRestreamed, from+"@"+md.Timestamp.UTC().Format(time.RFC3339Nano))
	// An id of its own: the stream it goes to may have stored a message under the original's
	// id within its duplicate window (where the session was before), and a copy of this copy
	// must not be dropped for it; the same copy made again is.
	if id := out.Header.Get(jetstream.MsgIDHeader); id != "" {
		base, _, _ := strings.Cut(id, ":restream:")
		out.Header.Set(jetstream.MsgIDHeader, base+":restream:"+from)
	}
	pctx, cancel := context.WithTimeout(ctx, restreamWait)
	defer cancel()
	ack, err := b.JS.PublishMsg(pctx, out)
	if err != nil {
		return "", fmt.Errorf("bus: copy message %d of stream %s to %s: %w", md.Sequence.Stream, md.Stream, subject, err)
	}
	if ack.Duplicate {
		return "", nil // stored by a run cut short, after its copy was bounded
	}
	return ack.Stream, nil
}

// msgBytes is about what a stream counts of msg, copied, against its byte limit.
func msgBytes(msg jetstream.Msg) int64 {
	n := len(msg.Subject()) + len(msg.Data()) + 128
	for k, vs := range msg.Headers() {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return int64(n) + int64(len(HeaderRestreamed))
}

// hermesConsumer reports whether name is one of the durable consumers Hermes makes on the
// record's streams for its work: those a change of the record's streams waits for (Quiet) and
// deletes where copies arrive. The audit's (ConsumerAudit) is none: it holds no work, and what
// it writes is idempotent, so a change leaves it as it is, however far behind it is. It reads
// the copies its stream receives as anything new (those it had read before are read again,
// harmlessly: HeaderRestreamed says they are copies); what it had not read of a session moved
// away it reads in the copy; one on a stream the change deletes goes with the stream, and the
// audit makes one on each stream added, from the stream's first message. (A running audit
// holds the change up, as any service reading does.)
func hermesConsumer(name string) bool {
	_, partition := partitionOf(name)
	return partition || name == ConsumerRouterResults || name == ConsumerSummarizer || strings.HasPrefix(name, "tool_")
}

// deleteConsumers deletes the consumers of stream s whose names which picks.
func deleteConsumers(ctx context.Context, s jetstream.Stream, which func(name string) bool) error {
	name := s.CachedInfo().Config.Name
	names := s.ConsumerNames(ctx)
	var drop []string
	for c := range names.Name() {
		if which(c) {
			drop = append(drop, c)
		}
	}
	if err := names.Err(); err != nil {
		return fmt.Errorf("bus: list the consumers of stream %s: %w", name, err)
	}
	for _, c := range drop {
		if err := s.DeleteConsumer(ctx, c); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("bus: delete consumer %s of stream %s: %w", c, name, err)
		}
	}
	return nil
}

// restreamOf reads the change of streams under way from the first stream's configuration; nil
// when there is none.
func restreamOf(cfg jetstream.StreamConfig) (*restreaming, error) {
	v, ok := cfg.Metadata[metaRestream]
	if !ok {
		return nil, nil
	}
	var st restreaming
	if err := json.Unmarshal([]byte(v), &st); err != nil || st.From < 1 || st.To < 1 || st.From > protocol.MaxRecordStreams || st.To > protocol.MaxRecordStreams ||
		st.From == st.To || st.Bytes == 0 || st.Bytes < -1 || st.Msgs == 0 || st.Msgs < -1 || len(st.Upto) > st.From {
		return nil, fmt.Errorf("bus: stream %s says a change of its streams is under way, unreadably (%q): remove its metadata %s by hand", cfg.Name, v, metaRestream)
	}
	return &st, nil
}

// markRestream writes st, and the number of streams of layout l, in the first stream's
// metadata.
func (b *Bus) markRestream(ctx context.Context, st *restreaming, l protocol.Layout) error {
	info, err := b.JS.Stream(ctx, protocol.StreamName)
	if err != nil {
		return fmt.Errorf("bus: read stream %s: %w", protocol.StreamName, err)
	}
	cfg := info.CachedInfo().Config
	cfg.Metadata = maps.Clone(cfg.Metadata)
	if cfg.Metadata == nil {
		cfg.Metadata = map[string]string{}
	}
	delete(cfg.Metadata, metaStreams)
	if l.Streams() > 1 {
		cfg.Metadata[metaStreams] = strconv.Itoa(l.Streams())
	}
	data, _ := json.Marshal(st)
	cfg.Metadata[metaRestream] = string(data)
	if _, err := b.JS.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("bus: note the change of the record's streams in %s: %w", protocol.StreamName, err)
	}
	return nil
}

// recordLimits adds up the byte and message limits of the streams of the record laid out as l
// (-1: none).
func recordLimits(ctx context.Context, js jetstream.JetStream, l protocol.Layout) (bytes, msgs int64, err error) {
	for k := range l.Streams() {
		s, err := js.Stream(ctx, protocol.RecordStream(k))
		if err != nil {
			return 0, 0, fmt.Errorf("bus: read stream %s: %w", protocol.RecordStream(k), err)
		}
		cfg := s.CachedInfo().Config
		for _, p := range []struct {
			total *int64
			have  int64
		}{{&bytes, cfg.MaxBytes}, {&msgs, cfg.MaxMsgs}} {
			switch {
			case *p.total < 0:
			case p.have <= 0:
				*p.total = -1
			default:
				*p.total += p.have
			}
		}
	}
	return bytes, msgs, nil
}

// roomFor is a limit of a stream of a record of n streams whose streams together have total
// (-1: none) that holds used and will receive incoming: its share of total, or what it will
// hold and a little more, whichever is more.
func roomFor(total int64, n int, used, incoming int64) int64 {
	if total <= 0 {
		return total
	}
	return max(total/int64(n), used+incoming+slack(used+incoming))
}

// makeRoom sets the limits of source stream k (s) for the change — with grow those that grow,
// without it those that shrink: one that stays gets its share of the record's, or room for what
// it holds and will receive, whichever is more; one that goes, no more than it holds.
func (r *restreamer) makeRoom(ctx context.Context, s jetstream.Stream, k int, incoming [2]int64, grow bool) error {
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("bus: read stream %s: %w", protocol.RecordStream(k), err)
	}
	cfg := info.Config
	used := [2]int64{int64(info.State.Bytes), int64(info.State.Msgs)}
	var want [2]int64
	for i, p := range []*int64{&cfg.MaxBytes, &cfg.MaxMsgs} {
		total := r.st.Bytes
		if i == 1 {
			total = r.st.Msgs
		}
		want[i] = *p
		switch {
		case total <= 0:
		case k < r.to.Streams():
			want[i] = roomFor(total, r.to.Streams(), used[i], incoming[i])
		case *p > 0:
			want[i] = min(*p, used[i]+slack(used[i]))
		}
	}
	if growsInBytes(want[0], cfg.MaxBytes) != grow || want[0] == cfg.MaxBytes && want[1] == cfg.MaxMsgs {
		return nil
	}
	cfg.MaxBytes, cfg.MaxMsgs = want[0], want[1]
	return r.setLimits(ctx, cfg)
}

// growsInBytes reports whether a byte limit set to now from was lets a stream hold more: only
// bytes are reserved on the server, so only they decide which limits change first.
func growsInBytes(now, was int64) bool { return now > was || now <= 0 && was > 0 }

// setLimits updates a stream of the record to cfg, its limits changed.
func (r *restreamer) setLimits(ctx context.Context, cfg jetstream.StreamConfig) error {
	if _, err := r.b.JS.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("bus: set stream %s's limits to %d bytes, %d messages: %w%s", cfg.Name, cfg.MaxBytes, cfg.MaxMsgs, err, storageHint(err))
	}
	return nil
}

// slack is the room kept above n (bytes or messages) a stream will hold: a sixty-fourth, at
// least 16.
func slack(n int64) int64 { return max(n/64, 16) }
