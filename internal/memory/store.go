package memory

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Bucket is memory's bucket: o.<owner token> holds one owner's fragments (Token).
const Bucket = "hermes-memory"

// Buckets are memory's buckets: written by gateways (the memory API and the chat loop, which
// runs there); strict, so that a write is read back from whichever server answers. A key's
// per-entry TTL (past its last fragment's expiry) is a backstop for owners nobody writes again.
func Buckets(maxBytes int64) []bus.Bucket {
	if maxBytes <= 0 {
		maxBytes = DefaultBucketBytes
	}
	return []bus.Bucket{{Name: Bucket, Description: "Hermes: what is remembered about each owner (fragments)", MaxBytes: maxBytes, Strict: true, MarkerTTL: markerTTL,
		Writers: []bus.Role{bus.RoleGateway}}}
}

// Defaults of a Store's bounds.
const (
	DefaultBucketBytes = 1 << 30
	DefaultPerOwner    = 256
	DefaultOwnerBytes  = 512 << 10
	DefaultSessionIdle = 24 * time.Hour
	// markerTTL is how long the marker of an emptied entry stays.
	markerTTL = time.Minute
	// backstop is how long past its last expiry an owner's entry outlives it in the bucket.
	backstop = 24 * time.Hour
)

// ErrFull means a fragment cannot be kept: every fragment its owner has is forever, and the new
// one does not fit beside them.
var ErrFull = errors.New("memory: full")

// ErrProtected means a model's write was refused: it would replace what the person or a rule
// kept, or keep more forever fragments than a model may.
var ErrProtected = errors.New("memory: not the model's to write")

// Sources of fragments (Fragment.Source).
const (
	SourceAPI   = "api"
	SourceModel = "model"
	SourceRule  = "rule"
)

// MaxModelForever bounds the forever fragments a model keeps of one owner.
const MaxModelForever = 32

func countForever(en *entry, source string) int {
	n := 0
	for i := range en.Fragments {
		if en.Fragments[i].Forever() && en.Fragments[i].Source == source {
			n++
		}
	}
	return n
}

// ErrNotFound means no live fragment has the key asked for.
var ErrNotFound = errors.New("memory: no such fragment")

// Token is the bucket token of owner: 32 hex digits of its SHA-256, so that owners' ids (which
// hold ':' and '#') never shape a key, and a listing of the bucket names nobody.
func Token(owner string) string {
	h := sha256.Sum256([]byte(owner))
	return hex.EncodeToString(h[:16])
}

// Anonymous owns the memory of callers of a gateway that names none.
const Anonymous = "anonymous"

// OwnerOf is the owner of the memory of an actor whose owner id is owner (admission.Actor.Owner):
// itself, or Anonymous for none.
func OwnerOf(owner string) string {
	if owner == "" {
		return Anonymous
	}
	return owner
}

// HistorySession is the session on the record that holds owner's memory history (memory.v1
// events): one per owner, so that its history is read, and erased, in one place.
func HistorySession(owner string) string { return protocol.MemorySessionPrefix + Token(owner) }

func key(owner string) string { return "o." + Token(owner) }

// entry is what the bucket keeps of one owner.
type entry struct {
	Owner     string     `json:"owner"`
	Fragments []Fragment `json:"fragments"`
}

// Store keeps owners' fragments in the memory bucket. It is safe for concurrent use; writes
// of one owner are serialized by compare-and-set, whatever process makes them.
type Store struct {
	KV jetstream.KeyValue
	// JS writes entries with a TTL of their own (the backstop); nil: without one.
	JS jetstream.JetStream
	// History records each change on the record; nil records nothing.
	History History
	// Now is the store's clock (default time.Now): lifetimes are judged by it.
	Now func() time.Time
	// PerOwner bounds the fragments of one owner (default DefaultPerOwner); OwnerBytes the
	// bytes of its entry (default DefaultOwnerBytes).
	PerOwner   int
	OwnerBytes int
	// SessionIdle is how long a session fragment lives past its last write or use (default
	// DefaultSessionIdle).
	SessionIdle time.Duration
	// Cache, when set, is the hot tier reads are served from (it must be Run).
	Cache *Cache
	// noRoomUntil is when a full bucket is scanned for room again (unix nanoseconds).
	noRoomUntil atomic.Int64
	// Decay is how long the context of an intent lives, by business domain (seed 003 §2.1):
	// a session fragment written in an intent of a domain named here lives this long past its
	// last write or use instead of SessionIdle, and is archived when it lapses — kept on the
	// record, no longer given to a model.
	Decay map[string]time.Duration
}

// History records what happened to fragments (memory.v1 events).
type History interface {
	Record(ctx context.Context, owner string, ev *protocol.MemoryEvent) error
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

func (s *Store) perOwner() int {
	if s.PerOwner > 0 {
		return s.PerOwner
	}
	return DefaultPerOwner
}

func (s *Store) ownerBytes() int {
	if s.OwnerBytes > 0 {
		return s.OwnerBytes
	}
	return DefaultOwnerBytes
}

func (s *Store) sessionIdle() time.Duration {
	if s.SessionIdle > 0 {
		return s.SessionIdle
	}
	return DefaultSessionIdle
}

// sessionLife is how long a session fragment of an intent of domain lives past its last write
// or use, and whether that is the domain's decay.
func (s *Store) sessionLife(domain string) (time.Duration, bool) {
	if d, ok := s.Decay[domain]; ok && d > 0 {
		return d, true
	}
	return s.sessionIdle(), false
}

// read returns owner's entry and its revision (0: none).
func (s *Store) read(ctx context.Context, owner string) (*entry, uint64, error) {
	e, err := s.KV.Get(ctx, key(owner))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return &entry{Owner: owner}, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("memory: read: %w", err)
	}
	var en entry
	if err := json.Unmarshal(e.Value(), &en); err != nil || en.Owner != owner {
		// Unreadable, or another owner's (a hash collision): never shown, and replaced by
		// the next write.
		return &entry{Owner: owner}, e.Revision(), nil
	}
	return &en, e.Revision(), nil
}

// load returns owner's entry for reading (never to be changed): from the cache when it holds
// it, else from the bucket, then kept there.
func (s *Store) load(ctx context.Context, owner string) (*entry, error) {
	token := Token(owner)
	if en, ok := s.Cache.get(token); ok {
		return en, nil
	}
	m := s.Cache.mark(token)
	en, _, err := s.read(ctx, owner)
	if err != nil {
		return nil, err
	}
	s.Cache.put(token, en, m)
	return en, nil
}

// errBucketFull means the bucket refused a write for want of room.
var errBucketFull = fmt.Errorf("%w: the memory bucket is full", ErrFull)

// errChanged means another write to the owner came first.
var errChanged = errors.New("memory: changed meanwhile")

// write stores en at rev (0: a new entry), or deletes the entry when it holds nothing.
func (s *Store) write(ctx context.Context, en *entry, rev uint64) error {
	k := key(en.Owner)
	if len(en.Fragments) == 0 {
		if rev == 0 {
			return nil
		}
		err := s.KV.Purge(ctx, k, jetstream.LastRevision(rev), jetstream.PurgeTTL(markerTTL))
		return casErr(err)
	}
	data, err := json.Marshal(en)
	if err != nil {
		return err
	}
	ttl := time.Duration(0)
	last := time.Time{}
	for _, f := range en.Fragments {
		if f.ExpiresAt.IsZero() {
			last = time.Time{}
			break
		}
		if f.ExpiresAt.After(last) {
			last = f.ExpiresAt
		}
	}
	if !last.IsZero() {
		ttl = max(last.Sub(s.now())+backstop, time.Second)
	}
	ttl = ttl.Truncate(time.Second)
	switch {
	case rev == 0 && ttl > 0:
		_, err = s.KV.Create(ctx, k, data, jetstream.KeyTTL(ttl))
	case rev == 0:
		_, err = s.KV.Create(ctx, k, data)
	case ttl > 0 && s.JS != nil:
		// A TTL of its own: published with the expected last sequence, as an update is.
		_, err = s.JS.Publish(ctx, bus.KVSubject(Bucket, k), data, jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(ttl))
	default:
		_, err = s.KV.Update(ctx, k, data, rev)
	}
	return casErr(err)
}

func casErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch), bus.IsWrongLastSequence(err):
		return errChanged
	case strings.Contains(err.Error(), "maximum bytes exceeded"):
		return errBucketFull
	}
	return fmt.Errorf("memory: write: %w", err)
}

// change applies fn to owner's live fragments and writes the result, retrying on a concurrent
// write; the fragments that lapsed meanwhile are dropped (and recorded as expired).
func (s *Store) change(ctx context.Context, owner string, fn func(now time.Time, en *entry) ([]*protocol.MemoryEvent, error)) error {
	// The writes that make room never make room themselves.
	roomMade := ctx.Value(makingRoom{}) != nil
	for range 16 {
		en, rev, err := s.read(ctx, owner)
		if err != nil {
			return err
		}
		now := s.now()
		var events []*protocol.MemoryEvent
		en.Fragments = slices.DeleteFunc(en.Fragments, func(f Fragment) bool {
			if f.Live(now) {
				return false
			}
			if d, decays := s.sessionLife(f.Domain); f.Lifespan == LifespanSession && decays {
				events = append(events, eventOf(protocol.MemoryArchived, &f, fmt.Sprintf("its %s intent's context lapsed (%s)", f.Domain, d)))
			} else {
				events = append(events, eventOf(protocol.MemoryExpired, &f, "its lifespan ended"))
			}
			return true
		})
		more, err := fn(now, en)
		if err != nil {
			return err
		}
		events = append(events, more...)
		if len(events) == 0 {
			return nil
		}
		for _, ev := range events {
			ev.At = now
		}
		err = s.write(ctx, en, rev)
		s.Cache.changed(Token(owner)) // read-your-writes here; the watch tells the others
		switch {
		case errors.Is(err, errChanged):
			continue
		case errors.Is(err, errBucketFull) && !roomMade && time.Now().UnixNano() >= s.noRoomUntil.Load():
			// The bucket is full: the least relevant fragments of any owner make room, once.
			// When nothing can go (only forever fragments left), the scan is not made again
			// for a minute.
			size, _ := json.Marshal(en)
			if n, rerr := s.makeRoom(ctx, len(size)); rerr != nil || n == 0 {
				if rerr == nil {
					s.noRoomUntil.Store(time.Now().Add(time.Minute).UnixNano())
				}
				return err
			}
			roomMade = true
			continue
		case err != nil:
			return err
		}
		return s.record(ctx, owner, events)
	}
	return fmt.Errorf("memory: %w 16 times; try again", errChanged)
}

func (s *Store) record(ctx context.Context, owner string, events []*protocol.MemoryEvent) error {
	if s.History == nil {
		return nil
	}
	for _, ev := range events {
		if ev.Op == protocol.MemoryUsed {
			continue // the turn's decision names what it was given
		}
		if err := s.History.Record(ctx, owner, ev); err != nil {
			return fmt.Errorf("memory: the change is kept, but its history could not be recorded: %w", err)
		}
	}
	return nil
}

func eventOf(op string, f *Fragment, reason string) *protocol.MemoryEvent {
	ev := &protocol.MemoryEvent{Op: op, Session: f.Session, Type: f.Type, Key: f.Key, Lifespan: f.Lifespan,
		Tags: f.Tags, Source: f.Source, Domain: f.Domain, Version: f.Version, Reason: reason}
	if op == protocol.MemoryWritten || op == protocol.MemoryReplaced {
		ev.Value = f.Value
	}
	return ev
}

// Written is what Put did: the fragment kept, the one it replaced, and those evicted for room.
type Written struct {
	Fragment Fragment
	Replaced *Fragment
	Evicted  []Fragment
}

// Put remembers w for owner: a new fragment, or the new value of the key (in w's session for a
// session fragment). At capacity (PerOwner fragments or OwnerBytes bytes), the least relevant
// fragments that are not forever are evicted for room; when only forever fragments are left,
// the write is refused with ErrFull. A field that is wrong is a *FieldError.
func (s *Store) Put(ctx context.Context, owner string, w Write) (Written, error) {
	l, err := w.Check()
	if err != nil {
		return Written{}, err
	}
	if w.Source == "" {
		w.Source = SourceAPI
	}
	var out Written
	err = s.change(ctx, owner, func(now time.Time, en *entry) ([]*protocol.MemoryEvent, error) {
		out = Written{}
		f := Fragment{Session: w.Session, Type: w.Type, Key: w.Key, Value: w.Value, Lifespan: l.String(),
			Tags: slices.Clone(w.Tags), Source: w.Source, Version: 1, CreatedAt: now, UpdatedAt: now}
		switch {
		case l.Session:
			life, _ := s.sessionLife(w.Domain)
			f.Domain, f.ExpiresAt = w.Domain, now.Add(life)
		case !l.Forever:
			f.ExpiresAt = now.Add(l.For)
		}
		op := protocol.MemoryWritten
		i := slices.IndexFunc(en.Fragments, func(g Fragment) bool { return g.id() == f.id() })
		if w.Source == SourceModel {
			// What a model says is data: it may not overwrite what the person or a rule
			// kept, nor fill an owner's memory with what is never evicted.
			if i >= 0 && en.Fragments[i].Source != SourceModel {
				return nil, fmt.Errorf("%w: %s was kept by %s, which only the person (the memory API) changes", ErrProtected, w.Key, en.Fragments[i].Source)
			}
			if l.Forever && i < 0 && countForever(en, SourceModel) >= MaxModelForever {
				return nil, fmt.Errorf("%w: the model has kept %d forever fragments of this user, the most it may", ErrProtected, MaxModelForever)
			}
		}
		if i >= 0 {
			old := en.Fragments[i]
			out.Replaced = &old
			f.Version, f.CreatedAt, f.UsedAt, f.Uses = old.Version+1, old.CreatedAt, old.UsedAt, old.Uses
			en.Fragments = slices.Delete(en.Fragments, i, i+1)
			op = protocol.MemoryReplaced
		}
		en.Fragments = append(en.Fragments, f)
		events := []*protocol.MemoryEvent{eventOf(op, &f, "")}
		evicted, err := s.fit(now, en, &f)
		if err != nil {
			return nil, err
		}
		for i := range evicted {
			events = append(events, eventOf(protocol.MemoryEvicted, &evicted[i], "room for "+f.Key))
		}
		out.Fragment, out.Evicted = f, evicted
		return events, nil
	})
	return out, err
}

// fit evicts the least relevant fragments of en that are not forever, and not added, until en
// is within its bounds.
func (s *Store) fit(now time.Time, en *entry, added *Fragment) ([]Fragment, error) {
	var evicted []Fragment
	for {
		size, err := json.Marshal(en)
		if err != nil {
			return nil, err
		}
		if len(en.Fragments) <= s.perOwner() && len(size) <= s.ownerBytes() {
			return evicted, nil
		}
		victim := -1
		for i := range en.Fragments {
			f := &en.Fragments[i]
			if f.Forever() || f.id() == added.id() {
				continue
			}
			if victim < 0 || f.Relevance(now) < en.Fragments[victim].Relevance(now) {
				victim = i
			}
		}
		if victim < 0 {
			if !added.Forever() {
				// Nothing but forever fragments beside it: the new one is the one that
				// does not fit.
				return nil, fmt.Errorf("%w: every other fragment of this user is forever (%d of at most %d, %d bytes of at most %d); forget one first",
					ErrFull, len(en.Fragments)-1, s.perOwner(), len(size), s.ownerBytes())
			}
			return nil, fmt.Errorf("%w: a forever fragment is never evicted, and this user's memory holds %d fragments of at most %d (%d bytes of at most %d); forget one first",
				ErrFull, len(en.Fragments)-1, s.perOwner(), len(size), s.ownerBytes())
		}
		evicted = append(evicted, en.Fragments[victim])
		en.Fragments = slices.Delete(en.Fragments, victim, victim+1)
	}
}

// Query narrows a listing. Empty fields match everything.
type Query struct {
	// Session keeps the owner's fragments and that session's: not other sessions'. Empty:
	// every fragment, every session's included.
	Session string
	Type    string
	Key     string
	Tag     string
}

func (q Query) match(f *Fragment) bool {
	return (q.Session == "" || f.Session == "" || f.Session == q.Session) &&
		(q.Type == "" || f.Type == q.Type) && (q.Key == "" || f.Key == q.Key) && (q.Tag == "" || f.HasTag(q.Tag))
}

// List returns owner's live fragments that q matches, the most relevant first.
func (s *Store) List(ctx context.Context, owner string, q Query) ([]Fragment, error) {
	en, err := s.load(ctx, owner)
	if err != nil {
		return nil, err
	}
	now := s.now()
	out := make([]Fragment, 0, len(en.Fragments))
	for i := range en.Fragments {
		if f := &en.Fragments[i]; f.Live(now) && q.match(f) {
			out = append(out, *f)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Relevance(now) > out[j].Relevance(now) })
	return out, nil
}

// Get returns owner's live fragment of key: session's own when session is given and has
// one, else the owner's.
func (s *Store) Get(ctx context.Context, owner, session, k string) (Fragment, error) {
	fs, err := s.List(ctx, owner, Query{Session: session, Key: k})
	if err != nil {
		return Fragment{}, err
	}
	// The session's own first, else the owner's: never another session's.
	for _, want := range []string{session, ""} {
		for _, f := range fs {
			if f.Session == want {
				return f, nil
			}
		}
	}
	return Fragment{}, ErrNotFound
}

// Delete forgets owner's fragment of key (of session, for a session fragment); ErrNotFound
// when there is none.
func (s *Store) Delete(ctx context.Context, owner, session, k string) (Fragment, error) {
	var gone Fragment
	err := s.change(ctx, owner, func(_ time.Time, en *entry) ([]*protocol.MemoryEvent, error) {
		i := slices.IndexFunc(en.Fragments, func(f Fragment) bool { return f.Key == k && f.Session == session })
		if i < 0 {
			return nil, ErrNotFound
		}
		gone = en.Fragments[i]
		en.Fragments = slices.Delete(en.Fragments, i, i+1)
		return []*protocol.MemoryEvent{eventOf(protocol.MemoryDeleted, &gone, "")}, nil
	})
	return gone, err
}

// usedEvery is how often a fragment's use is written: uses closer together count once, so
// that a conversation's turns do not rewrite (and drop from every hot tier) its owner's entry
// each time.
const usedEvery = time.Minute

// Used notes that the fragments of keys (in session, or the owner's) were given to a model at
// now: their relevance rises, and a session fragment lives its lifetime more from now. A
// fragment used within the last minute is not written again.
func (s *Store) Used(ctx context.Context, owner, session string, keys []string) error {
	return s.change(ctx, owner, func(now time.Time, en *entry) ([]*protocol.MemoryEvent, error) {
		var events []*protocol.MemoryEvent
		for i := range en.Fragments {
			f := &en.Fragments[i]
			if !slices.Contains(keys, f.Key) || f.Session != "" && f.Session != session || now.Sub(f.UsedAt) < usedEvery {
				continue
			}
			f.UsedAt, f.Uses = now, f.Uses+1
			if f.Lifespan == LifespanSession {
				life, _ := s.sessionLife(f.Domain)
				f.ExpiresAt = now.Add(life)
			}
			events = append(events, eventOf(protocol.MemoryUsed, f, ""))
		}
		return events, nil
	})
}

// Forget removes everything owner's entry holds, and the entry: what Forget leaves is no key
// in the bucket. It returns how many fragments it removed.
func (s *Store) Forget(ctx context.Context, owner string) (int, error) {
	en, _, err := s.read(ctx, owner)
	if err != nil {
		return 0, err
	}
	// A purge, not a delete: no earlier revision stays readable.
	err = s.KV.Purge(ctx, key(owner), jetstream.PurgeTTL(markerTTL))
	s.Cache.changed(Token(owner))
	if err != nil {
		return 0, fmt.Errorf("memory: forget: %w", err)
	}
	return len(en.Fragments), nil
}

// Sweep removes the lapsed fragments of owner, recording each as expired.
func (s *Store) Sweep(ctx context.Context, owner string) error {
	return s.change(ctx, owner, func(time.Time, *entry) ([]*protocol.MemoryEvent, error) { return nil, nil })
}
