// Package versioned keeps named documents in a key-value bucket of the bus, each apply a new
// version: the current one read by one get, earlier ones by the key's history (as many as the
// bucket keeps), a removal a version of its own. Writes are compare-and-set, so concurrent
// applies from several gateways each land as a version of their own or not at all.
package versioned

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
)

// Record is what the bucket keeps per apply.
type Record struct {
	Name string `json:"name"`
	// Doc is the document from this version on; empty on a removal.
	Doc json.RawMessage `json:"doc,omitempty"`
	// Version numbers the name's applies from 1, removals included.
	Version   int       `json:"version"`
	AppliedAt time.Time `json:"applied_at"`
	// By names who applied (or removed) it.
	By      string `json:"by"`
	Removed bool   `json:"removed,omitempty"`
}

// Entry is a record with its revision in the bucket.
type Entry struct {
	Record
	Revision uint64 `json:"revision"`
}

// Errors of the store.
var (
	// ErrNotFound: the name has no current document (never had, or it was removed).
	ErrNotFound = errors.New("not found")
	// ErrFull: the bucket holds as much as it may.
	ErrFull = errors.New("the bucket is full")
)

// errChanged: the key was written by someone else between the read and the write.
var errChanged = errors.New("changed meanwhile")

// Store reads and writes versioned documents. It is safe for concurrent use.
type Store struct {
	KV jetstream.KeyValue
	// What names a document in errors ("blueprint").
	What string
	// MaxBytes bounds a stored record (default 256 KiB).
	MaxBytes int
	// Check says whether doc is a document of name as stored; records that fail it are
	// left out, as if another program had written them.
	Check func(name string, doc json.RawMessage) error
	Now   func() time.Time
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Store) maxBytes() int {
	if s.MaxBytes > 0 {
		return s.MaxBytes
	}
	return 256 << 10
}

// decode reads a stored record of name, refusing what is not one.
func (s *Store) decode(name string, data []byte) (*Record, error) {
	if len(data) > s.maxBytes() {
		return nil, fmt.Errorf("%s: the record of %s is %d bytes", s.What, name, len(data))
	}
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: the record of %s: %w", s.What, name, err)
	}
	switch {
	case r.Name != name || r.Version < 1:
		return nil, fmt.Errorf("%s: the record kept under %s is not its own", s.What, name)
	case !r.Removed && len(r.Doc) == 0:
		return nil, fmt.Errorf("%s: the record of %s holds nothing", s.What, name)
	case !r.Removed && s.Check != nil:
		if err := s.Check(name, r.Doc); err != nil {
			return nil, fmt.Errorf("%s: the record of %s: %w", s.What, name, err)
		}
	}
	return &r, nil
}

// Apply makes doc the name's document, as a new version, unless it already is the current one
// (byte for byte: then nothing is written and changed is false). name must be a valid key.
func (s *Store) Apply(ctx context.Context, name string, doc json.RawMessage, by string) (e *Entry, changed bool, err error) {
	for range 8 {
		cur, rev, last, err := s.head(ctx, name)
		if err != nil {
			return nil, false, err
		}
		if cur != nil && !cur.Removed && bytes.Equal(cur.Doc, doc) {
			return &Entry{Record: *cur, Revision: rev}, false, nil
		}
		e, err := s.write(ctx, rev, Record{Name: name, Doc: doc, Version: last + 1, AppliedAt: s.now().UTC(), By: by})
		if errors.Is(err, errChanged) {
			continue
		}
		return e, err == nil, err
	}
	return nil, false, fmt.Errorf("%s: apply %s: it keeps changing; try again", s.What, name)
}

// Remove ends the name's document, as a version of its own. ErrNotFound when it has none.
func (s *Store) Remove(ctx context.Context, name, by string) (*Entry, error) {
	for range 8 {
		cur, rev, last, err := s.head(ctx, name)
		if err != nil {
			return nil, err
		}
		if cur == nil || cur.Removed {
			return nil, fmt.Errorf("%s %s: %w", s.What, name, ErrNotFound)
		}
		e, err := s.write(ctx, rev, Record{Name: name, Version: last + 1, AppliedAt: s.now().UTC(), By: by, Removed: true})
		if errors.Is(err, errChanged) {
			continue
		}
		return e, err
	}
	return nil, fmt.Errorf("%s: remove %s: it keeps changing; try again", s.What, name)
}

// write records rec over revision rev (created when the key never held anything).
func (s *Store) write(ctx context.Context, rev uint64, rec Record) (*Entry, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	if len(data) > s.maxBytes() {
		return nil, fmt.Errorf("%s: %s takes %d bytes to keep; at most %d", s.What, rec.Name, len(data), s.maxBytes())
	}
	if rev == 0 {
		rev, err = s.KV.Create(ctx, rec.Name, data)
	} else {
		rev, err = s.KV.Update(ctx, rec.Name, data, rev)
	}
	switch {
	case err == nil:
		return &Entry{Record: rec, Revision: rev}, nil
	case errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return nil, errChanged
	case strings.Contains(err.Error(), "maximum bytes exceeded"):
		return nil, fmt.Errorf("%w (%s %s): remove what is no longer used", ErrFull, s.What, rec.Name)
	}
	return nil, fmt.Errorf("%s: write %s: %w", s.What, rec.Name, err)
}

// head is what the bucket holds last for name: its record (nil when none, or when what is
// kept is no record), its revision (0 when the key never held anything), and the last version
// the bucket still keeps (0 for none).
func (s *Store) head(ctx context.Context, name string) (*Record, uint64, int, error) {
	all, err := s.KV.History(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, 0, nil
	}
	if err != nil {
		return nil, 0, 0, fmt.Errorf("%s: read %s: %w", s.What, name, err)
	}
	last := 0
	for _, e := range all {
		if rec, err := s.decode(name, e.Value()); err == nil {
			last = max(last, rec.Version)
		}
	}
	top := all[len(all)-1]
	rec, err := s.decode(name, top.Value())
	if err != nil || top.Operation() != jetstream.KeyValuePut {
		rec = nil
	}
	return rec, top.Revision(), last, nil
}

// Get returns the name's current document; ErrNotFound when it has none.
func (s *Store) Get(ctx context.Context, name string) (*Entry, error) {
	e, err := s.KV.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("%s %s: %w", s.What, name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: read %s: %w", s.What, name, err)
	}
	return s.entry(name, e)
}

// Decode reads a bucket entry of name (a watch's, say): ErrNotFound for a removal.
func (s *Store) entry(name string, e jetstream.KeyValueEntry) (*Entry, error) {
	if e.Operation() != jetstream.KeyValuePut {
		return nil, fmt.Errorf("%s %s: %w", s.What, name, ErrNotFound)
	}
	rec, err := s.decode(name, e.Value())
	if err != nil {
		return nil, err
	}
	if rec.Removed {
		return nil, fmt.Errorf("%s %s: %w", s.What, name, ErrNotFound)
	}
	return &Entry{Record: *rec, Revision: e.Revision()}, nil
}

// Decode reads an entry of the bucket (a watch's): ErrNotFound for a removal.
func (s *Store) Decode(e jetstream.KeyValueEntry) (*Entry, error) { return s.entry(e.Key(), e) }

// History returns every version the bucket still holds of name, oldest first (removals
// included); ErrNotFound when there is none.
func (s *Store) History(ctx context.Context, name string) ([]*Entry, error) {
	all, err := s.KV.History(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("%s %s: %w", s.What, name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: read the history of %s: %w", s.What, name, err)
	}
	var out []*Entry
	for _, e := range all {
		if rec, err := s.decode(name, e.Value()); err == nil && e.Operation() == jetstream.KeyValuePut {
			out = append(out, &Entry{Record: *rec, Revision: e.Revision()})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s %s: %w", s.What, name, ErrNotFound)
	}
	return out, nil
}

// Version returns version v of name, if the bucket still keeps it.
func (s *Store) Version(ctx context.Context, name string, v int) (*Entry, error) {
	all, err := s.History(ctx, name)
	if err != nil {
		return nil, err
	}
	for _, e := range all {
		if e.Version == v && !e.Removed {
			return e, nil
		}
	}
	return nil, fmt.Errorf("%s %s version %d: %w", s.What, name, v, ErrNotFound)
}

// List returns every name's current document, by name.
func (s *Store) List(ctx context.Context) ([]*Entry, error) {
	keys, err := s.KV.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: list: %w", s.What, err)
	}
	var names []string
	for k := range keys.Keys() {
		names = append(names, k)
	}
	slices.Sort(names)
	var out []*Entry
	for _, n := range names {
		e, err := s.Get(ctx, n)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil && ctx.Err() != nil:
			return nil, err
		case err != nil:
			// Not a record Hermes wrote: left out.
		default:
			out = append(out, e)
		}
	}
	return out, nil
}
