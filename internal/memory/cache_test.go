package memory

import (
	"context"
	"testing"
	"time"
)

// Two processes share the bucket, each with its hot tier: a read is served from the tier once
// held; a change made by the other reaches it through the watch; forgetting leaves it empty.
func TestTheHotTierFollowsChangesFromEveryProcess(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, _, _, b := newStore(t)
	a.Cache = &Cache{}
	other := &Store{KV: b.Bucket(Bucket), JS: b.JS, Cache: &Cache{}}
	for _, s := range []*Store{a, other} {
		if err := s.Cache.Run(ctx, s.KV, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Put(ctx, "carol", write("default_shipping", `"YTO"`, "forever")); err != nil {
		t.Fatal(err)
	}
	value := func(s *Store) string {
		t.Helper()
		f, err := s.Get(ctx, "carol", "", "default_shipping")
		if err != nil {
			return ""
		}
		return string(f.Value)
	}
	if v := value(a); v != `"YTO"` {
		t.Fatalf("read your write: %s", v)
	}
	// Once the watch has brought this process's own write back (it drops the entry once
	// more), reads are served from the tier.
	eventually(t, "three reads served from the hot tier", func() bool {
		hits0, _, _ := a.Cache.Stats()
		for range 3 {
			value(a)
		}
		hits, _, _ := a.Cache.Stats()
		return hits-hits0 == 3 && a.Cache.Holds("carol")
	})
	if v := value(other); v != `"YTO"` || !other.Cache.Holds("carol") {
		t.Fatalf("the other process: %s", v)
	}
	if _, err := other.Put(ctx, "carol", write("default_shipping", `"SF-Express"`, "forever")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the change reaches the first process", func() bool { return value(a) == `"SF-Express"` })
	if _, err := other.Forget(ctx, "carol"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first process forgets", func() bool { return !a.Cache.Holds("carol") && value(a) == "" })
	if other.Cache.Holds("carol") {
		t.Fatal("the forgetting process still holds the owner")
	}
}

// A read that raced a change is not kept.
func TestAReadThatRacedAChangeIsNotKept(t *testing.T) {
	c := &Cache{}
	c.following(true)
	m := c.mark("t")
	c.changed("t")
	c.put("t", &entry{Owner: "stale"}, m)
	if _, ok := c.get("t"); ok {
		t.Fatal("kept a read older than a change")
	}
	m = c.mark("t")
	c.put("t", &entry{Owner: "fresh"}, m)
	if en, ok := c.get("t"); !ok || en.Owner != "fresh" {
		t.Fatal("a read after the change is not kept")
	}
	m = c.mark("u")
	c.following(false)
	c.following(true)
	c.put("u", &entry{Owner: "old watch"}, m)
	if _, ok := c.get("u"); ok {
		t.Fatal("kept a read begun under an earlier watch")
	}
	// A change whose trace is trimmed before a racing read is put: not kept.
	tiny := &Cache{Max: 2}
	tiny.following(true)
	m = tiny.mark("x")
	tiny.changed("x")
	tiny.changed("y")
	tiny.changed("z")
	tiny.put("x", &entry{Owner: "stale"}, m)
	if _, ok := tiny.get("x"); ok {
		t.Fatal("kept a read whose change was trimmed")
	}
	// A fresh read put meanwhile is not overwritten by an older one.
	old := tiny.mark("w")
	tiny.changed("w")
	fresh := tiny.mark("w")
	tiny.put("w", &entry{Owner: "fresh"}, fresh)
	tiny.put("w", &entry{Owner: "stale"}, old)
	if en, ok := tiny.get("w"); !ok || en.Owner != "fresh" {
		t.Fatalf("the fresh read was overwritten: %+v", en)
	}
	small := &Cache{Max: 2}
	small.following(true)
	for _, tok := range []string{"x", "y", "z"} {
		small.put(tok, &entry{}, small.mark(tok))
	}
	if _, _, n := small.Stats(); n != 2 {
		t.Fatalf("%d owners held, at most 2", n)
	}
	if _, ok := small.get("x"); ok {
		t.Fatal("the least recently used was kept")
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
