// Package blueprints keeps blueprints (package pkg/blueprint says what one is) and runs them.
// Blueprints are versioned in the bus's hermes-blueprints bucket (Library); each run is kept in
// hermes-runs (Runs) and driven by an Engine: a run is a session on the bus (protocol.RunSession),
// each step a request of it whose id follows from the run id and the step's place, so that a
// run resumed after any crash never runs a finished step again. Every gateway runs an engine
// and a Resumer, which takes over the runs whose holder stopped renewing its lease.
package blueprints

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/versioned"
	"github.com/hermesbus/hermes/pkg/blueprint"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// The blueprints' buckets (bus.Config.Buckets).
const (
	// BlueprintsBucket holds the blueprints (key: the name), each apply a new revision.
	BlueprintsBucket = "hermes-blueprints"
	// RunsBucket holds the runs (key: the run id).
	RunsBucket = "hermes-runs"
)

// History is how many versions of a blueprint stay readable (and runnable: a run keeps the
// version it began with).
const History = 64

// keepRuns is how long a run is kept after its last change.
const keepRuns = 7 * 24 * time.Hour

// MaxRunBytes bounds a run as kept: its input, its steps' inputs and outputs.
const MaxRunBytes = 768 << 10

// MaxUserInputBytes bounds a run's user_input (compacted).
const MaxUserInputBytes = 64 << 10

// Buckets are the blueprints' buckets, written by gateways (which register blueprints and
// drive runs); strict, so that a run taken over is read as its last holder left it.
func Buckets() []bus.Bucket {
	return []bus.Bucket{
		{Name: BlueprintsBucket, Description: "Hermes: blueprints (composed tools), each version kept", MaxBytes: 16 << 20, History: History, Strict: true, Writers: []bus.Role{bus.RoleGateway}},
		{Name: RunsBucket, Description: "Hermes: the runs of blueprints, step by step", MaxBytes: 256 << 20, TTL: keepRuns, Strict: true, Writers: []bus.Role{bus.RoleGateway}},
	}
}

// Library keeps the blueprints: applied, versioned, read back compiled.
type Library struct {
	store *versioned.Store
	mu    sync.Mutex
	cache map[string]*blueprint.Blueprint // "name@version"
}

// NewLibrary returns the library kept in kv (BlueprintsBucket).
func NewLibrary(kv jetstream.KeyValue) *Library {
	return &Library{store: &versioned.Store{KV: kv, What: "blueprint", MaxBytes: blueprint.MaxBytes + 4096,
		Check: func(name string, doc json.RawMessage) error {
			b, err := blueprint.Parse(doc)
			if err != nil {
				return err
			}
			if b.Name != name {
				return fmt.Errorf("names %s", b.Name)
			}
			return nil
		}}}
}

// ErrNotFound: no such blueprint (or version).
var ErrNotFound = versioned.ErrNotFound

// Entry is a version of a blueprint as kept.
type Entry = versioned.Entry

// Apply makes b (compiled) its name's current blueprint, as a new version unless it is the
// current one already.
func (l *Library) Apply(ctx context.Context, b *blueprint.Blueprint, by string) (*Entry, bool, error) {
	doc, err := json.Marshal(b)
	if err != nil {
		return nil, false, err
	}
	return l.store.Apply(ctx, b.Name, doc, by)
}

// Remove ends a blueprint (its runs in flight go on under their version).
func (l *Library) Remove(ctx context.Context, name, by string) (*Entry, error) {
	return l.store.Remove(ctx, name, by)
}

// Get is a blueprint's current version.
func (l *Library) Get(ctx context.Context, name string) (*Entry, error) {
	return l.store.Get(ctx, name)
}

// History is every version kept of a blueprint, oldest first.
func (l *Library) History(ctx context.Context, name string) ([]*Entry, error) {
	return l.store.History(ctx, name)
}

// List is every current blueprint, by name.
func (l *Library) List(ctx context.Context) ([]*Entry, error) { return l.store.List(ctx) }

// Compiled implements Source: version of name, compiled once. Its tools are not looked up
// again: a tool gone since fails the step that calls it, at dispatch.
func (l *Library) Compiled(ctx context.Context, name string, version int) (*blueprint.Blueprint, error) {
	key := fmt.Sprintf("%s@%d", name, version)
	l.mu.Lock()
	b, ok := l.cache[key]
	l.mu.Unlock()
	if ok {
		return b, nil
	}
	e, err := l.store.Version(ctx, name, version)
	if err != nil {
		return nil, err
	}
	b, err = Decode(e)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	if l.cache == nil || len(l.cache) > 1024 {
		l.cache = map[string]*blueprint.Blueprint{}
	}
	l.cache[key] = b
	l.mu.Unlock()
	return b, nil
}

// Decode is the blueprint an entry keeps, compiled (its tools taken as known).
func Decode(e *Entry) (*blueprint.Blueprint, error) {
	return blueprint.Load(e.Doc, nil)
}

// NewRun is a run asked for.
type NewRun struct {
	RunID     string
	Blueprint string
	UserInput json.RawMessage
	Caller    *protocol.Caller
	Owner     string
	Trace     protocol.TraceContext
	// Holder, when set, holds the new run until LeaseUntil: the runner of the gateway that
	// begins it, so that no other takes it first.
	Holder     string
	LeaseUntil time.Time
}

// Errors of Begin.
var (
	// ErrBadInput: the run's user_input cannot start it (the message says why).
	ErrBadInput = errors.New("bad user_input")
	// ErrTooManyRuns: the caller has as many runs going as it may.
	ErrTooManyRuns = errors.New("too many runs")
	// ErrCheckUnavailable: the first step's contract could not be read to check the input;
	// nothing was begun (try again).
	ErrCheckUnavailable = errors.New("the first step's contract cannot be read now")
)

// CheckInput checks the arguments the first step would call tool with against its contract:
// an error wrapping ErrCheckUnavailable when the contract cannot be read now.
type CheckInput func(ctx context.Context, tool string, args json.RawMessage) error

// Begin keeps a new run of the blueprint's current version (or finds the same run asked
// before under its id: created false). user_input must be a JSON object whose first step's
// mapping finds every value, and whose arguments pass its tool's contract (check, when set).
func Begin(ctx context.Context, lib *Library, runs *Runs, nr NewRun, check CheckInput, now time.Time) (*Run, bool, error) {
	if err := protocol.CheckToolName("blueprint", nr.Blueprint); err != nil {
		return nil, false, err
	}
	e, err := lib.Get(ctx, nr.Blueprint)
	if err != nil {
		return nil, false, err
	}
	b, err := lib.Compiled(ctx, e.Name, e.Version)
	if err != nil {
		return nil, false, err
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, nr.UserInput); err != nil {
		return nil, false, fmt.Errorf("%w: user_input: %v", ErrBadInput, err)
	}
	if compact.Len() > MaxUserInputBytes {
		return nil, false, fmt.Errorf("%w: user_input: is %d bytes; at most %d", ErrBadInput, compact.Len(), MaxUserInputBytes)
	}
	nr.UserInput = compact.Bytes()
	in, err := decodeValue(nr.UserInput)
	if err != nil {
		return nil, false, fmt.Errorf("%w: user_input: %v", ErrBadInput, err)
	}
	if _, ok := in.(map[string]any); !ok {
		return nil, false, fmt.Errorf("%w: user_input: must be a JSON object", ErrBadInput)
	}
	if err := blueprint.CheckContext(map[string]any{"user_input": in}); err != nil {
		return nil, false, fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	// The first step, when it runs whatever happens, is checked before anything runs.
	if first := b.Nodes()[0]; len(first.Group) == 0 && first.Step.Condition == "" {
		args, err := first.Step.Inputs(map[string]any{"user_input": in})
		if err != nil {
			return nil, false, fmt.Errorf("%w: %v", ErrBadInput, err)
		}
		if check != nil {
			if err := check(ctx, first.Step.Tool, args); errors.Is(err, ErrCheckUnavailable) {
				return nil, false, err
			} else if err != nil {
				return nil, false, fmt.Errorf("%w: step %s (%s): %v", ErrBadInput, first.Step.ID(), first.Step.Tool, err)
			}
		}
	}
	r := &Run{RunID: nr.RunID, Blueprint: e.Name, Version: e.Version, SessionID: protocol.RunSession(nr.RunID),
		Caller: nr.Caller, Owner: nr.Owner, Trace: nr.Trace, UserInput: nr.UserInput,
		Fingerprint: Fingerprint(nr.Blueprint, nr.UserInput), Status: Pending, CreatedAt: now.UTC(), UpdatedAt: now.UTC(),
		Holder: nr.Holder, LeaseUntil: nr.LeaseUntil.UTC()}
	r.Steps = stepsOf(b)
	got, _, created, err := runs.Create(ctx, r)
	var big *BoundError
	if errors.As(err, &big) {
		return nil, false, fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	return got, created, err
}

// stepsOf are the steps a run of b begins with, each pending: every step and group member in
// order (fallback steps join when taken).
func stepsOf(b *blueprint.Blueprint) []StepRun {
	var out []StepRun
	for _, n := range b.Nodes() {
		steps := n.Group
		if len(steps) == 0 {
			steps = []*blueprint.Step{n.Step}
		}
		for _, s := range steps {
			out = append(out, StepRun{ID: s.ID(), Tool: s.Tool, OutputKey: s.OutputKey, Status: StepPending})
		}
	}
	return out
}
