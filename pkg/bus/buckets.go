package bus

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Bucket is a key-value bucket an application built on the bus keeps its own state in, beside
// Hermes' buckets (Config.Buckets): Provision creates or opens it with them — in the same
// store, with the same replicas, counted in StoreBytes, created only where Provision creates,
// opened only otherwise — and the permission table (AccessOf) lets the roles it names watch
// and write it. Hermes' gateway keeps its callers' API keys, browsers' sign-ins and session
// owners so; what the bucket holds is the application's business, not the bus's.
type Bucket struct {
	// Name of the bucket: a subject token, and none of Hermes' own buckets.
	Name string
	// Description says what it holds (nats kv ls); set on a bucket made without one.
	Description string
	// MaxBytes bounds the bucket; full, it refuses new entries. Required.
	MaxBytes int64
	// TTL of its keys; 0: they never expire.
	TTL time.Duration
	// History is how many values of each key the bucket keeps (1 to 64; 0 is 1): more than one
	// keeps earlier versions readable by revision.
	History uint8
	// AsLongAsPlans keeps its keys as long as plans are kept (Config.StateTTL or the record's
	// MaxAge, whichever is longer, and an hour more), whatever TTL says: what names a
	// request or a session is remembered as long as the record may hold them.
	AsLongAsPlans bool
	// Strict makes every read see the last write, from whichever server (no direct gets
	// from replicas): for what a revocation or a first write decides.
	Strict bool
	// Rollup allows roll-ups (Nats-Rollup), which empty a whole bucket: whoever may write one
	// key could. Leave it off unless the application purges keys.
	Rollup bool
	// MarkerTTL, when set, lets writers give a key a TTL of its own (a per-message TTL,
	// Nats-TTL) and keeps the marker the server leaves when one lapses, or when a key is
	// purged, this long: a watcher sees the lapse.
	MarkerTTL time.Duration
	// Watchers are the roles that may watch the bucket (ordered consumers); Writers may also
	// write its keys. Admin may do anything; gateways and routers read every bucket by direct
	// gets (a watcher or writer of another role is given those reads of this bucket too).
	Watchers, Writers []Role
}

// check says what is wrong with b, if anything.
func (b Bucket) check() error {
	if err := protocol.CheckID("bucket name", b.Name); err != nil {
		return fmt.Errorf("bus: %w", err)
	}
	if slices.Contains(hermesBuckets, b.Name) || slices.Contains(earlierBuckets, b.Name) {
		return fmt.Errorf("bus: bucket %s is one of Hermes' own", b.Name)
	}
	if b.History > ContractHistory {
		return fmt.Errorf("bus: bucket %s: History must be at most %d", b.Name, ContractHistory)
	}
	if b.MaxBytes <= 0 {
		return fmt.Errorf("bus: bucket %s: MaxBytes must be positive", b.Name)
	}
	for _, r := range slices.Concat(b.Watchers, b.Writers) {
		if _, err := ParseRole(string(r)); err != nil {
			return fmt.Errorf("bus: bucket %s: %w", b.Name, err)
		}
	}
	return nil
}

// checkBuckets says what is wrong with buckets, if anything: each one, and a name given twice.
func checkBuckets(buckets []Bucket) error {
	seen := map[string]bool{}
	for _, b := range buckets {
		if err := b.check(); err != nil {
			return err
		}
		if seen[b.Name] {
			return fmt.Errorf("bus: bucket %s is given twice", b.Name)
		}
		seen[b.Name] = true
	}
	return nil
}

// hermesBuckets are Hermes' own buckets; earlierBuckets those earlier versions kept state in,
// which hermes migrate removes once drained (Provision).
var (
	hermesBuckets  = []string{BucketCalls, BucketTools, BucketClaims, BucketSessions, BucketParked, BucketContracts}
	earlierBuckets = []string{"hermes-intake", "hermes-responses"}
)

// Bucket returns the application's bucket named name as Provision opened it (Config.Buckets);
// nil when the configuration named none so.
func (b *Bus) Bucket(name string) jetstream.KeyValue { return b.buckets[name] }

// grant adds to a the rights over buckets that role has.
func grant(a *Access, role Role, buckets []Bucket) {
	if role == RoleAdmin {
		return
	}
	for _, b := range buckets {
		writer := slices.Contains(b.Writers, role)
		if !writer && !slices.Contains(b.Watchers, role) {
			continue
		}
		a.Publish = append(a.Publish, bucketReads(b.Name)...)
		a.Publish = append(a.Publish, ordered(KVStream(b.Name))...)
		if writer {
			a.Publish = append(a.Publish, writes(b.Name)...)
		}
	}
	seen := map[string]bool{}
	a.Publish = slices.DeleteFunc(a.Publish, func(s string) bool {
		dup := seen[s]
		seen[s] = true
		return dup
	})
}

// IsWrongLastSequence reports whether err is the server refusing a write whose expected last
// sequence (a compare-and-set) no longer holds: code 10071, or 10164 on replicated streams.
func IsWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
