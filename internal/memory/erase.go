package memory

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Erasure is what Erase removed.
type Erasure struct {
	Owner string `json:"owner"`
	// Fragments were in the bucket; History were memory.v1 events on the record (every write,
	// replacement, deletion, eviction and archived intent context of the owner).
	Fragments int    `json:"fragments"`
	History   uint64 `json:"history_messages"`
	// Sessions are the owner's sessions purged from the record, and their messages.
	Sessions        []string `json:"sessions,omitempty"`
	SessionMessages uint64   `json:"session_messages,omitempty"`
}

// Erase removes everything kept about owner: its fragments (Forget), then what EraseRecord
// erases. It needs an operator's rights (hermes memory forget --nats).
func Erase(ctx context.Context, js jetstream.JetStream, s *Store, owner string, sessions []string) (Erasure, error) {
	n, err := s.Forget(ctx, owner)
	if err != nil {
		return Erasure{Owner: owner}, err
	}
	out, err := EraseRecord(ctx, js, owner, sessions)
	out.Fragments = n
	return out, err
}

// ErrRecordChanging is returned by EraseRecord while the record's streams are being changed
// (hermes provision --streams): the erasure is to be tried again once the change is over.
var ErrRecordChanging = errors.New("memory: erase: the record's streams are being changed; the erasure is tried again when the change is over")

// EraseRecord removes from the record what is kept there about owner: its memory history (its
// HistorySession: the values it ever had, its archived intents' contexts), and, given
// sessions, every message of those sessions. The record is Hermes' proof of what happened, so
// no service but the eraser may purge it (an operator's rights, or the eraser role's: package
// erasure), and a caller's DELETE /v1/memory asks the eraser for it. Erasing again what is
// erased finds nothing: it may be repeated.
func EraseRecord(ctx context.Context, js jetstream.JetStream, owner string, sessions []string) (Erasure, error) {
	out := Erasure{Owner: owner}
	first, err := js.Stream(ctx, protocol.StreamName)
	if err != nil {
		return out, fmt.Errorf("memory: erase: the record: %w", err)
	}
	// While the record's streams change, a session's messages are being copied from one
	// stream to another: an erasure then would miss the copies still to come. It waits for the
	// change to end (the eraser tries again later).
	layouts, err := bus.RecordLayouts(first.CachedInfo().Config)
	if err != nil {
		return out, fmt.Errorf("memory: erase: %w", err)
	}
	if len(layouts) > 1 {
		return out, ErrRecordChanging
	}
	// purge removes what filters (of session, in layout l) match, from the stream that keeps
	// session there.
	purge := func(l protocol.Layout, session string, filters ...string) (uint64, error) {
		stream, err := js.Stream(ctx, l.StreamNameOf(session))
		if err != nil {
			return 0, err
		}
		var count uint64
		for _, filter := range filters {
			info, err := stream.Info(ctx, jetstream.WithSubjectFilter(filter))
			if err != nil {
				return count, err
			}
			var n uint64
			for _, c := range info.State.Subjects {
				n += c
			}
			if n == 0 {
				continue
			}
			if err := stream.Purge(ctx, jetstream.WithPurgeSubject(filter)); err != nil {
				return count, err
			}
			count += n
		}
		return count, nil
	}
	l, history := layouts[0], HistorySession(owner)
	if out.History, err = purge(l, history, l.SubjectEvent(protocol.EventMemory, history)); err != nil {
		return out, fmt.Errorf("memory: erase the history: %w", err)
	}
	for _, session := range sessions {
		c, err := purge(l, session, l.FilterSession(session)...)
		out.SessionMessages += c
		if err != nil {
			return out, fmt.Errorf("memory: erase session %s: %w", session, err)
		}
		out.Sessions = append(out.Sessions, session)
	}
	// A change begun meanwhile may have copied what was purged here before it was: tried
	// again once the change is over.
	if info, err := first.Info(ctx); err != nil {
		return out, fmt.Errorf("memory: erase: the record: %w", err)
	} else if now, err := bus.RecordLayouts(info.Config); err != nil || len(now) > 1 || now[0] != layouts[0] {
		return out, ErrRecordChanging
	}
	return out, nil
}
