package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/approvals"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/internal/wake"
	"github.com/hermesbus/hermes/pkg/blueprint"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Blueprints over HTTP: registered at /api/v1/blueprints (reading needs a caller who may
// submit, changing tools:admin), run at POST /v1/blueprints/{name}/runs and followed at
// GET /v1/runs/{run_id}. Every gateway drives the runs it begins, and takes over those whose
// gateway stopped (package blueprints).

// blueprintsAPI is what the gateway keeps for blueprints; nil fields without the buckets.
type blueprintsAPI struct {
	lib     *blueprints.Library
	runs    *blueprints.Runs
	engine  *blueprints.Engine
	resumer *blueprints.Resumer
	// ended wakes those waiting for a run this gateway drives when it ends (by run id).
	ended *wake.Waiters
	// begins serializes the beginning of one owner's runs (by ownerStripe).
	begins [64]sync.Mutex

	// listed is the blueprints as last listed for the doors, at listedAt: read again once a
	// second old, so that a chat message or an MCP listing does not read the bucket each time.
	mu       sync.Mutex
	listed   []*blueprints.Entry
	listedAt time.Time
}

// current is every current blueprint, as read at most a second ago.
func (b *blueprintsAPI) current(ctx context.Context) ([]*blueprints.Entry, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.listedAt.IsZero() || time.Since(b.listedAt) > time.Second {
		all, err := b.lib.List(ctx)
		if err != nil {
			return nil, err
		}
		b.listed, b.listedAt = all, time.Now()
	}
	return b.listed, nil
}

// ownerStripe picks owner's lock among blueprintsAPI.begins.
func ownerStripe(owner string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(owner))
	return int(h.Sum32() % 64)
}

// MaxRunsPerCaller bounds the blueprint runs one caller has going at once.
const MaxRunsPerCaller = 32

func (g *Gateway) registerBlueprints() {
	if g.cfg.Bus == nil || g.cfg.Bus.Bucket(blueprints.BlueprintsBucket) == nil || g.cfg.Bus.Bucket(blueprints.RunsBucket) == nil {
		return
	}
	runsKV := g.cfg.Bus.Bucket(blueprints.RunsBucket)
	lib := blueprints.NewLibrary(g.cfg.Bus.Bucket(blueprints.BlueprintsBucket))
	runs := &blueprints.Runs{KV: runsKV, MaxBytes: min(blueprints.MaxRunBytes, g.cfg.Bus.MaxMessageBytes()-64<<10)}
	eng := &blueprints.Engine{Runs: runs, Source: lib, Submit: g.submit, Instance: g.cfg.Instance, Log: g.log.With("part", "blueprints")}
	if g.approvals.decisions != nil {
		eng.Approvals = g.approvals.decisions
	}
	eng.Events = eventPublisher{g.cfg.Bus.NewPublisher(protocol.Sender{Role: protocol.RoleGateway, Instance: g.cfg.Instance})}
	ended := &wake.Waiters{}
	eng.Observe = func(r *blueprints.Run) {
		if r.Status.Final() {
			ended.Wake(r.RunID)
		}
	}
	g.blueprints = blueprintsAPI{lib: lib, runs: runs, engine: eng, ended: ended,
		resumer: &blueprints.Resumer{KV: runsKV, Engine: eng, Log: g.log.With("part", "blueprints")}}
	g.mux.HandleFunc("GET /api/v1/blueprints", g.require(auth.PermSubmit, g.handleListBlueprints))
	g.mux.HandleFunc("GET /api/v1/blueprints/{name}", g.require(auth.PermSubmit, g.handleGetBlueprint))
	g.mux.HandleFunc("GET /api/v1/blueprints/{name}/versions", g.require(auth.PermSubmit, g.handleBlueprintVersions))
	g.mux.HandleFunc("POST /api/v1/blueprints", g.require(auth.PermToolsAdmin, g.handleApplyBlueprint))
	g.mux.HandleFunc("DELETE /api/v1/blueprints/{name}", g.require(auth.PermToolsAdmin, g.handleRemoveBlueprint))
	g.mux.HandleFunc("POST /v1/blueprints/{name}/runs", g.require(auth.PermSubmit, g.handleStartRun))
	g.mux.HandleFunc("GET /v1/runs/{run_id}", g.require(auth.PermSubmit, g.handleGetRun))
}

// eventPublisher publishes a run's events.
type eventPublisher struct{ p *bus.Publisher }

func (e eventPublisher) Publish(ctx context.Context, subject string, m *protocol.Message) error {
	_, err := e.p.Publish(ctx, subject, m)
	return err
}

// BlueprintView is a blueprint's version as the API shows it.
type BlueprintView struct {
	Name      string               `json:"name"`
	Version   int                  `json:"version"`
	Revision  uint64               `json:"revision"`
	AppliedAt time.Time            `json:"applied_at"`
	By        string               `json:"by,omitempty"`
	Removed   bool                 `json:"removed,omitempty"`
	Blueprint *blueprint.Blueprint `json:"blueprint,omitempty"`
	// Changed (apply only): false when the blueprint was applied already as it is.
	Changed *bool `json:"changed,omitempty"`
}

func blueprintView(e *blueprints.Entry) BlueprintView {
	v := BlueprintView{Name: e.Name, Version: e.Version, Revision: e.Revision, AppliedAt: e.AppliedAt, By: e.By, Removed: e.Removed}
	if !e.Removed {
		if b, err := blueprint.Parse(e.Doc); err == nil {
			v.Blueprint = b
		}
	}
	return v
}

func (g *Gateway) handleApplyBlueprint(w http.ResponseWriter, r *http.Request) {
	if !g.toolsAdmin(w) {
		return
	}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if !contractTypes[mt] {
		writeError(w, http.StatusUnsupportedMediaType, protocol.CodeUnsupportedMediaType,
			"a blueprint is sent as JSON (Content-Type: application/json) or YAML (application/yaml)", nil)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, blueprint.MaxBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, protocol.CodeBodyTooLarge, fmt.Sprintf("a blueprint is at most %d bytes", blueprint.MaxBytes), nil)
			return
		}
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, "could not read the request body: "+err.Error(), nil)
		return
	}
	b, err := blueprint.Parse(body)
	if err == nil {
		var known func(string) bool
		if known, err = g.knownTools(r.Context()); err != nil {
			g.log.Error("read the tools to check a blueprint", "err", err)
			writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the tools could not be read to check the blueprint; nothing was applied; retry", nil)
			return
		}
		err = b.Compile(known)
	}
	if err != nil {
		writeBlueprintError(w, err)
		return
	}
	e, changed, err := g.blueprints.lib.Apply(r.Context(), b, byOf(r))
	if err != nil {
		g.log.Error("apply a blueprint", "blueprint", b.Name, "err", err)
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the blueprint could not be applied; retry (applying it again is safe)", nil)
		return
	}
	v := blueprintView(e)
	v.Changed = &changed
	status := http.StatusOK
	if changed {
		status = http.StatusCreated
		g.log.Info("blueprint applied", "blueprint", e.Name, "version", e.Version, "by", e.By)
	}
	writeJSON(w, status, v)
}

// writeBlueprintError answers 400 INVALID_BLUEPRINT naming the step, field and line of err.
func writeBlueprintError(w http.ResponseWriter, err error) {
	var body apiError
	body.Error.Code, body.Error.Message = protocol.CodeInvalidBlueprint, err.Error()
	var be *blueprint.Error
	if errors.As(err, &be) {
		body.Error.Field, body.Error.Line = be.Step, be.Line
		if be.Field != "" {
			body.Error.Field = be.Step + "." + be.Field
			if be.Step == "" {
				body.Error.Field = be.Field
			}
		}
	}
	writeJSON(w, http.StatusBadRequest, body)
}

// knownTools says which tools are known here: registered (a contract) or served (the tools'
// bucket), read once.
func (g *Gateway) knownTools(ctx context.Context) (func(string) bool, error) {
	known, err := g.servedTools(ctx)
	if err != nil {
		return nil, err
	}
	if g.tools != nil {
		entries, damaged, err := g.tools.List(ctx)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if !e.Removed {
				known[e.Contract.Name] = true
			}
		}
		for _, n := range damaged {
			known[n] = true
		}
	}
	return func(name string) bool { return known[name] }, nil
}

// isBlueprint reports whether name is a registered blueprint (a policy may guard it as it
// guards a tool).
func (g *Gateway) isBlueprint(ctx context.Context, name string) bool {
	if g.blueprints.lib == nil {
		return false
	}
	_, err := g.blueprints.lib.Get(ctx, name)
	return err == nil
}

// BlueprintList is GET /api/v1/blueprints.
type BlueprintList struct {
	Blueprints []BlueprintView `json:"blueprints"`
}

func (g *Gateway) handleListBlueprints(w http.ResponseWriter, r *http.Request) {
	all, err := g.blueprints.lib.List(r.Context())
	if err != nil {
		g.log.Warn("list blueprints", "err", err)
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the blueprints cannot be read now; retry", nil)
		return
	}
	out := BlueprintList{Blueprints: []BlueprintView{}}
	for _, e := range all {
		out.Blueprints = append(out.Blueprints, blueprintView(e))
	}
	writeJSON(w, http.StatusOK, out)
}

// blueprintEntry answers a blueprint store error; false when it did.
func (g *Gateway) blueprintErr(w http.ResponseWriter, name string, err error) bool {
	switch {
	case err == nil:
		return true
	case errors.Is(err, blueprints.ErrNotFound):
		writeError(w, http.StatusNotFound, protocol.CodeNotFound, fmt.Sprintf("no blueprint %s is registered", name), nil)
	default:
		g.log.Warn("read a blueprint", "blueprint", name, "err", err)
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the blueprints cannot be read now; retry", nil)
	}
	return false
}

func (g *Gateway) handleGetBlueprint(w http.ResponseWriter, r *http.Request) {
	name, ok := toolName(w, r)
	if !ok {
		return
	}
	e, err := g.blueprints.lib.Get(r.Context(), name)
	if g.blueprintErr(w, name, err) {
		writeJSON(w, http.StatusOK, blueprintView(e))
	}
}

func (g *Gateway) handleBlueprintVersions(w http.ResponseWriter, r *http.Request) {
	name, ok := toolName(w, r)
	if !ok {
		return
	}
	all, err := g.blueprints.lib.History(r.Context(), name)
	if !g.blueprintErr(w, name, err) {
		return
	}
	out := BlueprintList{Blueprints: []BlueprintView{}}
	for _, e := range all {
		out.Blueprints = append(out.Blueprints, blueprintView(e))
	}
	writeJSON(w, http.StatusOK, out)
}

func (g *Gateway) handleRemoveBlueprint(w http.ResponseWriter, r *http.Request) {
	if !g.toolsAdmin(w) {
		return
	}
	name, ok := toolName(w, r)
	if !ok {
		return
	}
	e, err := g.blueprints.lib.Remove(r.Context(), name, byOf(r))
	if g.blueprintErr(w, name, err) {
		g.log.Info("blueprint removed", "blueprint", name, "version", e.Version, "by", e.By)
		writeJSON(w, http.StatusOK, blueprintView(e))
	}
}

// runBody is POST /v1/blueprints/{name}/runs.
type runBody struct {
	// RunID makes the run idempotent: the same run asked again under it is the first one.
	RunID     string          `json:"run_id,omitempty"`
	UserInput json.RawMessage `json:"user_input"`
}

// handleStartRun begins a run of a blueprint (or finds the one begun under its run_id) and
// drives it; ?wait=DURATION waits for it to end (at most the gateway's longest wait).
func (g *Gateway) handleStartRun(w http.ResponseWriter, r *http.Request) {
	name, ok := toolName(w, r)
	if !ok {
		return
	}
	wait, err := g.runWait(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, err.Error(), err)
		return
	}
	var body runBody
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, g.cfg.MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, "the body is a JSON object {\"run_id\": …, \"user_input\": {…}}: "+err.Error(), nil)
		return
	}
	a, ok := actorOf(w, r, "")
	if !ok {
		return
	}
	trace, err := traceOf(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, err.Error(), err)
		return
	}
	run, created, err := g.RunBlueprint(r.Context(), a, BlueprintRun{Name: name, RunID: body.RunID, UserInput: body.UserInput, Trace: trace, Wait: wait})
	var refused *RunRefusal
	switch {
	case errors.As(err, &refused):
		if refused.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int(refused.RetryAfter.Seconds())))
		}
		writeError(w, refused.Status, refused.Code, refused.Message, nil)
		return
	case err != nil:
		if ar := admission.AsRefusal(err); ar != nil {
			writeRefusal(w, ar)
			return
		}
		if r.Context().Err() == nil {
			writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the bus is not reachable; retry with the same run_id", nil)
		}
		return
	}
	w.Header().Set("Location", "/v1/runs/"+run.RunID)
	status := http.StatusAccepted
	switch {
	case run.Status.Final():
		status = http.StatusOK
	case created:
		status = http.StatusCreated
	}
	writeJSON(w, status, run)
}

// BlueprintRun is a run a door asks for.
type BlueprintRun = blueprints.Ask

// RunRefusal is why a run was not begun, as a door answers it.
type RunRefusal = blueprints.Refusal

// RunBlueprint begins a run of a blueprint for actor a (or finds the one begun under its
// run_id: created false), drives it, and waits for it up to br.Wait. A run refused is a
// *RunRefusal (or an *admission.Refusal); other errors are the bus's. Every door runs
// blueprints through it: the same permissions, policy and bounds apply to each.
func (g *Gateway) RunBlueprint(ctx context.Context, a admission.Actor, br BlueprintRun) (*blueprints.Run, bool, error) {
	if g.blueprints.lib == nil {
		return nil, false, &RunRefusal{Status: http.StatusNotFound, Code: protocol.CodeNotFound, Message: "this gateway runs no blueprints (the bus has no blueprints' buckets)"}
	}
	if len(br.UserInput) == 0 {
		return nil, false, &RunRefusal{Status: http.StatusBadRequest, Code: protocol.CodeInvalidRequest, Message: "user_input: is required (a JSON object)"}
	}
	if br.RunID == "" {
		var b [12]byte
		_, _ = rand.Read(b[:])
		br.RunID = "run-" + hex.EncodeToString(b[:])
	}
	if !protocol.ValidToken(br.RunID, protocol.MaxRunIDLen) {
		return nil, false, &RunRefusal{Status: http.StatusBadRequest, Code: protocol.CodeInvalidRequest,
			Message: fmt.Sprintf("run_id: at most %d letters, digits, '-' and '_'", protocol.MaxRunIDLen)}
	}
	if !g.Offers(br.Name, nil, a.Role()) {
		return nil, false, &RunRefusal{Status: http.StatusForbidden, Code: protocol.CodePolicyDenied,
			Message: fmt.Sprintf("the policy of %s does not let role %q run it", br.Name, a.Role())}
	}
	trace := br.Trace
	if trace.TraceID == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		trace.TraceID = hex.EncodeToString(b[:])
	}
	hold := admission.HoldNone
	if br.Wait > 0 {
		hold = admission.HoldWaiting // a wait for the run's end is one of the caller's waiting requests
	}
	t, err := g.admit.Admit(ctx, admission.Ask{Actor: a, Need: auth.PermSubmit, Session: protocol.RunSession(br.RunID), Size: len(br.UserInput), Hold: hold})
	if err != nil {
		return nil, false, err
	}
	defer t.Close()
	run, created, err := g.beginRun(ctx, t, br, trace)
	if err != nil {
		return nil, false, err
	}
	if created {
		g.log.Info("blueprint run begun", "blueprint", br.Name, "version", run.Version, "run_id", run.RunID, "session_id", run.SessionID)
	}
	if !run.Status.Final() {
		g.blueprints.engine.Start(g.runCtx, run.RunID)
	}
	if br.Wait > 0 && !run.Status.Final() {
		run = g.awaitRun(ctx, run, br.Wait)
	}
	return run, created, nil
}

// beginRun begins br's run for the caller t admitted (or finds it), counting it against the
// caller's bound: one begin at a time per owner here, counted before the next is checked, so
// that concurrent POSTs of one caller cannot pass the bound together at this gateway (across
// gateways a run counts once the others' watches deliver it).
func (g *Gateway) beginRun(ctx context.Context, t *admission.Ticket, br BlueprintRun, trace protocol.TraceContext) (*blueprints.Run, bool, error) {
	lock := &g.blueprints.begins[ownerStripe(t.Owner)]
	lock.Lock()
	defer lock.Unlock()
	if n := g.blueprints.resumer.Going(t.Owner); n >= MaxRunsPerCaller {
		if run, _, err := g.blueprints.runs.Get(ctx, br.RunID); err != nil || run.Owner != t.Owner {
			return nil, false, &RunRefusal{Status: http.StatusTooManyRequests, Code: protocol.CodeTooManyRuns, RetryAfter: 5 * time.Second,
				Message: fmt.Sprintf("you have %d blueprint runs going; at most %d at once: wait for one to end", n, MaxRunsPerCaller)}
		}
	}
	run, created, err := blueprints.Begin(ctx, g.blueprints.lib, g.blueprints.runs, blueprints.NewRun{RunID: br.RunID, Blueprint: br.Name,
		UserInput: br.UserInput, Caller: t.Caller, Owner: t.Owner, Trace: trace,
		Holder: g.cfg.Instance, LeaseUntil: time.Now().Add(g.blueprints.engine.LeaseFor())}, g.checkInput, time.Now())
	t.Accepted(err == nil && created)
	var fe *protocol.FieldError
	switch {
	case errors.Is(err, blueprints.ErrNotFound):
		return nil, false, &RunRefusal{Status: http.StatusNotFound, Code: protocol.CodeNotFound, Message: fmt.Sprintf("no blueprint %s is registered", br.Name)}
	case errors.Is(err, blueprints.ErrBadInput):
		return nil, false, &RunRefusal{Status: http.StatusBadRequest, Code: protocol.CodeInvalidRequest, Message: err.Error()}
	case errors.Is(err, blueprints.ErrRunConflict):
		return nil, false, &RunRefusal{Status: http.StatusConflict, Code: protocol.CodeRunIDConflict, Message: err.Error()}
	case errors.As(err, &fe):
		return nil, false, &RunRefusal{Status: http.StatusBadRequest, Code: protocol.CodeInvalidRequest, Message: err.Error()}
	case errors.Is(err, blueprints.ErrFull):
		g.log.Error("the runs' bucket is full", "err", err)
		return nil, false, &RunRefusal{Status: http.StatusInsufficientStorage, Code: protocol.CodeStoreFull, RetryAfter: 30 * time.Second,
			Message: "the blueprint runs' store is full: no run can begin until runs age out (they are kept 7 days)"}
	case err != nil:
		g.log.Error("begin a blueprint run", "blueprint", br.Name, "run_id", br.RunID, "err", err)
		return nil, false, err
	}
	if created {
		g.blueprints.resumer.Note(run) // one asked again is counted (or not) as the watch says
	}
	return run, created, nil
}

// Blueprints are the current blueprints a caller of role may run, compiled (for the doors
// that offer them as tools: MCP tools/list, the chat loop).
func (g *Gateway) Blueprints(ctx context.Context, role string) ([]*blueprint.Blueprint, error) {
	if g.blueprints.lib == nil {
		return nil, nil
	}
	all, err := g.blueprints.current(ctx)
	if err != nil {
		return nil, err
	}
	var out []*blueprint.Blueprint
	for _, e := range all {
		b, err := g.blueprints.lib.Compiled(ctx, e.Name, e.Version)
		if err != nil || !g.Offers(e.Name, nil, role) {
			continue
		}
		out = append(out, b)
	}
	return out, nil
}

// runWait reads ?wait= (0 when absent).
func (g *Gateway) runWait(r *http.Request) (time.Duration, error) {
	s := r.URL.Query().Get("wait")
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("wait: a duration such as 30s (got %q)", protocol.Shorten(s, 40))
	}
	return min(d, g.cfg.MaxWait), nil
}

// awaitRun waits until run ends, wait passes or ctx ends, and returns it as last read.
func (g *Gateway) awaitRun(ctx context.Context, run *blueprints.Run, wait time.Duration) *blueprints.Run {
	// A run this gateway drives wakes the wait as it ends; one driven elsewhere is read again
	// every quarter second.
	ended, stop := g.blueprints.ended.Add(run.RunID)
	defer stop()
	if got, _, err := g.blueprints.runs.Get(ctx, run.RunID); err == nil {
		run = got // it may have ended before the wait began
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for !run.Status.Final() {
		select {
		case <-ctx.Done():
			return run
		case <-timer.C:
			return run
		case <-ended:
		case <-tick.C:
		}
		if got, _, err := g.blueprints.runs.Get(ctx, run.RunID); err == nil {
			run = got
		}
	}
	return run
}

// checkInput checks a first step's arguments against its tool's contract, if it has one.
func (g *Gateway) checkInput(ctx context.Context, tool string, args json.RawMessage) error {
	if g.tools == nil {
		return nil
	}
	e, err := g.tools.Get(ctx, tool)
	if errors.Is(err, registry.ErrNotFound) || errors.Is(err, registry.ErrDamaged) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: %v", blueprints.ErrCheckUnavailable, err)
	}
	k, err := contract.Compile(&e.Contract, e.Version, e.Revision)
	if err != nil {
		return nil
	}
	return k.CheckInput(args)
}

// handleGetRun is GET /v1/runs/{run_id}: the run, to whoever may read its session.
func (g *Gateway) handleGetRun(w http.ResponseWriter, r *http.Request) {
	a, ok := actorOf(w, r, "")
	if !ok {
		return
	}
	wait, err := g.runWait(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, err.Error(), err)
		return
	}
	id := r.PathValue("run_id")
	run, _, err := g.blueprints.runs.Get(r.Context(), id)
	if err == nil {
		see := a.ReadsAll() || approvals.Identity(a.Record()) == approvals.Identity(run.Caller)
		if !see {
			see, err = g.admit.MayRead(r.Context(), a, run.SessionID)
		}
		if err == nil && !see {
			err = blueprints.ErrRunNotFound
		}
	}
	switch {
	case errors.Is(err, blueprints.ErrRunNotFound):
		writeError(w, http.StatusNotFound, protocol.CodeNotFound, fmt.Sprintf("no run %s is known (or it is older than runs are kept)", protocol.Shorten(id, 100)), nil)
	case err != nil:
		g.log.Warn("read a run", "run_id", id, "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the runs cannot be read now", nil)
	default:
		if wait > 0 {
			// A wait is one of the caller's waiting requests, bounded as theirs are.
			t, ok := g.admitted(r.Context(), w, admission.Ask{Actor: a, Need: auth.PermSubmit, Mode: admission.NoSession,
				Hold: admission.HoldWaiting, Store: admission.StoreNone})
			if !ok {
				return
			}
			defer t.Close()
			run = g.awaitRun(r.Context(), run, wait)
		}
		writeJSON(w, http.StatusOK, run)
	}
}
