// Package approvals keeps the durable approvals of calls whose tool's policy asks a person to
// confirm them (confirm_required): each parked call is an approval in the bus's
// hermes-approvals bucket, written with compare-and-set, so it survives the loss of every Hermes
// process, lapses at its expiry, is decided once, and runs its call once — the same tool, the
// same arguments, for the same caller, checked again when the call runs.
//
// An approval is opened by the router's policy stage (Gate) as it answers the call
// APPROVAL_REQUIRED; approved or denied through the gateway (Decide); run either by the request
// Hermes makes on approval (RunRequest: calls that came through /v1/route or the bus), or by
// the identical call the requester makes next (calls of MCP and the chat loop, whose callers
// call again); and expired by every router's Expirer.
package approvals

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Bucket is the approvals' bucket: a.<id> holds an approval, h.<hash> the id of the last
// approval a recalling door opened for a call (by Hash).
const Bucket = "hermes-approvals"

// keepFor is how long an approval stays readable after its last change: past the longest
// expiry, so that what was decided can still be shown.
const keepFor = 7 * 24 * time.Hour

// Buckets are the approvals' buckets: written by routers (opening, running, expiring) and
// gateways (deciding); strict, so that whichever server answers sees the last decision.
func Buckets() []bus.Bucket {
	return []bus.Bucket{{Name: Bucket, Description: "Hermes: calls parked for a person's approval, and the decisions", MaxBytes: 64 << 20, TTL: keepFor, Strict: true,
		Writers: []bus.Role{bus.RoleRouter, bus.RoleGateway}}}
}

// State is where an approval stands.
type State string

// States of an approval. Pending is the only one a person decides; Approved the only one a
// call runs under; every other is final.
const (
	Pending  State = "pending"
	Approved State = "approved"
	Denied   State = "denied"
	Expired  State = "expired"
	Used     State = "used"
)

// Approval is one parked call waiting for (or past) a person's decision.
type Approval struct {
	ID         string          `json:"id"`
	RequestID  string          `json:"request_id"`
	SessionID  string          `json:"session_id"`
	ToolCallID string          `json:"tool_call_id"`
	Tool       string          `json:"tool"`
	Arguments  json.RawMessage `json:"arguments"`
	// Hash binds the approval to its tool, arguments and caller (Hash).
	Hash string `json:"hash"`
	// Requester is the caller the call was made by (nil: a gateway that names no callers).
	Requester *protocol.Caller `json:"requester,omitempty"`
	// Approvers are the roles that may decide, the requester excluded; none: the requester
	// decides (the seed's "one more round").
	Approvers []string `json:"approvers,omitempty"`
	// Source and Version name the policy that parked the call.
	Source  string `json:"source"`
	Version int    `json:"version"`
	// Recall: the requester's next identical call runs under the approval (MCP, the chat
	// loop); otherwise Hermes runs the call in a request of its own once it is approved.
	Recall    bool      `json:"recall,omitempty"`
	State     State     `json:"state"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	// DecidedBy names who approved or denied it, DecidedAt when, Reason why (a denial's).
	DecidedBy string    `json:"decided_by,omitempty"`
	DecidedAt time.Time `json:"decided_at,omitzero"`
	Reason    string    `json:"reason,omitempty"`
	// UsedBy names the call that ran under it: "<request id>/<tool_call_id>".
	UsedBy string    `json:"used_by,omitempty"`
	UsedAt time.Time `json:"used_at,omitzero"`
	// Trace is the correlation id of the call's request, carried to the run.
	Trace protocol.TraceContext `json:"trace,omitzero"`
}

// Open reports whether a person may still decide a.
func (a *Approval) Open() bool { return a.State == Pending }

// Identity is who a caller is for an approval: its id, and the user it acts for.
func Identity(c *protocol.Caller) string {
	if c == nil {
		return ""
	}
	return c.ID + "#" + c.User
}

// Hash is what an approval is bound to: the tool, the call's arguments (as compacted JSON) and
// the caller (Identity).
func Hash(tool string, args json.RawMessage, caller *protocol.Caller) string {
	h := sha256.New()
	for _, p := range [][]byte{[]byte(tool), args, []byte(Identity(caller))} {
		_, _ = fmt.Fprintf(h, "%d:", len(p))
		_, _ = h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ID is the approval id of call callID of request requestID: the same for every delivery of
// the request, so a redelivered call finds its approval instead of opening another.
func ID(requestID, callID string) string {
	sum := sha256.Sum256([]byte(requestID + "\x00" + callID))
	return protocol.ApprovalRequestPrefix + hex.EncodeToString(sum[:12])
}

// IsID reports whether s has the form of an approval id.
func IsID(s string) bool {
	h, ok := strings.CutPrefix(s, protocol.ApprovalRequestPrefix)
	if !ok || len(h) != 24 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil
}

// Errors of the store.
var (
	// ErrNotFound: no such approval (or it is older than the bucket keeps).
	ErrNotFound = errors.New("approvals: no such approval")
	// ErrDecided: the approval is not pending (the error says where it stands).
	ErrDecided = errors.New("approvals: decided already")
	// ErrPending: nobody has decided the approval yet.
	ErrPending = errors.New("approvals: not decided yet")
	// ErrExpired: the approval lapsed before it was decided.
	ErrExpired = errors.New("approvals: the approval expired")
)

// maxBytes bounds a stored approval (arguments are bounded by the request's limits).
const maxBytes = 2 << 20

// kv is the part of a key-value bucket the store uses.
type kv interface {
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
	Put(ctx context.Context, key string, value []byte) (uint64, error)
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
	ListKeysFiltered(ctx context.Context, filters ...string) (jetstream.KeyLister, error)
}

// Store reads and writes approvals. It is safe for concurrent use.
type Store struct {
	KV kv
}

func keyOf(id string) string     { return "a." + id }
func hashKey(hash string) string { return "h." + hash }

// decode reads a stored approval of id, refusing what is not one.
func decode(id string, data []byte) (*Approval, error) {
	if len(data) > maxBytes {
		return nil, fmt.Errorf("approvals: %s is %d bytes", id, len(data))
	}
	var a Approval
	if err := json.Unmarshal(data, &a); err != nil {
		return nil, fmt.Errorf("approvals: %s: %w", id, err)
	}
	if a.ID != id || a.Hash == "" || !slices.Contains([]State{Pending, Approved, Denied, Expired, Used}, a.State) {
		return nil, fmt.Errorf("approvals: what is kept under %s is no approval of it", id)
	}
	return &a, nil
}

// Get returns approval id and its revision; ErrNotFound when there is none.
func (s *Store) Get(ctx context.Context, id string) (*Approval, uint64, error) {
	if !IsID(id) {
		return nil, 0, fmt.Errorf("%w: %q is not an approval id", ErrNotFound, id)
	}
	e, err := s.KV.Get(ctx, keyOf(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("approvals: read %s: %w", id, err)
	}
	a, err := decode(id, e.Value())
	if err != nil {
		return nil, 0, err
	}
	return a, e.Revision(), nil
}

// Create keeps a new approval; when one with its id is kept already (a redelivery opened
// it), that one is returned, with created false.
func (s *Store) Create(ctx context.Context, a *Approval) (_ *Approval, created bool, err error) {
	data, err := json.Marshal(a)
	if err != nil {
		return nil, false, err
	}
	if _, err := s.KV.Create(ctx, keyOf(a.ID), data); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			have, _, err := s.Get(ctx, a.ID)
			return have, false, err
		}
		return nil, false, fmt.Errorf("approvals: keep %s: %w", a.ID, err)
	}
	if a.Recall {
		if _, err := s.KV.Put(ctx, hashKey(a.Hash), []byte(a.ID)); err != nil {
			return nil, false, fmt.Errorf("approvals: index %s: %w", a.ID, err)
		}
	}
	return a, true, nil
}

// ByHash returns the last approval a recalling door opened for calls of hash; ErrNotFound
// when there is none.
func (s *Store) ByHash(ctx context.Context, hash string) (*Approval, error) {
	e, err := s.KV.Get(ctx, hashKey(hash))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("approvals: read the index: %w", err)
	}
	a, _, err := s.Get(ctx, string(e.Value()))
	if err != nil {
		return nil, err
	}
	if a.Hash != hash {
		return nil, ErrNotFound
	}
	return a, nil
}

// Change applies change to approval id with compare-and-set, reading it again whenever
// another process changed it meanwhile, and returns what was written. change returns an
// error to write nothing.
func (s *Store) Change(ctx context.Context, id string, change func(*Approval) error) (*Approval, error) {
	for range 16 {
		a, rev, err := s.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		if err := change(a); err != nil {
			return a, err
		}
		data, err := json.Marshal(a)
		if err != nil {
			return nil, err
		}
		_, err = s.KV.Update(ctx, keyOf(id), data, rev)
		switch {
		case err == nil:
			return a, nil
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
			continue
		default:
			return nil, fmt.Errorf("approvals: write %s: %w", id, err)
		}
	}
	return nil, fmt.Errorf("approvals: %s keeps changing; try again", id)
}

// maxList bounds a listing.
const maxList = 10_000

// List returns every approval kept, newest first, at most maxList.
func (s *Store) List(ctx context.Context) ([]*Approval, error) {
	keys, err := s.KV.ListKeysFiltered(ctx, "a.>")
	if err != nil {
		return nil, fmt.Errorf("approvals: list: %w", err)
	}
	var out []*Approval
	for k := range keys.Keys() {
		if len(out) == maxList {
			_ = keys.Stop()
			break
		}
		a, _, err := s.Get(ctx, strings.TrimPrefix(k, "a."))
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			continue // not an approval Hermes wrote: left out
		}
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b *Approval) int { return b.CreatedAt.Compare(a.CreatedAt) })
	return out, nil
}

// Decider is who decides an approval: the caller as the record keeps it (its role
// included), and whether it holds the permission to approve any held call.
type Decider struct {
	Caller *protocol.Caller
	// Approver: the caller may decide approvals that name no approvers, whoever requested
	// them (an administrator; the calls of bus clients, who have no HTTP identity, need one).
	Approver bool
}

// Name is how the record names the decider.
func (d Decider) Name() string {
	if d.Caller == nil {
		return "a caller of a gateway that names none"
	}
	s := d.Caller.ID
	if d.Caller.User != "" {
		s += " for " + d.Caller.User
	}
	return s
}

// ErrForbidden: the decider may not decide this approval.
var ErrForbidden = errors.New("approvals: not yours to decide")

// MayDecide says why d may not decide a, or nil: with approvers, only a caller of one of their
// roles who is not the requester (four eyes); without, the requester, or a caller who may
// approve any held call (Decider.Approver).
func MayDecide(a *Approval, d Decider) error {
	if len(a.Approvers) == 0 {
		if Identity(a.Requester) != Identity(d.Caller) && !d.Approver {
			return fmt.Errorf("%w: the call's requester confirms it (%s's policy names no approvers)", ErrForbidden, a.Tool)
		}
		return nil
	}
	// Four eyes are two callers: the same key or token acting for another user is the
	// requester still.
	if a.Requester == nil || d.Caller == nil || a.Requester.ID == d.Caller.ID {
		return fmt.Errorf("%w: %s's policy asks someone other than the requester to approve (approvers: %v)", ErrForbidden, a.Tool, a.Approvers)
	}
	if d.Caller == nil || !slices.Contains(a.Approvers, d.Caller.Role) {
		return fmt.Errorf("%w: only a caller with one of the roles %v may decide it", ErrForbidden, a.Approvers)
	}
	return nil
}

// decidable says why a pending approval cannot be decided at now, or nil.
func decidable(a *Approval, now time.Time) error {
	switch {
	case a.State == Pending && !now.Before(a.ExpiresAt):
		return fmt.Errorf("%w at %s", ErrExpired, a.ExpiresAt.UTC().Format(time.RFC3339))
	case a.State == Expired:
		return fmt.Errorf("%w at %s", ErrExpired, a.ExpiresAt.UTC().Format(time.RFC3339))
	case a.State != Pending:
		by := ""
		if a.DecidedBy != "" {
			by = " by " + a.DecidedBy + " at " + a.DecidedAt.UTC().Format(time.RFC3339)
		}
		return fmt.Errorf("%w: it is %s%s", ErrDecided, a.State, by)
	}
	return nil
}

// Decide approves (approve true) or denies approval id as d, at now, with reason. It fails
// with ErrNotFound, ErrForbidden (MayDecide), ErrExpired (an expiry not yet recorded is
// recorded), or ErrDecided — whatever the error, nothing is decided twice.
func (s *Store) Decide(ctx context.Context, id string, d Decider, approve bool, reason string, now time.Time) (*Approval, error) {
	lapsed := false
	a, err := s.Change(ctx, id, func(a *Approval) error {
		if err := MayDecide(a, d); err != nil {
			return err
		}
		if err := decidable(a, now); err != nil {
			if a.State == Pending && errors.Is(err, ErrExpired) {
				a.State, lapsed = Expired, true
				return nil
			}
			return err
		}
		a.State, a.DecidedBy, a.DecidedAt, a.Reason = Denied, d.Name(), now.UTC(), reason
		if approve {
			a.State = Approved
		}
		return nil
	})
	if err == nil && lapsed {
		return a, fmt.Errorf("%w at %s", ErrExpired, a.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return a, err
}

// Expire ends approval id at now when it is past its expiry and still pending, or approved
// but not yet called again (Recall); expired reports whether it is expired now (by this call or before).
func (s *Store) Expire(ctx context.Context, id string, now time.Time) (a *Approval, expired bool, err error) {
	errNo := errors.New("not due")
	a, err = s.Change(ctx, id, func(a *Approval) error {
		if a.State == Expired {
			return errNo
		}
		// An approved call Hermes runs itself runs however late (it is on its way); one the
		// requester must make again lapses like an undecided one.
		if !(a.State == Pending || a.State == Approved && a.Recall) || now.Before(a.ExpiresAt) {
			return errNo
		}
		a.State = Expired
		return nil
	})
	if errors.Is(err, errNo) {
		return a, a.State == Expired, nil
	}
	return a, err == nil, err
}

// Use marks approval id used by call (UsedBy) at now, when it is approved, unexpired and
// bound to hash; a call it was used by already may use it again (a redelivery). The error
// says why the call may not run under it.
func (s *Store) Use(ctx context.Context, id, hash, call string, now time.Time) (*Approval, error) {
	a, err := s.Change(ctx, id, func(a *Approval) error {
		switch {
		case a.Hash != hash:
			return fmt.Errorf("%w: the call differs from the one approved (its tool, arguments or caller)", ErrForbidden)
		case a.State == Used && a.UsedBy == call:
			return errAgain
		case a.State == Used:
			return fmt.Errorf("%w: it ran its call already (%s)", ErrDecided, a.UsedBy)
		case a.State == Approved && a.Recall && !now.Before(a.ExpiresAt):
			return fmt.Errorf("%w at %s, before the call was made again", ErrExpired, a.ExpiresAt.UTC().Format(time.RFC3339))
		case a.State == Pending:
			return fmt.Errorf("%w: nobody has approved it yet", ErrPending)
		case a.State != Approved:
			return decidable(a, now)
		}
		a.State, a.UsedBy, a.UsedAt = Used, call, now.UTC()
		return nil
	})
	if errors.Is(err, errAgain) {
		return a, nil
	}
	return a, err
}

// errAgain: the call used the approval before; it runs again without writing.
var errAgain = errors.New("used by this call before")

// Release gives approval id back to its approval after the call that used it (UsedBy) was
// kept from running after all (its rate window was full): approved and unused again, for the
// call's next try.
func (s *Store) Release(ctx context.Context, id, call string) error {
	_, err := s.Change(ctx, id, func(a *Approval) error {
		if a.State != Used || a.UsedBy != call {
			return errAgain
		}
		a.State, a.UsedBy, a.UsedAt = Approved, "", time.Time{}
		return nil
	})
	if errors.Is(err, errAgain) {
		return nil
	}
	return err
}

// Index points the recalling door's next identical call at a (h.<hash>), again: an approval
// kept before its index was written (a delivery cut off between the two) is found all the same.
func (s *Store) Index(ctx context.Context, a *Approval) error {
	if !a.Recall {
		return nil
	}
	if _, err := s.KV.Put(ctx, hashKey(a.Hash), []byte(a.ID)); err != nil {
		return fmt.Errorf("approvals: index %s: %w", a.ID, err)
	}
	return nil
}
