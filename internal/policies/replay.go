package policies

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Replay decides recorded calls again as the policy stage would, running nothing and reading
// nothing of the bus: the rules that read no state are the stage's own (judge), a call to
// confirm is parked, and rate limits are counted in windows kept in memory (Windows on an
// in-memory bucket), on the record's clock — each call at the time it is given. Calls must
// therefore be decided in the order of their times for the windows to be the ones the stage
// would have seen. It is not safe for concurrent use.
type Replay struct {
	windows *Windows
	now     time.Time
}

// NewReplay returns a replay whose windows are empty.
func NewReplay() *Replay {
	r := &Replay{}
	r.windows = &Windows{KV: &memKV{data: map[string]memEntry{}}, Now: func() time.Time { return r.now }}
	return r
}

// Decide decides call of request m (the request message: its caller, when it was made, its
// deadline) at time at under rule (nil: the tool has no policy, and nothing is decided: nil),
// with k the tool's contract (nil for none). It returns the decision the stage would make:
// denied (allowed_roles, max_recipients), parked (confirm_required, before anyone decides),
// allowed, limited, or waited with the time the window has room (RetryAt) — a call that waits
// is decided again at that time, as the stage decides it when the wait ends.
func (r *Replay) Decide(at time.Time, m *protocol.Message, call *protocol.ToolCall, k *contract.Compiled, rule *Rule) *protocol.PolicyDecision {
	if rule == nil {
		return nil
	}
	j := rule.judge(callerRole(m), k, call)
	switch {
	case j.refusal != nil:
		return rule.decision(j.refusal.decision, j.refusal.rule, j.refusal.reason)
	case j.confirm:
		return rule.decision(protocol.PolicyParked, policy.RuleConfirmRequired, "the call waits for its approval")
	case !j.limit:
		return rule.decision(protocol.PolicyAllowed, "", "")
	}
	r.now = at
	p := rule.Policy
	ok, retry, err := r.windows.Take(context.Background(), WindowKey(call.Name, p.ScopeOrDefault(), callerKey(m)), *p.RateLimit, CallID(m.RequestID, call.ToolCallID))
	if err != nil { // an in-memory window is always read
		return rule.decision(protocol.PolicyUnavailable, policy.RuleRateLimit, err.Error())
	}
	if ok {
		return rule.decision(protocol.PolicyAllowed, "", "")
	}
	wait, over, limited := rule.overLimit(m, retry)
	if !wait {
		d := rule.decision(limited.decision, limited.rule, limited.reason)
		d.RetryAt = retry
		return d
	}
	d := rule.decision(protocol.PolicyWaited, policy.RuleRateLimit, over)
	d.RetryAt = retry
	return d
}

// memKV is a bucket in memory for Replay's windows: one goroutine, no history.
type memKV struct {
	rev  uint64
	data map[string]memEntry
}

var _ kv = (*memKV)(nil)

// memEntry is one key's value and revision.
type memEntry struct {
	jetstream.KeyValueEntry // nil: the methods Windows does not use are not there
	value                   []byte
	rev                     uint64
}

func (e memEntry) Value() []byte    { return e.value }
func (e memEntry) Revision() uint64 { return e.rev }

func (m *memKV) Get(_ context.Context, key string) (jetstream.KeyValueEntry, error) {
	e, ok := m.data[key]
	if !ok {
		return nil, jetstream.ErrKeyNotFound
	}
	return e, nil
}

func (m *memKV) Create(_ context.Context, key string, value []byte, _ ...jetstream.KVCreateOpt) (uint64, error) {
	if _, ok := m.data[key]; ok {
		return 0, jetstream.ErrKeyExists
	}
	return m.put(key, value), nil
}

func (m *memKV) Update(_ context.Context, key string, value []byte, revision uint64) (uint64, error) {
	if e, ok := m.data[key]; !ok || e.rev != revision {
		return 0, jetstream.ErrKeyRevisionMismatch
	}
	return m.put(key, value), nil
}

func (m *memKV) put(key string, value []byte) uint64 {
	m.rev++
	m.data[key] = memEntry{value: append([]byte(nil), value...), rev: m.rev}
	return m.rev
}
