package memory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// roomShare is how much of the bucket an eviction for room frees beyond what the write needs,
// so that a full bucket is not scanned again at the next write.
const roomShare = 20 // 1/20: 5 %

// makeRoom frees at least need bytes and a twentieth of the bucket by evicting, across every
// owner, the least relevant fragments that are not forever (those past their lifespan first),
// each recorded as evicted. It returns how many it evicted; none when only forever fragments
// are left. It reads every owner's entry: a full bucket is rare, and the scan is bounded by the
// bucket's size.
func (s *Store) makeRoom(ctx context.Context, need int) (int, error) {
	st, err := s.KV.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("memory: make room: %w", err)
	}
	target := need
	if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok && bs.StreamInfo() != nil {
		target += int(bs.StreamInfo().Config.MaxBytes / roomShare)
	}
	lister, err := s.KV.ListKeys(ctx)
	if err != nil {
		return 0, fmt.Errorf("memory: make room: %w", err)
	}
	now := s.now()
	type candidate struct {
		owner string
		f     Fragment
		score float64
		size  int
	}
	var cands []candidate
	for k := range lister.Keys() {
		e, err := s.KV.Get(ctx, k)
		if err != nil {
			continue // gone meanwhile
		}
		var en entry
		if json.Unmarshal(e.Value(), &en) != nil || key(en.Owner) != k {
			continue
		}
		for _, f := range en.Fragments {
			if f.Forever() {
				continue
			}
			b, _ := json.Marshal(f)
			score := f.Relevance(now)
			if !f.Live(now) {
				score = -1
			}
			cands = append(cands, candidate{owner: en.Owner, f: f, score: score, size: len(b)})
		}
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].score < cands[j].score })
	chosen := map[string][]Fragment{}
	freed := 0
	for _, c := range cands {
		if freed >= target {
			break
		}
		chosen[c.owner] = append(chosen[c.owner], c.f)
		freed += c.size
	}
	evicted := 0
	ctx = context.WithValue(ctx, makingRoom{}, true)
	for owner, fs := range chosen {
		err := s.change(ctx, owner, func(_ time.Time, en *entry) ([]*protocol.MemoryEvent, error) {
			var events []*protocol.MemoryEvent
			en.Fragments = slices.DeleteFunc(en.Fragments, func(f Fragment) bool {
				if !slices.ContainsFunc(fs, func(g Fragment) bool { return g.id() == f.id() && g.Version == f.Version }) {
					return false
				}
				events = append(events, eventOf(protocol.MemoryEvicted, &f, "room in the memory bucket"))
				return true
			})
			evicted += len(events)
			return events, nil
		})
		if err != nil && !errors.Is(err, ErrNotFound) {
			return evicted, err
		}
	}
	return evicted, nil
}

// makingRoom marks the context of the writes that make room.
type makingRoom struct{}
