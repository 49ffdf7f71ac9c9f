package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// KeyPrefix starts every API key, so secret scanners recognise a leaked one.
const KeyPrefix = "hk_"

const (
	idBytes     = 10 // 16 characters
	secretBytes = 32 // 52 characters
)

var (
	encoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)
	// keyPattern is the shape of a key: hk_<id>_<secret>.
	keyPattern = regexp.MustCompile(`^hk_([a-z2-7]{16})_([a-z2-7]{52})$`)
	// namePattern is what a key's name may be.
	namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
)

// ParseKey splits an API key into its id and secret, or says it is not one (without echoing
// it).
func ParseKey(key string) (id, secret string, err error) {
	m := keyPattern.FindStringSubmatch(key)
	if m == nil {
		return "", "", fmt.Errorf("%w: not an API key (they look like %s<16 characters>_<52 characters>)", ErrUnauthenticated, KeyPrefix)
	}
	return m[1], m[2], nil
}

// Key is what is kept of an API key: never the key itself, only a hash of its secret.
type Key struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Role        Role   `json:"role"`
	ActForUsers bool   `json:"act_for_users,omitempty"`
	// Hash is the lower-case hex SHA-256 of the secret as it is written in the key (its 52
	// characters).
	Hash      string    `json:"hash,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by,omitempty"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
}

// Revoked reports whether k was revoked.
func (k *Key) Revoked() bool { return !k.RevokedAt.IsZero() }

// Check reports whether secret is k's, in time that does not depend on where they differ.
func (k *Key) Check(secret string) bool {
	return subtle.ConstantTimeCompare([]byte(hashSecret(secret)), []byte(k.Hash)) == 1
}

// Caller is the caller k names; nil when k is revoked.
func (k *Key) Caller() *Caller {
	if k.Revoked() {
		return nil
	}
	return &Caller{ID: "key:" + k.ID, Name: k.Name, Role: k.Role, ActForUsers: k.ActForUsers}
}

// maxKeyRecord bounds a stored key record: anything larger is not one.
const maxKeyRecord = 4 << 10

// ErrBadRecord is wrapped by DecodeKey's errors: the stored bytes are no key record.
var ErrBadRecord = errors.New("auth: not a key record")

// DecodeKey reads the record stored under id, whatever the bytes: hostile input, or a record
// that is not id's, gives an error wrapping ErrBadRecord.
func DecodeKey(id string, data []byte) (*Key, error) {
	if len(data) > maxKeyRecord {
		return nil, fmt.Errorf("%w: %d bytes (at most %d)", ErrBadRecord, len(data), maxKeyRecord)
	}
	var k Key
	if err := json.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRecord, err)
	}
	switch {
	case k.ID != id || !encodedID(k.ID):
		return nil, fmt.Errorf("%w: stored under %s, it says it is %q", ErrBadRecord, id, k.ID)
	case !namePattern.MatchString(k.Name):
		return nil, fmt.Errorf("%w: no valid name", ErrBadRecord)
	case len(k.Hash) != 2*sha256.Size || strings.Trim(k.Hash, "0123456789abcdef") != "":
		return nil, fmt.Errorf("%w: no valid hash", ErrBadRecord)
	}
	if _, err := ParseRole(string(k.Role)); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRecord, err)
	}
	return &k, nil
}

func encodedID(id string) bool {
	return len(id) == 16 && strings.Trim(id, "abcdefghijklmnopqrstuvwxyz234567") == ""
}

// kv is the part of a key-value bucket the key store uses.
type kv interface {
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
	ListKeys(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyLister, error)
	Purge(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error
}

// Keys is the store of API keys (the bus's hermes-keys bucket). It is safe for concurrent use.
type Keys struct {
	kv  kv
	now func() time.Time
}

// NewKeys returns the key store in bucket.
func NewKeys(bucket jetstream.KeyValue) *Keys { return &Keys{kv: bucket, now: time.Now} }

// NewKey is what Create specifies.
type NewKey struct {
	Name        string
	Role        Role
	ActForUsers bool
	// CreatedBy names who created it (a caller id, or "hermes up").
	CreatedBy string
}

// Create makes a key, keeps its hash, and returns the key — the only time it is seen — and
// its record.
func (s *Keys) Create(ctx context.Context, spec NewKey) (string, *Key, error) {
	if !namePattern.MatchString(spec.Name) {
		return "", nil, fmt.Errorf("auth: key name %q: 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit", spec.Name)
	}
	if _, err := ParseRole(string(spec.Role)); err != nil {
		return "", nil, err
	}
	id, secret := make([]byte, idBytes), make([]byte, secretBytes)
	if _, err := rand.Read(id); err != nil {
		return "", nil, err
	}
	if _, err := rand.Read(secret); err != nil {
		return "", nil, err
	}
	k := &Key{ID: encoding.EncodeToString(id), Name: spec.Name, Role: spec.Role, ActForUsers: spec.ActForUsers,
		Hash: hashSecret(encoding.EncodeToString(secret)), CreatedAt: s.now().UTC(), CreatedBy: spec.CreatedBy}
	data, err := json.Marshal(k)
	if err != nil {
		return "", nil, err
	}
	if _, err := s.kv.Create(ctx, k.ID, data); err != nil {
		return "", nil, fmt.Errorf("auth: keep key %s: %w", k.Name, err)
	}
	return KeyPrefix + k.ID + "_" + encoding.EncodeToString(secret), k, nil
}

func hashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// Verify returns the caller an API key names, or an error wrapping ErrUnauthenticated when it
// names none (malformed, unknown, wrong secret, revoked). Other errors mean the store could not
// be read.
func (s *Keys) Verify(ctx context.Context, key string) (*Caller, error) {
	id, secret, err := ParseKey(key)
	if err != nil {
		return nil, err
	}
	k, _, err := s.get(ctx, id)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, fmt.Errorf("%w: unknown key id %s", ErrUnauthenticated, id)
	case errors.Is(err, ErrBadRecord):
		return nil, fmt.Errorf("%w: key id %s: %v", ErrUnauthenticated, id, err)
	case err != nil:
		return nil, err
	}
	if !k.Check(secret) {
		return nil, fmt.Errorf("%w: wrong secret for key id %s", ErrUnauthenticated, id)
	}
	if k.Revoked() {
		return nil, fmt.Errorf("%w: key %s (%s) was revoked", ErrUnauthenticated, id, k.Name)
	}
	return k.Caller(), nil
}

func (s *Keys) get(ctx context.Context, id string) (*Key, uint64, error) {
	e, err := s.kv.Get(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	k, err := DecodeKey(id, e.Value())
	if err != nil {
		return nil, 0, err
	}
	return k, e.Revision(), nil
}

// ErrNoSuchKey is returned by Revoke for a key id or name the store does not hold.
var ErrNoSuchKey = errors.New("auth: no such key")

// Revoke revokes the key with id idOrName, or else the one named so; revoking a revoked key
// changes nothing. It returns the key's record.
func (s *Keys) Revoke(ctx context.Context, idOrName string) (*Key, error) {
	id := ""
	if encodedID(idOrName) {
		if _, _, err := s.get(ctx, idOrName); err == nil {
			id = idOrName
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, err
		}
	}
	if id == "" {
		var err error
		if id, err = s.named(ctx, idOrName); err != nil {
			return nil, err
		}
	}
	for range 8 {
		k, rev, err := s.get(ctx, id)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("%w: %s", ErrNoSuchKey, idOrName)
		}
		if err != nil {
			return nil, err
		}
		if k.Revoked() {
			return k, nil
		}
		k.RevokedAt = s.now().UTC()
		data, err := json.Marshal(k)
		if err != nil {
			return nil, err
		}
		if _, err := s.kv.Update(ctx, id, data, rev); err == nil {
			return k, nil
		} else if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("auth: revoke %s: %w", id, err)
		}
	}
	return nil, fmt.Errorf("auth: revoke %s: changed by others meanwhile; try again", id)
}

// named returns the id of the key named name: the one not revoked, or else a revoked one.
func (s *Keys) named(ctx context.Context, name string) (string, error) {
	all, _, err := s.List(ctx)
	if err != nil {
		return "", err
	}
	live, revoked := "", ""
	for _, k := range all {
		switch {
		case k.Name != name:
		case k.Revoked():
			revoked = k.ID
		case live != "":
			return "", fmt.Errorf("auth: more than one key is named %s; revoke it by id", name)
		default:
			live = k.ID
		}
	}
	switch {
	case live != "":
		return live, nil
	case revoked != "":
		return revoked, nil
	}
	return "", fmt.Errorf("%w: %s", ErrNoSuchKey, name)
}

// List returns every key's record, revoked ones too, oldest first, and the ids of records
// that are damaged (not a key's), which it leaves out.
func (s *Keys) List(ctx context.Context) ([]*Key, []string, error) {
	lister, err := s.kv.ListKeys(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("auth: list keys: %w", err)
	}
	var ids []string
	for id := range lister.Keys() {
		ids = append(ids, id)
	}
	if err := ctx.Err(); err != nil { // the listing ends early, without an error of its own
		return nil, nil, fmt.Errorf("auth: list keys: %w", err)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids) // a key written while listed may be listed twice
	var out []*Key
	var damaged []string
	for _, id := range ids {
		k, _, err := s.get(ctx, id)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case errors.Is(err, ErrBadRecord):
			damaged = append(damaged, id)
		case err != nil:
			return nil, nil, err
		default:
			out = append(out, k)
		}
	}
	slices.SortStableFunc(out, func(a, b *Key) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, damaged, nil
}
