// Package park is Hermes' one way to make a message wait: a parking lot any pipeline stage can
// use — a serial request for its predecessor's response, an approval for hours, a rate-limited
// call for seconds.
//
// A parked message is kept in the hermes-parked bucket under its wake key and item, and the
// delivery that parked it is acked: waiting spends none of the consumer's deliveries
// (MaxDeliver), holds no slot of a consumer that allows one message in flight, and survives
// the death of every process. The bucket has no TTL, so nothing parked is ever dropped; it is
// bounded in bytes and refuses to park more when full (the parking delivery then fails and is
// retried) rather than lose what waits.
//
// A wake key is woken by Wake (its response was recorded, an approval arrived), or by a timer
// when the wait names a time: the timer stream holds one schedule per wake key, which the NATS
// server turns into a message at its time (JetStream message schedules, NATS 2.12 or later),
// consumed by Run. Either way every message parked under the key is published again to its
// subject — its exact bytes, under a stream message id of its own (protocol.MsgIDWoken), so a
// message parked and woken twice is delivered twice — and only then removed. The woken
// message goes through its consumer like any other: whoever parked it decides again whether
// to let it go. Waking is at least once: a message may be published again twice (a wake-up
// and a timer, or a retry after an ambiguous failure); handlers are idempotent.
package park

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/retry"
)

// Wait says what a parked message waits for: its Key to be woken, or At to pass, whichever
// comes first.
type Wait struct {
	// Key is the wake key (protocol.WakeOnResponse, protocol.WakeAt, …). Required: a wait for
	// a time alone takes a key of its own, e.g. protocol.WakeAt(request_id + "." + call_id).
	Key string
	// At, when set, wakes Key at that time even if nothing else woke it.
	At time.Time
}

// Lot is the parking lot on a provisioned bus. It is safe for concurrent use.
type Lot struct {
	bus *bus.Bus
	pub *bus.Publisher
	log *slog.Logger
	// Settled, when set, says whether what a wake key waits for has happened already; Run
	// then sweeps the lot every SweepEvery and wakes such keys — a backstop for wake-ups lost
	// because whoever should have woken them stopped half-way, or ran an older Hermes.
	Settled func(ctx context.Context, key string) (bool, error)
	// SweepEvery is how often Run sweeps. Default 30 s.
	SweepEvery time.Duration
}

// New returns the lot of b; woken messages are published by pub.
func New(b *bus.Bus, pub *bus.Publisher, logger *slog.Logger) *Lot {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Lot{bus: b, pub: pub, log: logger}
}

// Spot is where Park put a message: enough to take it out again (Unpark).
type Spot struct {
	key      string
	revision uint64
}

// spot is what the lot keeps of one parked message.
type spot struct {
	Subject  string    `msgpack:"subject"`
	Data     []byte    `msgpack:"data"`
	ParkedAt time.Time `msgpack:"parked_at"`
	At       time.Time `msgpack:"at,omitempty"`
}

// Park keeps raw, an encoded HermesMessage, until w is woken, then publishes it again to
// subject. item (one token: a request id, say) names it among what waits under the same key:
// parking the same item under the same key again replaces it. Park is idempotent. It returns
// where the message waits, for Unpark.
func (l *Lot) Park(ctx context.Context, w Wait, item, subject string, raw []byte) (Spot, error) {
	key := w.Key
	if !protocol.ValidWakeKey(key) || !protocol.ValidToken(item, protocol.MaxIDLen) {
		return Spot{}, bus.Permanent(fmt.Errorf("park: wake key %q is not dot-separated tokens, or item %q not one token", key, item))
	}
	enc, err := msgpack.Marshal(&spot{Subject: subject, Data: raw, ParkedAt: time.Now().UTC(), At: w.At})
	if err != nil {
		return Spot{}, bus.Permanent(fmt.Errorf("park: encode: %w", err))
	}
	rev, err := l.bus.Parked.Put(ctx, protocol.KeyParked(key, item), enc)
	if err != nil {
		return Spot{}, fmt.Errorf("park: keep %s under %s: %w", item, key, err)
	}
	if !w.At.IsZero() {
		if err := l.schedule(ctx, key, w.At); err != nil {
			return Spot{}, err
		}
	}
	return Spot{key: protocol.KeyParked(key, item), revision: rev}, nil
}

// Unpark takes out the message Park put at sp, unless it was parked again since (then that
// one waits on). For a delivery that may go on after all, having parked.
func (l *Lot) Unpark(ctx context.Context, sp Spot) error {
	return l.remove(ctx, sp.key, sp.revision)
}

// remove deletes the entry at key's revision and older ones: a purge of the key's subject in
// the bucket's stream below revision+1, which leaves no delete marker behind (the bucket has
// no TTL to reclaim one) and keeps a newer revision.
func (l *Lot) remove(ctx context.Context, key string, revision uint64) error {
	err := l.bus.ParkedStream.Purge(ctx, jetstream.WithPurgeSubject(bus.KVSubject(bus.BucketParked, key)), jetstream.WithPurgeSequence(revision+1))
	if err != nil {
		return fmt.Errorf("park: remove %s: %w", key, err)
	}
	return nil
}

// dropMarker removes key's delete marker, if that is what the bucket holds for it: only the
// marker, never a message parked since.
func (l *Lot) dropMarker(ctx context.Context, key string) {
	m, err := l.bus.ParkedStream.GetLastMsgForSubject(ctx, bus.KVSubject(bus.BucketParked, key))
	if err == nil && m.Header.Get(kvOperationHeader) != "" {
		_ = l.remove(ctx, key, m.Sequence)
	}
}

// kvOperationHeader marks a key-value bucket's delete and purge markers.
const kvOperationHeader = "KV-Operation"

// scheduleHeader is the header holding a schedule's spec ("@at <RFC 3339>").
const scheduleHeader = "Nats-Schedule"

// schedule sets key's timer to at, rounded up to a whole second (schedules have second
// precision; a wake-up is never early), unless it is set to go off earlier already: a key
// waited for by several messages goes off at the earliest of their times.
func (l *Lot) schedule(ctx context.Context, key string, at time.Time) error {
	at = at.UTC().Truncate(time.Second).Add(time.Second)
	for range 8 { // each round loses only to a concurrent schedule of the same key
		var last uint64
		prev, err := l.bus.Timers.GetLastMsgForSubject(ctx, protocol.SubjectTimer(key))
		switch {
		case err == nil:
			if t, ok := scheduledAt(prev.Header.Get(scheduleHeader)); ok && !t.After(at) {
				return nil
			}
			last = prev.Sequence
		case !errors.Is(err, jetstream.ErrMsgNotFound):
			return fmt.Errorf("park: read the timer of %s: %w", key, err)
		}
		_, err = l.bus.JS.Publish(ctx, protocol.SubjectTimer(key), []byte(key), jetstream.WithScheduleAt(at),
			jetstream.WithScheduleTarget(protocol.SubjectTimerDue(key)), jetstream.WithExpectLastSequencePerSubject(last))
		if bus.IsWrongLastSequence(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("park: set the timer of %s: %w", key, err)
		}
		return nil
	}
	return fmt.Errorf("park: set the timer of %s: it keeps changing", key)
}

// scheduledAt reads the time of an "@at" schedule spec.
func scheduledAt(spec string) (time.Time, bool) {
	v, ok := strings.CutPrefix(spec, "@at ")
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(v))
	return t, err == nil
}

// Wake publishes again every message parked under key and removes it from the lot; it returns
// how many it woke. A message is removed only after its publish was acknowledged, so a failed
// Wake loses nothing and may simply be called again.
func (l *Lot) Wake(ctx context.Context, key string) (int, error) {
	if !protocol.ValidWakeKey(key) {
		return 0, fmt.Errorf("park: wake key %q is not dot-separated tokens", key)
	}
	// The key's timer as it is before anything is listed: only it may be removed below; one
	// set after (by a message parked meanwhile, which this wake-up may not list) stays.
	var timer uint64
	if t, err := l.bus.Timers.GetLastMsgForSubject(ctx, protocol.SubjectTimer(key)); err == nil {
		timer = t.Sequence
	} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, fmt.Errorf("park: read the timer of %s: %w", key, err)
	}
	names, err := l.list(ctx, protocol.KeyParked(key, "*"))
	if err != nil {
		return 0, fmt.Errorf("park: list what waits for %s: %w", key, err)
	}
	wakeListed()
	var entries []jetstream.KeyValueEntry
	for _, k := range names {
		e, err := l.bus.Parked.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			// Woken meanwhile by someone else, or a delete marker left by an earlier version
			// (which deleted what it woke): the marker goes.
			l.dropMarker(ctx, k)
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("park: read %s: %w", k, err)
		}
		entries = append(entries, e)
	}
	// In the order they were parked.
	slices.SortFunc(entries, func(a, b jetstream.KeyValueEntry) int { return cmp.Compare(a.Revision(), b.Revision()) })
	woken := 0
	for _, e := range entries {
		k := e.Key()
		var s spot
		if err := decodeSpot(e.Value(), &s); err != nil {
			l.log.Error("a parked message cannot be read; it is removed", "key", k, "err", err)
			_ = l.remove(ctx, k, e.Revision())
			continue
		}
		m, err := protocol.Unmarshal(s.Data)
		if err != nil {
			l.log.Error("a parked message is not a Hermes message; it is removed", "key", k, "err", err)
			_ = l.remove(ctx, k, e.Revision())
			continue
		}
		hdr := nats.Header{}
		hdr.Set(bus.HeaderWoken, key)
		if _, err := l.pub.PublishAs(ctx, s.Subject, m, s.Data, protocol.MsgIDWoken(m.MsgID, e.Revision()), hdr); err != nil {
			return woken, fmt.Errorf("park: wake %s: %w", k, err)
		}
		// Parked again meanwhile (a newer revision): that one waits on.
		if err := l.remove(ctx, k, e.Revision()); err != nil {
			l.log.Warn("a woken message stays in the lot; it will be woken again", "key", k, "err", err)
		}
		l.log.Debug("woken", "key", key, "request_id", m.RequestID, "session_id", m.SessionID, "msg_id", m.MsgID)
		woken++
	}
	if timer != 0 {
		// What waited for this timer is woken; a timer set since stays.
		if err := l.bus.Timers.Purge(ctx, jetstream.WithPurgeSubject(protocol.SubjectTimer(key)), jetstream.WithPurgeSequence(timer+1)); err != nil {
			l.log.Warn("could not remove a timer no longer needed; it will go off and wake nothing", "key", key, "err", err)
		}
		// A message parked meanwhile may have counted on the timer just removed (it was set
		// early enough already): what still waits gets its timer again.
		if err := l.rescheduleLeft(ctx, key); err != nil {
			return woken, err
		}
	}
	return woken, nil
}

// listRetry spaces out listings while the bucket has no leader.
var listRetry = retry.Policy{Initial: 20 * time.Millisecond, Factor: 2, Max: 500 * time.Millisecond}

// wakeListed runs in Wake once it listed what to wake; tests park more there.
var wakeListed = func() {}

// rescheduleLeft sets key's timer to the earliest time among the messages still parked under
// it, if any has one.
func (l *Lot) rescheduleLeft(ctx context.Context, key string) error {
	keys, err := l.list(ctx, protocol.KeyParked(key, "*"))
	if err != nil {
		return fmt.Errorf("park: list what waits for %s: %w", key, err)
	}
	var earliest time.Time
	for _, k := range keys {
		e, err := l.bus.Parked.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // woken meanwhile
		}
		if err != nil {
			return fmt.Errorf("park: read %s: %w", k, err)
		}
		var s spot
		if decodeSpot(e.Value(), &s) == nil && !s.At.IsZero() && (earliest.IsZero() || s.At.Before(earliest)) {
			earliest = s.At
		}
	}
	if earliest.IsZero() {
		return nil
	}
	return l.schedule(ctx, key, earliest)
}

// Parked reports how many messages wait under key.
func (l *Lot) Parked(ctx context.Context, key string) (int, error) {
	keys, err := l.list(ctx, protocol.KeyParked(key, "*"))
	if err != nil {
		return 0, fmt.Errorf("park: list what waits for %s: %w", key, err)
	}
	return len(keys), nil
}

// list returns the keys of the lot matching filter (which may hold wildcards), read from the
// bucket stream's subjects as its leader counts them. (A key-value watcher would wait for a
// message that a concurrent wake-up removes after the watcher counted it, until its context
// ends.) While a replicated bucket has no leader, every replica answers from what it holds,
// which may lag: such an answer is not taken, and the listing is asked for again.
func (l *Lot) list(ctx context.Context, filter string) ([]string, error) {
	prefix := bus.KVSubject(bus.BucketParked, "")
	var info *jetstream.StreamInfo
	err := retry.Do(ctx, listRetry, time.Now().Add(10*time.Second), func() (err error) {
		info, err = l.bus.ParkedStream.Info(ctx, jetstream.WithSubjectFilter(prefix+filter))
		switch {
		case err != nil:
			return retry.Stop(err)
		case info.Cluster != nil && info.Config.Replicas > 1 && info.Cluster.Leader == "":
			return errors.New("the bucket has no leader")
		}
		return nil
	}, nil)
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(info.State.Subjects))
	for subject := range info.State.Subjects {
		keys = append(keys, strings.TrimPrefix(subject, prefix))
	}
	slices.Sort(keys)
	return keys, nil
}

// Run wakes what waits for timers as they go off, and sweeps the lot when Settled is set,
// until ctx is done. Any number of processes may run it; each timer is handled once (a shared
// consumer), and retried until its wake-up succeeds.
func (l *Lot) Run(ctx context.Context) error {
	cons, err := l.bus.TimerConsumer(ctx)
	if err != nil {
		return err
	}
	if l.Settled != nil {
		every := l.SweepEvery
		if every <= 0 {
			every = 30 * time.Second
		}
		stop := bus.Every(every, func() {
			if n, err := l.Sweep(ctx); err != nil && ctx.Err() == nil {
				l.log.Warn("sweeping the parking lot failed", "err", err)
			} else if n > 0 {
				l.log.Info("the sweep woke messages whose wake-up was missed", "woken", n)
			}
		})
		defer stop()
	}
	return (&bus.Subscriber{Consumer: cons, Handler: bus.HandlerFunc(l.handleTimer), Concurrency: 4, Logger: l.log}).Run(ctx)
}

// Sweep wakes every key of the lot whose wait Settled says is over, and returns how many
// messages it woke.
func (l *Lot) Sweep(ctx context.Context) (int, error) {
	if l.Settled == nil {
		return 0, nil
	}
	all, err := l.list(ctx, ">")
	if err != nil {
		return 0, fmt.Errorf("park: list the lot: %w", err)
	}
	seen := map[string]bool{}
	var keys []string
	for _, k := range all {
		if i := strings.LastIndexByte(k, '.'); i > 0 && !seen[k[:i]] {
			seen[k[:i]] = true
			keys = append(keys, k[:i])
		}
	}
	woken := 0
	for _, key := range keys {
		done, err := l.Settled(ctx, key)
		if err != nil {
			return woken, err
		}
		if !done {
			continue
		}
		n, err := l.Wake(ctx, key)
		woken += n
		if err != nil {
			return woken, err
		}
	}
	return woken, nil
}

func (l *Lot) handleTimer(ctx context.Context, d *bus.Delivery) error {
	key, ok := protocol.WakeKeyOfTimer(d.Subject)
	if !ok || !protocol.ValidWakeKey(key) {
		l.log.Warn("a timer names no wake key; ignored", "subject", d.Subject)
		return nil
	}
	n, err := l.Wake(ctx, key)
	if err == nil && n > 0 {
		l.log.Info("timer went off", "key", key, "woken", n)
	}
	return err
}

func decodeSpot(b []byte, s *spot) error {
	if err := protocol.CheckMsgpack(b, protocol.MaxDepth); err != nil {
		return err
	}
	return msgpack.Unmarshal(b, s)
}
