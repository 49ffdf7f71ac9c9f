package protocol

import (
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Seal is a router's signature over a tool call message: a worker that is given the routers'
// public keys runs only calls they sealed, so a message forged by anyone else able to publish on
// the bus — pointing a call at a URL of their choosing — is refused.
type Seal struct {
	// KeyID names the key that signed (several may be trusted while keys rotate).
	KeyID string `msgpack:"key_id"`
	// Expires bounds how long the seal is good: a captured message cannot be replayed once
	// the call ledger may have forgotten the call.
	Expires time.Time `msgpack:"expires"`
	// Sig is the ed25519 signature of sealedBytes.
	Sig []byte `msgpack:"sig"`
}

// ErrUnsealed is wrapped by VerifySeal's errors: the message is not one a trusted router sealed.
var ErrUnsealed = errors.New("protocol: not sealed by a trusted router")

// ErrSealExpired is VerifySeal's error for a message a trusted router did seal, whose seal has
// expired: its ids are genuine (it may be answered), but it must not run.
var ErrSealExpired = errors.New("protocol: the router's seal has expired")

// sealedBytes is what a seal signs: a domain tag, the message's type, ids, expiry, deadline and
// payload, each length-prefixed (no two messages share it). The attempt and trace are not
// sealed: they change as the call is retried, and decide nothing a forger could use.
func (m *Message) sealedBytes(keyID string, expires time.Time) []byte {
	b := make([]byte, 0, 128+len(m.Payload))
	field := func(s []byte) {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	field([]byte("hermes seal v1"))
	field([]byte(keyID))
	field([]byte(m.Type))
	field([]byte(m.MsgID))
	field([]byte(m.RequestID))
	field([]byte(m.SessionID))
	b = binary.BigEndian.AppendUint64(b, uint64(expires.UnixNano()))
	var deadline int64
	if !m.Deadline.IsZero() {
		deadline = m.Deadline.UnixNano()
	}
	b = binary.BigEndian.AppendUint64(b, uint64(deadline))
	field(m.Payload)
	return b
}

// SealWith signs m with key, named keyID, good until expires.
func (m *Message) SealWith(key ed25519.PrivateKey, keyID string, expires time.Time) {
	expires = expires.UTC().Round(0)
	m.Seal = &Seal{KeyID: keyID, Expires: expires, Sig: ed25519.Sign(key, m.sealedBytes(keyID, expires))}
}

// VerifySeal checks that m carries a seal, by one of keys, not expired at now, over m as it is.
func (m *Message) VerifySeal(keys map[string]ed25519.PublicKey, now time.Time) error {
	s := m.Seal
	switch {
	case s == nil:
		return fmt.Errorf("%w: the message has no seal", ErrUnsealed)
	case keys[s.KeyID] == nil:
		return fmt.Errorf("%w: sealed with key %q, which this worker does not trust", ErrUnsealed, cut(s.KeyID, 64))
	case len(keys[s.KeyID]) != ed25519.PublicKeySize || len(s.Sig) != ed25519.SignatureSize ||
		!ed25519.Verify(keys[s.KeyID], m.sealedBytes(s.KeyID, s.Expires), s.Sig):
		return fmt.Errorf("%w: the seal does not match the message", ErrUnsealed)
	case now.After(s.Expires):
		return fmt.Errorf("%w at %s", ErrSealExpired, s.Expires.Format(time.RFC3339))
	}
	return nil
}
