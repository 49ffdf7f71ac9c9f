package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
)

// Memory event operations (MemoryEvent.Op).
const (
	// MemoryWritten: a new fragment; MemoryReplaced: a key's new value.
	MemoryWritten  = "written"
	MemoryReplaced = "replaced"
	// MemoryDeleted: forgotten by its owner (or an admin); MemoryExpired: its lifespan ended;
	// MemoryEvicted: dropped for room, the least relevant.
	MemoryDeleted = "deleted"
	MemoryExpired = "expired"
	MemoryEvicted = "evicted"
	// MemoryArchived: the context of an intent whose lifetime lapsed (its domain's decay):
	// kept here, on the record, and no longer given to a model.
	MemoryArchived = "archived"
	// MemoryUsed: given to a model in a turn (not recorded on its own: the turn's decision
	// names what it was given).
	MemoryUsed = "used"
)

// EventMemory is the event kind of memory.v1 messages: what happened to a fragment of what
// Hermes remembers about a user, on the user's memory session.
const EventMemory = "memory"

// Memory event bounds.
const (
	MaxMemoryKeyBytes   = 128
	MaxMemoryValueBytes = 4096
	MaxMemoryTags       = 16
	maxMemoryText       = 256
)

// MemoryEvent is the payload of a memory message: one change of one fragment. Its value is
// recorded on writes and replacements, so the record holds the key's history.
type MemoryEvent struct {
	Op string `msgpack:"op" json:"op"`
	// Session is the session a session fragment belongs to; empty for the owner's.
	Session  string   `msgpack:"session_id,omitempty" json:"session_id,omitempty"`
	Type     string   `msgpack:"type" json:"type"`
	Key      string   `msgpack:"key" json:"key"`
	Value    []byte   `msgpack:"value,omitempty" json:"value,omitempty"`
	Lifespan string   `msgpack:"lifespan,omitempty" json:"lifespan,omitempty"`
	Tags     []string `msgpack:"semantic_tag,omitempty" json:"semantic_tag,omitempty"`
	// Source says who wrote it: api, model or rule.
	Source string `msgpack:"source,omitempty" json:"source,omitempty"`
	// Domain is the business domain of the intent a session fragment belongs to.
	Domain  string `msgpack:"domain,omitempty" json:"domain,omitempty"`
	Version int    `msgpack:"version,omitempty" json:"version,omitempty"`
	Reason  string `msgpack:"reason,omitempty" json:"reason,omitempty"`
	// At is when the change was made, by the memory store's clock.
	At time.Time `msgpack:"at" json:"at"`
}

// MsgIDMemory is the message id of a memory event: one change of one key (its operation,
// version and time) is recorded once, however often its publication is tried.
func MsgIDMemory(ownerToken string, ev *MemoryEvent) string {
	return "memory:" + ownerToken + ":" + ev.Op + ":" + shortHash(ev.Session+"\x00"+ev.Key) + ":" + strconv.Itoa(ev.Version) + ":" + strconv.FormatInt(ev.At.UnixNano(), 10)
}

// DecodeMemory reads the memory payload of m.
func (m *Message) DecodeMemory() (*MemoryEvent, error) {
	var e MemoryEvent
	if err := m.decodePayload(TypeMemory, &e); err != nil {
		return nil, err
	}
	switch e.Op {
	case MemoryWritten, MemoryReplaced, MemoryDeleted, MemoryExpired, MemoryEvicted, MemoryArchived, MemoryUsed:
	default:
		return nil, fieldErr("op", "is not a memory operation")
	}
	if e.Session != "" {
		if err := CheckID("session_id", e.Session); err != nil {
			return nil, err
		}
	}
	for field, s := range map[string]string{"key": e.Key, "type": e.Type} {
		if s == "" || len(s) > MaxMemoryKeyBytes || !utf8.ValidString(s) || !Printable(s) {
			return nil, fieldErr(field, fmt.Sprintf("must be 1 to %d printable bytes", MaxMemoryKeyBytes))
		}
	}
	if len(e.Value) > MaxMemoryValueBytes || len(e.Value) > 0 && !json.Valid(e.Value) {
		return nil, fieldErr("value", fmt.Sprintf("must be JSON of at most %d bytes", MaxMemoryValueBytes))
	}
	if len(e.Tags) > MaxMemoryTags || e.Version < 0 {
		return nil, fieldErr("semantic_tag", "out of bounds")
	}
	for _, s := range append([]string{e.Lifespan, e.Source, e.Domain, e.Reason}, e.Tags...) {
		if len(s) > maxMemoryText || !utf8.ValidString(s) || !Printable(s) {
			return nil, fieldErr("reason", fmt.Sprintf("must be at most %d printable bytes", maxMemoryText))
		}
	}
	return &e, nil
}

// shortHash is 16 hex digits of s's SHA-256: a bounded, subject-safe stand-in for text.
func shortHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:8])
}
