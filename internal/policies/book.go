package policies

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/kvwatch"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// ErrNotFollowing is the Book's error before it follows the bucket: which policies are applied
// is not known, so nothing is decided.
var ErrNotFollowing = errors.New("policy: the applied policies are not followed yet")

// Sources of a rule.
const (
	SourcePolicy   = "policy"   // applied through the policies' API
	SourceContract = "contract" // the tool contract's policy block
)

// Rule is the policy a tool's calls go under now, and where it is written.
type Rule struct {
	Tool   string
	Policy *policy.Policy
	// Source is SourcePolicy or SourceContract; Version the policy's (or the contract's)
	// version there.
	Source  string
	Version int
}

// String names the rule's policy: "policy v2 of notify_send".
func (r *Rule) String() string { return fmt.Sprintf("%s v%d of %s", r.Source, r.Version, r.Tool) }

// decision is a decision under r.
func (r *Rule) decision(decision, rule, reason string) *protocol.PolicyDecision {
	return &protocol.PolicyDecision{Decision: decision, Rule: rule, Source: r.Source, Version: r.Version, Reason: reason}
}

// Book is the policies applied through the API as they are now, followed as they change once
// Start has run: a change written to the bucket is seen as soon as the server delivers it, by
// every router and gateway. It is safe for concurrent use.
type Book struct {
	kv  jetstream.KeyValue
	log *slog.Logger

	mu        sync.RWMutex
	following bool
	applied   map[string]applied
}

type applied struct {
	rec *Record // the version in use; nil when the tool has none
	err error   // what the bucket holds last is no record, and no earlier one is in use
}

// NewBook returns the applied policies kept in kv (the bus's PoliciesBucket), not yet followed.
func NewBook(kv jetstream.KeyValue, log *slog.Logger) *Book {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Book{kv: kv, log: log, applied: map[string]applied{}}
}

// Rule returns the policy tool's calls go under now: the one applied through the API, else
// the policy block of k (the tool's contract; nil for none), else nil. It fails with
// ErrNotFollowing before the book follows the bucket, and when what the bucket holds for the
// tool is no record (calls are then refused, never let through unchecked).
func (b *Book) Rule(tool string, k *contract.Compiled) (*Rule, error) {
	b.mu.RLock()
	following, a := b.following, b.applied[tool]
	b.mu.RUnlock()
	switch {
	case !following:
		return nil, ErrNotFollowing
	case a.err != nil:
		return nil, a.err
	case a.rec != nil && !a.rec.Removed:
		return &Rule{Tool: tool, Policy: a.rec.Policy, Source: SourcePolicy, Version: a.rec.Version}, nil
	case k != nil && k.Policy != nil && !k.Policy.Empty():
		return &Rule{Tool: tool, Policy: k.Policy, Source: SourceContract, Version: k.Version}, nil
	}
	return nil, nil
}

// Following reports whether the book follows the bucket now (Rule decides).
func (b *Book) Following() bool {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.following
}

// Offers reports whether a caller of role is offered tool (its contract k; nil for none) in
// listings: the tool's rule allows role. A tool whose rule cannot be known is offered to
// nobody.
func (b *Book) Offers(tool string, k *contract.Compiled, role string) bool {
	r, err := b.Rule(tool, k)
	return err == nil && (r == nil || r.Policy.Allows(role))
}

// Start follows the bucket until ctx ends, returning once every policy it holds is known.
// Should the watch end before ctx, Rule says ErrNotFollowing until it is watched again.
func (b *Book) Start(ctx context.Context) error {
	f := &kvwatch.Follower{What: "the applied policies", Log: b.log, Apply: b.apply,
		Watch: func(ctx context.Context) (jetstream.KeyWatcher, error) { return b.kv.WatchAll(ctx) },
		Following: func(on bool) {
			b.mu.Lock()
			b.following = on
			b.mu.Unlock()
		}}
	if err := f.Start(ctx); err != nil {
		return fmt.Errorf("policy: follow the policies: %w", err)
	}
	return nil
}

// Run follows the bucket until ctx ends: Start, tried again every few seconds while it fails.
func (b *Book) Run(ctx context.Context) error {
	for {
		err := b.Start(ctx)
		if err == nil || ctx.Err() != nil {
			break
		}
		b.log.Warn("the applied policies are not followed; calls of tools with policies wait", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(5 * time.Second):
		}
	}
	<-ctx.Done()
	return nil
}

// apply takes one change of the bucket. A change that is no record Hermes wrote (one that
// cannot be read, a delete or purge from outside) leaves the version in use as it was, and is
// logged; a tool that had none has its calls refused until a policy is applied again.
func (b *Book) apply(e jetstream.KeyValueEntry) {
	tool := e.Key()
	rec, err := decodeRecord(tool, e.Value())
	if e.Operation() != jetstream.KeyValuePut {
		rec, err = nil, fmt.Errorf("policy: the policy of %s was deleted outside Hermes; apply it again", tool)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil {
		b.applied[tool] = applied{rec: rec}
		b.log.Info("policy in use", "tool", tool, "version", rec.Version, "removed", rec.Removed)
		return
	}
	b.log.Error("the policies' bucket holds what is no policy; the version in use stays", "tool", tool, "revision", e.Revision(), "err", err)
	if cur := b.applied[tool]; cur.rec == nil {
		b.applied[tool] = applied{err: err}
	}
}
