package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

func (a answeredSet) answered(_ context.Context, id, _ string) (bool, error) { return a[id], nil }

func TestSerialStage(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
	r := newSerialRig(t)
	answered, plans, process, mustGo, mustWait := r.answered, r.plans, r.process, r.mustGo, r.mustWait
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
	if v := process("y"); v.kind != stopIt || len(r.woke) != 1 || r.woke[0] != "y" {
		t.Fatalf("answered y: %+v, woke %v", v, r.woke)
	}
	// Once p, which ran, is answered, z goes: nothing before p is waited for.
	answered["p"] = true
	mustGo("z")
	// A request after z waits for z only: z ran.
	mustWait("w", "z")
	answered["z"] = true
	mustGo("w")
}

// resultKey names call's result of request id among the results plans holds.
func resultKey(id, call string) string { return id + "." + call }

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

func (p *plans) HaveResults(_ context.Context, id, _ string, calls []string) (map[string]bool, error) {
	have := map[string]bool{}
	for _, call := range calls {
		if p.results[resultKey(id, call)] {
			have[call] = true
		}
	}
	return have, nil
}

func (p *plans) AnswerFromResults(_ context.Context, id, _ string) error {
	p.republished = append(p.republished, id+" from results")
	return nil
}

func (p *plans) Announce(_ context.Context, id, _ string) (bool, error) {
	if p.answered[id] {
		p.republished = append(p.republished, id)
	}
	return p.answered[id], nil
}

func TestPlanStage(t *testing.T) {
	t.Parallel()
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
				p.plans["r1"] = bus.PlanOf(j.Msg, j.Req, now)
				p.results[resultKey("r1", "a")] = true
			},
			kind: goOn, done: []bool{true, false}, cancelled: []bool{false, false}},
		{name: "answered already: the response again, nothing else",
			before: func(p *plans, j *Job) {
				p.plans["r1"] = bus.PlanOf(j.Msg, j.Req, now)
				p.answered["r1"] = true
			},
			kind: stopIt, republished: true},
		{name: "request_id reused for other content",
			before: func(p *plans, j *Job) {
				other := *bus.PlanOf(j.Msg, j.Req, now)
				other.Fingerprint = "0000"
				p.plans["r1"] = &other
			},
			kind: stopIt},
		{name: "every call has its result but no response: one result again, for aggregation",
			before: func(p *plans, j *Job) {
				p.plans["r1"] = bus.PlanOf(j.Msg, j.Req, now)
				p.results[resultKey("r1", "a")] = true
				p.results[resultKey("r1", "b")] = true
			},
			kind: stopIt, done: []bool{true, true}, republished: true},
		{name: "planned by a cancellation that stopped half-way",
			before: func(p *plans, j *Job) {
				p.plans["r1"] = &bus.Plan{SessionID: "s", CallIDs: []string{"a", "b"}, Cancelled: true}
				p.results[resultKey("r1", "a")] = true
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
	p := bus.PlanOf(j.Msg, j.Req, now)
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
	// A serial request passing the serial stage for the first time: its plan (recorded at
	// intake) is found, and nothing else is looked up — nothing of it was dispatched.
	sp := newPlans()
	jf := job(t, "r5", "s", true, "echo", "a")
	sp.plans["r5"] = bus.PlanOf(jf.Msg, jf.Req, now)
	sp.plans["r5"].AtIntake = true
	sp.results[resultKey("r5", "a")] = true // would mark the call done if looked up
	jf.FirstPass = true
	if v, err := (&PlanStage{Plans: sp}).Process(ctx, jf); err != nil || v.kind != goOn || jf.Calls[0].Done || len(sp.republished) != 0 {
		t.Fatalf("first pass: %+v %v, done %v, announced %v", v, err, jf.Calls[0].Done, sp.republished)
	}
	// One older than the serial stage's marks are kept: they may have expired; its results
	// are looked up.
	jt := job(t, "r7", "s", true, "echo", "a")
	sp.plans["r7"] = bus.PlanOf(jt.Msg, jt.Req, now.Add(-13*time.Hour))
	sp.plans["r7"].AtIntake = true
	sp.results[resultKey("r7", "a")] = true
	jt.FirstPass = true
	if v, err := (&PlanStage{Plans: sp, StateTTL: 24 * time.Hour, Now: func() time.Time { return now }}).Process(ctx, jt); err != nil || v.kind != stopIt {
		t.Fatalf("first pass of a request older than half the state TTL: %+v %v (its one call has a result: answered from it)", v, err)
	}
	// Its plan recorded by a router of an earlier version (which marked nothing else): it
	// went, and its results are looked up.
	jo := job(t, "r6", "s", true, "echo", "a")
	sp.plans["r6"] = bus.PlanOf(jo.Msg, jo.Req, now)
	sp.results[resultKey("r6", "a")] = true
	jo.FirstPass = true
	if v, err := (&PlanStage{Plans: sp}).Process(ctx, jo); err != nil || v.kind != stopIt {
		t.Fatalf("first pass of a request a router planned: %+v %v (its one call has a result: answered from it)", v, err)
	}
	// Planned at intake, on its first delivery: the store is not asked.
	jp := job(t, "r4", "s", false, "echo", "a")
	jp.Planned = true
	if v, err := (&PlanStage{Plans: failing}).Process(ctx, jp); err != nil || v.kind != goOn || jp.Plan == nil || jp.Plan.Fingerprint == "" || jp.Calls[0].Done {
		t.Fatalf("planned at intake: %+v %v", v, err)
	}
}

func TestRouteStage(t *testing.T) {
	t.Parallel()
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
	// A router told of fewer kinds (one older than its workers, say) refuses the others.
	s := &RouteStage{Table: func() *routes.Table { return table }, Kinds: []string{protocol.ActionHTTP, protocol.ActionGo, protocol.ActionMCP},
		Ensure: func(_ context.Context, kind, tool string, _ int) error {
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
	s.Ensure = func(context.Context, string, string, int) error { return bustest.ErrUnreachable }
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
	t.Parallel()
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
	t.Parallel()
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
	}, Kinds: protocol.ImplementedKinds, Ensure: func(context.Context, string, string, int) error { return nil }}
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
	t.Parallel()
	r := newSerialRig(t)
	run := func(id string, out Outlet) {
		t.Helper()
		if err := (&Pipeline{Stages: []Stage{r.s}, Out: out}).Run(t.Context(), job(t, id, "s", true, "echo", "c")); err != nil {
			t.Fatal(err)
		}
	}
	r.mustGo("p")
	x := &outlet{}
	run("x", x)
	if len(x.parked) != 1 || x.emitted != nil {
		t.Fatalf("x: parked %v, emitted %v", x.parked, x.emitted)
	}
	y := &parkHookOutlet{onPark: func() { r.answered["x"], r.plans["x"] = true, false }}
	run("y", y)
	if y.emitted != nil {
		t.Fatalf("y was dispatched while p still runs (parked %v, unparked %d)", y.parked, y.unparked)
	}
	if len(r.woke) != 1 || r.woke[0] != "x" {
		t.Fatalf("woke %v, want y's copy woken from x's key", r.woke)
	}
	r.mustWait("y", "p") // woken
}

// Serial order records live under the state TTL. A request that went (passed the stage) and
// was answered without running lets its successors go, though the one before it is long gone;
// an unanswered one is waited for, whatever expired of its order.
func TestSerialOrderPastTheStateTTL(t *testing.T) {
	t.Parallel()
	expire := func(r *serialRig, ids ...string) {
		t.Helper()
		for _, id := range ids {
			if err := r.kv.Delete(t.Context(), protocol.KeySerialPrev(id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Run("stepping back to one whose response expired", func(t *testing.T) {
		r := newSerialRig(t)
		r.mustGo("p")
		r.answered["p"] = true
		r.mustGo("x")
		r.answered["x"], r.plans["x"] = true, false // cancelled before its router recorded its plan
		// p's order, mark, plan and response expire; x's order and the session's tail stay.
		expire(r, "p")
		if err := r.kv.Delete(t.Context(), protocol.KeySerialWent("p")); err != nil {
			t.Fatal(err)
		}
		delete(r.plans, "p")
		delete(r.answered, "p")
		r.mustGo("y")
	})
	t.Run("woken from a hold after its predecessor's response expired", func(t *testing.T) {
		// v answered; x arrives nearly a day later, goes, and a later stage holds one of its
		// calls. Woken after v's response expired (x's own order lives), x goes on: it went.
		r := newSerialRig(t)
		r.mustGo("v")
		r.answered["v"] = true
		r.mustGo("x")
		r.expireAll("v")
		woken := job(t, "x", "s", true, "echo", "c")
		woken.Woken, woken.WokenBy = true, protocol.WakeAt("x.c")
		if v, err := r.s.Process(t.Context(), woken); err != nil || v.kind != goOn {
			t.Fatalf("x woken from its hold: %+v %v", v, err)
		}
	})
	t.Run("stepped over one whose response then expired", func(t *testing.T) {
		// x stepped over cancelled w to wait for v; w's response expires before v answers.
		r := newSerialRig(t)
		r.mustGo("u")
		r.mustWait("v", "u")
		r.mustWait("w", "v")
		r.answered["w"], r.plans["w"] = true, false
		r.answered["u"] = true
		r.mustGo("v")
		r.mustWait("x", "v")
		r.expireAll("u", "w")
		r.answered["v"] = true
		woken := job(t, "x", "s", true, "echo", "c")
		woken.Woken, woken.WokenBy = true, protocol.WakeOnResponse("v")
		if v, err := r.s.Process(t.Context(), woken); err != nil || v.kind != goOn {
			t.Fatalf("x woken by v's response: %+v %v", v, err)
		}
	})
	t.Run("the tail expired between a request's order and its move", func(t *testing.T) {
		r := newSerialRig(t)
		r.mustGo("w")
		if _, err := r.kv.Create(t.Context(), protocol.KeySerialPrev("x"), []byte("w")); err != nil { // x's first delivery stopped here
			t.Fatal(err)
		}
		if err := r.kv.Delete(t.Context(), protocol.KeySerialTail("s")); err != nil {
			t.Fatal(err)
		}
		r.mustWait("x", "w") // redelivered
		r.mustWait("y", "x")
		// A woken request moved the tail before: one missing then is not taken back.
		if err := r.kv.Delete(t.Context(), protocol.KeySerialTail("s")); err != nil {
			t.Fatal(err)
		}
		r.answered["w"] = true
		woken := job(t, "x", "s", true, "echo", "c")
		woken.Woken, woken.WokenBy = true, protocol.WakeOnResponse("w")
		if v, err := r.s.Process(t.Context(), woken); err != nil || v.kind != goOn || r.kv.Value(protocol.KeySerialTail("s")) != nil {
			t.Fatalf("x woken: %+v %v, tail %q", v, err, r.kv.Value(protocol.KeySerialTail("s")))
		}
	})
	t.Run("stepping back to one woken and not yet handled", func(t *testing.T) {
		r := newSerialRig(t)
		r.mustGo("p")
		r.mustWait("x", "p")
		r.mustWait("y", "x")
		r.mustWait("z", "y")
		expire(r, "p", "x")
		r.answered["y"], r.plans["y"] = true, false // y cancelled: z's copy woken
		r.answered["p"] = true                      // p answered: x's copy woken, behind z's
		r.mustWait("z", "x")
		woken := job(t, "x", "s", true, "echo", "c")
		woken.Woken, woken.WokenBy = true, protocol.WakeOnResponse("p")
		if v, err := r.s.Process(t.Context(), woken); err != nil || v.kind != goOn {
			t.Fatalf("x woken: %+v %v", v, err)
		}
	})
	t.Run("stepping back to one still waiting", func(t *testing.T) {
		r := newSerialRig(t)
		r.mustGo("p") // dispatched, not answered: its tool's workers are down for a day
		r.mustWait("x", "p")
		r.mustWait("y", "x")
		r.mustWait("z", "y")
		expire(r, "p", "x")
		r.answered["y"], r.plans["y"] = true, false // cancelled while it waits
		r.mustWait("z", "x")
	})
	t.Run("redelivered while its predecessor still waits", func(t *testing.T) {
		r := newSerialRig(t)
		r.mustGo("p")
		r.mustWait("x", "p")
		r.mustWait("y", "x")
		expire(r, "x")
		r.mustWait("y", "x")
	})
	t.Run("woken from a hold after its own order expired", func(t *testing.T) {
		// y passed, and a later stage held one of its calls; z waits for y. Woken by the
		// hold's timer, y goes on: queued again it would wait for z, which waits for y.
		r := newSerialRig(t)
		r.mustGo("y")
		r.mustWait("z", "y")
		expire(r, "y")
		woken := job(t, "y", "s", true, "echo", "c")
		woken.Woken, woken.WokenBy = true, protocol.WakeAt("y.c")
		if v, err := r.s.Process(t.Context(), woken); err != nil || v.kind != goOn {
			t.Fatalf("y woken: %+v %v (prev.y=%q, tail=%q)", v, err, r.kv.Value(protocol.KeySerialPrev("y")), r.kv.Value(protocol.KeySerialTail("s")))
		}
	})
}

// serialRig is a serial stage over an in-memory session bucket and the answered requests and
// plans it reads; woke lists the requests whose successors it woke.
type serialRig struct {
	t        *testing.T
	s        *SerialStage
	kv       *bustest.MemKV
	answered answeredSet
	plans    planSet
	woke     []string
}

// expireAll removes what the state TTL reclaims of requests: their order, went marks, plans
// and responses.
func (r *serialRig) expireAll(ids ...string) {
	r.t.Helper()
	for _, id := range ids {
		for _, k := range []string{protocol.KeySerialPrev(id), protocol.KeySerialWent(id)} {
			if err := r.kv.Delete(r.t.Context(), k); err != nil {
				r.t.Fatal(err)
			}
		}
		delete(r.plans, id)
		delete(r.answered, id)
	}
}

// More requests answered without going than one delivery steps over: the request parks
// where it stopped, is woken at once, and steps on — it never goes while p runs, and goes
// once p is answered.
func TestSerialStageStepsOverMoreThanOneDeliveryFollows(t *testing.T) {
	t.Parallel()
	r := newSerialRig(t)
	r.mustGo("p")
	prev := "p"
	var ids []string
	for i := range 2*maxHops + 1 {
		id := fmt.Sprintf("c%03d", i)
		r.mustWait(id, prev)
		ids, prev = append(ids, id), id
	}
	for _, id := range ids {
		r.answered[id], r.plans[id] = true, false // all cancelled while they wait
	}
	for range 3 {
		if v := r.process("z"); v.kind != parkIt {
			t.Fatalf("z: %+v while p runs", v)
		}
	}
	if v := r.process("z"); v.kind != parkIt || v.wait.Key != protocol.WakeOnResponse("p") {
		t.Fatalf("z: %+v; want it to wait for p", v)
	}
	r.answered["p"] = true
	r.mustGo("z")
}

func newSerialRig(t *testing.T) *serialRig {
	r := &serialRig{t: t, kv: bustest.NewMemKV(), answered: answeredSet{}, plans: planSet{}}
	r.s = &SerialStage{Sessions: r.kv, Answered: r.answered.answered, Plan: r.plans.plan,
		WakeNext: func(_ context.Context, id string) error {
			r.woke = append(r.woke, id)
			return nil
		},
	}
	return r
}

func (r *serialRig) process(id string) Verdict {
	r.t.Helper()
	v, err := r.s.Process(r.t.Context(), job(r.t, id, "s", true, "echo", "c"))
	if err != nil {
		r.t.Fatalf("%s: %v", id, err)
	}
	return v
}

// mustGo processes id, which must go on; it is planned then, as the plan stage would.
func (r *serialRig) mustGo(id string) {
	r.t.Helper()
	if v := r.process(id); v.kind != goOn {
		r.t.Fatalf("%s: %+v; want it to go", id, v)
	}
	r.plans[id] = true
}

// mustWait processes id, which must park to wait for prev's response.
func (r *serialRig) mustWait(id, prev string) {
	r.t.Helper()
	if v := r.process(id); v.kind != parkIt || v.wait.Key != protocol.WakeOnResponse(prev) {
		r.t.Fatalf("%s: %+v; want it to wait for %s", id, v, prev)
	}
}

// A plan shows that its serial request passed the serial stage only when a router recorded it
// (the earlier version marked nothing else): one recorded at intake, or by a cancellation,
// shows nothing.
func TestSerialWentIgnoresPlansRecordedAtIntake(t *testing.T) {
	t.Parallel()
	plans := map[string]*bus.Plan{"intake": {AtIntake: true}, "router": {}, "cancelled": {Cancelled: true}}
	s := &SerialStage{Sessions: bustest.NewMemKV(), Plan: func(_ context.Context, id string) (*bus.Plan, error) {
		if p, ok := plans[id]; ok {
			return p, nil
		}
		return nil, bus.ErrNotFound
	}}
	for id, want := range map[string]bool{"intake": false, "router": true, "cancelled": false, "none": false} {
		if got, err := s.went(t.Context(), id); err != nil || got != want {
			t.Errorf("went(%s) = %v, %v; want %v", id, got, err, want)
		}
	}
	if err := s.markWent(t.Context(), "intake"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.went(t.Context(), "intake"); !got {
		t.Error("a request marked as gone did not go")
	}
}
