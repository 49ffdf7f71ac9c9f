// Package coordination serializes the calls that change one resource (state coordination, seed
// 003 §2.3): a contract's resource_key names the resource a call changes, and calls that change
// the same resource run one at a time, across every router and worker, in the order their
// proposals were accepted — each under a transaction id (protocol.TxID) and a fencing token
// the tool is given.
//
// The state lives in one JetStream KV bucket (Bucket), every write a compare-and-set, so any
// router may decide for any call:
//
//   - r.<token> holds a resource's turn: its holder (request, call, fencing token) and the
//     proposals waiting, in the order they were accepted. The resource's token is a hash of its
//     key (protocol.ResourceToken), so any key may be used.
//   - l.<token>.<fence> is the holder's lease, written with a per-message TTL: the NATS server
//     removes it when the TTL lapses (the lease is measured by the bus, not by clocks that can
//     disagree), leaving a marker every router watches (Expirer), which passes the turn on.
//
// The fencing token of a turn is the sequence of the resource's entry that the granting write
// replaced, so it is strictly greater than every earlier turn's on the same resource, even
// after the entry was emptied and made again (stream sequences only grow). A grant is written
// only over an existing entry: a resource seen for the first time has its proposal written
// first, and its grant next.
//
// A turn ends when its call's result is recorded (Release, from aggregation: the result
// carries the grant), or when its lease lapses (Expire): a holder that died, or a call woken
// for its turn that never came to take it. Either way the next proposal in line is granted,
// its lease written before the grant (so no holder is ever without one), and its request
// woken. A lease cannot stop a call still running at a tool after its turn has passed on:
// that is what the fencing token is for — the tool refuses a token lower than the highest it
// has seen.
package coordination

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Bucket holds the resources' turns and the holders' leases.
const Bucket = "hermes-coordination"

// Bounds and times.
const (
	// MaxWaiting bounds the proposals waiting for one resource: a call past it is answered
	// RESOURCE_BUSY.
	MaxWaiting = 256
	// ClaimWindow is the lease of a turn granted to a waiting call, until its router takes
	// it (and leases it for the call's run): a call woken that never comes loses its turn
	// after it.
	ClaimWindow = time.Minute
	// markerTTL is how long the bus keeps the marker of a lapsed lease or an emptied entry.
	markerTTL = time.Minute
	// maxLease bounds any lease.
	maxLease = time.Hour
	// minLease is the shortest lease of a call's run.
	minLease = 30 * time.Second
)

// Buckets is the coordination's bucket: written by routers (each turn a compare-and-set) and
// read by gateways (GET /debug/coordination).
func Buckets() []bus.Bucket {
	return []bus.Bucket{{Name: Bucket, Description: "Hermes: who holds each resource calls change, and who waits", MaxBytes: 256 << 20, Strict: true, MarkerTTL: markerTTL,
		Watchers: []bus.Role{bus.RoleGateway, bus.RoleRouter}, Writers: []bus.Role{bus.RoleRouter}}}
}

// Proposal is a call's proposal to change a resource.
type Proposal struct {
	RequestID  string    `json:"request_id"`
	CallID     string    `json:"tool_call_id"`
	SessionID  string    `json:"session_id"`
	Tool       string    `json:"tool"`
	Tx         string    `json:"tx"`
	Changes    []string  `json:"changes,omitempty"`
	ProposedAt time.Time `json:"proposed_at"`
}

// same reports whether p and q are the same call's.
func (p *Proposal) same(q *Proposal) bool { return p.RequestID == q.RequestID && p.CallID == q.CallID }

// Who names p's call: "request_id/tool_call_id".
func (p *Proposal) Who() string { return p.RequestID + "/" + p.CallID }

// Turn is a granted proposal: the call holds the resource.
type Turn struct {
	Proposal
	Fence     uint64    `json:"fence"`
	GrantedAt time.Time `json:"granted_at"`
}

// State is one resource's entry: who holds it, and who waits, in order.
type State struct {
	Resource string     `json:"resource"`
	Holder   *Turn      `json:"holder,omitempty"`
	Waiting  []Proposal `json:"waiting,omitempty"`
}

// position is where call stands: 0 holding, n ≥ 1 waiting n-th, -1 neither.
func (s *State) position(p *Proposal) int {
	if s.Holder != nil && s.Holder.same(p) {
		return 0
	}
	for i := range s.Waiting {
		if s.Waiting[i].same(p) {
			return i + 1
		}
	}
	return -1
}

// lease is what a holder's lease key holds.
type lease struct {
	RequestID string `json:"request_id"`
	CallID    string `json:"tool_call_id"`
	Fence     uint64 `json:"fence"`
}

// Store reads and writes the turns in the bucket.
type Store struct {
	KV jetstream.KeyValue
	JS jetstream.JetStream
	// Now stamps proposals and grants (time.Now when nil); it decides nothing.
	Now func() time.Time
	// ClaimFor is the lease of a turn passed on to a waiting call (default ClaimWindow); MinRun
	// the shortest lease of a call's run (default 30 s). Tests shorten them.
	ClaimFor, MinRun time.Duration
	// Answered, when set, says whether a request is answered already: a proposal of one is
	// dropped from the line rather than granted a turn nobody would take (a cancelled or
	// timed-out request's).
	Answered func(ctx context.Context, requestID string) (bool, error)
	// Running, when set, says whether a worker may still be running a call (the call
	// ledger's claim is live): an answered request's holder keeps its turn while it does.
	Running func(ctx context.Context, requestID, callID string) (bool, error)
}

func (s *Store) claimWindow() time.Duration {
	if s.ClaimFor > 0 {
		return s.ClaimFor
	}
	return ClaimWindow
}

func (s *Store) minRun() time.Duration {
	if s.MinRun > 0 {
		return s.MinRun
	}
	return minLease
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

func stateKey(token string) string               { return "r." + token }
func leaseKey(token string, fence uint64) string { return fmt.Sprintf("l.%s.%d", token, fence) }

// errChanged: the entry changed between reading and writing it.
var errChanged = errors.New("coordination: changed meanwhile")

// ErrContended: a resource's entry kept changing under a write; the delivery is tried again.
var ErrContended = errors.New("coordination: the resource's turn keeps changing; try again")

// read returns the resource's state and the revision it was read at (0: no entry).
func (s *Store) read(ctx context.Context, token string) (*State, uint64, error) {
	e, err := s.KV.Get(ctx, stateKey(token))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return &State{}, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("coordination: read %s: %w", stateKey(token), err)
	}
	var st State
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		// Damaged: nothing Hermes wrote. Its waiters are lost to it; start again from
		// nothing rather than stop every change of the resource.
		return &State{}, e.Revision(), nil
	}
	return &st, e.Revision(), nil
}

// write writes st over revision rev (0: the key holds nothing now), or empties the entry when
// nothing holds or waits. It returns errChanged when another write came first.
func (s *Store) write(ctx context.Context, token string, st *State, rev uint64) (uint64, error) {
	key := stateKey(token)
	var err error
	var next uint64
	switch {
	case st.Holder == nil && len(st.Waiting) == 0 && rev == 0:
		return 0, nil
	case st.Holder == nil && len(st.Waiting) == 0:
		err = s.KV.Purge(ctx, key, jetstream.LastRevision(rev), jetstream.PurgeTTL(markerTTL))
	default:
		data, merr := json.Marshal(st)
		if merr != nil {
			return 0, bus.Permanent(merr)
		}
		if rev == 0 {
			next, err = s.KV.Create(ctx, key, data)
		} else {
			next, err = s.KV.Update(ctx, key, data, rev)
		}
	}
	if errors.Is(err, jetstream.ErrKeyExists) || isWrongLastSeq(err) {
		return 0, errChanged
	}
	if err != nil {
		return 0, fmt.Errorf("coordination: write %s: %w", key, err)
	}
	return next, nil
}

func isWrongLastSeq(err error) bool { return bus.IsWrongLastSequence(err) }

// putLease writes the lease of fence's turn on token, lapsing after ttl; rev is the lease's
// revision to write over (0: none yet). It returns the lease's new revision.
func (s *Store) putLease(ctx context.Context, token string, l lease, ttl time.Duration, rev uint64) (uint64, error) {
	data, err := json.Marshal(l)
	if err != nil {
		return 0, bus.Permanent(err)
	}
	ttl = min(max(ttl, time.Second), maxLease)
	m := &nats.Msg{Subject: "$KV." + Bucket + "." + leaseKey(token, l.Fence), Header: nats.Header{}, Data: data}
	ack, err := s.JS.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(ttl.Truncate(time.Second)))
	if isWrongLastSeq(err) {
		return 0, errChanged
	}
	if err != nil {
		return 0, fmt.Errorf("coordination: lease %s: %w", leaseKey(token, l.Fence), err)
	}
	return ack.Sequence, nil
}

// liveLease returns the revision of fence's lease on token, 0 when it lapsed or was given back.
func (s *Store) liveLease(ctx context.Context, token string, fence uint64) (uint64, error) {
	e, err := s.KV.Get(ctx, leaseKey(token, fence))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("coordination: read %s: %w", leaseKey(token, fence), err)
	}
	return e.Revision(), nil
}

// dropLease gives fence's lease on token back (best effort: a lease left lapses by itself).
func (s *Store) dropLease(ctx context.Context, token string, fence uint64) {
	_ = s.KV.Purge(ctx, leaseKey(token, fence), jetstream.PurgeTTL(markerTTL))
}

// Outcome is what Propose decided about one proposal.
type Outcome struct {
	// Turn is set when the call holds the resource now (granted by this write or before).
	Turn *Turn
	// Position is the call's place in line when it waits (1: next); HeldBy who holds it.
	Position int
	HeldBy   string
	// HolderSession is the holder's session.
	HolderSession string
	// Busy: too many calls wait already; the proposal was not accepted.
	Busy bool
	// Proposed: the proposal was accepted by this call of Propose (it was not in line before).
	Proposed bool
}

// Change is what a write did to the resource's turn, for events and wake-ups: Granted is
// the turn it granted (nil: none), to a call that may be one of the proposer's or another's.
type Change struct {
	Resource string
	Granted  *Turn
	// Leased: the grant is one of the proposer's, leased for its call's run by this write.
	Leased bool
}

// Propose puts the proposals (calls of one request that change resource, in the order they
// are to run) in line, unless they are already, and grants the resource to the first in line
// when nobody holds it. A granted proposal of the caller's is leased for run (its call's run:
// ClaimWindow at least). It returns what became of each proposal, and the grant the write
// made, if any.
func (s *Store) Propose(ctx context.Context, resource string, ps []Proposal, run time.Duration) ([]Outcome, *Change, error) {
	token := protocol.ResourceToken(resource)
	var known *State // the state this call wrote last, and its revision: no need to read it back
	var knownRev uint64
	proposed := make([]bool, len(ps)) // put in line by an earlier write of this call
	for range 32 {
		st, rev := known, knownRev
		if st == nil {
			var err error
			if st, rev, err = s.read(ctx, token); err != nil {
				return nil, nil, err
			}
		}
		known = nil
		st.Resource = resource
		out := make([]Outcome, len(ps))
		changed := false
		for i := range ps {
			switch pos := st.position(&ps[i]); {
			case pos == 0:
			case pos > 0:
			case len(st.Waiting) >= MaxWaiting:
				out[i].Busy = true
			default:
				st.Waiting = append(st.Waiting, ps[i])
				out[i].Proposed, changed = true, true
			}
		}
		var granted *Turn
		leased := false
		if rev > 0 && st.Holder == nil && len(st.Waiting) > 0 {
			mine := func(t *Turn) bool { return slices.ContainsFunc(ps, func(p Proposal) bool { return t.same(&p) }) }
			var dropped bool
			var err error
			granted, leased, dropped, err = s.promote(ctx, token, st, rev, func(t *Turn) time.Duration {
				if mine(t) {
					return max(run, s.minRun())
				}
				return s.claimWindow()
			})
			if err != nil {
				return nil, nil, err
			}
			changed = changed || granted != nil || dropped
			leased = leased && granted != nil && mine(granted)
		}
		if changed {
			next, err := s.write(ctx, token, st, rev)
			if errors.Is(err, errChanged) {
				continue
			} else if err != nil {
				return nil, nil, err
			}
			if rev == 0 {
				// The proposals are in line; the grant is written over them.
				known, knownRev = st, next
				for i := range ps {
					proposed[i] = proposed[i] || out[i].Proposed
				}
				continue
			}
		}
		for i := range ps {
			if out[i].Busy {
				continue
			}
			switch pos := st.position(&ps[i]); {
			case pos == 0:
				out[i].Turn = st.Holder
			default:
				out[i].Position = pos
				if st.Holder != nil {
					out[i].HeldBy, out[i].HolderSession = st.Holder.Who(), st.Holder.SessionID
				}
			}
		}
		for i := range ps {
			out[i].Proposed = out[i].Proposed || proposed[i]
		}
		var ch *Change
		if granted != nil {
			ch = &Change{Resource: resource, Granted: granted, Leased: leased}
		}
		return out, ch, nil
	}
	return nil, nil, ErrContended
}

// promote grants the resource of token, held by nobody in st (read at revision rev), to the
// first in line whose request is not answered yet (those answered are dropped from the line:
// nobody would take their turn). The grant's fencing token is rev; its lease, lasting
// ttl(turn), is written before the grant, so no holder is ever without one. leased says the
// lease was written here (false: one was there already, written by a write that lost its
// race); dropped says proposals were dropped.
func (s *Store) promote(ctx context.Context, token string, st *State, rev uint64, ttl func(*Turn) time.Duration) (granted *Turn, leased, dropped bool, err error) {
	for len(st.Waiting) > 0 && s.Answered != nil {
		done, err := s.Answered(ctx, st.Waiting[0].RequestID)
		if err != nil {
			return nil, false, false, err
		}
		if !done {
			break
		}
		st.Waiting, dropped = st.Waiting[1:], true
	}
	if len(st.Waiting) == 0 {
		return nil, false, dropped, nil
	}
	t := &Turn{Proposal: st.Waiting[0], Fence: rev, GrantedAt: s.now()}
	_, err = s.putLease(ctx, token, lease{RequestID: t.RequestID, CallID: t.CallID, Fence: t.Fence}, ttl(t), 0)
	if err != nil && !errors.Is(err, errChanged) {
		return nil, false, false, err
	}
	st.Holder, st.Waiting = t, st.Waiting[1:]
	return t, err == nil, dropped, nil
}

// InLine reports whether a call of request holds resource or waits for it.
func (s *Store) InLine(ctx context.Context, resource, requestID string) (bool, error) {
	st, _, err := s.read(ctx, protocol.ResourceToken(resource))
	if err != nil {
		return false, err
	}
	if st.Holder != nil && st.Holder.RequestID == requestID {
		return true, nil
	}
	return slices.ContainsFunc(st.Waiting, func(p Proposal) bool { return p.RequestID == requestID }), nil
}

// Holds reports whether call (requestID, callID) holds resource now.
func (s *Store) Holds(ctx context.Context, resource, requestID, callID string) (bool, error) {
	st, _, err := s.read(ctx, protocol.ResourceToken(resource))
	if err != nil {
		return false, err
	}
	return st.Holder != nil && st.Holder.RequestID == requestID && st.Holder.CallID == callID, nil
}

// Claim leases turn t on resource for its call's run (from now), when the turn is still the
// call's: false when it lapsed meanwhile (the call must propose again).
func (s *Store) Claim(ctx context.Context, resource string, t *Turn, run time.Duration) (bool, error) {
	token := protocol.ResourceToken(resource)
	for range 8 {
		rev, err := s.liveLease(ctx, token, t.Fence)
		if err != nil || rev == 0 {
			return false, err
		}
		_, err = s.putLease(ctx, token, lease{RequestID: t.RequestID, CallID: t.CallID, Fence: t.Fence}, max(run, s.minRun()), rev)
		if !errors.Is(err, errChanged) {
			return err == nil, err
		}
	}
	return false, ErrContended
}

// Ended is a turn that ended, and the turn granted after it.
type Ended struct {
	Resource string
	Ended    *Turn
	Granted  *Turn
}

// Release ends the turn of call (requestID, callID) with fence on resource — its result is
// recorded — and grants the resource to the next in line. Nothing happens when the turn is no
// longer that call's (released before, or lapsed): nil.
func (s *Store) Release(ctx context.Context, resource, requestID, callID string, fence uint64) (*Ended, error) {
	return s.end(ctx, resource, func(ctx context.Context, h *Turn) (bool, error) {
		return h.RequestID == requestID && h.CallID == callID && h.Fence == fence, nil
	})
}

// Expire ends the turn with fence on the resource of token when its lease is gone (lapsed),
// and grants the resource to the next in line: nil when the turn is another's, or still
// leased.
func (s *Store) Expire(ctx context.Context, token string, fence uint64) (*Ended, error) {
	st, _, err := s.read(ctx, token)
	if err != nil || st.Holder == nil || st.Holder.Fence != fence {
		return nil, err
	}
	return s.end(ctx, st.Resource, func(ctx context.Context, h *Turn) (bool, error) {
		if h.Fence != fence {
			return false, nil
		}
		rev, err := s.liveLease(ctx, token, fence)
		return rev == 0, err
	})
}

// EndAnswered ends the turn with fence on the resource of token when its request is answered
// already (its call's result is recorded, by whoever recorded it: a cancellation, say, whose
// result carries no grant) and no worker may still be running its call (Running), and grants
// the next in line; nil when not. A cancelled call still running keeps the turn until its
// worker stops or its lease lapses.
func (s *Store) EndAnswered(ctx context.Context, token string, fence uint64) (*Ended, error) {
	if s.Answered == nil {
		return nil, nil
	}
	st, _, err := s.read(ctx, token)
	if err != nil || st.Holder == nil || st.Holder.Fence != fence {
		return nil, err
	}
	return s.end(ctx, st.Resource, func(ctx context.Context, h *Turn) (bool, error) {
		if h.Fence != fence {
			return false, nil
		}
		if done, err := s.Answered(ctx, h.RequestID); err != nil || !done {
			return false, err
		}
		if s.Running == nil {
			return true, nil
		}
		running, err := s.Running(ctx, h.RequestID, h.CallID)
		return !running, err
	})
}

// end ends the holder's turn on resource when ends says so, and grants the next in line.
func (s *Store) end(ctx context.Context, resource string, ends func(context.Context, *Turn) (bool, error)) (*Ended, error) {
	token := protocol.ResourceToken(resource)
	for range 32 {
		st, rev, err := s.read(ctx, token)
		if err != nil {
			return nil, err
		}
		if st.Holder == nil {
			return nil, nil
		}
		if ok, err := ends(ctx, st.Holder); err != nil || !ok {
			return nil, err
		}
		ended := st.Holder
		st.Holder = nil
		granted, _, _, err := s.promote(ctx, token, st, rev, func(*Turn) time.Duration { return s.claimWindow() })
		if err != nil {
			return nil, err
		}
		if _, err := s.write(ctx, token, st, rev); errors.Is(err, errChanged) {
			continue
		} else if err != nil {
			return nil, err
		}
		s.dropLease(ctx, token, ended.Fence)
		return &Ended{Resource: resource, Ended: ended, Granted: granted}, nil
	}
	return nil, ErrContended
}

// List returns every resource that is held or waited for.
func (s *Store) List(ctx context.Context) ([]State, error) {
	keys, err := s.KV.ListKeysFiltered(ctx, "r.*")
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil, nil
		}
		return nil, fmt.Errorf("coordination: list: %w", err)
	}
	var out []State
	for k := range keys.Keys() {
		st, rev, err := s.read(ctx, k[len("r."):])
		if err != nil {
			return nil, err
		}
		if rev > 0 && (st.Holder != nil || len(st.Waiting) > 0) {
			out = append(out, *st)
		}
	}
	slices.SortFunc(out, func(a, b State) int {
		switch {
		case a.Resource < b.Resource:
			return -1
		case a.Resource > b.Resource:
			return 1
		}
		return 0
	})
	return out, nil
}
