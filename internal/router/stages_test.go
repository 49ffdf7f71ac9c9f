package router

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/park"
	"github.com/hermesbus/hermes/internal/routes"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// job makes the job of request id in session with calls (name, id pairs).
func job(t *testing.T, id, session string, serial bool, calls ...string) *Job {
	t.Helper()
	req := &protocol.Request{RequestID: id, SessionID: session, Intent: "test", Serial: serial}
	for i := 0; i+1 < len(calls); i += 2 {
		req.ToolCalls = append(req.ToolCalls, protocol.ToolCall{Name: calls[i], ToolCallID: calls[i+1], Arguments: json.RawMessage(`{}`)})
	}
	m, err := protocol.NewMessage(protocol.TypeRequest, req)
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDRequest(id), id, req.Session()
	raw, _ := protocol.Marshal(m)
	return NewJob(m, req, raw, "", slog.New(slog.DiscardHandler))
}

// answeredSet is an answeredFunc over a set of answered requests.
type answeredSet map[string]bool

func (a answeredSet) answered(_ context.Context, id string) (bool, error) { return a[id], nil }

func TestSerialStage(t *testing.T) {
	ctx := t.Context()
	kv := bustest.NewMemKV()
	answered := answeredSet{}
	plans := planSet{"ser1": true, "ser2": true, "ser3": true, "other1": true}
	s := &SerialStage{Sessions: kv, Answered: answered.answered, Plan: plans.plan}

	// Not serial: through, and the session's order is not touched.
	if v, err := s.Process(ctx, job(t, "free", "s1", false, "echo", "c")); err != nil || v.kind != goOn || len(kv.Keys()) != 0 {
		t.Fatalf("free request: %+v %v, keys %v", v, err, kv.Keys())
	}
	// The first serial request of the session goes; it is the session's last now.
	if v, err := s.Process(ctx, job(t, "ser1", "s1", true, "echo", "c")); err != nil || v.kind != goOn {
		t.Fatalf("first: %+v %v", v, err)
	}
	if got := string(kv.Value(protocol.KeySerialTail("s1"))); got != "ser1" {
		t.Fatalf("tail %q", got)
	}
	// The second waits for the first's response, parked under its wake key.
	v, err := s.Process(ctx, job(t, "ser2", "s1", true, "echo", "c"))
	if err != nil || v.kind != parkIt || v.wait.Key != protocol.WakeOnResponse("ser1") || !v.wait.At.IsZero() {
		t.Fatalf("second: %+v %v", v, err)
	}
	// Its recheck says whether the first was answered meanwhile.
	if ok, err := v.recheck(ctx); ok || err != nil {
		t.Fatalf("recheck before the answer: %v %v", ok, err)
	}
	answered["ser1"] = true
	if ok, err := v.recheck(ctx); !ok || err != nil {
		t.Fatalf("recheck after the answer: %v %v", ok, err)
	}
	// Woken (or redelivered) once the first is answered: through, predecessor as recorded.
	if v, err := s.Process(ctx, job(t, "ser2", "s1", true, "echo", "c")); err != nil || v.kind != goOn {
		t.Fatalf("second, woken: %+v %v", v, err)
	}
	if got := string(kv.Value(protocol.KeySerialPrev("ser2"))); got != "ser1" {
		t.Fatalf("prev of ser2 %q", got)
	}
	// A third queues behind the second, not the first.
	if v, _ := s.Process(ctx, job(t, "ser3", "s1", true, "echo", "c")); v.kind != parkIt || v.wait.Key != protocol.WakeOnResponse("ser2") {
		t.Fatalf("third: %+v", v)
	}
	// A serial request answered while it waited (dead-lettered, cancelled) goes no further.
	answered["ser3"] = true
	if v, _ := s.Process(ctx, job(t, "ser3", "s1", true, "echo", "c")); v.kind != stopIt {
		t.Fatalf("answered: %+v", v)
	}
	// Another session has an order of its own.
	if v, _ := s.Process(ctx, job(t, "other1", "s2", true, "echo", "c")); v.kind != goOn {
		t.Fatalf("other session: %+v", v)
	}
	// A request woken after its recorded order expired (hermes-sessions has the state TTL)
	// knows its predecessor from the wake key, and does not wait for a later request.
	if err := kv.Delete(ctx, protocol.KeySerialPrev("ser3")); err != nil {
		t.Fatal(err)
	}
	answered["ser3"] = false
	answered["ser2"] = true
	woken := job(t, "ser3", "s1", true, "echo", "c")
	woken.Woken, woken.WokenBy = true, protocol.WakeOnResponse("ser2")
	if v, err := s.Process(ctx, woken); err != nil || v.kind != goOn {
		t.Fatalf("woken with its order forgotten: %+v %v", v, err)
	}
	// The session's last request, its order forgotten, waits for nothing (not for itself).
	if err := kv.Delete(ctx, protocol.KeySerialPrev("ser3")); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Process(ctx, job(t, "ser3", "s1", true, "echo", "c")); err != nil || v.kind != goOn {
		t.Fatalf("the tail, its order forgotten: %+v %v", v, err)
	}
	// The bus unreachable: an error, to be retried.
	kv.Err = bustest.ErrUnreachable
	if _, err := s.Process(ctx, job(t, "ser4", "s1", true, "echo", "c")); !errors.Is(err, bustest.ErrUnreachable) {
		t.Fatalf("unreachable: %v", err)
	}
}

// planSet is the Plan func of a SerialStage over plans recorded by tests: ran[id] true is a
// plan by a router, false a plan by a cancellation.
type planSet map[string]bool

func (p planSet) plan(_ context.Context, id string) (*bus.Plan, error) {
	ran, ok := p[id]
	if !ok {
		return nil, bus.ErrNotFound
	}
	return &bus.Plan{Cancelled: !ran}, nil
}

// A serial request redelivered before its predecessor answered (it failed to park, or its
// router died) still waits for it, though it is the session's last by then; an answered one
// lets its successor go on every delivery; predecessors answered without running (cancelled
// or dead-lettered while they waited) are stepped over to the one they waited for.
func TestSerialStageRedeliveriesAndPredecessorsThatNeverRan(t *testing.T) {
	ctx := t.Context()
	s, answered, plans, woke := newSerialStage()
	process := func(id string) Verdict {
		t.Helper()
		v, err := s.Process(ctx, job(t, id, "s", true, "echo", "c"))
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		return v
	}
	mustGo := func(id string) {
		t.Helper()
		if v := process(id); v.kind != goOn {
			t.Fatalf("%s: %+v; want it to go", id, v)
		}
		plans[id] = true // it passes the plan stage next
	}
	mustWait := func(id, prev string) {
		t.Helper()
		if v := process(id); v.kind != parkIt || v.wait.Key != protocol.WakeOnResponse(prev) {
			t.Fatalf("%s: %+v; want it to wait for %s", id, v, prev)
		}
	}
	mustGo("p")
	mustWait("x", "p")
	mustWait("x", "p") // redelivered: x is the tail now, and still waits for p
	mustWait("y", "x")
	mustWait("z", "y")
	// y and x are cancelled while they wait (answered, planned by the cancellation or not at
	// all); z, woken by them, waits for p, which still runs.
	answered["y"], plans["y"] = true, false
	mustWait("z", "x")
	answered["x"] = true
	mustWait("z", "p")
	// An answered request's every delivery lets its successor go.
	if v := process("y"); v.kind != stopIt || len(*woke) != 1 || (*woke)[0] != "y" {
		t.Fatalf("answered y: %+v, woke %v", v, *woke)
	}
	// Once p, which ran, is answered, z goes: nothing before p is waited for.
	answered["p"] = true
	mustGo("z")
	// A request after z waits for z only: z ran.
	mustWait("w", "z")
	answered["z"] = true
	mustGo("w")
}

// plans is a planStore in memory.
type plans struct {
	plans       map[string]*bus.Plan
	results     map[string]bool // request.call
	answered    map[string]bool
	republished []string
	err         error
}

func newPlans() *plans {
	return &plans{plans: map[string]*bus.Plan{}, results: map[string]bool{}, answered: map[string]bool{}}
}

func (p *plans) CreatePlan(_ context.Context, id string, plan *bus.Plan) (bool, *bus.Plan, error) {
	if p.err != nil {
		return false, nil, p.err
	}
	if have, ok := p.plans[id]; ok {
		return false, have, nil
	}
	p.plans[id] = plan
	return true, plan, nil
}

func (p *plans) HasResult(_ context.Context, id, call string) (bool, error) {
	return p.results[protocol.KeyResult(id, call)], nil
}

func (p *plans) AnswerFromResults(_ context.Context, id, _ string) error {
	p.republished = append(p.republished, id+" from results")
	return nil
}

func (p *plans) Republish(_ context.Context, id, _ string) (bool, error) {
	if p.answered[id] {
		p.republished = append(p.republished, id)
	}
	return p.answered[id], nil
}

func TestPlanStage(t *testing.T) {
	ctx := t.Context()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name        string
		before      func(p *plans, j *Job)
		kind        verdictKind
		done        []bool // per call
		cancelled   []bool // per call: decided CANCELLED
		republished bool
	}{
		{name: "first time", kind: goOn, done: []bool{false, false}, cancelled: []bool{false, false}},
		{name: "redelivered, one call has its result",
			before: func(p *plans, j *Job) {
				p.plans["r1"] = newPlan(j.Msg, j.Req, now)
				p.results[protocol.KeyResult("r1", "a")] = true
			},
			kind: goOn, done: []bool{true, false}, cancelled: []bool{false, false}},
		{name: "answered already: the response again, nothing else",
			before: func(p *plans, j *Job) {
				p.plans["r1"] = newPlan(j.Msg, j.Req, now)
				p.answered["r1"] = true
			},
			kind: stopIt, republished: true},
		{name: "request_id reused for other content",
			before: func(p *plans, j *Job) {
				other := *newPlan(j.Msg, j.Req, now)
				other.Fingerprint = "0000"
				p.plans["r1"] = &other
			},
			kind: stopIt},
		{name: "every call has its result but no response: one result again, for aggregation",
			before: func(p *plans, j *Job) {
				p.plans["r1"] = newPlan(j.Msg, j.Req, now)
				p.results[protocol.KeyResult("r1", "a")] = true
				p.results[protocol.KeyResult("r1", "b")] = true
			},
			kind: stopIt, done: []bool{true, true}, republished: true},
		{name: "planned by a cancellation that stopped half-way",
			before: func(p *plans, j *Job) {
				p.plans["r1"] = &bus.Plan{SessionID: "s", CallIDs: []string{"a", "b"}, Cancelled: true}
				p.results[protocol.KeyResult("r1", "a")] = true
			},
			kind: goOn, done: []bool{true, false}, cancelled: []bool{false, true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPlans()
			j := job(t, "r1", "s", false, "echo", "a", "echo", "b")
			if c.before != nil {
				c.before(p, j)
			}
			v, err := (&PlanStage{Plans: p, Now: func() time.Time { return now }}).Process(ctx, j)
			if err != nil || v.kind != c.kind {
				t.Fatalf("verdict %+v, %v; want kind %d", v, err, c.kind)
			}
			if j.Plan == nil || j.Plan != p.plans["r1"] {
				t.Fatalf("job plan %+v, recorded %+v", j.Plan, p.plans["r1"])
			}
			if (len(p.republished) == 1) != c.republished {
				t.Errorf("republished %v", p.republished)
			}
			for i, want := range c.done {
				if j.Calls[i].Done != want {
					t.Errorf("call %d done %v, want %v", i, j.Calls[i].Done, want)
				}
			}
			for i, want := range c.cancelled {
				got := j.Calls[i].Result != nil && j.Calls[i].Result.ErrorCode == protocol.CodeCancelled
				if got != want {
					t.Errorf("call %d cancelled %v, want %v (%+v)", i, got, want, j.Calls[i].Result)
				}
			}
		})
	}
	// The plan names the request: call ids and names in order, session, serial, fingerprint.
	j := job(t, "r2", "s", true, "echo", "a", "weather", "b")
	p := newPlan(j.Msg, j.Req, now)
	if strings.Join(p.CallIDs, ",") != "a,b" || strings.Join(p.Names, ",") != "echo,weather" || !p.Serial || p.SessionID != "s" ||
		p.RequestMsg != "request:r2" || len(p.Fingerprint) != 32 || !p.AcceptedAt.Equal(now) {
		t.Errorf("plan %+v", p)
	}
	// The store failing is an error, retried.
	failing := newPlans()
	failing.err = bustest.ErrUnreachable
	if _, err := (&PlanStage{Plans: failing}).Process(ctx, job(t, "r3", "s", false, "echo", "a")); !errors.Is(err, bustest.ErrUnreachable) {
		t.Fatalf("store failing: %v", err)
	}
}

func TestRouteStage(t *testing.T) {
	table, err := routes.Parse("routes.yaml", []byte(`version: 1.0
rules:
  - name: policy_by_name
    match: {tool_name: policy, intent_regex: '^(?P<who>\w+) asks'}
    action: {http: {url: 'http://svc/policy/{who}'}}
  - name: weather_go
    match: {tool_name: weather}
    action: {go: {timeout_ms: 500}}
  - name: lookup_grpc
    match: {tool_name: lookup}
    action: {grpc: {service: svc.Lookup, method: Get}}
`))
	if err != nil {
		t.Fatal(err)
	}
	var ensured []string
	s := &RouteStage{Table: func() *routes.Table { return table }, Kinds: protocol.ImplementedKinds,
		Ensure: func(_ context.Context, kind, tool string) error {
			ensured = append(ensured, kind+"/"+tool)
			return nil
		}}
	j := job(t, "r1", "s", false, "policy", "a", "weather", "b", "lookup", "c", "fax", "d", "policy", "e")
	j.Req.Intent = "alice asks for her policy"
	j.Calls[4].Done = true // has its result from an earlier delivery
	v, err := s.Process(t.Context(), j)
	if err != nil || v.kind != goOn {
		t.Fatalf("%+v %v", v, err)
	}
	a, b, c, d, e := j.Calls[0], j.Calls[1], j.Calls[2], j.Calls[3], j.Calls[4]
	if a.Dispatch == nil || a.Dispatch.Route != "policy_by_name" || a.Dispatch.Action.Kind != protocol.ActionHTTP || a.Dispatch.Params["who"] != "alice" {
		t.Errorf("http call: %+v", a.Dispatch)
	}
	if b.Dispatch == nil || b.Dispatch.Action.Kind != protocol.ActionGo || b.Dispatch.Action.TimeoutMS != 500 {
		t.Errorf("go call: %+v", b.Dispatch)
	}
	if c.Dispatch != nil || c.Result == nil || c.Result.ErrorCode != protocol.CodeActionUnsupported || c.Result.Route != "lookup_grpc" ||
		c.Result.ToolCallID != "c" || !strings.Contains(c.Result.RecoveryHint, "lookup_grpc") {
		t.Errorf("grpc call: %+v %+v", c.Dispatch, c.Result)
	}
	if d.Result == nil || d.Result.ErrorCode != protocol.CodeNoRoute || d.Result.ErrorOrigin != protocol.OriginHermes ||
		d.Result.Name != "fax" || !strings.Contains(d.Result.RecoveryHint, "routes.yaml") {
		t.Errorf("unrouted call: %+v", d.Result)
	}
	if e.Dispatch != nil || e.Result != nil {
		t.Errorf("a call that has its result was routed again: %+v %+v", e.Dispatch, e.Result)
	}
	if strings.Join(ensured, ",") != "http/policy,go/weather" {
		t.Errorf("consumers ensured: %v", ensured)
	}
	// A consumer that cannot be made fails the delivery, to be retried.
	s.Ensure = func(context.Context, string, string) error { return bustest.ErrUnreachable }
	if _, err := s.Process(t.Context(), job(t, "r2", "s", false, "weather", "a")); !errors.Is(err, bustest.ErrUnreachable) {
		t.Fatalf("ensure failing: %v", err)
	}
}

// outlet records what a pipeline hands it.
type outlet struct {
	parked   []park.Wait
	unparked int
	emitted  *Job
	err      error
}

func (o *outlet) Park(_ context.Context, _ *Job, w park.Wait) (func(context.Context) error, error) {
	o.parked = append(o.parked, w)
	return func(context.Context) error { o.unparked++; return nil }, o.err
}

func (o *outlet) Emit(_ context.Context, j *Job) error {
	o.emitted = j
	return o.err
}

// stageFunc is a Stage from a function.
type stageFunc struct {
	name string
	f    func(*Job) (Verdict, error)
}

func (s stageFunc) Name() string { return s.name }
func (s stageFunc) Process(_ context.Context, j *Job) (Verdict, error) {
	return s.f(j)
}

func TestPipeline(t *testing.T) {
	ctx := t.Context()
	var ran []string
	step := func(name string, v Verdict, err error) Stage {
		return stageFunc{name, func(*Job) (Verdict, error) { ran = append(ran, name); return v, err }}
	}
	wait := park.Wait{Key: protocol.WakeOnResponse("prev")}
	permanent := bus.Permanent(errors.New("bad request"))
	for _, c := range []struct {
		name    string
		stages  []Stage
		ran     string
		parked  int
		emitted bool
		err     string
	}{
		{"all continue", []Stage{step("a", Continue(), nil), step("b", Continue(), nil)}, "a,b", 0, true, ""},
		{"stop", []Stage{step("a", Stop(), nil), step("b", Continue(), nil)}, "a", 0, false, ""},
		{"park", []Stage{step("a", Park(wait, nil), nil), step("b", Continue(), nil)}, "a", 1, false, ""},
		{"park, then the recheck lets it go",
			[]Stage{step("a", Park(wait, func(context.Context) (bool, error) { return true, nil }), nil), step("b", Continue(), nil)}, "a,b", 1, true, ""},
		{"park, the recheck fails",
			[]Stage{step("a", Park(wait, func(context.Context) (bool, error) { return false, bustest.ErrUnreachable }), nil)}, "a", 1, false, "router: a: recheck"},
		{"an error names its stage", []Stage{step("a", Continue(), nil), step("b", Continue(), permanent)}, "a,b", 0, false, "router: b: bad request"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ran = nil
			o := &outlet{}
			err := (&Pipeline{Stages: c.stages, Out: o}).Run(ctx, job(t, "r1", "s", false, "echo", "a"))
			if strings.Join(ran, ",") != c.ran || len(o.parked) != c.parked || (o.emitted != nil) != c.emitted {
				t.Errorf("ran %v, parked %v, emitted %v", ran, o.parked, o.emitted != nil)
			}
			// A delivery that goes on after parking takes its parked copy out.
			if want := map[bool]int{true: 1}[c.parked == 1 && c.emitted]; o.unparked != want {
				t.Errorf("unparked %d times, want %d", o.unparked, want)
			}
			if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
				t.Errorf("error %v, want %q", err, c.err)
			}
		})
	}
	// A permanent error stays permanent through the pipeline: the request is dead-lettered.
	err := (&Pipeline{Stages: []Stage{step("a", Continue(), permanent)}, Out: &outlet{}}).Run(ctx, job(t, "r1", "s", false, "echo", "a"))
	if !bus.IsPermanent(err) {
		t.Errorf("%v lost its permanence", err)
	}
}

// A coming stage — an approval, a rate limit — holds one call while the others go: the calls
// it does not hold reach the outlet to be dispatched, the held one parks the request.
func TestAStageHoldsOneCall(t *testing.T) {
	hold := park.Wait{Key: protocol.WakeAt("r1.b"), At: time.Now().Add(time.Hour)}
	approval := stageFunc{"approval", func(j *Job) (Verdict, error) {
		for _, c := range j.Calls {
			if c.Call.Name == "notify_send" && c.Pending() {
				c.Hold = &hold
			}
		}
		return Continue(), nil
	}}
	route := &RouteStage{Table: func() *routes.Table {
		t, _ := routes.Parse("r.yaml", []byte("version: 1.0\nrules:\n  - name: any\n    match: {tool_name: echo}\n    action: {http: {url: 'http://x/'}}\n  - name: notify\n    match: {tool_name: notify_send}\n    action: {http: {url: 'http://x/n'}}\n"))
		return t
	}, Kinds: protocol.ImplementedKinds, Ensure: func(context.Context, string, string) error { return nil }}
	o := &outlet{}
	j := job(t, "r1", "s", false, "echo", "a", "notify_send", "b")
	if err := (&Pipeline{Stages: []Stage{approval, route}, Out: o}).Run(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	if o.emitted == nil || j.Calls[0].Dispatch == nil || j.Calls[1].Dispatch != nil || j.Calls[1].Hold == nil || *j.Calls[1].Hold != hold {
		t.Fatalf("emitted %v; a %+v; b dispatch %+v hold %+v", o.emitted != nil, j.Calls[0].Dispatch, j.Calls[1].Dispatch, j.Calls[1].Hold)
	}
}

// parkHookOutlet runs onPark as a request parks: what happens between a stage's check and
// the parking.
type parkHookOutlet struct {
	outlet
	onPark func()
}

func (o *parkHookOutlet) Park(ctx context.Context, j *Job, w park.Wait) (func(context.Context) error, error) {
	if o.onPark != nil {
		o.onPark()
	}
	return o.outlet.Park(ctx, j, w)
}

// y parks to wait for x, and x is cancelled in between (answered, never run): the recheck
// does not let y go — p still runs — but wakes y's parked copy at once, to wait for p.
func TestSerialRecheckStepsOverAPredecessorCancelledMeanwhile(t *testing.T) {
	ctx := t.Context()
	s, answered, plans, woke := newSerialStage()
	run := func(id string, out Outlet) {
		t.Helper()
		if err := (&Pipeline{Stages: []Stage{s}, Out: out}).Run(ctx, job(t, id, "s", true, "echo", "c")); err != nil {
			t.Fatal(err)
		}
	}
	run("p", &outlet{})
	plans["p"] = true // planned: it runs
	x := &outlet{}
	run("x", x)
	if len(x.parked) != 1 || x.emitted != nil {
		t.Fatalf("x: parked %v, emitted %v", x.parked, x.emitted)
	}
	y := &parkHookOutlet{onPark: func() { answered["x"], plans["x"] = true, false }}
	run("y", y)
	if y.emitted != nil {
		t.Fatalf("y was dispatched while p still runs (parked %v, unparked %d)", y.parked, y.unparked)
	}
	if len(*woke) != 1 || (*woke)[0] != "x" {
		t.Fatalf("woke %v, want y's copy woken from x's key", *woke)
	}
	// Woken, y waits for p.
	if v, err := s.Process(ctx, job(t, "y", "s", true, "echo", "c")); err != nil || v.kind != parkIt || v.wait.Key != protocol.WakeOnResponse("p") {
		t.Fatalf("woken y: %+v %v; want it to wait for p", v, err)
	}
}

// Stepping back over a request that never ran reaches one whose order and response expired
// (older than the state TTL): nothing is waited for, rather than a response that will never
// come.
func TestSerialStageStepsBackToAnExpiredPredecessor(t *testing.T) {
	ctx := t.Context()
	kv := bustest.NewMemKV()
	answered, plans := answeredSet{}, planSet{}
	s := &SerialStage{Sessions: kv, Answered: answered.answered, Plan: plans.plan}
	process := func(id string) Verdict {
		t.Helper()
		v, err := s.Process(ctx, job(t, id, "s", true, "echo", "c"))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := process("p"); v.kind != goOn {
		t.Fatalf("p: %+v", v)
	}
	plans["p"], answered["p"] = true, true
	if v := process("x"); v.kind != goOn {
		t.Fatalf("x: %+v", v)
	}
	answered["x"], plans["x"] = true, false // cancelled before its router recorded its plan
	// p's order, then its response, expire; x's order and the session's tail stay.
	if err := kv.Delete(ctx, protocol.KeySerialPrev("p")); err != nil {
		t.Fatal(err)
	}
	delete(answered, "p")
	if v := process("y"); v.kind != goOn {
		t.Fatalf("y: %+v (waits for %q); nothing before it runs, and nothing would wake it", v, v.wait.Key)
	}
}

// newSerialStage returns a serial stage over an in-memory session bucket, the answered
// requests and plans it reads, and the list of requests it woke the successors of.
func newSerialStage() (*SerialStage, answeredSet, planSet, *[]string) {
	answered, plans, woke := answeredSet{}, planSet{}, &[]string{}
	return &SerialStage{Sessions: bustest.NewMemKV(), Answered: answered.answered, Plan: plans.plan, WakeNext: func(_ context.Context, id string) error {
		*woke = append(*woke, id)
		return nil
	}}, answered, plans, woke
}
