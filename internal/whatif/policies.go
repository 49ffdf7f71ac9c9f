package whatif

import (
	"cmp"
	"container/heap"
	"slices"
	"strconv"
	"time"

	"github.com/hermesbus/hermes/internal/policies"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// SourceFile is the source of the decisions Policies.Compare makes under a policy file.
const SourceFile = "file"

// Contracts gives the tools' contracts the calls are decided with (what max_recipients counts,
// and a contract's policy block for a tool the policy file leaves out): nil for a tool with
// none.
type Contracts func(tool string) *contract.Compiled

// PolicyCall is one recorded call decided again under a policy file.
type PolicyCall struct {
	RequestID  string
	SessionID  string
	ToolCallID string
	Tool       string
	// At is when the call's request was recorded: when the call is decided again.
	At time.Time
	// Before is what the tool's policy decided first, by the record; After what the file's
	// policies decide. Nil is a call no policy decided: allowed (no policy).
	Before, After *protocol.PolicyDecision
}

// PolicyReport is the outcome of [Policies.Compare].
type PolicyReport struct {
	// Requests and Calls count what was compared, each request once.
	Requests, Calls int
	// Duplicates counts request records ignored because their request_id was recorded before.
	Duplicates int
	// Unreadable counts recorded requests that could not be read.
	Unreadable int
	// Changed are the calls the file's policies decide differently, in the order of their
	// requests' times.
	Changed []PolicyCall
	// NotDecided are the calls of which nothing after their request is on record (no
	// dispatch, result or policy event: the request was still in flight, or no router ran),
	// with After set; they are not compared.
	NotDecided []PolicyCall
}

// Policies collects recorded requests and what their tools' policies decided about each call,
// for [Policies.Compare]. The zero value is ready to use; it is not safe for concurrent use.
type Policies struct {
	requests   []recordedRequest
	seen       map[string]bool
	first      map[callKey]*protocol.PolicyDecision // the first decision on record
	recorded   map[callKey]bool                     // something of the call after its request is on record
	duplicates int
	unreadable int
}

type recordedRequest struct {
	at  time.Time
	msg *protocol.Message
	req *protocol.Request
}

func (p *Policies) init() {
	if p.seen == nil {
		p.seen, p.first, p.recorded = map[string]bool{}, map[callKey]*protocol.PolicyDecision{}, map[callKey]bool{}
	}
}

// Add adds a decoded message of the record, stored at at: requests (the first record of a
// request_id; a later one is a duplicate), tool calls (the decision a dispatch carries),
// tool results (the decision of a refusal) and policy events. Other types are ignored. The
// first decision recorded for a call is the one compared: a wait before the call ran, a
// parking before its approval.
func (p *Policies) Add(at time.Time, m *protocol.Message, payload any) {
	p.init()
	decided := func(callID string, d *protocol.PolicyDecision) {
		k := callKey{m.RequestID, callID}
		p.recorded[k] = true
		if d != nil && p.first[k] == nil {
			p.first[k] = d
		}
	}
	switch v := payload.(type) {
	case *protocol.Request:
		if p.seen[v.RequestID] {
			p.duplicates++
			return
		}
		p.seen[v.RequestID] = true
		p.requests = append(p.requests, recordedRequest{at: at, msg: m, req: v})
	case *protocol.Dispatch:
		decided(v.Call.ToolCallID, v.Policy)
	case *protocol.ToolResult:
		decided(v.ToolCallID, v.Policy)
	case *protocol.PolicyEvent:
		d := v.Decision
		decided(v.ToolCallID, &d)
	}
}

// AddUnreadable counts a recorded request that could not be read; it cannot be compared.
func (p *Policies) AddUnreadable() { p.unreadable++ }

// Compare decides every call of every recorded request again under the policies of f, as the
// router's policy stage would (policies.Replay): a tool f names goes under f's policy, any
// other under its contract's policy block (contracts; nil reads none), as when f is applied.
// Calls are decided in the order of their requests' times, a call that would wait decided
// again when its window has room, so rate windows fill as they would have; a call that would
// be parked for approval is not counted in a window (when it runs depends on a person).
// Sandbox requests go under no policy. It runs nothing and publishes nothing.
func (p *Policies) Compare(f *policy.File, contracts Contracts) *PolicyReport {
	p.init()
	rep := &PolicyReport{Requests: len(p.requests), Duplicates: p.duplicates, Unreadable: p.unreadable}
	if contracts == nil {
		contracts = func(string) *contract.Compiled { return nil }
	}
	rule := func(tool string, k *contract.Compiled) *policies.Rule {
		if pol, ok := f.Policies[tool]; ok {
			return &policies.Rule{Tool: tool, Policy: pol, Source: SourceFile}
		}
		if k != nil && k.Policy != nil && !k.Policy.Empty() {
			return &policies.Rule{Tool: tool, Policy: k.Policy, Source: policies.SourceContract, Version: k.Version}
		}
		return nil
	}
	reqs := slices.Clone(p.requests)
	// Stable: requests of the same time stay in record order.
	slices.SortStableFunc(reqs, func(a, b recordedRequest) int { return a.at.Compare(b.at) })
	q := &decisions{}
	for _, r := range reqs {
		for i := range r.req.ToolCalls {
			c := &r.req.ToolCalls[i]
			rep.Calls++
			heap.Push(q, &pending{at: r.at, seq: q.seq, r: r, call: c})
			q.seq++
		}
	}
	type decided struct {
		call  PolicyCall
		order int
	}
	var out []decided
	rp := policies.NewReplay()
	for q.Len() > 0 {
		pd := heap.Pop(q).(*pending)
		k := contracts(pd.call.Name)
		var d *protocol.PolicyDecision
		if pd.r.req.Sandbox == nil {
			d = rp.Decide(pd.at, pd.r.msg, pd.call, k, rule(pd.call.Name, k))
		}
		if pd.again {
			// Decided again once its wait ends: only the windows change; the first
			// decision, the wait, is what is compared.
			if d != nil && d.Decision == protocol.PolicyWaited {
				pd.at = d.RetryAt
				heap.Push(q, pd)
			}
			continue
		}
		out = append(out, decided{order: pd.seq, call: PolicyCall{RequestID: pd.r.req.RequestID, SessionID: pd.r.req.Session(),
			ToolCallID: pd.call.ToolCallID, Tool: pd.call.Name, At: pd.r.at, After: d}})
		if d != nil && d.Decision == protocol.PolicyWaited {
			pd.at, pd.again = d.RetryAt, true
			heap.Push(q, pd)
		}
	}
	slices.SortStableFunc(out, func(a, b decided) int { return cmp.Compare(a.order, b.order) })
	for _, o := range out {
		c := o.call
		key := callKey{c.RequestID, c.ToolCallID}
		if !p.recorded[key] {
			rep.NotDecided = append(rep.NotDecided, c)
			continue
		}
		c.Before = p.first[key]
		if !SameDecision(c.Before, c.After) {
			rep.Changed = append(rep.Changed, c)
		}
	}
	return rep
}

// SameDecision reports whether two decisions are the same: the same decision (nil is
// allowed, with no policy) and, for a call kept from running or held, the same rule.
func SameDecision(a, b *protocol.PolicyDecision) bool {
	da, db := decisionOf(a), decisionOf(b)
	if da != db {
		return false
	}
	return da == protocol.PolicyAllowed || a.Rule == b.Rule
}

func decisionOf(d *protocol.PolicyDecision) string {
	if d == nil {
		return protocol.PolicyAllowed
	}
	return d.Decision
}

// Decided says a decision in a few words: "allowed (no policy)", "allowed (file)",
// "denied: allowed_roles (policy v2)".
func Decided(d *protocol.PolicyDecision) string {
	if d == nil {
		return protocol.PolicyAllowed + " (no policy)"
	}
	s := d.Decision
	if d.Rule != "" {
		s += ": " + d.Rule
	}
	switch {
	case d.Source == SourceFile:
		s += " (" + SourceFile + ")"
	case d.Source != "":
		s += " (" + d.Source + " v" + strconv.Itoa(d.Version) + ")"
	}
	return s
}

// pending is a call waiting to be decided, at its time.
type pending struct {
	at    time.Time
	seq   int
	r     recordedRequest
	call  *protocol.ToolCall
	again bool // decided before: it waits for its window
}

// decisions is a queue of calls by time, then record order.
type decisions struct {
	items []*pending
	seq   int
}

func (q *decisions) Len() int { return len(q.items) }
func (q *decisions) Less(i, j int) bool {
	if c := q.items[i].at.Compare(q.items[j].at); c != 0 {
		return c < 0
	}
	return q.items[i].seq < q.items[j].seq
}
func (q *decisions) Swap(i, j int) { q.items[i], q.items[j] = q.items[j], q.items[i] }
func (q *decisions) Push(x any)    { q.items = append(q.items, x.(*pending)) }
func (q *decisions) Pop() any {
	n := len(q.items)
	it := q.items[n-1]
	q.items = q.items[:n-1]
	return it
}
