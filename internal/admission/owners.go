package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/protocol"
)

const (
	// ownersCacheTTL is how long a gateway trusts an owner it read; owners never change, but
	// an owner record may expire and be claimed anew once its session has left the record.
	ownersCacheTTL = 30 * time.Second
	// maxOwnersCached bounds the owners a gateway remembers.
	maxOwnersCached = 100_000
	// maxOwnerRecord bounds an owner record read from the bucket.
	maxOwnerRecord = 2 << 10
	// renewAfter is how old an owner record gets before a request of its owner writes it
	// again. The bucket keeps a record an hour longer than the record stream keeps a message,
	// so renewing at least every half hour keeps the owner longer than any request of the
	// session.
	renewAfter = 30 * time.Minute
	// unownedHistory stands as the owner of a session the record holds requests of that no
	// owner record names (submitted on the bus directly, or before callers): nobody's.
	unownedHistory = "(requests without an owner)"
)

// ownerRecord is what the owners bucket keeps per session.
type ownerRecord struct {
	Owner string    `json:"owner"`
	Since time.Time `json:"since"`
}

// decodeOwner reads an owner record, refusing what is not one.
func decodeOwner(data []byte) (*ownerRecord, error) {
	if len(data) > maxOwnerRecord {
		return nil, fmt.Errorf("admission: owner record of %d bytes (at most %d)", len(data), maxOwnerRecord)
	}
	var rec ownerRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("admission: owner record: %w", err)
	}
	if rec.Owner == "" || len(rec.Owner) > protocol.MaxCallerIDLen+1+protocol.MaxUserLen {
		return nil, errors.New("admission: owner record without a valid owner")
	}
	return &rec, nil
}

// owners says who each session belongs to, from the owners bucket (OwnersBucket). The
// first claim of a session wins (a create, so two gateways cannot both win); later claims learn
// the owner. It is safe for concurrent use.
type owners struct {
	kv  jetstream.KeyValue
	ttl time.Duration // the bucket's; 0 when owners never expire
	now func() time.Time

	mu   sync.Mutex
	seen map[string]ownerSeen
}

type ownerSeen struct {
	owner string
	since time.Time // when the record was written
	rev   uint64    // its revision
	at    time.Time // when this gateway read it
}

// newOwners returns the owners kept in kv; with kv nil, in this gateway's memory alone (for
// tests).
func newOwners(ctx context.Context, kv jetstream.KeyValue) *owners {
	o := &owners{kv: kv, now: time.Now, seen: map[string]ownerSeen{}}
	if kv != nil {
		if st, err := kv.Status(ctx); err == nil {
			o.ttl = st.TTL()
		}
	}
	return o
}

// claim makes owner the owner of session unless it has one, and returns who owns it. A session
// without an owner record whose requests the record holds (history reports them, asked first)
// is not claimed: its owner is unownedHistory. With history nil, such a session is claimed as any
// other (for callers who read every session). A record past renewAfter is written again by its
// owner, so a session in use never loses its owner while the record holds its requests.
func (o *owners) claim(ctx context.Context, session, owner string, history func(context.Context) (bool, error)) (string, error) {
	if s, ok := o.cached(session); ok {
		if s.owner == owner {
			o.renew(ctx, session, s)
		}
		return s.owner, nil
	}
	if o.kv == nil {
		o.mu.Lock()
		defer o.mu.Unlock()
		if s, ok := o.seen[session]; ok {
			return s.owner, nil
		}
		o.seen[session] = ownerSeen{owner: owner}
		return owner, nil
	}
	for range 3 {
		// A session nobody owns that has requests already is not this caller's: asked before
		// anything is written, so no one ever sees a claim that would have to be taken back.
		// (A request stored in between comes with its own claim, which the create below
		// finds.)
		if history != nil {
			had, err := history(ctx)
			if err != nil {
				return "", fmt.Errorf("admission: claim session %s: %w", session, err)
			}
			if had {
				s, found, err := o.read(ctx, session)
				switch {
				case err != nil:
					return "", err
				case !found:
					return unownedHistory, nil
				case s.owner == owner:
					o.renew(ctx, session, s)
				}
				return s.owner, nil
			}
		}
		rec, _ := json.Marshal(ownerRecord{Owner: owner, Since: o.now().UTC()})
		rev, err := o.kv.Create(ctx, session, rec)
		if err == nil {
			o.remember(session, ownerSeen{owner: owner, since: o.now(), rev: rev, at: o.now()})
			return owner, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return "", fmt.Errorf("admission: claim session %s: %w", session, err)
		}
		s, found, err := o.read(ctx, session)
		switch {
		case err != nil:
			return "", err
		case found:
			if s.owner == owner {
				o.renew(ctx, session, s)
			}
			return s.owner, nil
		}
		// Deleted (expired) between the create and the read: claim again.
	}
	return "", fmt.Errorf("admission: claim session %s: its owner record keeps changing", session)
}

// of returns who owns session; "" when nobody does (no request of it came through a gateway,
// or it has left the record).
func (o *owners) of(ctx context.Context, session string) (string, error) {
	if s, ok := o.cached(session); ok || o.kv == nil {
		return s.owner, nil
	}
	s, _, err := o.read(ctx, session)
	return s.owner, err
}

func (o *owners) read(ctx context.Context, session string) (ownerSeen, bool, error) {
	e, err := o.kv.Get(ctx, session)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return ownerSeen{}, false, nil
	case err != nil:
		return ownerSeen{}, false, fmt.Errorf("admission: read the owner of session %s: %w", session, err)
	}
	rec, err := decodeOwner(e.Value())
	if err != nil {
		// A record that is not one names nobody who could use the session: refuse it to all
		// but those who read every session.
		rec = &ownerRecord{Owner: "(damaged owner record)"}
	}
	s := ownerSeen{owner: rec.Owner, since: e.Created(), rev: e.Revision(), at: o.now()}
	o.remember(session, s)
	return s, true, nil
}

// renew writes s's record again once it is older than renewAfter, over the revision read (a
// record that changed meanwhile is left as it is). Best effort: a failure leaves it to the next
// request.
func (o *owners) renew(ctx context.Context, session string, s ownerSeen) {
	if o.ttl <= 0 || o.now().Sub(s.since) < min(renewAfter, o.ttl/2) {
		return
	}
	rec, _ := json.Marshal(ownerRecord{Owner: s.owner, Since: o.now().UTC()})
	if rev, err := o.kv.Update(ctx, session, rec, s.rev); err == nil {
		s.since, s.rev = o.now(), rev
		o.remember(session, s)
	} else {
		o.forget(session) // read it again next time
	}
}

func (o *owners) forget(session string) {
	o.mu.Lock()
	delete(o.seen, session)
	o.mu.Unlock()
}

func (o *owners) cached(session string) (ownerSeen, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s, ok := o.seen[session]
	if ok && o.kv != nil && o.now().Sub(s.at) > ownersCacheTTL {
		delete(o.seen, session)
		return ownerSeen{}, false
	}
	return s, ok
}

func (o *owners) remember(session string, s ownerSeen) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.seen) >= maxOwnersCached {
		now := o.now()
		for k, v := range o.seen {
			if now.Sub(v.at) > ownersCacheTTL {
				delete(o.seen, k)
			}
		}
		if len(o.seen) >= maxOwnersCached {
			clear(o.seen) // all fresh: start over rather than grow
		}
	}
	o.seen[session] = s
}
