// Package registry keeps tools' contracts in the bucket hermes-contracts (bus.BucketContracts):
// one key per tool, each registration a new revision, so every version stays readable while
// the bucket's history holds it (bus.ContractHistory). Store writes and reads it (the gateway's
// /api/v1/tools, hermes up); Live follows it, so routers and workers see a change as soon as it
// is written, with no restart.
package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/contract"
)

// maxRecordBytes bounds a stored record: a contract as written twice (the source and the
// normalized form) and some.
const maxRecordBytes = 2*contract.MaxSourceBytes + 64<<10

// Record is what the bucket keeps per registration.
type Record struct {
	Contract contract.Contract `json:"contract"`
	// Version numbers the tool's registrations from 1, removals included.
	Version      int       `json:"version"`
	RegisteredAt time.Time `json:"registered_at"`
	// By names who registered (or removed) it: the caller as the gateway knew it.
	By string `json:"by"`
	// Source is the contract as written, when it came as text.
	Source string `json:"source,omitempty"`
	// Removed marks a removal: the tool has no contract from this version on.
	Removed bool `json:"removed,omitempty"`
}

// Entry is a record with its revision in the bucket.
type Entry struct {
	Record
	Revision uint64 `json:"revision"`
}

// errBadRecord is wrapped by decodeRecord's errors.
var errBadRecord = errors.New("registry: not a contract record")

// decodeRecord reads a stored record, refusing what is not one for name.
func decodeRecord(name string, data []byte) (*Record, error) {
	if len(data) > maxRecordBytes {
		return nil, fmt.Errorf("%w: %s: %d bytes", errBadRecord, name, len(data))
	}
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", errBadRecord, name, err)
	}
	if r.Contract.Name != name || r.Version < 1 {
		return nil, fmt.Errorf("%w: %s: not this tool's", errBadRecord, name)
	}
	return &r, nil
}

// ErrNotFound: the tool has no contract (never had, or it was removed).
var ErrNotFound = errors.New("registry: no such contract")

// Store reads and writes contracts. It is safe for concurrent use.
type Store struct {
	kv  jetstream.KeyValue
	now func() time.Time
}

// NewStore returns the store kept in kv (bus.Bus.Contracts).
func NewStore(kv jetstream.KeyValue) *Store { return &Store{kv: kv, now: time.Now} }

// Register makes c the tool's contract, as a new version, unless it is already the current one
// (then nothing is written and changed is false). c must have come from contract.Parse or
// passed contract.Compile. source is the contract as written (may be nil).
func (s *Store) Register(ctx context.Context, c *contract.Contract, source []byte, by string) (e *Entry, changed bool, err error) {
	if _, err := contract.Compile(c, 0, 0); err != nil {
		return nil, false, err
	}
	for range 8 {
		cur, rev, err := s.current(ctx, c.Name)
		if err != nil {
			return nil, false, err
		}
		if cur != nil && !cur.Removed && same(&cur.Contract, c) {
			return &Entry{Record: *cur, Revision: rev}, false, nil
		}
		version := 1
		if cur != nil {
			version = cur.Version + 1
		}
		rec := Record{Contract: *c, Version: version, RegisteredAt: s.now().UTC(), By: by, Source: string(source)}
		data, err := json.Marshal(rec)
		if err != nil {
			return nil, false, err
		}
		if len(data) > maxRecordBytes {
			return nil, false, fmt.Errorf("registry: the contract of %s takes %d bytes to keep; at most %d", c.Name, len(data), maxRecordBytes)
		}
		var newRev uint64
		if rev == 0 {
			newRev, err = s.kv.Create(ctx, c.Name, data)
		} else {
			newRev, err = s.kv.Update(ctx, c.Name, data, rev)
		}
		if err == nil {
			return &Entry{Record: rec, Revision: newRev}, true, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return nil, false, fmt.Errorf("registry: register %s: %w", c.Name, err)
		}
		// Registered by someone else meanwhile: look again.
	}
	return nil, false, fmt.Errorf("registry: register %s: it keeps changing; try again", c.Name)
}

// Remove ends the tool's contract: a removal is recorded as a version of its own, so the
// history says who removed it and when. ErrNotFound when it has none.
func (s *Store) Remove(ctx context.Context, name, by string) (*Entry, error) {
	for range 8 {
		cur, rev, err := s.current(ctx, name)
		if err != nil {
			return nil, err
		}
		if cur == nil || cur.Removed {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
		}
		rec := Record{Contract: contract.Contract{Name: name}, Version: cur.Version + 1, RegisteredAt: s.now().UTC(), By: by, Removed: true}
		data, _ := json.Marshal(rec)
		newRev, err := s.kv.Update(ctx, name, data, rev)
		if err == nil {
			return &Entry{Record: rec, Revision: newRev}, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return nil, fmt.Errorf("registry: remove %s: %w", name, err)
		}
	}
	return nil, fmt.Errorf("registry: remove %s: it keeps changing; try again", name)
}

// current returns the tool's last record (a removal included) and its revision; nil and 0 when
// it has none. A damaged record is an error: nothing is written over what cannot be read.
func (s *Store) current(ctx context.Context, name string) (*Record, uint64, error) {
	e, err := s.kv.Get(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, 0, nil
	case err != nil:
		return nil, 0, fmt.Errorf("registry: read %s: %w", name, err)
	}
	rec, err := decodeRecord(name, e.Value())
	if err != nil {
		return nil, 0, err
	}
	return rec, e.Revision(), nil
}

// Get returns the tool's current contract; ErrNotFound when it has none.
func (s *Store) Get(ctx context.Context, name string) (*Entry, error) {
	rec, rev, err := s.current(ctx, name)
	if err != nil {
		return nil, err
	}
	if rec == nil || rec.Removed {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	return &Entry{Record: *rec, Revision: rev}, nil
}

// At returns the version of the tool's contract at revision (what a call routed under it names).
func (s *Store) At(ctx context.Context, name string, revision uint64) (*Entry, error) {
	e, err := s.kv.GetRevision(ctx, name, revision)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("%w: %s at revision %d", ErrNotFound, name, revision)
	}
	if err != nil {
		return nil, fmt.Errorf("registry: read %s at revision %d: %w", name, revision, err)
	}
	rec, err := decodeRecord(name, e.Value())
	if err != nil {
		return nil, err
	}
	if rec.Removed {
		return nil, fmt.Errorf("%w: %s at revision %d is a removal", ErrNotFound, name, revision)
	}
	return &Entry{Record: *rec, Revision: e.Revision()}, nil
}

// History returns every version the bucket still holds of the tool's contract, oldest first
// (removals included); ErrNotFound when there is none.
func (s *Store) History(ctx context.Context, name string) ([]*Entry, error) {
	all, err := s.kv.History(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return nil, fmt.Errorf("registry: read the history of %s: %w", name, err)
	}
	var out []*Entry
	for _, e := range all {
		if e.Operation() != jetstream.KeyValuePut {
			continue
		}
		rec, err := decodeRecord(name, e.Value())
		if err != nil {
			continue // damaged: not a version anyone registered
		}
		out = append(out, &Entry{Record: *rec, Revision: e.Revision()})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	return out, nil
}

// List returns every tool's current contract, by name. Damaged records are left out and
// reported in damaged.
func (s *Store) List(ctx context.Context) (entries []*Entry, damaged []string, err error) {
	keys, err := s.kv.ListKeys(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("registry: list: %w", err)
	}
	var names []string
	for k := range keys.Keys() {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, name := range names {
		e, err := s.Get(ctx, name)
		switch {
		case errors.Is(err, ErrNotFound):
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil && ctx.Err() != nil:
			return nil, nil, err
		case err != nil:
			damaged = append(damaged, name)
		default:
			entries = append(entries, e)
		}
	}
	return entries, damaged, nil
}

// same reports whether two contracts say the same (as JSON: the form written is part of it).
func same(a, b *contract.Contract) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}
