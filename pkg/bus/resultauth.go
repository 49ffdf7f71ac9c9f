package bus

import (
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// resultAuth is what a bus knows to seal and check results (protocol.ResultKeys). Both are set
// once, before the bus is used (SealResults, TrustResults).
type resultAuth struct {
	// keys, when set, are the keys trusted to seal results: a result on the record counts
	// for its call only when one of them, trusted for the call's tool, sealed it.
	keys protocol.ResultKeys
	// sealID and seal, when set, seal every result this bus records.
	sealID string
	seal   ed25519.PrivateKey
	// ids derives the message ids of the results this bus publishes without reading the
	// record (resultMsgID) from the seal key: no one without it can take one first.
	ids []byte
}

// SealResults makes this bus seal every result it records (RecordResult) with key, named id.
// Call it before the bus is used.
func (b *Bus) SealResults(id string, key ed25519.PrivateKey) {
	b.auth.sealID, b.auth.seal = id, key
	sum := sha256.Sum256(append([]byte("hermes result message ids\x00"), key.Seed()...))
	b.auth.ids = sum[:]
}

// resultMsgID is the message id under which this bus publishes a result whose id would be
// base, when it records without reading the record (PublishResult): base and a MAC of it under
// a key derived from the seal key, the same for every try of the write, and unknowable in
// advance to whoever does not hold the key — so no one can take it first, which would make the
// stream drop the result as a duplicate. Without a seal key, base.
func (b *Bus) resultMsgID(base string) string {
	if b.auth.ids == nil {
		return base
	}
	mac := hmac.New(sha256.New, b.auth.ids)
	mac.Write([]byte(base))
	return protocol.Shorten(base, 200) + "~" + hex.EncodeToString(mac.Sum(nil)[:8])
}

// TrustResults makes this bus take a recorded result for its call only when a key of keys
// trusted for the call's tool sealed it: anything else on the call's subject is as good as
// nothing (a writer records after it; a reader looks past it). Call it before the bus is used;
// nil or empty keys take every result, as a bus without sealing does.
func (b *Bus) TrustResults(keys protocol.ResultKeys) {
	if len(keys) == 0 {
		keys = nil
	}
	b.auth.keys = keys
}

// ResultKeys returns the keys trusted to seal results (nil: results are not checked).
func (b *Bus) ResultKeys() protocol.ResultKeys { return b.auth.keys }

// VerifyResult checks m, a recorded result carrying res, against the trusted keys for tool, the
// tool of its call ("" when not known: the result's own name is checked). Without trusted keys
// every result passes.
func (b *Bus) VerifyResult(m *protocol.Message, res *protocol.ToolResult, tool string) error {
	if b.auth.keys == nil {
		return nil
	}
	return b.auth.keys.VerifyResult(m, res, tool)
}

// sealResult seals m when this bus seals results.
func (b *Bus) sealResult(m *protocol.Message) {
	if b.auth.seal != nil {
		m.SealResult(b.auth.seal, b.auth.sealID)
	}
}

// toolsOf tells the tool of each call of a request (from its plan), read once on first need.
type toolsOf struct {
	b         *Bus
	requestID string
	names     map[string]string
	read      bool
	err       error
}

// tool returns the tool of call callID: "" when the plan does not say (no plan, an earlier
// version's plan without names), then the result's own name is checked.
func (t *toolsOf) tool(ctx context.Context, callID string) (string, error) {
	if t.names != nil {
		return t.names[callID], nil
	}
	if !t.read {
		t.read = true
		p, err := t.b.Plan(ctx, t.requestID)
		switch {
		case err == nil && len(p.Names) == len(p.CallIDs):
			t.names = make(map[string]string, len(p.CallIDs))
			for i, id := range p.CallIDs {
				t.names[id] = p.Names[i]
			}
			return t.names[callID], nil
		case err == nil || errors.Is(err, ErrNotFound) || IsPermanent(err):
		default:
			t.err = fmt.Errorf("bus: read the plan of %s to check its results: %w", t.requestID, err)
		}
	}
	return "", t.err
}

// namesOf is a toolsOf that knows the names already (callIDs[i] is a call of names[i]); nil or
// mismatched names read the plan when needed.
func (b *Bus) namesOf(requestID string, callIDs, names []string) *toolsOf {
	t := &toolsOf{b: b, requestID: requestID}
	if len(names) == len(callIDs) && len(names) > 0 {
		t.names = make(map[string]string, len(names))
		for i, id := range callIDs {
			t.names[id] = names[i]
		}
	}
	return t
}
