package memory

import (
	"container/list"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/kvwatch"
)

// Cache is memory's hot tier: the entries of the owners read lately, in this process, so that
// a turn's recall costs no round trip to the bus. It follows the bucket (Run): a change of an
// owner, from any process, drops the owner's entry, and while the watch is down nothing is
// served from it. An entry read before a change it did not see is never kept after that change
// (each change's revision is remembered against the read that raced it). Bounded by Max owners,
// the least recently used going first. Safe for concurrent use.
type Cache struct {
	// Max bounds the owners held (default DefaultCacheOwners).
	Max int

	mu      sync.Mutex
	on      bool
	epoch   uint64 // counts the watches: a read begun under another is not kept
	changes uint64 // counts the changes seen
	// trimmed is the highest change count of an item trimmed: a read marked before it may
	// have missed a change whose trace is gone.
	trimmed uint64
	ll      *list.List               // most recent first
	items   map[string]*list.Element // owner token → *cached

	hits, misses atomic.Int64
}

// DefaultCacheOwners is how many owners' entries a Cache holds by default.
const DefaultCacheOwners = 10_000

type cached struct {
	token string
	en    *entry // nil: a change seen, no entry held
	// rev is the change count of the last change of the owner seen, or of the mark its entry
	// was read under: a read is kept only under the mark it was read under.
	rev uint64
}

func (c *Cache) max() int {
	if c.Max > 0 {
		return c.Max
	}
	return DefaultCacheOwners
}

// get returns owner token's entry when held.
func (c *Cache) get(token string) (*entry, bool) {
	if c == nil {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.on {
		return nil, false
	}
	if el, ok := c.items[token]; ok && el.Value.(*cached).en != nil {
		c.ll.MoveToFront(el)
		c.hits.Add(1)
		return el.Value.(*cached).en, true
	}
	c.misses.Add(1)
	return nil, false
}

// mark is taken before an entry is read from the bucket: what put checks that no change came
// meanwhile.
type mark struct {
	epoch, rev, changes uint64
}

func (c *Cache) mark(token string) mark {
	if c == nil {
		return mark{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := mark{epoch: c.epoch, changes: c.changes}
	if el, ok := c.items[token]; ok {
		m.rev = el.Value.(*cached).rev
	}
	return m
}

// put keeps en, read from the bucket after m, unless a change of token came since m (or the
// watch restarted).
func (c *Cache) put(token string, en *entry, m mark) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.on || c.epoch != m.epoch {
		return
	}
	if el, ok := c.items[token]; ok {
		x := el.Value.(*cached)
		if x.rev != m.rev {
			return // a change came while it was read
		}
		x.en = en
		c.ll.MoveToFront(el)
		return
	}
	if m.rev != 0 || c.trimmed > m.changes {
		// What marked it, or a change of it since, may have been trimmed meanwhile.
		return
	}
	c.items[token] = c.ll.PushFront(&cached{token: token, en: en, rev: m.changes})
	c.trim()
}

// changed drops token's entry: the bucket changed it (a watch's update, or this process's own
// write). Each change counts, so that a read that raced it is not kept.
func (c *Cache) changed(token string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.on {
		return
	}
	c.changes++
	if el, ok := c.items[token]; ok {
		x := el.Value.(*cached)
		x.en, x.rev = nil, c.changes
		return
	}
	c.items[token] = c.ll.PushFront(&cached{token: token, rev: c.changes})
	c.trim()
}

func (c *Cache) trim() {
	for c.ll.Len() > c.max() {
		el := c.ll.Back()
		x := el.Value.(*cached)
		c.trimmed = max(c.trimmed, x.rev)
		delete(c.items, x.token)
		c.ll.Remove(el)
	}
}

// following turns the cache on (the watch gives every change) or off (it may miss some): off,
// it holds nothing.
func (c *Cache) following(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.on = on
	c.epoch++
	c.trimmed = c.changes
	c.ll, c.items = list.New(), map[string]*list.Element{}
}

// Holds reports whether the cache holds any fragment of owner: what a test of an erasure asks.
// (An owner known to have none may be held, to spare the bus its reads.)
func (c *Cache) Holds(owner string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.items == nil {
		return false
	}
	el, ok := c.items[Token(owner)]
	return ok && el.Value.(*cached).en != nil && len(el.Value.(*cached).en.Fragments) > 0
}

// Stats are the cache's hits and misses so far, and the owners it holds.
func (c *Cache) Stats() (hits, misses int64, owners int) {
	c.mu.Lock()
	n := 0
	if c.ll != nil {
		n = c.ll.Len()
	}
	c.mu.Unlock()
	return c.hits.Load(), c.misses.Load(), n
}

// Run follows kv until ctx ends, returning once the cache is on; an error says the first
// watch could not be made.
func (c *Cache) Run(ctx context.Context, kv jetstream.KeyValue, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &kvwatch.Follower{What: "memory", Log: log, Following: c.following,
		Watch: func(ctx context.Context) (jetstream.KeyWatcher, error) {
			// Headers only: the owners held are listed at first (what ends the watch's start),
			// then each change.
			return kv.Watch(ctx, "o.*", jetstream.MetaOnly())
		},
		Apply: func(e jetstream.KeyValueEntry) {
			if token, ok := strings.CutPrefix(e.Key(), "o."); ok {
				c.changed(token)
			}
		}}
	return f.Start(ctx)
}
