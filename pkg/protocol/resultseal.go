package protocol

import (
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// A tool result is sealed by whoever records it, with the same Seal a router puts on a call:
// the worker that ran the call, or the Hermes service that answered it (a router's NO_ROUTE, the
// dead-letter processor's DEAD_LETTERED, a cancellation's CANCELLED). A reader that is given the
// trusted keys (ResultKeys) takes a result for its call only when a key trusted for the call's
// tool sealed it, so a result published by anyone else able to publish on the bus — another
// tool's worker among them — is never taken for the call's. A worker can still answer calls of
// its own tools wrongly: that is the trust placed in the tool, not a forgery.

// ErrResultUnsealed is wrapped by VerifyResult's errors: the result is not one a key trusted
// for its call's tool sealed.
var ErrResultUnsealed = errors.New("protocol: result not sealed by a key trusted for its tool")

// ResultSigner is a public key trusted to seal results, and which calls' results it may seal.
type ResultSigner struct {
	// Key is the ed25519 public key.
	Key ed25519.PublicKey
	// Tools are the tools whose calls' results the key may seal; empty means any tool (a Hermes
	// service — router, gateway, dead-letter processor — or a worker trusted with every tool).
	Tools []string
}

// AnyTool reports whether s may seal the result of a call of any tool.
func (s ResultSigner) AnyTool() bool { return len(s.Tools) == 0 }

// Serves reports whether s may seal the result of a call of tool.
func (s ResultSigner) Serves(tool string) bool {
	return s.AnyTool() || slices.Contains(s.Tools, tool)
}

// ResultKeys are the keys trusted to seal results, by key id.
type ResultKeys map[string]ResultSigner

// Signer returns the trusted signer m names in its seal, if any.
func (k ResultKeys) Signer(m *Message) (ResultSigner, bool) {
	if m == nil || m.Seal == nil {
		return ResultSigner{}, false
	}
	s, ok := k[m.Seal.KeyID]
	return s, ok
}

// SealResult seals m, a tool_result message whose Sender is set, with key named keyID. A
// result's seal does not expire (the record keeps it as long as the call's state); its expiry
// is the time of sealing. Beside what a call's seal covers, it covers the result's correlation
// (the request's call ids, its serial flag, a cancellation's message) and its sender, which
// readers act on: a genuine result replayed with either changed no longer verifies.
func (m *Message) SealResult(key ed25519.PrivateKey, keyID string) {
	expires := time.Now().UTC().Round(0)
	m.Seal = &Seal{KeyID: keyID, Expires: expires, Sig: ed25519.Sign(key, m.resultSealedBytes(keyID, expires))}
}

// resultSealedBytes is what a result's seal signs: what a call's does, under another domain
// tag, then the correlation and the sender, each length-prefixed.
func (m *Message) resultSealedBytes(keyID string, expires time.Time) []byte {
	b := m.sealedBytes(keyID, expires)
	field := func(s string) {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	field("hermes result seal v1")
	if c := m.Correlation; c != nil {
		field("correlation")
		for _, id := range c.CallIDs {
			field(id)
		}
		field(fmt.Sprint(len(c.CallIDs), c.Serial))
		field(c.Cancelled)
	} else {
		field("no correlation")
	}
	field(m.Sender.Role)
	field(m.Sender.Instance)
	return b
}

// VerifyResult checks that m, a tool_result message carrying res, is sealed, over m as it is,
// by a key of k trusted for tool, the tool of the call the result answers (the request's plan
// says it, or the router-sealed dispatch). res.Name must be tool. An empty tool takes res.Name:
// the caller then knows the signer's tools were checked against the result's own claim only.
func (k ResultKeys) VerifyResult(m *Message, res *ToolResult, tool string) error {
	s := m.Seal
	switch {
	case m.Type != TypeToolResult:
		return fmt.Errorf("%w: a %s is no result", ErrResultUnsealed, cut(string(m.Type), 32))
	case s == nil:
		return fmt.Errorf("%w: the result has no seal", ErrResultUnsealed)
	}
	signer, ok := k[s.KeyID]
	switch {
	case !ok:
		return fmt.Errorf("%w: sealed with key %q, which is not trusted for results", ErrResultUnsealed, cut(s.KeyID, 64))
	case len(signer.Key) != ed25519.PublicKeySize || len(s.Sig) != ed25519.SignatureSize ||
		!ed25519.Verify(signer.Key, m.resultSealedBytes(s.KeyID, s.Expires), s.Sig):
		return fmt.Errorf("%w: the seal of key %q does not match the result", ErrResultUnsealed, cut(s.KeyID, 64))
	}
	if tool == "" {
		tool = res.Name
	}
	if res.Name != tool {
		return fmt.Errorf("%w: it names tool %q, but the call is of %q", ErrResultUnsealed, cut(res.Name, MaxToolNameLen), cut(tool, MaxToolNameLen))
	}
	if !signer.Serves(tool) {
		return fmt.Errorf("%w: key %q may seal results of %s only, not of %q", ErrResultUnsealed, cut(s.KeyID, 64),
			cut(strings.Join(signer.Tools, ", "), 256), cut(tool, MaxToolNameLen))
	}
	return nil
}
