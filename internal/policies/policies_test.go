package policies

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/router"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// newBus is a bus with the policies' buckets.
func newBus(t *testing.T) (*bustest.Server, *bus.Bus) {
	t.Helper()
	s := bustest.NewServer(t)
	return s, s.Provision(t, bus.Config{Buckets: Buckets()})
}

func mustPolicy(t testing.TB, js string) *policy.Policy {
	t.Helper()
	var p policy.Policy
	if err := json.Unmarshal([]byte(js), &p); err != nil {
		t.Fatal(err)
	}
	if err := p.Check("policy"); err != nil {
		t.Fatal(err)
	}
	return &p
}

// eventually polls cond for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 500 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("never: %s", what)
}

// Applies are versions: the same policy again writes nothing, a removal is a version of its
// own, and History shows them all.
func TestStoreVersionsApplies(t *testing.T) {
	t.Parallel()
	_, b := newBus(t)
	ctx := t.Context()
	s := NewStore(b.Bucket(PoliciesBucket))
	p1 := mustPolicy(t, `{"allowed_roles":["admin"]}`)
	e, changed, err := s.Apply(ctx, "meeting_book", p1, "key:a")
	if err != nil || !changed || e.Version != 1 || e.By != "key:a" {
		t.Fatalf("first apply: %+v %v %v", e, changed, err)
	}
	if e, changed, err = s.Apply(ctx, "meeting_book", mustPolicy(t, `{"allowed_roles":["admin"]}`), "key:b"); err != nil || changed || e.Version != 1 {
		t.Fatalf("the same again: %+v %v %v", e, changed, err)
	}
	if e, changed, err = s.Apply(ctx, "meeting_book", mustPolicy(t, `{"rate_limit":10}`), "key:a"); err != nil || !changed || e.Version != 2 {
		t.Fatalf("a change: %+v %v %v", e, changed, err)
	}
	if _, err := s.Remove(ctx, "meeting_book", "key:a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "meeting_book"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after removal: %v", err)
	}
	if _, err := s.Remove(ctx, "meeting_book", "key:a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("removed twice: %v", err)
	}
	e, _, err = s.Apply(ctx, "meeting_book", p1, "key:a")
	if err != nil || e.Version != 4 {
		t.Fatalf("applied after removal: %+v %v", e, err)
	}
	h, err := s.History(ctx, "meeting_book")
	if err != nil || len(h) != 4 || !h[2].Removed || h[3].Version != 4 {
		t.Fatalf("history: %+v %v", h, err)
	}
	if _, _, err := s.Apply(ctx, "notify_send", mustPolicy(t, `{"max_recipients":20}`), "key:a"); err != nil {
		t.Fatal(err)
	}
	all, err := s.List(ctx)
	if err != nil || len(all) != 2 || all[0].Tool != "meeting_book" || all[1].Tool != "notify_send" {
		t.Fatalf("list: %+v %v", all, err)
	}
	if _, _, err := s.Apply(ctx, "bad.tool", p1, "key:a"); err == nil {
		t.Fatal("a tool name that is no subject token was applied")
	}
	if _, _, err := s.Apply(ctx, "x", &policy.Policy{RateLimit: &policy.Rate{Count: 0, Per: time.Minute}}, "key:a"); err == nil {
		t.Fatal("an unchecked policy was applied")
	}
}

// The book follows the bucket live; an applied policy wins over the contract's block, and a
// removal gives the contract's back. What is no record refuses the tool's calls.
func TestBookFollowsAppliesAndFallsBackToTheContract(t *testing.T) {
	t.Parallel()
	_, b := newBus(t)
	ctx := t.Context()
	kv := b.Bucket(PoliciesBucket)
	book := NewBook(kv, nil)
	if _, err := book.Rule("x", nil); !errors.Is(err, ErrNotFollowing) {
		t.Fatalf("before Start: %v", err)
	}
	s := NewStore(kv)
	if _, _, err := s.Apply(ctx, "meeting_book", mustPolicy(t, `{"confirm_required":true}`), "key:a"); err != nil {
		t.Fatal(err)
	}
	if err := book.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var c contract.Contract
	if err := json.Unmarshal([]byte(`{"name":"meeting_book","policy":{"allowed_roles":["admin"]}}`), &c); err != nil {
		t.Fatal(err)
	}
	k, err := contract.Compile(&c, 3, 9)
	if err != nil {
		t.Fatal(err)
	}
	r, err := book.Rule("meeting_book", k)
	if err != nil || r.Source != SourcePolicy || r.Version != 1 || !r.Policy.ConfirmRequired {
		t.Fatalf("applied: %+v %v", r, err)
	}
	if !book.Offers("meeting_book", k, "user") {
		t.Error("the applied policy lets every role call it, yet it is not offered")
	}
	if _, err := s.Remove(ctx, "meeting_book", "key:a"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the contract's policy stands again", func() bool {
		r, err := book.Rule("meeting_book", k)
		return err == nil && r.Source == SourceContract && r.Version == 3
	})
	if book.Offers("meeting_book", k, "user") || !book.Offers("meeting_book", k, "admin") {
		t.Error("offers ignore the contract's allowed_roles")
	}
	if r, err := book.Rule("echo", nil); r != nil || err != nil {
		t.Errorf("a tool with no policy: %+v %v", r, err)
	}
	if _, err := kv.Put(ctx, "forged", []byte(`{"tool":"forged","version":1,"policy":{"rate_limit":"0/s"}}`)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "what is no policy refuses the tool", func() bool {
		_, err := book.Rule("forged", nil)
		return err != nil && !errors.Is(err, ErrNotFollowing)
	})
	if book.Offers("forged", nil, "admin") {
		t.Error("a tool whose policy cannot be read is offered")
	}
}

// However many routers count calls at once, no window lets more through than its rate, and a
// call counted before is let through again without counting twice.
func TestWindowsAreSharedByRouters(t *testing.T) {
	t.Parallel()
	s, b := newBus(t)
	second := s.Provision(t, bus.Config{Buckets: Buckets()})
	routers := []*Windows{{KV: b.Bucket(WindowsBucket)}, {KV: second.Bucket(WindowsBucket)}}
	rate := policy.Rate{Count: 10, Per: time.Minute}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, at, err := routers[i%2].Take(t.Context(), "t.tool", rate, CallID("r", fmt.Sprint(i)))
			switch {
			case err != nil:
				errs <- err
			case ok:
				allowed.Add(1)
			case at.Before(time.Now()):
				errs <- fmt.Errorf("refused with a retry time in the past: %v", at)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := allowed.Load(); n != 10 {
		t.Fatalf("%d calls let through; the rate is 10", n)
	}
	// A redelivered call that was counted runs again.
	e, err := b.Bucket(WindowsBucket).Get(t.Context(), "t.tool")
	if err != nil {
		t.Fatal(err)
	}
	calls, _ := decodeWindow(e.Value())
	again := calls[0].id
	if ok, _, err := routers[1].Take(t.Context(), "t.tool", rate, again); !ok || err != nil {
		t.Fatalf("a counted call again: %v %v", ok, err)
	}
}

// The window slides: a call is let through again once the oldest leaves it, and the retry
// time says when.
func TestWindowSlides(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	w := &Windows{KV: bustest.NewMemKV(), Now: func() time.Time { return now }}
	rate := policy.Rate{Count: 2, Per: time.Minute}
	take := func(n int) (bool, time.Time) {
		ok, at, err := w.Take(t.Context(), "k", rate, CallID("r", fmt.Sprint(n)))
		if err != nil {
			t.Fatal(err)
		}
		return ok, at
	}
	take(1)
	now = now.Add(20 * time.Second)
	take(2)
	if ok, at := take(3); ok || !at.Equal(time.Unix(1_000_060, 0)) {
		t.Fatalf("third in the window: %v %v", ok, at)
	}
	now = time.Unix(1_000_060, 1)
	if ok, _ := take(3); !ok {
		t.Fatal("the window did not slide")
	}
	if ok, at := take(4); ok || !at.Equal(time.Unix(1_000_080, 0)) {
		t.Fatalf("after sliding: %v %v", ok, at)
	}
	// What is no window is written over, never trusted.
	mem := bustest.NewMemKV()
	if _, err := mem.Put(t.Context(), "k", []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	w.KV = mem
	if ok, _ := take(5); !ok {
		t.Fatal("a garbled window kept refusing")
	}
}

func TestWindowKeysAreSubjectTokens(t *testing.T) {
	t.Parallel()
	a, b := WindowKey("notify_send", policy.ScopeCaller, "key:a#u1"), WindowKey("notify_send", policy.ScopeCaller, "key:a#u2")
	if a == b || strings.ContainsAny(a, " *>#:") || WindowKey("t", policy.ScopeTool, "x") != WindowKey("t", policy.ScopeTool, "y") {
		t.Fatalf("keys %q %q", a, b)
	}
}

// stageJob is a job of one call of tool with args, made by a caller of role.
func stageJob(t testing.TB, id, role, tool, args string) *router.Job {
	t.Helper()
	req := &protocol.Request{RequestID: id, SessionID: "s1", ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: tool, Arguments: json.RawMessage(args)}}}
	m, err := protocol.NewMessage(protocol.TypeRequest, req)
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDRequest(id), id, "s1"
	m.Caller = &protocol.Caller{ID: "key:k1", Role: role}
	raw, _ := protocol.Marshal(m)
	return router.NewJob(m, req, raw, "", slog.New(slog.DiscardHandler))
}

// rules is a fixed set of rules.
type rules map[string]*Rule

func (r rules) Rule(tool string, _ *contract.Compiled) (*Rule, error) { return r[tool], nil }

func compiled(t *testing.T, js string) *contract.Compiled {
	t.Helper()
	var c contract.Contract
	if err := json.Unmarshal([]byte(js), &c); err != nil {
		t.Fatal(err)
	}
	k, err := contract.Compile(&c, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The seed's policies decide calls as the seed says: a role not allowed is denied, more
// recipients than allowed are refused naming the count, the eleventh call in a minute is
// limited with a retry time; each names the rule and the policy's version.
func TestStageDecidesTheSeedPolicies(t *testing.T) {
	t.Parallel()
	f, err := policy.ParseFile([]byte(`policies:
  meeting_book:
    allowed_roles: [admin, manager]
    rate_limit: 10
  notify_send:
    max_recipients: 20
`))
	if err != nil {
		t.Fatal(err)
	}
	st := &Stage{Rules: rules{
		"meeting_book": {Tool: "meeting_book", Policy: f.Policies["meeting_book"], Source: SourcePolicy, Version: 2},
		"notify_send":  {Tool: "notify_send", Policy: f.Policies["notify_send"], Source: SourceContract, Version: 1},
	}, Windows: &Windows{KV: bustest.NewMemKV()}}
	run := func(j *router.Job, k *contract.Compiled) *router.Call {
		t.Helper()
		j.Calls[0].Contract = k
		if _, err := st.Process(t.Context(), j); err != nil {
			t.Fatal(err)
		}
		return j.Calls[0]
	}
	c := run(stageJob(t, "r-user", "user", "meeting_book", `{}`), nil)
	if c.Result == nil || c.Result.ErrorCode != protocol.CodePolicyDenied || c.Result.ErrorOrigin != protocol.OriginHermes ||
		c.Result.Policy.Rule != policy.RuleAllowedRoles || c.Result.Policy.Version != 2 || !strings.Contains(string(c.Result.Content), "policy v2 of meeting_book") {
		t.Fatalf("user: %+v", c.Result)
	}
	for i := range 10 {
		c = run(stageJob(t, fmt.Sprint("r-", i), "admin", "meeting_book", `{}`), nil)
		if !c.Pending() || c.Policy == nil || c.Policy.Decision != protocol.PolicyAllowed {
			t.Fatalf("call %d: %+v %+v", i, c.Result, c.Policy)
		}
	}
	c = run(stageJob(t, "r-11", "admin", "meeting_book", `{}`), nil)
	if c.Result == nil || c.Result.ErrorCode != protocol.CodeRateLimited || c.Result.Policy.RetryAt.IsZero() || c.Result.Policy.Decision != protocol.PolicyLimited {
		t.Fatalf("the 11th: %+v", c.Result)
	}
	// Another caller has a window of its own (scope caller, the default).
	j := stageJob(t, "r-other", "admin", "meeting_book", `{}`)
	j.Msg.Caller.ID = "key:k2"
	if c = run(j, nil); !c.Pending() {
		t.Fatalf("another caller: %+v", c.Result)
	}
	k := compiled(t, `{"name":"notify_send","recipients":["user_ids"]}`)
	ids := make([]string, 21)
	for i := range ids {
		ids[i] = fmt.Sprint("u", i)
	}
	args, _ := json.Marshal(map[string]any{"user_ids": ids, "text": "hi"})
	c = run(stageJob(t, "r-n", "user", "notify_send", string(args)), k)
	if c.Result == nil || c.Result.ErrorCode != protocol.CodePolicyDenied || !strings.Contains(string(c.Result.Content), "21 recipients") || c.Result.Policy.Source != SourceContract {
		t.Fatalf("21 recipients: %+v", c.Result)
	}
	args, _ = json.Marshal(map[string]any{"user_ids": ids[:20]})
	if c = run(stageJob(t, "r-n20", "user", "notify_send", string(args)), k); !c.Pending() {
		t.Fatalf("20 recipients: %+v", c.Result)
	}
	// A contract that names no recipients cannot be counted: refused, never guessed.
	if c = run(stageJob(t, "r-n0", "user", "notify_send", string(args)), nil); c.Result == nil || c.Result.ErrorCode != protocol.CodePolicyDenied {
		t.Fatalf("no recipients declared: %+v", c.Result)
	}
	// Sandbox requests go under no policy.
	j = stageJob(t, "sandbox-meeting_book-1-x", "user", "meeting_book", `{}`)
	j.Req.Sandbox = &protocol.Sandbox{Tool: "meeting_book", Revision: 1}
	if c = run(j, nil); !c.Pending() {
		t.Fatalf("sandbox: %+v", c.Result)
	}
}

// on_limit: wait holds the call until its window has room, bounded by max_wait and the
// request's deadline; beyond the bound it is limited at once.
func TestStageWaitsForTheWindow(t *testing.T) {
	t.Parallel()
	now := time.Now()
	p := mustPolicy(t, `{"rate_limit":"1/min","on_limit":"wait","max_wait":"2m","scope":"tool"}`)
	st := &Stage{Rules: rules{"t": {Tool: "t", Policy: p, Source: SourcePolicy, Version: 1}},
		Windows: &Windows{KV: bustest.NewMemKV(), Now: func() time.Time { return now }}}
	first := stageJob(t, "r1", "", "t", `{}`)
	if _, err := st.Process(t.Context(), first); err != nil || !first.Calls[0].Pending() {
		t.Fatalf("first: %+v %v", first.Calls[0].Result, err)
	}
	j := stageJob(t, "r2", "", "t", `{}`)
	j.Msg.CreatedAt = now
	if _, err := st.Process(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	c := j.Calls[0]
	if c.Hold == nil || c.Result != nil || !c.Hold.At.After(now.Add(59*time.Second)) || c.Hold.Key != protocol.WakeAt("rate.r2.c1") {
		t.Fatalf("held: %+v %+v", c.Hold, c.Result)
	}
	j = stageJob(t, "r3", "", "t", `{}`)
	j.Msg.CreatedAt = now
	j.Msg.Deadline = now.Add(10 * time.Second)
	if _, err := st.Process(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	if c = j.Calls[0]; c.Result == nil || c.Result.ErrorCode != protocol.CodeRateLimited || c.Hold != nil {
		t.Fatalf("past its deadline: %+v %+v", c.Hold, c.Result)
	}
}

// A window that cannot be read fails closed for a tool that may change something, and lets a
// lookup through; a call to confirm with no approvals kept is refused, never run.
func TestStageFailsClosed(t *testing.T) {
	t.Parallel()
	mem := bustest.NewMemKV()
	mem.Err = errors.New("nats: no responders available for request")
	p := mustPolicy(t, `{"rate_limit":"5/s"}`)
	st := &Stage{Rules: rules{
		"pay":     {Tool: "pay", Policy: p, Source: SourcePolicy, Version: 1},
		"lookup":  {Tool: "lookup", Policy: p, Source: SourcePolicy, Version: 1},
		"confirm": {Tool: "confirm", Policy: mustPolicy(t, `{"confirm_required":true}`), Source: SourcePolicy, Version: 1},
	}, Windows: &Windows{KV: mem}}
	j := stageJob(t, "r1", "admin", "pay", `{}`)
	j.Calls[0].Contract = compiled(t, `{"name":"pay","effects":"side_effects"}`)
	if _, err := st.Process(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	if c := j.Calls[0]; c.Result == nil || c.Result.ErrorCode != protocol.CodePolicyUnavailable || c.Result.Policy.Decision != protocol.PolicyUnavailable {
		t.Fatalf("pay: %+v", c.Result)
	}
	j = stageJob(t, "r2", "admin", "lookup", `{}`)
	j.Calls[0].Contract = compiled(t, `{"name":"lookup","effects":"none"}`)
	if _, err := st.Process(t.Context(), j); err != nil || !j.Calls[0].Pending() {
		t.Fatalf("lookup: %+v %v", j.Calls[0].Result, err)
	}
	j = stageJob(t, "r3", "admin", "confirm", `{}`)
	if _, err := st.Process(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	if c := j.Calls[0]; c.Result == nil || c.Result.ErrorCode != protocol.CodePolicyUnavailable {
		t.Fatalf("confirm: %+v", c.Result)
	}
	// Rules not known yet: the delivery is retried, the call never let through.
	st.Rules = NewBook(nil, nil)
	j = stageJob(t, "r4", "admin", "pay", `{}`)
	if _, err := st.Process(t.Context(), j); !errors.Is(err, ErrNotFollowing) || !j.Calls[0].Pending() {
		t.Fatalf("not following: %v", err)
	}
}

// What a window or a policy record holds is read only when it is one.
func FuzzDecodeWindowAndRecord(f *testing.F) {
	f.Add(encodeWindow([]call{{at: 1, id: CallID("r", "c")}}))
	f.Add([]byte(`{"tool":"t","version":1,"policy":{"rate_limit":"10/min"}}`))
	f.Add([]byte(`{"tool":"t","version":1,"removed":true}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if calls, err := decodeWindow(data); err == nil && len(calls)*entryBytes != len(data) {
			t.Fatalf("%d calls from %d bytes", len(calls), len(data))
		}
		if r, err := decodeRecord("t", data); err == nil && (r.Tool != "t" || r.Version < 1 || !r.Removed && r.Policy == nil) {
			t.Fatalf("decoded %+v", r)
		}
	})
}
