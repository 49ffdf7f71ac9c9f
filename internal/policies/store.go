// Package policies keeps and decides tools' policies (package pkg/policy says what one is): the
// policies applied through the API, versioned in the bus's hermes-policies bucket (Store) and
// followed live by every router and gateway (Book); the rate limits' windows, shared by every
// router through hermes-ratelimits (Windows); and the router's policy stage (Stage), which
// decides every call, whatever door it came through.
package policies

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Record is what the policies' bucket keeps per apply of a tool's policy.
type Record struct {
	Tool string `json:"tool"`
	// Policy is the tool's policy from this version on; nil on a removal.
	Policy *policy.Policy `json:"policy,omitempty"`
	// Version numbers the tool's applies from 1, removals included.
	Version   int       `json:"version"`
	AppliedAt time.Time `json:"applied_at"`
	// By names who applied (or removed) it: the caller as the gateway knew it.
	By string `json:"by"`
	// Removed marks a removal: the tool has no applied policy from this version on (its
	// contract's policy block, if any, stands again).
	Removed bool `json:"removed,omitempty"`
}

// Entry is a record with its revision in the bucket.
type Entry struct {
	Record
	Revision uint64 `json:"revision"`
}

// maxRecordBytes bounds a stored record.
const maxRecordBytes = 64 << 10

// decodeRecord reads a stored record of tool, refusing what is not one.
func decodeRecord(tool string, data []byte) (*Record, error) {
	if len(data) > maxRecordBytes {
		return nil, fmt.Errorf("policy: the record of %s is %d bytes", tool, len(data))
	}
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("policy: the record of %s: %w", tool, err)
	}
	switch {
	case r.Tool != tool || r.Version < 1:
		return nil, fmt.Errorf("policy: the record kept under %s is not its own", tool)
	case !r.Removed && r.Policy == nil:
		return nil, fmt.Errorf("policy: the record of %s holds no policy", tool)
	case r.Policy != nil:
		if err := r.Policy.Check("policy"); err != nil {
			return nil, fmt.Errorf("policy: the record of %s: %w", tool, err)
		}
	}
	return &r, nil
}

// Errors of the store.
var (
	// ErrNotFound: the tool has no applied policy (never had, or it was removed).
	ErrNotFound = errors.New("policy: no such policy")
	// ErrFull: the bucket holds as much as it may.
	ErrFull = errors.New("policy: the policies' bucket is full")
)

// errChanged: the key was written by someone else between the read and the write.
var errChanged = errors.New("policy: changed meanwhile")

// Store reads and writes applied policies. It is safe for concurrent use.
type Store struct {
	kv  jetstream.KeyValue
	now func() time.Time
}

// NewStore returns the store kept in kv (the bus's PoliciesBucket).
func NewStore(kv jetstream.KeyValue) *Store { return &Store{kv: kv, now: time.Now} }

// Apply makes p the tool's policy, as a new version, unless it is already the current one
// (then nothing is written and changed is false). p must have passed Check.
func (s *Store) Apply(ctx context.Context, tool string, p *policy.Policy, by string) (e *Entry, changed bool, err error) {
	if err := protocol.CheckToolName("tool", tool); err != nil {
		return nil, false, err
	}
	if err := p.Check("policy"); err != nil {
		return nil, false, err
	}
	for range 8 {
		cur, rev, last, err := s.head(ctx, tool)
		if err != nil {
			return nil, false, err
		}
		if cur != nil && !cur.Removed && reflect.DeepEqual(cur.Policy, p) {
			return &Entry{Record: *cur, Revision: rev}, false, nil
		}
		e, err := s.write(ctx, rev, Record{Tool: tool, Policy: p, Version: last + 1, AppliedAt: s.now().UTC(), By: by})
		if errors.Is(err, errChanged) {
			continue
		}
		return e, err == nil, err
	}
	return nil, false, fmt.Errorf("policy: apply %s: it keeps changing; try again", tool)
}

// Remove ends the tool's applied policy, as a version of its own. ErrNotFound when it has none.
func (s *Store) Remove(ctx context.Context, tool, by string) (*Entry, error) {
	for range 8 {
		cur, rev, last, err := s.head(ctx, tool)
		if err != nil {
			return nil, err
		}
		if cur == nil || cur.Removed {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, tool)
		}
		e, err := s.write(ctx, rev, Record{Tool: tool, Version: last + 1, AppliedAt: s.now().UTC(), By: by, Removed: true})
		if errors.Is(err, errChanged) {
			continue
		}
		return e, err
	}
	return nil, fmt.Errorf("policy: remove %s: it keeps changing; try again", tool)
}

// write records rec over revision rev (created when the key never held anything).
func (s *Store) write(ctx context.Context, rev uint64, rec Record) (*Entry, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	if len(data) > maxRecordBytes {
		return nil, fmt.Errorf("policy: the policy of %s takes %d bytes to keep; at most %d", rec.Tool, len(data), maxRecordBytes)
	}
	if rev == 0 {
		rev, err = s.kv.Create(ctx, rec.Tool, data)
	} else {
		rev, err = s.kv.Update(ctx, rec.Tool, data, rev)
	}
	switch {
	case err == nil:
		return &Entry{Record: rec, Revision: rev}, nil
	case errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return nil, errChanged
	case strings.Contains(err.Error(), "maximum bytes exceeded"):
		return nil, fmt.Errorf("%w (%s): remove policies no longer used", ErrFull, rec.Tool)
	}
	return nil, fmt.Errorf("policy: write %s: %w", rec.Tool, err)
}

// head is what the bucket holds last for tool: its record (nil when none, or when what is kept
// is no record), its revision (0 when the key never held anything), and the last version the
// bucket still keeps (0 for none).
func (s *Store) head(ctx context.Context, tool string) (*Record, uint64, int, error) {
	all, err := s.kv.History(ctx, tool)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, 0, nil
	}
	if err != nil {
		return nil, 0, 0, fmt.Errorf("policy: read %s: %w", tool, err)
	}
	last := 0
	for _, e := range all {
		if rec, err := decodeRecord(tool, e.Value()); err == nil {
			last = max(last, rec.Version)
		}
	}
	top := all[len(all)-1]
	rec, err := decodeRecord(tool, top.Value())
	if err != nil || top.Operation() != jetstream.KeyValuePut {
		rec = nil
	}
	return rec, top.Revision(), last, nil
}

// Get returns the tool's current applied policy; ErrNotFound when it has none.
func (s *Store) Get(ctx context.Context, tool string) (*Entry, error) {
	e, err := s.kv.Get(ctx, tool)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, tool)
	}
	if err != nil {
		return nil, fmt.Errorf("policy: read %s: %w", tool, err)
	}
	rec, err := decodeRecord(tool, e.Value())
	if err != nil {
		return nil, err
	}
	if rec.Removed {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, tool)
	}
	return &Entry{Record: *rec, Revision: e.Revision()}, nil
}

// History returns every version the bucket still holds of the tool's policy, oldest first
// (removals included); ErrNotFound when there is none.
func (s *Store) History(ctx context.Context, tool string) ([]*Entry, error) {
	all, err := s.kv.History(ctx, tool)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, tool)
	}
	if err != nil {
		return nil, fmt.Errorf("policy: read the history of %s: %w", tool, err)
	}
	var out []*Entry
	for _, e := range all {
		if rec, err := decodeRecord(tool, e.Value()); err == nil && e.Operation() == jetstream.KeyValuePut {
			out = append(out, &Entry{Record: *rec, Revision: e.Revision()})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, tool)
	}
	return out, nil
}

// List returns every tool's current applied policy, by tool.
func (s *Store) List(ctx context.Context) ([]*Entry, error) {
	keys, err := s.kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("policy: list: %w", err)
	}
	var tools []string
	for k := range keys.Keys() {
		tools = append(tools, k)
	}
	slices.Sort(tools)
	var out []*Entry
	for _, t := range tools {
		e, err := s.Get(ctx, t)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil && ctx.Err() != nil:
			return nil, err
		case err != nil:
			// Not a record Hermes wrote: left out (Book refuses the tool's calls meanwhile).
		default:
			out = append(out, e)
		}
	}
	return out, nil
}
