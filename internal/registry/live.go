package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/kvwatch"
	"github.com/hermesbus/hermes/pkg/contract"
)

// ErrDamaged: what the bucket holds for a tool cannot be read as its contract. Calls to the
// tool are refused rather than run unchecked.
var ErrDamaged = errors.New("registry: the tool's contract record is damaged")

// Live is the registry as it is now, followed as it changes once Start has run: every change
// written to the bucket is seen as soon as the server delivers it. At works without Start
// (it reads versions by revision). It is safe for concurrent use.
type Live struct {
	store *Store
	kv    jetstream.KeyValue
	log   *slog.Logger

	versions contract.Versions // versions asked for by revision

	mu        sync.RWMutex
	following bool
	current   map[string]current
}

type current struct {
	c   *contract.Compiled
	err error
}

// ErrNotFollowing is Current's error before Start has run: what is current is not known.
var ErrNotFollowing = errors.New("registry: the contracts are not followed yet")

// NewLive returns the registry kept in kv (bus.Bus.Contracts), not yet followed.
func NewLive(kv jetstream.KeyValue, log *slog.Logger) *Live {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Live{store: NewStore(kv), kv: kv, log: log, versions: contract.Versions{KV: kv}, current: map[string]current{}}
}

// Follow returns the registry kept in kv, followed until ctx ends (NewLive, then Start).
func Follow(ctx context.Context, kv jetstream.KeyValue, log *slog.Logger) (*Live, error) {
	l := NewLive(kv, log)
	return l, l.Start(ctx)
}

// Start follows the bucket until ctx ends, returning once every contract it holds is known.
// Should the watch end before ctx, what is current is not known until it is watched again
// (Current says ErrNotFollowing meanwhile: calls are refused, never run unchecked).
func (l *Live) Start(ctx context.Context) error {
	f := &kvwatch.Follower{What: "the contracts", Log: l.log, Apply: l.apply,
		Watch: func(ctx context.Context) (jetstream.KeyWatcher, error) { return l.kv.Watch(ctx, toolKeys) },
		Following: func(on bool) {
			l.mu.Lock()
			l.following = on
			l.mu.Unlock()
		}}
	if err := f.Start(ctx); err != nil {
		return fmt.Errorf("registry: follow the contracts: %w", err)
	}
	return nil
}

// apply takes one change of the bucket. A change that is no contract record Hermes wrote — a
// record that cannot be read or compiled, a delete or purge (the registry never deletes: a
// removal is a record) — leaves the version in use as it was, still checked, and is logged;
// a tool that had none is refused until registered again.
func (l *Live) apply(e jetstream.KeyValueEntry) {
	name := e.Key()
	var c *contract.Compiled
	rec, err := decodeRecord(name, e.Value())
	switch {
	case e.Operation() != jetstream.KeyValuePut:
		err = fmt.Errorf("the key was %s outside the registry", map[bool]string{true: "deleted", false: "purged"}[e.Operation() == jetstream.KeyValueDelete])
	case err == nil && !rec.Removed:
		if c, err = contract.Compile(&rec.Contract, rec.Version, e.Revision()); err != nil {
			err = fmt.Errorf("version %d does not compile: %w", rec.Version, err)
		}
	}
	l.mu.RLock()
	had := l.current[name].c != nil
	l.mu.RUnlock()
	if err != nil && !had {
		// Nothing in use yet (a follower starting): the last version that is one serves.
		if good, gerr := l.lastGood(name); gerr == nil && good != nil {
			l.log.Error("the last change of a contract is no registration; its last version is used", "tool", name,
				"revision", e.Revision(), "version", good.Version, "err", err)
			l.mu.Lock()
			l.current[name] = current{c: good}
			l.mu.Unlock()
			return
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err != nil && l.current[name].c != nil:
		l.log.Error("a change of a contract that is no registration; the version in use is kept", "tool", name,
			"revision", e.Revision(), "kept_version", l.current[name].c.Version, "err", err)
	case err != nil:
		l.log.Error("a contract record that cannot be used; calls to the tool are refused until it is registered again", "tool", name, "revision", e.Revision(), "err", err)
		l.current[name] = current{err: fmt.Errorf("%w: %s (revision %d)", ErrDamaged, name, e.Revision())}
	case rec.Removed:
		delete(l.current, name)
		l.log.Info("contract removed", "tool", name, "version", rec.Version)
	default:
		l.current[name] = current{c: c}
		l.log.Info("contract in use", "tool", name, "version", rec.Version, "revision", e.Revision())
	}
}

// lastGood returns the last version the bucket keeps of name that is a contract, compiled; nil
// when it keeps none (or the last registration is a removal).
func (l *Live) lastGood(name string) (*contract.Compiled, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	all, err := l.store.History(ctx, name)
	if err != nil {
		return nil, err
	}
	last := all[len(all)-1]
	if last.Removed {
		return nil, nil
	}
	return contract.Compile(&last.Contract, last.Version, last.Revision)
}

// Current returns the tool's contract now: nil when it has none, ErrDamaged when what the
// bucket holds for it cannot be used, ErrNotFollowing before Start.
func (l *Live) Current(name string) (*contract.Compiled, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if !l.following {
		return nil, ErrNotFollowing
	}
	cur := l.current[name]
	return cur.c, cur.err
}

// At returns the version of the tool's contract at revision, compiled: the current one, or one
// read from the bucket (contract.Versions). An error wrapping contract.ErrUnavailable says the
// bucket no longer holds it, or holds no contract there.
func (l *Live) At(ctx context.Context, name string, revision uint64) (*contract.Compiled, error) {
	l.mu.RLock()
	cur := l.current[name]
	l.mu.RUnlock()
	if cur.c != nil && cur.c.Revision == revision {
		return cur.c, nil
	}
	return l.versions.At(ctx, name, revision)
}

// All returns every tool's contract now, by name; ErrNotFollowing before Start. A tool whose
// record cannot be used is left out.
func (l *Live) All() ([]*contract.Compiled, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if !l.following {
		return nil, ErrNotFollowing
	}
	out := make([]*contract.Compiled, 0, len(l.current))
	for _, cur := range l.current {
		if cur.c != nil {
			out = append(out, cur.c)
		}
	}
	slices.SortFunc(out, func(a, b *contract.Compiled) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Tools returns every tool's contract now: as followed, or — before the contracts are
// followed, or while they cannot be — read from the bucket and compiled (nothing is kept of
// them: the followed registry is the only one remembered). A tool whose record cannot be used
// is left out.
func (l *Live) Tools(ctx context.Context) ([]*contract.Compiled, error) {
	if all, err := l.All(); err == nil {
		return all, nil
	}
	entries, _, err := l.store.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*contract.Compiled, 0, len(entries))
	for _, e := range entries {
		if k, err := contract.Compile(&e.Contract, e.Version, e.Revision); err == nil {
			out = append(out, k)
		}
	}
	return out, nil
}

// StartAgain is how soon Run tries Start again when it fails.
var StartAgain = 5 * time.Second

// Run follows the bucket until ctx ends: Start, tried again every StartAgain while it fails (a
// bus not reachable yet, say; Tools reads the bucket meanwhile).
func (l *Live) Run(ctx context.Context) error {
	for {
		err := l.Start(ctx)
		if err == nil || ctx.Err() != nil {
			break
		}
		l.log.Warn("the contracts are not followed; they are read on each request until they are", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(StartAgain):
		}
	}
	<-ctx.Done()
	return nil
}
