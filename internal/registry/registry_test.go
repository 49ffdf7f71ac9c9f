package registry_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/contract"
)

func parse(t *testing.T, doc string) (*contract.Contract, []byte) {
	t.Helper()
	c, err := registry.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return c, []byte(doc)
}

const v1 = "name: order_query\ninput_schema:\n  order_id: {type: string, required: true, pattern: \"^ORD[0-9]{12}$\"}\n"
const v2 = "name: order_query\ninput_schema:\n  order_id: {type: string, required: true, pattern: \"^ORD[0-9]{12}$\"}\n  verbose: {type: boolean}\n"

// Registering creates versions, the same contract again changes nothing, every version stays
// readable by its revision, a removal is a version of its own, and a follower sees each change
// without being restarted.
func TestVersionsHistoryAndFollowers(t *testing.T) {
	t.Parallel()
	s := bustest.NewLockedServer(t)
	b := s.Provision(t, bus.Config{})
	t.Cleanup(func() {
		if v := s.Violations(); len(v) > 0 {
			t.Errorf("refused by the server: %v", v)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	store := registry.NewStore(b.Contracts)
	// A worker's user follows the bucket: its permissions are enough.
	js, err := jetstream.New(s.ConnectAs(t, bus.RoleWorker))
	if err != nil {
		t.Fatal(err)
	}
	wb, err := bus.Provision(ctx, js, bus.Config{OpenOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	live, err := registry.Follow(ctx, wb.Contracts, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if c, err := live.Current("order_query"); c != nil || err != nil {
		t.Fatalf("before any registration: %v %v", c, err)
	}
	c1, src1 := parse(t, v1)
	e1, changed, err := store.Register(ctx, c1, src1, "key alice")
	if err != nil || !changed || e1.Version != 1 {
		t.Fatalf("first: %+v %v %v", e1, changed, err)
	}
	if again, changed, err := store.Register(ctx, c1, src1, "key bob"); err != nil || changed || again.Version != 1 || again.By != "key alice" {
		t.Fatalf("the same again: %+v %v %v", again, changed, err)
	}
	c2, src2 := parse(t, v2)
	e2, changed, err := store.Register(ctx, c2, src2, "key alice")
	if err != nil || !changed || e2.Version != 2 {
		t.Fatalf("second: %+v %v %v", e2, changed, err)
	}
	waitFor(t, "the follower sees version 2", func() bool {
		c, _ := live.Current("order_query")
		return c != nil && c.Version == 2
	})
	// Version 1 is read by its revision, as a call routed under it asks.
	old, err := live.At(ctx, "order_query", e1.Revision)
	if err != nil || old.Version != 1 || old.CheckInput([]byte(`{"order_id":"ORD123456789012","verbose":true}`)) == nil {
		t.Fatalf("version 1: %+v %v", old, err)
	}
	if _, err := store.Remove(ctx, "order_query", "key ops"); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Remove(ctx, "order_query", "key ops"); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("removed twice: %v", err)
	}
	waitFor(t, "the follower sees the removal", func() bool { c, err := live.Current("order_query"); return c == nil && err == nil })
	if _, err := store.Get(ctx, "order_query"); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("get after removal: %v", err)
	}
	hist, err := store.History(ctx, "order_query")
	if err != nil || len(hist) != 3 || !hist[2].Removed || hist[2].By != "key ops" || hist[0].Source != v1 {
		t.Fatalf("history: %v %+v", err, hist)
	}
	// Registered again after a removal: the versions go on.
	if e, _, err := store.Register(ctx, c1, src1, "key alice"); err != nil || e.Version != 4 {
		t.Fatalf("again after removal: %+v %v", e, err)
	}
	list, damaged, err := store.List(ctx)
	if err != nil || len(list) != 1 || list[0].Version != 4 || len(damaged) != 0 {
		t.Fatalf("list: %+v %v %v", list, damaged, err)
	}
}

// What the bucket holds that is not a contract record Hermes wrote — a stream acknowledgement
// written through a reply subject, a delete from outside the registry — never makes calls run
// unchecked: the version in use stays in use, a tool without one is refused, and registering
// repairs the key, its versions going on.
func TestDamageIsNeverUnchecked(t *testing.T) {
	t.Parallel()
	s := bustest.NewServer(t)
	b := s.Provision(t, bus.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	live, err := registry.Follow(ctx, b.Contracts, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	store := registry.NewStore(b.Contracts)
	c1, src1 := parse(t, v1)
	if _, _, err := store.Register(ctx, c1, src1, "x"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "version 1 in use", func() bool { c, _ := live.Current("order_query"); return c != nil })
	if _, err := b.Contracts.Put(ctx, "order_query", []byte(`{"stream":"HERMES","seq":9}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Contracts.Put(ctx, "other_tool", []byte(`{"stream":"HERMES","seq":10}`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the damage seen", func() bool { _, err := live.Current("other_tool"); return errors.Is(err, registry.ErrDamaged) })
	if c, err := live.Current("order_query"); err != nil || c == nil || c.Version != 1 {
		t.Fatalf("the version in use was dropped: %v %v", c, err)
	}
	if _, err := store.Get(ctx, "order_query"); !errors.Is(err, registry.ErrDamaged) {
		t.Fatalf("get of a damaged key: %v", err)
	}
	if _, damaged, err := store.List(ctx); err != nil || len(damaged) != 2 {
		t.Fatalf("list: %v %v", damaged, err)
	}
	c2, src2 := parse(t, v2)
	e, changed, err := store.Register(ctx, c2, src2, "x")
	if err != nil || !changed || e.Version != 2 {
		t.Fatalf("registering over the damage: %+v %v", e, err)
	}
	waitFor(t, "version 2 in use", func() bool { c, _ := live.Current("order_query"); return c != nil && c.Version == 2 })
	if _, err := store.Remove(ctx, "other_tool", "x"); err != nil {
		t.Fatalf("removing a damaged key: %v", err)
	}
	// Deleted outside the registry: still checked, and the next registration is version 3.
	if err := b.Contracts.Delete(ctx, "order_query"); err != nil {
		t.Fatal(err)
	}
	// The watch delivers in order: once a later registration is seen, so was the delete.
	marker, markerSrc := parse(t, "name: marker_tool\neffects: none\n")
	if _, _, err := store.Register(ctx, marker, markerSrc, "x"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a later registration seen", func() bool { c, _ := live.Current("marker_tool"); return c != nil })
	if c, err := live.Current("order_query"); err != nil || c == nil || c.Version != 2 {
		t.Fatalf("after a delete: %v %v", c, err)
	}
	// A follower that starts now uses the last version that is one.
	fresh, err := registry.Follow(ctx, b.Contracts, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if c, err := fresh.Current("order_query"); err != nil || c == nil || c.Version != 2 {
		t.Fatalf("a new follower after a delete: %v %v", c, err)
	}
	if _, err := store.Get(ctx, "order_query"); !errors.Is(err, registry.ErrDamaged) {
		t.Fatalf("get after a delete: %v", err)
	}
	if e, _, err := store.Register(ctx, c1, src1, "x"); err != nil || e.Version != 3 {
		t.Fatalf("after a delete: %+v %v", e, err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
