package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"slices"
	"sync"
	"time"
)

// Verifier names the caller a credential belongs to, or returns an error wrapping
// ErrUnauthenticated; any other error means it could not tell.
type Verifier interface {
	Verify(ctx context.Context, credential string) (*Caller, error)
}

var _ Verifier = (*Keys)(nil)

// Cached remembers for TTL what Next said about a credential — the caller it names, or that it
// names none — so a busy gateway reads the key store once per credential per TTL, and a revoked
// key stops working within TTL. What Next could not tell (the store unreachable) is not
// remembered. At most Max credentials are remembered (by their hash, never as given); when
// full, the oldest half goes. It is safe for concurrent use.
type Cached struct {
	Next Verifier
	// TTL is how long an answer is remembered. Default 5 s.
	TTL time.Duration
	// Max bounds the credentials remembered. Default 10 000.
	Max int
	now func() time.Time

	mu      sync.Mutex
	entries map[[sha256.Size]byte]cached
}

type cached struct {
	caller *Caller
	err    error
	at     time.Time
}

// fresh reports whether e may still be answered from: younger than ttl, and the credential it
// is about not expired.
func (e cached) fresh(now time.Time, ttl time.Duration) bool {
	return now.Sub(e.at) < ttl && (e.caller == nil || e.caller.Expires.IsZero() || now.Before(e.caller.Expires))
}

// lookup returns what is remembered of credential and whether it is fresh, with the key it is
// remembered under, the time and the TTL in force.
func (c *Cached) lookup(credential string) (e cached, fresh bool, key [sha256.Size]byte, now time.Time, ttl time.Duration) {
	now = time.Now()
	if c.now != nil {
		now = c.now()
	}
	ttl = c.TTL
	if ttl <= 0 {
		ttl = 5 * time.Second
	}
	key = sha256.Sum256([]byte(credential))
	c.mu.Lock()
	e, ok := c.entries[key]
	c.mu.Unlock()
	return e, ok && e.fresh(now, ttl), key, now, ttl
}

// Verify answers from memory, or asks Next.
func (c *Cached) Verify(ctx context.Context, credential string) (*Caller, error) {
	e, fresh, key, now, ttl := c.lookup(credential)
	if fresh {
		return e.caller, e.err
	}
	caller, err := c.Next.Verify(ctx, credential)
	if err != nil && !errors.Is(err, ErrUnauthenticated) {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[[sha256.Size]byte]cached{}
	}
	limit := c.Max
	if limit <= 0 {
		limit = 10_000
	}
	if len(c.entries) >= limit {
		c.evict(now, ttl, limit/2)
	}
	c.entries[key] = cached{caller: caller, err: err, at: now}
	return caller, err
}

// evict drops what has expired, then the oldest entries until at most keep are left.
func (c *Cached) evict(now time.Time, ttl time.Duration, keep int) {
	type aged struct {
		key [sha256.Size]byte
		at  time.Time
	}
	var live []aged
	for k, e := range c.entries {
		if now.Sub(e.at) >= ttl {
			delete(c.entries, k)
		} else {
			live = append(live, aged{k, e.at})
		}
	}
	if len(live) <= keep {
		return
	}
	slices.SortFunc(live, func(a, b aged) int { return a.at.Compare(b.at) })
	for _, e := range live[:len(live)-keep] {
		delete(c.entries, e.key)
	}
}

// Forget drops what is remembered of credential (a sign-out on this gateway takes effect at
// once).
func (c *Cached) Forget(credential string) {
	key := sha256.Sum256([]byte(credential))
	c.mu.Lock()
	delete(c.entries, key)
	c.mu.Unlock()
}

// Known returns what is remembered of credential, if anything is and it is still fresh: the
// caller it names (nil when it names none). Nothing is asked of Next.
func (c *Cached) Known(credential string) (*Caller, bool) {
	e, fresh, _, _, _ := c.lookup(credential)
	if !fresh {
		return nil, false
	}
	return e.caller, true
}

// WasValid reports whether credential named a caller when last checked, however long ago (while
// it is remembered at all).
func (c *Cached) WasValid(credential string) bool {
	key := sha256.Sum256([]byte(credential))
	c.mu.Lock()
	e, ok := c.entries[key]
	c.mu.Unlock()
	return ok && e.caller != nil
}
