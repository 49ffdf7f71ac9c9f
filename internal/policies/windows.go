package policies

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/policy"
)

// kv is the part of a JetStream key-value bucket the windows use.
type kv interface {
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
}

// Windows are the rate limits' sliding windows, kept in the bus's WindowsBucket and shared by
// every router: each key holds the calls let through in its last window (when, and which
// call), written with compare-and-set, so however many routers decide at once no window lets
// more calls through than its rate. It is safe for concurrent use.
type Windows struct {
	KV kv
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// ErrContended: the window kept changing under this router's writes; the call is decided
// again later.
var ErrContended = errors.New("policy: the rate window is changed by others too often; tried again later")

// entryBytes is what a window keeps per call: when it was let through (Unix nanoseconds) and
// a 128-bit hash of the call's ids (no two calls share one that anyone could find).
const entryBytes = 24

// maxTries bounds compare-and-set rounds of one Take.
const maxTries = 32

// Take lets the call named id (CallID) through key's window of rate r when the window has
// room, counting it; a call counted before (a redelivery) is let through again without
// counting twice. Otherwise it returns false and when the window has room next. An error says
// the window could not be read or written.
func (w *Windows) Take(ctx context.Context, key string, r policy.Rate, id ID) (ok bool, retryAt time.Time, err error) {
	for range maxTries {
		now := time.Now()
		if w.Now != nil {
			now = w.Now()
		}
		var rev uint64
		var calls []call
		e, err := w.KV.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return false, time.Time{}, fmt.Errorf("policy: read rate window %s: %w", key, err)
		default:
			rev = e.Revision()
			calls, _ = decodeWindow(e.Value()) // what is no window holds no call: written over
		}
		from := now.Add(-r.Per).UnixNano()
		kept := calls[:0]
		for _, c := range calls {
			if c.at > from {
				if c.id == id {
					return true, time.Time{}, nil
				}
				kept = append(kept, c)
			}
		}
		if len(kept) >= r.Count {
			// There is room once all but Count-1 of the calls still counted have left the
			// window (more than Count are counted after the rate was lowered).
			ats := make([]int64, len(kept))
			for i, c := range kept {
				ats[i] = c.at
			}
			slices.Sort(ats)
			return false, time.Unix(0, ats[len(ats)-r.Count]).Add(r.Per), nil
		}
		kept = append(kept, call{at: now.UnixNano(), id: id})
		if rev == 0 {
			_, err = w.KV.Create(ctx, key, encodeWindow(kept))
		} else {
			_, err = w.KV.Update(ctx, key, encodeWindow(kept), rev)
		}
		switch {
		case err == nil:
			return true, time.Time{}, nil
		case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
			continue // another router counted a call meanwhile: look again
		default:
			return false, time.Time{}, fmt.Errorf("policy: write rate window %s: %w", key, err)
		}
	}
	return false, time.Time{}, ErrContended
}

// call is one call a window let through.
type call struct {
	at int64
	id ID
}

func encodeWindow(calls []call) []byte {
	b := make([]byte, 0, len(calls)*entryBytes)
	for _, c := range calls {
		b = binary.BigEndian.AppendUint64(b, uint64(c.at))
		b = append(b, c.id[:]...)
	}
	return b
}

// decodeWindow reads a window; what is no window (a length not a multiple of an entry, more
// entries than any rate keeps) is an error.
func decodeWindow(b []byte) ([]call, error) {
	if len(b)%entryBytes != 0 || len(b)/entryBytes > policy.MaxRateCount {
		return nil, fmt.Errorf("policy: a rate window of %d bytes", len(b))
	}
	out := make([]call, len(b)/entryBytes)
	for i := range out {
		out[i] = call{at: int64(binary.BigEndian.Uint64(b[i*entryBytes:]))}
		copy(out[i].id[:], b[i*entryBytes+8:(i+1)*entryBytes])
	}
	return out, nil
}

// ID is what a window counts a call under (CallID).
type ID [16]byte

// CallID is the id a window counts a call under: a hash of its request's and its own id.
func CallID(requestID, callID string) ID {
	sum := sha256.Sum256([]byte(requestID + "\x00" + callID))
	return ID(sum[:16])
}

// WindowKey is the key of tool's window under scope: the tool's (scope tool) or the caller's
// (scope caller; caller names it, "" for a request nobody is named for), a hash of the caller
// standing for it.
func WindowKey(tool string, scope policy.Scope, caller string) string {
	if scope == policy.ScopeTool {
		return tool + ".tool"
	}
	sum := sha256.Sum256([]byte(caller))
	return tool + ".caller." + hex.EncodeToString(sum[:12])
}
