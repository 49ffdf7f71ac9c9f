package record

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Handler is called with each entry, in stream order. An error it returns stops the reading
// and is returned as is.
type Handler func(*Entry) error

// Start says where reading begins. The zero Start reads from the beginning of the record.
type Start struct {
	// Seq, when not 0, starts at this stream sequence.
	Seq uint64
	// Time, when not zero, starts at the first message stored at or after it.
	Time time.Time
}

// Validate reports ErrStart when both Seq and Time are set.
func (s Start) Validate() error {
	if s.Seq != 0 && !s.Time.IsZero() {
		return ErrStart
	}
	return nil
}

func (s Start) String() string {
	switch {
	case s.Seq != 0:
		return "from sequence " + strconv.FormatUint(s.Seq, 10)
	case !s.Time.IsZero():
		return "since " + s.Time.Format(time.RFC3339)
	}
	return "from the beginning"
}

// ParseSince reads a --since value: a duration before now ("90s", "15m", "2h") or an RFC 3339
// time ("2026-03-16T09:00:00Z", "2026-03-16T09:00:00+08:00").
func ParseSince(v string, now time.Time) (time.Time, error) {
	v = strings.TrimSpace(v)
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("--since %q: give a positive duration, e.g. 1h", v)
		}
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("--since %q: want a duration (90s, 15m, 2h) or an RFC 3339 time (2026-03-16T09:00:00Z)", v)
}

// SessionFilters returns the subject filters that together match every message of session, in
// the record's layout (the session is the last token of every subject). The session id is
// validated first; field names it in the error.
func SessionFilters(field, session string) ([]string, error) {
	if err := protocol.CheckID(field, session); err != nil {
		return nil, err
	}
	return protocol.FilterSession(session), nil
}

// ReadSession reads the whole recorded history of session from start, in stream order, and
// returns how many messages it delivered. See [Read].
func ReadSession(ctx context.Context, js jetstream.JetStream, session string, from Start, h Handler) (int, error) {
	filters, err := SessionFilters("session", session)
	if err != nil {
		return 0, err
	}
	return Read(ctx, js, filters, from, h)
}

// idleCheck is how long Read waits for a message before asking the server whether any is
// still pending (messages can expire between the start of reading and their delivery).
const idleCheck = 2 * time.Second

// inactive is how soon the server removes a reader's consumer after the reader vanished.
const inactive = 30 * time.Second

// Read delivers to h, in stream order, the messages of the record on any of filters (none: every
// message) from start, and returns how many it delivered. It ends once it has delivered every
// matching message that was in the stream when it started, and returns 0, nil at once when none
// matches. It does not wait for new messages: use [Follow] for those.
//
// Filters are written as the record's first stream holds its subjects (protocol's one-stream
// builders); on a record of several streams each is read where it lies (a session's in the
// session's stream, one for every session in each), stream after stream, each in its order.
// A start sequence is a sequence of one stream: it is refused for filters that span several.
func Read(ctx context.Context, js jetstream.JetStream, filters []string, from Start, h Handler) (int, error) {
	if err := from.Validate(); err != nil {
		return 0, err
	}
	parts, err := placed(ctx, js, filters, from)
	if err != nil {
		return 0, err
	}
	total := 0
	for _, p := range parts {
		n, err := readStream(ctx, js, p.stream, p.filters, from, h)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// readStream is Read of one stream.
func readStream(ctx context.Context, js jetstream.JetStream, stream jetstream.Stream, filters []string, from Start, h Handler) (int, error) {
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("record: stream info: %w", err)
	}
	last := info.State.LastSeq // the end of what there is to read
	if info.State.Msgs == 0 || from.Seq > last {
		return 0, nil
	}
	cons, err := stream.OrderedConsumer(ctx, startConfig(filters, from))
	if err != nil {
		return 0, fmt.Errorf("record: read: %w", err)
	}
	defer deleteConsumer(js, cons)
	if ci := cons.CachedInfo(); ci != nil && ci.NumPending == 0 {
		return 0, nil
	}
	it, err := cons.Messages()
	if err != nil {
		return 0, fmt.Errorf("record: read: %w", err)
	}
	defer it.Stop()
	n := 0
	for {
		msg, done, err := nextMsg(ctx, it, cons)
		switch {
		case err != nil && ctx.Err() != nil:
			return n, ctx.Err()
		case err != nil:
			return n, fmt.Errorf("record: read: %w", err)
		case done:
			return n, nil // what was left expired or was deleted meanwhile
		}
		md, err := msg.Metadata()
		if err != nil {
			return n, fmt.Errorf("record: read: %w", err)
		}
		seq := md.Sequence.Stream
		if seq > last {
			return n, nil // stored after reading began
		}
		n++
		if err := h(Decode(seq, msg.Subject(), md.Timestamp, msg.Data())); err != nil {
			return n, err
		}
		if md.NumPending == 0 || seq == last {
			return n, nil
		}
	}
}

// Follow delivers to h, in stream order, every message on any of filters (none: every message)
// stored after Follow started, until ctx is done; it then returns nil. ready, when not nil, is
// called once Follow is sure to see every message stored from then on. Follow rides out
// disconnects: the ordered consumer resumes after the last message it delivered.
//
// On a record of several streams, filters are placed as Read places them, and h is called with
// one message at a time, each stream's in order.
func Follow(ctx context.Context, js jetstream.JetStream, filters []string, ready func(), h Handler) error {
	parts, err := placed(ctx, js, filters, Start{})
	if err != nil {
		return err
	}
	return consumeAll(ctx, js, parts, func(p part) jetstream.OrderedConsumerConfig {
		return jetstream.OrderedConsumerConfig{FilterSubjects: p.filters, DeliverPolicy: jetstream.DeliverNewPolicy, InactiveThreshold: inactive}
	}, ready, h, "follow")
}

// consumeAll runs consume on each part at once, with the ordered consumer cfg makes of it. As
// with one consumer, ready is called once every consumer exists and before the first message,
// and h with one message at a time; neither after consumeAll returns, and ready not at all when
// a consumer failed first. It returns the first error; nil once ctx is done.
func consumeAll(ctx context.Context, js jetstream.JetStream, parts []part, cfg func(part) jetstream.OrderedConsumerConfig, ready func(), h Handler, what string) error {
	if len(parts) == 1 {
		return consume(ctx, js, parts[0].stream, cfg(parts[0]), ready, h, what)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	opened := make(chan struct{}) // closed once ready has been called (or never will be)
	failed := false
	one := func(e *Entry) error {
		select {
		case <-opened:
		case <-ctx.Done():
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if failed || ctx.Err() != nil {
			return nil
		}
		if err := h(e); err != nil {
			failed = true // no other stream's message after it
			return err
		}
		return nil
	}
	var started sync.WaitGroup
	started.Add(len(parts))
	errs := make(chan error, len(parts))
	for _, p := range parts {
		go func() {
			var once sync.Once
			err := consume(ctx, js, p.stream, cfg(p), func() { once.Do(started.Done) }, one, what)
			if err != nil {
				mu.Lock()
				failed = true
				mu.Unlock()
				cancel()
			}
			once.Do(started.Done)
			errs <- err
		}()
	}
	go func() {
		started.Wait()
		mu.Lock()
		if ready != nil && !failed && ctx.Err() == nil {
			ready()
		}
		mu.Unlock()
		close(opened)
	}()
	// The first error that is not the others' ending because of it.
	var first error
	for range parts {
		if err := <-errs; err != nil && (first == nil || errors.Is(first, context.Canceled) && !errors.Is(err, context.Canceled)) {
			first = err
		}
	}
	cancel()
	<-opened // ready is not called after this returns
	return first
}

// consume delivers to h every message an ordered consumer configured by cfg reads from stream,
// until ctx is done (then it returns nil) or h fails; ready, when not nil, is called once the
// consumer exists. The consumer is deleted on return. what names the caller in errors.
func consume(ctx context.Context, js jetstream.JetStream, stream jetstream.Stream, cfg jetstream.OrderedConsumerConfig, ready func(), h Handler, what string) error {
	cons, err := stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("record: %s: %w", what, err)
	}
	defer deleteConsumer(js, cons)
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("record: %s: %w", what, err)
	}
	defer it.Stop()
	if ready != nil {
		ready()
	}
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("record: %s: %w", what, err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("record: %s: %w", what, err)
		}
		if err := h(Decode(md.Sequence.Stream, msg.Subject(), md.Timestamp, msg.Data())); err != nil {
			return err
		}
	}
}

// startConfig is the ordered consumer reading filters from start.
func startConfig(filters []string, from Start) jetstream.OrderedConsumerConfig {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: filters, DeliverPolicy: jetstream.DeliverAllPolicy, InactiveThreshold: inactive}
	switch {
	case from.Seq != 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from.Seq
	case !from.Time.IsZero():
		t := from.Time
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
	return cfg
}

// openStreams opens the record's streams, stream k at index k, and returns its layout.
func openStreams(ctx context.Context, js jetstream.JetStream) ([]jetstream.Stream, protocol.Layout, error) {
	first, l, err := openLayout(ctx, js)
	if err != nil {
		return nil, l, err
	}
	out := []jetstream.Stream{first}
	for k := 1; k < l.Streams(); k++ {
		s, err := openStream(ctx, js, protocol.RecordStream(k))
		if err != nil {
			return nil, l, err
		}
		out = append(out, s)
	}
	return out, l, nil
}

// openLayout opens the record's first stream and reads the record's layout from it.
func openLayout(ctx context.Context, js jetstream.JetStream) (jetstream.Stream, protocol.Layout, error) {
	first, err := openStream(ctx, js, protocol.StreamName)
	if err != nil {
		return nil, protocol.Layout{}, err
	}
	l, err := bus.RecordLayout(first.CachedInfo().Config)
	if err != nil {
		return nil, l, fmt.Errorf("record: %w", err)
	}
	return first, l, nil
}

func openStream(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, ErrNoRecord
	}
	if err != nil {
		return nil, fmt.Errorf("record: open stream %s: %w", name, err)
	}
	return s, nil
}

// part is what to read of one record stream: filters written for it.
type part struct {
	stream  jetstream.Stream
	filters []string
}

// placed opens the record and places filters (written as its first stream holds subjects) in
// the streams that hold what they match: a filter ending in a session id in that session's
// stream, one ending in a wildcard (every session) in each; none reads every stream whole. It
// refuses a start sequence for filters that span several streams.
func placed(ctx context.Context, js jetstream.JetStream, filters []string, from Start) ([]part, error) {
	streams, l, err := openStreams(ctx, js)
	if err != nil {
		return nil, err
	}
	if len(streams) == 1 {
		return []part{{streams[0], filters}}, nil
	}
	byStream := make([][]string, len(streams))
	every := len(filters) == 0
	for _, f := range filters {
		last := protocol.SessionOfSubject(f)
		if last == "*" || last == ">" {
			for k := range streams {
				byStream[k] = append(byStream[k], protocol.InStream(f, k))
			}
			continue
		}
		k := l.StreamOf(last)
		byStream[k] = append(byStream[k], protocol.InStream(f, k))
	}
	var out []part
	for k, s := range streams {
		if every || len(byStream[k]) > 0 {
			out = append(out, part{s, byStream[k]})
		}
	}
	if from.Seq != 0 && len(out) > 1 {
		return nil, fmt.Errorf("record: the record is kept in %d streams, each with sequences of its own: start from a sequence in one session's messages, or from a time", len(streams))
	}
	return out, nil
}

// deleteConsumer removes the reader's consumer at once rather than leaving it to expire.
func deleteConsumer(js jetstream.JetStream, cons jetstream.Consumer) {
	ci := cons.CachedInfo()
	if ci == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = js.DeleteConsumer(ctx, ci.Stream, ci.Name)
}

// nextMsg is it's next message from cons; done when none is left to read: while it waited,
// what was pending expired or was deleted (looked at each idleCheck).
func nextMsg(ctx context.Context, it jetstream.MessagesContext, cons jetstream.Consumer) (msg jetstream.Msg, done bool, err error) {
	for {
		wait, cancel := context.WithTimeout(ctx, idleCheck)
		msg, err := it.Next(jetstream.NextContext(wait))
		cancel()
		switch {
		case err == nil:
			return msg, false, nil
		case ctx.Err() != nil:
			return nil, false, ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			if ci, ierr := cons.Info(ctx); ierr == nil && ci.NumPending == 0 {
				return nil, true, nil
			}
		default:
			return nil, false, err
		}
	}
}

// SessionStream opens the record stream that holds session's messages, and returns it with the
// record's layout (which names their subjects there).
func SessionStream(ctx context.Context, js jetstream.JetStream, session string) (jetstream.Stream, protocol.Layout, error) {
	first, l, err := openLayout(ctx, js)
	if err != nil || l.StreamOf(session) == 0 {
		return first, l, err
	}
	s, err := openStream(ctx, js, l.StreamNameOf(session))
	return s, l, err
}
