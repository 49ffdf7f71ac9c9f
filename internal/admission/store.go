package admission

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
)

// storeCheckEvery is how often a gateway looks at how full the record and the plans are.
const storeCheckEvery = 2 * time.Second

// storeGauge says whether the store is too full to accept requests: full is nil when it is
// not, else why (naming the limit). Between two looks, the requests accepted since the last
// one count as what they will write (footprint), so that requests arriving back to back, or a
// few large ones, cannot take the record past the margin before the next look sees them.
type storeGauge struct {
	full atomic.Pointer[string]
	// The record's byte limit and bytes at the last look (limit 0: none), and the estimated
	// bytes of accepted requests not yet seen written (the sum of accepted).
	limit, used, pending atomic.Int64

	mu       sync.Mutex
	accepted []*pendingWrite // oldest first
}

// pendingWrite is what one accepted request is expected to write, and when it was accepted.
type pendingWrite struct {
	at   time.Time
	need int64
}

// pendingFor is how long an accepted request counts at most: by then what it writes is in the
// store (or it wrote less than its footprint).
const pendingFor = 10 * time.Second

// seen takes a look at the store: the bytes it grew by since the last look are the writes of
// the oldest accepted requests, which stop counting as they are seen; requests accepted long
// ago stop counting too. (A look does not forget every accepted request: on a busy machine one
// accepted just before the look may not have written anything yet.)
func (s *storeGauge) seen(used int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	grown := used - s.used.Swap(used)
	cutoff := time.Now().Add(-pendingFor)
	kept := s.accepted[:0]
	var sum int64
	for _, p := range s.accepted {
		if grown > 0 {
			take := min(grown, p.need)
			p.need -= take
			grown -= take
		}
		if p.need > 0 && p.at.After(cutoff) {
			kept = append(kept, p)
			sum += p.need
		}
	}
	s.accepted = kept
	s.pending.Store(sum)
}

// footprint is what a request of size bytes is expected to write to the record: the request,
// its calls' dispatches (each carrying its arguments), results echoing them, and the response
// carrying the results. Measured: a 1 MB request of four echo calls grew the store by 3.9 MB.
func footprint(size int) int64 { return 4 * int64(size) }

// never reports whether a request of size bytes could never be accepted under the record's
// limit, however empty the record.
func (s *storeGauge) never(size int) bool {
	limit := s.limit.Load()
	return limit > 0 && float64(footprint(size)) > bus.IntakeStopsAt*float64(limit)
}

// counted is one request counted by the gauge: its caller settles it with what Submit said
// and closes it; a request that wrote nothing new (refused further on, a replay of one
// accepted before) stops counting then.
type counted struct {
	forget func()
	kept   bool
}

// close stops counting the request unless it was settled as accepted.
func (a *counted) close() {
	if !a.kept {
		a.forget()
	}
}

// admit says why a request of size bytes cannot be accepted now, or nil, counting it until it
// is closed unsettled.
func (s *storeGauge) admit(size int) (*counted, *string) {
	adm := &counted{forget: func() {}}
	if why := s.full.Load(); why != nil {
		return adm, why
	}
	limit := s.limit.Load()
	if limit <= 0 {
		return adm, nil
	}
	need := footprint(size)
	s.mu.Lock()
	defer s.mu.Unlock()
	if used := s.used.Load() + s.pending.Load() + need; float64(used) > bus.IntakeStopsAt*float64(limit) {
		why := fmt.Sprintf("the record would hold about %s of its %s limit with this request (--record-max-bytes); new requests are refused until older messages age out, so that accepted ones can finish",
			bytesText(used), bytesText(limit))
		return adm, &why
	}
	p := &pendingWrite{at: time.Now(), need: need}
	s.pending.Add(need)
	s.accepted = append(s.accepted, p)
	adm.forget = func() { s.forget(p) }
	return adm, nil
}

// forget stops counting p (its request wrote nothing new).
func (s *storeGauge) forget(p *pendingWrite) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, q := range s.accepted {
		if q == p {
			s.accepted = append(s.accepted[:i], s.accepted[i+1:]...)
			s.pending.Add(-q.need)
			return
		}
	}
}

// watchStore checks the store every interval until ctx is done (and a check under way ends).
func (a *Admitter) watchStore(ctx context.Context, every time.Duration) {
	defer bus.Every(every, func() { a.checkStore(ctx) })()
	<-ctx.Done()
}

// checkStore reads how full the record and the plans' bucket are. At bus.IntakeStopsAt of a
// byte limit, requests are refused until there is room again (messages age out): what is left
// lets the requests already accepted finish. A store that cannot be read changes nothing.
func (a *Admitter) checkStore(ctx context.Context) {
	if a.bus == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, storeCheckEvery)
	defer cancel()
	fullest, limit, seen := -1.0, int64(0), int64(0)
	check := func(s jetstream.Stream, what, flag string, record bool) (string, bool) {
		info, err := s.Info(ctx)
		if err != nil {
			return "", false
		}
		max, used := info.Config.MaxBytes, info.State.Bytes
		if record && (fullest < 0 || max > 0 && float64(used)/float64(max) > fullest) {
			// A record of several streams is as full as its fullest: a request may go to it.
			fullest, limit, seen = 0, max, int64(used)
			if max > 0 {
				fullest = float64(used) / float64(max)
			}
		}
		if maxMsgs := info.Config.MaxMsgs; maxMsgs > 0 && float64(info.State.Msgs) >= bus.IntakeStopsAt*float64(maxMsgs) {
			return fmt.Sprintf("%s holds %d of its %d messages (--record-max-msgs); new requests are refused until older messages age out, so that accepted ones can finish",
				what, info.State.Msgs, maxMsgs), true
		}
		if max <= 0 || float64(used) < bus.IntakeStopsAt*float64(max) {
			return "", true
		}
		return fmt.Sprintf("%s holds %s of its %s limit (%s); new requests are refused until older messages age out, so that accepted ones can finish",
			what, bytesText(int64(used)), bytesText(max), flag), true
	}
	var why string
	ok := true
	for _, s := range a.bus.Streams {
		w, sok := check(s, "the record", "--record-max-bytes", true)
		ok = ok && sok
		if why == "" {
			why = w
		}
	}
	if fullest >= 0 {
		a.store.limit.Store(limit)
		a.store.seen(seen)
	}
	if ok && why == "" {
		// The plans unreadable for a moment: the record's answer stands.
		if plans, err := a.bus.JS.Stream(ctx, bus.KVStream(bus.BucketCalls)); err == nil {
			if w, pok := check(plans, "the plans' bucket "+bus.BucketCalls, "--state-max-bytes", false); pok {
				why = w
			}
		}
	}
	if !ok {
		return
	}
	if why == "" {
		if a.store.full.Swap(nil) != nil {
			a.log.Info("the store has room again; accepting requests")
		}
		return
	}
	if a.store.full.Swap(&why) == nil {
		a.log.Warn("the store is nearly full; refusing new requests", "why", why)
	}
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}
