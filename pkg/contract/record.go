package contract

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// MaxRecordBytes bounds a stored registration: a contract as written twice (the source and
// the form as read) and some.
const MaxRecordBytes = 2*MaxSourceBytes + 64<<10

// Record is what the contracts' bucket (hermes-contracts) keeps per registration of a tool.
type Record struct {
	Contract Contract `json:"contract"`
	// Version numbers the tool's registrations from 1, removals included.
	Version      int       `json:"version"`
	RegisteredAt time.Time `json:"registered_at"`
	// By names who registered (or removed) it: the caller as the gateway knew it.
	By string `json:"by"`
	// Source is the contract as written, when it came as text.
	Source string `json:"source,omitempty"`
	// Removed marks a removal: the tool has no contract from this version on.
	Removed bool `json:"removed,omitempty"`
	// Sandbox is what the sandbox said of this version as it was registered (its report, as
	// JSON): the cases tried and what broke, or why none was.
	Sandbox json.RawMessage `json:"sandbox,omitempty"`
}

// ErrBadRecord is wrapped by DecodeRecord's errors.
var ErrBadRecord = errors.New("contract: not a contract record")

// DecodeRecord reads a stored registration of tool name, refusing what is not one.
func DecodeRecord(name string, data []byte) (*Record, error) {
	if len(data) > MaxRecordBytes {
		return nil, fmt.Errorf("%w: %s: %d bytes", ErrBadRecord, name, len(data))
	}
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadRecord, name, err)
	}
	if r.Contract.Name != name || r.Version < 1 {
		return nil, fmt.Errorf("%w: %s: not this tool's", ErrBadRecord, name)
	}
	return &r, nil
}

// Versions reads the versions of tools' contracts by revision from the contracts' bucket
// (bus.Bus.Contracts), compiled and remembered: what a worker checks answers against. It is
// safe for concurrent use.
type Versions struct {
	KV jetstream.KeyValue

	mu   sync.Mutex
	seen map[string]*Compiled // name@revision
}

// At returns the version of a tool's contract kept under key (the tool's name, or
// protocol.SandboxKey of it for a candidate the sandbox tries) at revision. An error wrapping
// ErrUnavailable says the bucket no longer holds it, or holds no contract there.
func (v *Versions) At(ctx context.Context, key string, revision uint64) (*Compiled, error) {
	tool := strings.TrimPrefix(key, protocol.SandboxKey(""))
	seenKey := fmt.Sprintf("%s@%d", key, revision)
	v.mu.Lock()
	if c := v.seen[seenKey]; c != nil {
		v.mu.Unlock()
		return c, nil
	}
	v.mu.Unlock()
	e, err := v.KV.GetRevision(ctx, key, revision)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("%w: %s at revision %d", ErrUnavailable, tool, revision)
	}
	if err != nil {
		return nil, fmt.Errorf("contract: read %s at revision %d: %w", tool, revision, err)
	}
	rec, err := DecodeRecord(tool, e.Value())
	if err != nil || rec.Removed {
		return nil, fmt.Errorf("%w: %s at revision %d holds no contract", ErrUnavailable, tool, revision)
	}
	c, err := Compile(&rec.Contract, rec.Version, e.Revision())
	if err != nil {
		return nil, fmt.Errorf("%w: %s version %d: %v", ErrUnavailable, tool, rec.Version, err)
	}
	v.mu.Lock()
	if v.seen == nil || len(v.seen) >= 256 {
		v.seen = map[string]*Compiled{}
	}
	v.seen[seenKey] = c
	v.mu.Unlock()
	return c, nil
}
