package prefilter

import (
	"container/list"
	"sync"
)

// lru remembers at most max values by key, forgetting the least recently used first. Safe for
// concurrent use.
type lru[V any] struct {
	max   int
	mu    sync.Mutex
	m     map[string]*list.Element
	order *list.List // most recent first
}

type lruEntry[V any] struct {
	key string
	v   V
}

func newLRU[V any](max int) *lru[V] {
	return &lru[V]{max: max, m: map[string]*list.Element{}, order: list.New()}
}

func (c *lru[V]) get(key string) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok {
		var zero V
		return zero, false
	}
	c.order.MoveToFront(e)
	return e.Value.(*lruEntry[V]).v, true
}

// put remembers v under key, replacing what was there.
func (c *lru[V]) put(key string, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[key]; ok {
		e.Value.(*lruEntry[V]).v = v
		c.order.MoveToFront(e)
		return
	}
	c.m[key] = c.order.PushFront(&lruEntry[V]{key: key, v: v})
	if c.order.Len() > c.max {
		old := c.order.Back()
		c.order.Remove(old)
		delete(c.m, old.Value.(*lruEntry[V]).key)
	}
}

func (c *lru[V]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

// clear forgets everything.
func (c *lru[V]) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m = map[string]*list.Element{}
	c.order.Init()
}
