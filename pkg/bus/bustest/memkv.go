package bustest

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// MemKV is an in-memory key-value bucket for unit tests of code that uses a few methods of
// jetstream.KeyValue: Get, Put, Create, Update and Delete behave as a bucket with History 1
// does (revisions grow across the bucket, Create fails with jetstream.ErrKeyExists, Update on
// a stale revision with jetstream.ErrKeyRevisionMismatch, Get of a missing or deleted key
// with jetstream.ErrKeyNotFound). Err, when set, makes every call fail with it (the bus is
// unreachable). Other methods of the interface panic. It is safe for concurrent use.
type MemKV struct {
	jetstream.KeyValue // nil: the methods MemKV does not implement panic

	mu   sync.Mutex
	rev  uint64
	data map[string]memEntry
	// Err, when set, is returned by every call.
	Err error
	// Calls counts calls by method name ("Get", "Create", …).
	Calls map[string]int
}

type memEntry struct {
	value   []byte
	rev     uint64
	created time.Time
}

// NewMemKV returns an empty bucket.
func NewMemKV() *MemKV { return &MemKV{data: map[string]memEntry{}, Calls: map[string]int{}} }

func (m *MemKV) enter(method string) error {
	m.Calls[method]++
	return m.Err
}

// Get returns the key's entry.
func (m *MemKV) Get(_ context.Context, key string) (jetstream.KeyValueEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("Get"); err != nil {
		return nil, err
	}
	e, ok := m.data[key]
	if !ok {
		return nil, jetstream.ErrKeyNotFound
	}
	return &memKVEntry{key: key, e: e}, nil
}

// Put writes value whatever the key holds.
func (m *MemKV) Put(_ context.Context, key string, value []byte) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("Put"); err != nil {
		return 0, err
	}
	return m.write(key, value), nil
}

// Create writes value if the key holds nothing.
func (m *MemKV) Create(_ context.Context, key string, value []byte, _ ...jetstream.KVCreateOpt) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("Create"); err != nil {
		return 0, err
	}
	if _, ok := m.data[key]; ok {
		return 0, jetstream.ErrKeyExists
	}
	return m.write(key, value), nil
}

// Update writes value if the key is at revision.
func (m *MemKV) Update(_ context.Context, key string, value []byte, revision uint64) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("Update"); err != nil {
		return 0, err
	}
	if e, ok := m.data[key]; !ok || e.rev != revision {
		return 0, jetstream.ErrKeyRevisionMismatch
	}
	return m.write(key, value), nil
}

// Delete removes the key (with jetstream.LastRevision honoured only as "it must exist").
func (m *MemKV) Delete(_ context.Context, key string, _ ...jetstream.KVDeleteOpt) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("Delete"); err != nil {
		return err
	}
	delete(m.data, key)
	return nil
}

// Keys lists the keys held, in no order.
func (m *MemKV) Keys() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.data))
	for k := range m.data {
		out = append(out, k)
	}
	return out
}

// Value returns what key holds, or nil.
func (m *MemKV) Value(key string) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.data[key].value
}

func (m *MemKV) write(key string, value []byte) uint64 {
	m.rev++
	m.data[key] = memEntry{value: append([]byte(nil), value...), rev: m.rev, created: time.Now()}
	return m.rev
}

type memKVEntry struct {
	key string
	e   memEntry
}

func (e *memKVEntry) Bucket() string                  { return "mem" }
func (e *memKVEntry) Key() string                     { return e.key }
func (e *memKVEntry) Value() []byte                   { return e.e.value }
func (e *memKVEntry) Revision() uint64                { return e.e.rev }
func (e *memKVEntry) Created() time.Time              { return e.e.created }
func (e *memKVEntry) Delta() uint64                   { return 0 }
func (e *memKVEntry) Operation() jetstream.KeyValueOp { return jetstream.KeyValuePut }

// ErrUnreachable is an error to set as MemKV.Err: the bus does not answer.
var ErrUnreachable = errors.New("bustest: the bus is unreachable")
