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
	// While the record's streams change, a session may be in either layout's stream: both
	// are purged.
	layouts, err := bus.RecordLayouts(first.CachedInfo().Config)
	if err != nil {
		return out, fmt.Errorf("memory: erase: %w", err)
	}
	// purge removes what filter (of session, in layout l) matches, from the stream that keeps
	// session there.
	purge := func(l protocol.Layout, session string, filters ...string) (uint64, error) {
		stream, err := js.Stream(ctx, l.StreamNameOf(session))
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return 0, nil // a stream of a change not made yet
		}
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
	history := HistorySession(owner)
	for _, l := range layouts {
		n, err := purge(l, history, l.SubjectEvent(protocol.EventMemory, history))
		out.History += n
		if err != nil {
			return out, fmt.Errorf("memory: erase the history: %w", err)
		}
	}
	for _, session := range sessions {
		for _, l := range layouts {
			c, err := purge(l, session, l.FilterSession(session)...)
			out.SessionMessages += c
			if err != nil {
				return out, fmt.Errorf("memory: erase session %s: %w", session, err)
			}
		}
		out.Sessions = append(out.Sessions, session)
	}
	return out, nil
}
