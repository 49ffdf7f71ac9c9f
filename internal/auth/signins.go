package auth

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// SigninPrefix starts every sign-in token: what a browser holds, in an HttpOnly cookie, once it
// has signed in with a key or a token.
const SigninPrefix = "hs_"

// SigninTTL is how long a sign-in lasts at most.
const SigninTTL = 12 * time.Hour

// signinPattern is the shape of a sign-in token: hs_<id>_<secret>.
var signinPattern = regexp.MustCompile(`^hs_([a-z2-7]{16})_([a-z2-7]{52})$`)

// maxSigninRecord bounds a stored sign-in record.
const maxSigninRecord = 4 << 10

// signin is what is kept of a sign-in: the caller it stands for, until when, and a hash of its
// secret, never the token.
type signin struct {
	ID      string    `json:"id"`
	Hash    string    `json:"hash"`
	Caller  Caller    `json:"caller"`
	Expires time.Time `json:"expires"`
}

// decodeSignin reads the record stored under id, whatever the bytes.
func decodeSignin(id string, data []byte) (*signin, error) {
	if len(data) > maxSigninRecord {
		return nil, fmt.Errorf("%w: %d bytes (at most %d)", ErrBadRecord, len(data), maxSigninRecord)
	}
	var s signin
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRecord, err)
	}
	switch {
	case s.ID != id || !encodedID(s.ID):
		return nil, fmt.Errorf("%w: stored under %s, it says it is %q", ErrBadRecord, id, s.ID)
	case len(s.Hash) != 64 || strings.Trim(s.Hash, "0123456789abcdef") != "":
		return nil, fmt.Errorf("%w: no valid hash", ErrBadRecord)
	case s.Caller.ID == "" || len(s.Caller.ID) > 512 || len(s.Caller.Name) > 128:
		return nil, fmt.Errorf("%w: no valid caller", ErrBadRecord)
	}
	if _, err := ParseRole(string(s.Caller.Role)); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRecord, err)
	}
	return &s, nil
}

// Signins keeps browsers' sign-ins (the bus's hermes-signins bucket), so that any gateway
// recognises them and signing out ends them everywhere. A sign-in made with an API key ends
// when the key is revoked. It is safe for concurrent use.
type Signins struct {
	kv   kv
	keys *Keys // to see whether the key a sign-in was made with still stands; nil: not checked
	now  func() time.Time
}

// NewSignins returns the sign-ins kept in bucket; keys, when set, is where the API keys they
// were made with are checked.
func NewSignins(bucket jetstream.KeyValue, keys *Keys) *Signins {
	return &Signins{kv: bucket, keys: keys, now: time.Now}
}

var _ Verifier = (*Signins)(nil)

// Create signs c in until until (at most SigninTTL from now) and returns the token, the only
// time it is seen.
func (s *Signins) Create(ctx context.Context, c *Caller, until time.Time) (string, time.Time, error) {
	now := s.now()
	if until.IsZero() || until.After(now.Add(SigninTTL)) {
		until = now.Add(SigninTTL)
	}
	id, secret := make([]byte, idBytes), make([]byte, secretBytes)
	if _, err := rand.Read(id); err != nil {
		return "", time.Time{}, err
	}
	if _, err := rand.Read(secret); err != nil {
		return "", time.Time{}, err
	}
	rec := signin{ID: encoding.EncodeToString(id), Hash: hashSecret(encoding.EncodeToString(secret)), Caller: *c, Expires: until.UTC()}
	data, err := json.Marshal(&rec)
	if err != nil {
		return "", time.Time{}, err
	}
	if _, err := s.kv.Create(ctx, rec.ID, data); err != nil {
		return "", time.Time{}, fmt.Errorf("auth: keep the sign-in: %w", err)
	}
	return SigninPrefix + rec.ID + "_" + encoding.EncodeToString(secret), until, nil
}

// Verify returns the caller a sign-in token stands for, or an error wrapping
// ErrUnauthenticated (malformed, unknown, wrong, expired, signed out, or its key revoked).
func (s *Signins) Verify(ctx context.Context, token string) (*Caller, error) {
	rec, err := s.lookup(ctx, token)
	if err != nil {
		return nil, err
	}
	if s.now().After(rec.Expires) {
		return nil, fmt.Errorf("%w: sign-in %s expired", ErrUnauthenticated, rec.ID)
	}
	if keyID, ok := strings.CutPrefix(rec.Caller.ID, "key:"); ok && s.keys != nil {
		k, _, err := s.keys.get(ctx, keyID)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, ErrBadRecord):
			return nil, fmt.Errorf("%w: sign-in %s: its key is gone", ErrUnauthenticated, rec.ID)
		case err != nil:
			return nil, err
		case k.Revoked():
			return nil, fmt.Errorf("%w: sign-in %s: its key was revoked", ErrUnauthenticated, rec.ID)
		}
	}
	c := rec.Caller
	return &c, nil
}

// Delete ends the sign-in token stands for; ending one that is not there is no error.
func (s *Signins) Delete(ctx context.Context, token string) error {
	rec, err := s.lookup(ctx, token)
	if errors.Is(err, ErrUnauthenticated) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := s.kv.Purge(ctx, rec.ID); err != nil {
		return fmt.Errorf("auth: sign out: %w", err)
	}
	return nil
}

func (s *Signins) lookup(ctx context.Context, token string) (*signin, error) {
	m := signinPattern.FindStringSubmatch(token)
	if m == nil {
		return nil, fmt.Errorf("%w: not a sign-in token", ErrUnauthenticated)
	}
	e, err := s.kv.Get(ctx, m[1])
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, fmt.Errorf("%w: unknown sign-in %s", ErrUnauthenticated, m[1])
	case err != nil:
		return nil, err
	}
	rec, err := decodeSignin(m[1], e.Value())
	if err != nil {
		return nil, fmt.Errorf("%w: sign-in %s: %v", ErrUnauthenticated, m[1], err)
	}
	if subtle.ConstantTimeCompare([]byte(hashSecret(m[2])), []byte(rec.Hash)) != 1 {
		return nil, fmt.Errorf("%w: wrong secret for sign-in %s", ErrUnauthenticated, m[1])
	}
	return rec, nil
}
