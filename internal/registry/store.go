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
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/contract"
)

// maxRecordBytes bounds a stored record.
const maxRecordBytes = contract.MaxRecordBytes

// Record is what the bucket keeps per registration (contract.Record).
type Record = contract.Record

// Entry is a record with its revision in the bucket.
type Entry struct {
	Record
	Revision uint64 `json:"revision"`
}

// decodeRecord reads a stored record, refusing what is not one for name.
func decodeRecord(name string, data []byte) (*Record, error) {
	return contract.DecodeRecord(name, data)
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
// (then nothing is written and changed is false). c must have come from Parse or passed
// contract.Compile. source is the contract as written (may be nil). What the bucket holds for
// the tool that is no record (damaged) is written over: registering is how it is repaired.
func (s *Store) Register(ctx context.Context, c *contract.Contract, source []byte, by string) (e *Entry, changed bool, err error) {
	return s.RegisterTried(ctx, c, source, by, nil)
}

// RegisterTried is Register, keeping with the new version what the sandbox said of it
// (report, as JSON; nil: it was not tried).
func (s *Store) RegisterTried(ctx context.Context, c *contract.Contract, source []byte, by string, report json.RawMessage) (e *Entry, changed bool, err error) {
	if _, err := contract.Compile(c, 0, 0); err != nil {
		return nil, false, err
	}
	if err := s.checkPrecedence(ctx, c); err != nil {
		return nil, false, err
	}
	for range 8 {
		head, err := s.head(ctx, c.Name)
		if err != nil {
			return nil, false, err
		}
		if cur := head.rec; cur != nil && !cur.Removed && same(&cur.Contract, c) {
			return &Entry{Record: *cur, Revision: head.rev}, false, nil
		}
		version, err := s.next(ctx, c.Name, head)
		if err != nil {
			return nil, false, err
		}
		rec := Record{Contract: *c, Version: version, RegisteredAt: s.now().UTC(), By: by, Source: string(source), Sandbox: report}
		e, err := s.write(ctx, head, rec)
		if errors.Is(err, errChanged) {
			continue // written by someone else meanwhile: look again
		}
		return e, err == nil, err
	}
	return nil, false, fmt.Errorf("registry: register %s: it keeps changing; try again", c.Name)
}

// checkPrecedence refuses c when its precedence, with the other registered contracts', makes a
// cycle (no order would satisfy them all).
func (s *Store) checkPrecedence(ctx context.Context, c *contract.Contract) error {
	if c.Precedence == nil {
		return nil // no edge of its own: replacing a contract by it removes cycles, never makes one
	}
	entries, _, err := s.List(ctx)
	if err != nil {
		return err
	}
	all := []*contract.Contract{c}
	for _, e := range entries {
		if e.Contract.Name != c.Name && !e.Removed {
			all = append(all, &e.Contract)
		}
	}
	if cyc := contract.PrecedenceCycle(all); cyc != nil {
		return &contract.Error{Field: "precedence", Reason: "makes a precedence cycle with the registered contracts: " + strings.Join(cyc, " before ")}
	}
	return nil
}

// Registered returns the tool's current entry when it says what c says (registering c would
// change nothing), nil otherwise; the version c would get is next.
func (s *Store) Registered(ctx context.Context, c *contract.Contract) (e *Entry, next int, err error) {
	head, err := s.head(ctx, c.Name)
	if err != nil {
		return nil, 0, err
	}
	if cur := head.rec; cur != nil && !cur.Removed && same(&cur.Contract, c) {
		return &Entry{Record: *cur, Revision: head.rev}, cur.Version, nil
	}
	next, err = s.next(ctx, c.Name, head)
	return nil, next, err
}

// Remove ends the tool's contract: a removal is recorded as a version of its own, so the
// history says who removed it and when. ErrNotFound when it has none. A damaged record is
// removed as a contract would be.
func (s *Store) Remove(ctx context.Context, name, by string) (*Entry, error) {
	for range 8 {
		head, err := s.head(ctx, name)
		if err != nil {
			return nil, err
		}
		if head.rev == 0 || head.rec != nil && head.rec.Removed {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
		}
		version, err := s.next(ctx, name, head)
		if err != nil {
			return nil, err
		}
		e, err := s.write(ctx, head, Record{Contract: contract.Contract{Name: name}, Version: version, RegisteredAt: s.now().UTC(), By: by, Removed: true})
		if errors.Is(err, errChanged) {
			continue
		}
		return e, err
	}
	return nil, fmt.Errorf("registry: remove %s: it keeps changing; try again", name)
}

// errChanged: the key changed between reading its head and writing over it.
var errChanged = errors.New("registry: changed meanwhile")

// ErrTooLarge: a contract too large to keep (its source and its form as read, together).
var ErrTooLarge = errors.New("registry: too large")

// ErrFull: the bucket holds as much as it may; nothing more is registered.
var ErrFull = errors.New("registry: the contracts' bucket is full")

// write records rec over head (created when the key holds nothing).
func (s *Store) write(ctx context.Context, head head, rec Record) (*Entry, error) {
	name := rec.Contract.Name
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	if len(data) > maxRecordBytes {
		return nil, fmt.Errorf("%w: the contract of %s takes %d bytes to keep; at most %d", ErrTooLarge, name, len(data), maxRecordBytes)
	}
	var rev uint64
	if head.rev == 0 {
		rev, err = s.kv.Create(ctx, name, data)
	} else {
		rev, err = s.kv.Update(ctx, name, data, head.rev)
	}
	switch {
	case err == nil:
		return &Entry{Record: rec, Revision: rev}, nil
	case errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return nil, errChanged
	case strings.Contains(err.Error(), "maximum bytes exceeded"):
		return nil, fmt.Errorf("%w (%s): remove tools no longer used, or give the bucket more room", ErrFull, name)
	}
	return nil, fmt.Errorf("registry: write %s: %w", name, err)
}

// head is what the bucket holds last for a tool: its record (nil when there is none, or it
// is no record: damaged, or a delete from outside the registry) and its revision (0 when the
// key never held anything).
type head struct {
	rec *Record
	rev uint64
}

func (s *Store) head(ctx context.Context, name string) (head, error) {
	e, err := s.kv.Get(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		// Never written, or deleted or purged outside the registry (a removal is a record):
		// the marker's revision is what a repair writes over.
		all, herr := s.kv.History(ctx, name)
		switch {
		case errors.Is(herr, jetstream.ErrKeyNotFound):
			return head{}, nil
		case herr != nil:
			return head{}, fmt.Errorf("registry: read %s: %w", name, herr)
		}
		return head{rev: all[len(all)-1].Revision()}, nil
	case err != nil:
		return head{}, fmt.Errorf("registry: read %s: %w", name, err)
	}
	h := head{rev: e.Revision()}
	if rec, err := decodeRecord(name, e.Value()); err == nil {
		h.rec = rec
	}
	return h, nil
}

// next is the version the next write over h takes: after every version the bucket keeps,
// whatever became of the key since.
func (s *Store) next(ctx context.Context, name string, h head) (int, error) {
	if h.rec != nil {
		return h.rec.Version + 1, nil
	}
	if h.rev == 0 {
		return 1, nil
	}
	all, err := s.History(ctx, name)
	if errors.Is(err, ErrNotFound) {
		return 1, nil
	}
	if err != nil {
		return 0, err
	}
	last := 0
	for _, e := range all {
		last = max(last, e.Version)
	}
	return last + 1, nil
}

// current returns the tool's last record (a removal included) and its revision; nil and 0 when
// it has none. A damaged record is an error.
func (s *Store) current(ctx context.Context, name string) (*Record, uint64, error) {
	h, err := s.head(ctx, name)
	switch {
	case err != nil:
		return nil, 0, err
	case h.rev != 0 && h.rec == nil:
		return nil, 0, fmt.Errorf("%w: %s (revision %d): register the tool again to repair it", ErrDamaged, name, h.rev)
	}
	return h.rec, h.rev, nil
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
	keys, err := s.kv.ListKeysFiltered(ctx, toolKeys)
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

// toolKeys matches the keys of tools' contracts in the bucket: one token each, leaving out the
// candidates the sandbox tries (protocol.SandboxKey).
const toolKeys = "*"

// same reports whether two contracts say the same (as JSON: the form written is part of it).
func same(a, b *contract.Contract) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}
