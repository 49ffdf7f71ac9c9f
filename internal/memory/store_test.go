package memory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// clock is a clock tests move.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// history keeps what a store records.
type history struct {
	mu     sync.Mutex
	events []string
}

func (h *history) Record(_ context.Context, owner string, ev *protocol.MemoryEvent) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, fmt.Sprintf("%s %s %s v%d %s", owner, ev.Op, ev.Key, ev.Version, ev.Value))
	return nil
}

func (h *history) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.events
	h.events = nil
	return out
}

func newStore(t *testing.T) (*Store, *clock, *history, *bus.Bus) {
	t.Helper()
	b := bustest.NewServer(t).Provision(t, bus.Config{Buckets: Buckets(0)})
	c := &clock{now: time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)}
	h := &history{}
	return &Store{KV: b.Bucket(Bucket), JS: b.JS, History: h, Now: c.Now}, c, h, b
}

func write(key, value, lifespan string, tags ...string) Write {
	return Write{Type: "user_preference", Key: key, Value: json.RawMessage(value), Lifespan: lifespan, Tags: tags}
}

func TestAKeyWrittenAgainIsReplacedAndItsHistoryRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _, h, _ := newStore(t)
	if _, err := s.Put(ctx, "alice", write("default_shipping", `"YTO"`, "forever")); err != nil {
		t.Fatal(err)
	}
	w, err := s.Put(ctx, "alice", write("default_shipping", `"SF-Express"`, "forever"))
	if err != nil || w.Replaced == nil || string(w.Replaced.Value) != `"YTO"` || w.Fragment.Version != 2 {
		t.Fatalf("%+v %v", w, err)
	}
	got, err := s.Get(ctx, "alice", "", "default_shipping")
	if err != nil || string(got.Value) != `"SF-Express"` || !got.ExpiresAt.IsZero() {
		t.Fatalf("%+v %v", got, err)
	}
	if ev := h.take(); strings.Join(ev, "|") != `alice written default_shipping v1 "YTO"|alice replaced default_shipping v2 "SF-Express"` {
		t.Fatalf("history %q", ev)
	}
	if _, err := s.Delete(ctx, "alice", "", "default_shipping"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "alice", "", "default_shipping"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if _, err := s.Delete(ctx, "alice", "", "default_shipping"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete again: %v", err)
	}
	if ev := h.take(); len(ev) != 1 || !strings.HasPrefix(ev[0], "alice deleted default_shipping v2") {
		t.Fatalf("history %q", ev)
	}
}

// Two owners, the same keys: neither ever sees the other's.
func TestFragmentsNeverCrossOwners(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _, _, _ := newStore(t)
	for _, o := range []string{"key:a#carol", "key:b#carol"} {
		if _, err := s.Put(ctx, o, write("invoice_type", `"`+o+`"`, "30d")); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range []string{"key:a#carol", "key:b#carol"} {
		fs, err := s.List(ctx, o, Query{})
		if err != nil || len(fs) != 1 || string(fs[0].Value) != `"`+o+`"` {
			t.Fatalf("%s: %+v %v", o, fs, err)
		}
	}
	if _, err := s.Forget(ctx, "key:a#carol"); err != nil {
		t.Fatal(err)
	}
	if fs, _ := s.List(ctx, "key:b#carol", Query{}); len(fs) != 1 {
		t.Fatalf("forgetting one owner took another's: %+v", fs)
	}
}

// Lifetimes are the store's clock's: a 30d fragment is there after 29 days and gone after 31;
// a session fragment lives while its session is used; forever stays.
func TestLifespansFollowTheClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, c, h, _ := newStore(t)
	s.SessionIdle = time.Hour
	for _, w := range []Write{
		write("invoice_type", `"personal"`, "30d"),
		write("default_shipping", `"SF-Express"`, "forever"),
		{Session: "sess_1", Type: "location_context", Key: "location_context", Value: json.RawMessage(`{"city":"北京","store":"三里屯店"}`), Lifespan: "session", Tags: []string{"inventory_query"}},
	} {
		if _, err := s.Put(ctx, "bob", w); err != nil {
			t.Fatal(err)
		}
	}
	keys := func(q Query) string {
		fs, err := s.List(ctx, "bob", q)
		if err != nil {
			t.Fatal(err)
		}
		var k []string
		for _, f := range fs {
			k = append(k, f.Key)
		}
		return strings.Join(k, ",")
	}
	if got := keys(Query{Session: "sess_2"}); got != "invoice_type,default_shipping" && got != "default_shipping,invoice_type" {
		t.Fatalf("another session sees %s", got)
	}
	c.Add(50 * time.Minute)
	if err := s.Used(ctx, "bob", "sess_1", []string{"location_context"}); err != nil {
		t.Fatal(err)
	}
	c.Add(50 * time.Minute) // 100 minutes after the write, 50 after its use
	if got := keys(Query{Session: "sess_1", Key: "location_context"}); got != "location_context" {
		t.Fatalf("a session fragment used 50 minutes ago: %q", got)
	}
	c.Add(11 * time.Minute)
	if got := keys(Query{Session: "sess_1", Key: "location_context"}); got != "" {
		t.Fatalf("a session fragment idle past its hour: %q", got)
	}
	c.Add(29 * 24 * time.Hour)
	if got := keys(Query{Key: "invoice_type"}); got != "invoice_type" {
		t.Fatalf("a 30d fragment after 29 days: %q", got)
	}
	c.Add(2 * 24 * time.Hour)
	if got := keys(Query{}); got != "default_shipping" {
		t.Fatalf("after 31 days: %q", got)
	}
	h.take()
	if err := s.Sweep(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	ev := strings.Join(h.take(), "|")
	if !strings.Contains(ev, "bob expired invoice_type") || !strings.Contains(ev, "bob expired location_context") || strings.Contains(ev, "default_shipping") {
		t.Fatalf("the sweep recorded %q", ev)
	}
}

// At capacity the least relevant fragment that is not forever goes; forever ones never do,
// and a write that cannot fit beside them is refused.
func TestCapacityEvictsTheLeastRelevant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, c, h, _ := newStore(t)
	s.PerOwner = 3
	for _, k := range []string{"a", "b", "c"} {
		if _, err := s.Put(ctx, "o", write(k, `1`, "30d")); err != nil {
			t.Fatal(err)
		}
		c.Add(24 * time.Hour)
	}
	// a is the oldest, but used lately; b is the least relevant.
	if err := s.Used(ctx, "o", "", []string{"a"}); err != nil {
		t.Fatal(err)
	}
	h.take()
	w, err := s.Put(ctx, "o", write("d", `1`, "30d"))
	if err != nil || len(w.Evicted) != 1 || w.Evicted[0].Key != "b" {
		t.Fatalf("%+v %v", w, err)
	}
	if ev := h.take(); len(ev) != 2 || !strings.HasPrefix(ev[1], "o evicted b") {
		t.Fatalf("history %q", ev)
	}
	for _, k := range []string{"f1", "f2", "f3"} {
		if _, err := s.Put(ctx, "o", write(k, `1`, "forever")); err != nil {
			t.Fatal(err)
		}
	}
	fs, _ := s.List(ctx, "o", Query{})
	if len(fs) != 3 {
		t.Fatalf("%d fragments", len(fs))
	}
	for _, f := range fs {
		if !f.Forever() {
			t.Fatalf("a fragment that is not forever outlived forever ones: %+v", f)
		}
	}
	if _, err := s.Put(ctx, "o", write("f4", `1`, "forever")); !errors.Is(err, ErrFull) || !strings.Contains(err.Error(), "never evicted") {
		t.Fatalf("a fourth forever fragment: %v", err)
	}
	if _, err := s.Put(ctx, "o", write("t", `1`, "1h")); !errors.Is(err, ErrFull) {
		t.Fatalf("a fragment beside only forever ones: %v", err)
	}
	// Replacing a key at capacity is no new fragment.
	if _, err := s.Put(ctx, "o", write("f1", `2`, "forever")); err != nil {
		t.Fatal(err)
	}
	// Bytes are bounded as well as fragments.
	s.PerOwner, s.OwnerBytes = 100, 3000
	if _, err := s.Forget(ctx, "o"); err != nil {
		t.Fatal(err)
	}
	big := `"` + strings.Repeat("x", 900) + `"`
	for _, k := range []string{"x1", "x2", "x3"} {
		if _, err := s.Put(ctx, "o", write(k, big, "1h")); err != nil {
			t.Fatal(err)
		}
	}
	if fs, _ := s.List(ctx, "o", Query{}); len(fs) != 2 {
		t.Fatalf("%d fragments of 900 bytes within 3000", len(fs))
	}
}

func TestBadWritesNameTheField(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _, _, _ := newStore(t)
	tags := make([]string, MaxTags+1)
	for i := range tags {
		tags[i] = "t"
	}
	for _, tc := range []struct {
		w     Write
		field string
	}{
		{write("", `1`, "forever"), "key"},
		{write(strings.Repeat("k", MaxKeyBytes+1), `1`, "forever"), "key"},
		{Write{Key: "k", Value: json.RawMessage(`1`), Lifespan: "forever"}, "type"},
		{write("k", ``, "forever"), "value"},
		{write("k", `{`, "forever"), "value"},
		{write("k", `"`+strings.Repeat("v", MaxValueBytes)+`"`, "forever"), "value"},
		{write("k", `1`, "fortnight"), "lifespan"},
		{write("k", `1`, ""), "lifespan"},
		{write("k", `1`, "0s"), "lifespan"},
		{write("k", `1`, "99999d"), "lifespan"},
		{write("k", `1`, "session"), "session_id"},
		{Write{Session: "s1", Type: "t", Key: "k", Value: json.RawMessage(`1`), Lifespan: "30d"}, "session_id"},
		{Write{Session: "bad session", Type: "t", Key: "k", Value: json.RawMessage(`1`), Lifespan: "session"}, "session_id"},
		{write("k", `1`, "forever", tags...), "semantic_tag"},
		{write("k", `1`, "forever", "ok", strings.Repeat("t", MaxTagBytes+1)), "semantic_tag[1]"},
		{write("k\x00", `1`, "forever"), "key"},
	} {
		_, err := s.Put(ctx, "o", tc.w)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%+v: %v, want a field error on %s", tc.w, err, tc.field)
		}
	}
	if fs, _ := s.List(ctx, "o", Query{}); len(fs) != 0 {
		t.Fatalf("a bad write was kept: %+v", fs)
	}
}

func TestParseLifespan(t *testing.T) {
	for in, want := range map[string]string{"30d": "30d", "2h": "2h0m0s", "15m": "15m0s", "90s": "1m30s", "1h30m": "1h30m0s", "session": "session", "forever": "forever", "48h": "2d"} {
		l, err := ParseLifespan(in)
		if err != nil || l.String() != want {
			t.Errorf("%s: %v %v, want %s", in, l, err, want)
		}
	}
}

// Forget leaves no key, and no earlier revision, in the bucket.
func TestForgetLeavesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _, _, b := newStore(t)
	for _, k := range []string{"a", "b"} {
		if _, err := s.Put(ctx, "key:x#dave", write(k, `1`, "forever")); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.Forget(ctx, "key:x#dave")
	if err != nil || n != 2 {
		t.Fatalf("%d %v", n, err)
	}
	if _, err := b.Bucket(Bucket).Get(ctx, key("key:x#dave")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the entry: %v", err)
	}
	hist, err := b.Bucket(Bucket).History(ctx, key("key:x#dave"))
	for _, e := range hist {
		if e.Operation() == jetstream.KeyValuePut {
			t.Fatalf("a value is still readable: rev %d %s", e.Revision(), e.Value())
		}
	}
	_ = err
}

// A full bucket makes room: the least relevant fragments of any owner that are not forever go
// (recorded as evicted), never a forever one; a write fails only when nothing else can go.
func TestAFullBucketEvictsTheLeastRelevantOfAnyOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := bustest.NewServer(t).Provision(t, bus.Config{Buckets: Buckets(64 << 10)})
	c := &clock{now: time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)}
	h := &history{}
	s := &Store{KV: b.Bucket(Bucket), JS: b.JS, History: h, Now: c.Now}
	value := `"` + strings.Repeat("v", 900) + `"`
	written := 0
	for i := 0; ; i++ {
		w := write(fmt.Sprintf("k%d", i), value, "30d")
		if i%10 == 0 {
			w.Lifespan = "forever"
		}
		_, err := s.Put(ctx, fmt.Sprintf("owner%d", i%20), w)
		if err != nil {
			t.Fatalf("write %d: %v (history %d events)", i, err, len(h.take()))
		}
		written++
		c.Add(time.Hour)
		if ev := strings.Join(h.take(), "|"); strings.Contains(ev, "evicted") {
			if strings.Contains(ev, "evicted k0 ") || strings.Contains(ev, "evicted k10 ") {
				t.Fatalf("a forever fragment was evicted: %s", ev)
			}
			if !strings.Contains(ev, "evicted k1 ") {
				t.Fatalf("not the least relevant first: %s", ev)
			}
			break
		}
		if i > 1000 {
			t.Fatal("the bucket never filled")
		}
	}
	t.Logf("the bucket filled after %d writes", written)
}

// What a model writes is data: it does not replace what the person kept, nor keep more than
// MaxModelForever forever fragments; a key read without a session is never a session's.
func TestAModelsWritesAreBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _, _, _ := newStore(t)
	if _, err := s.Put(ctx, "o", write("default_shipping", `"SF-Express"`, "forever")); err != nil {
		t.Fatal(err)
	}
	m := write("default_shipping", `"attacker's address"`, "forever")
	m.Source = SourceModel
	if _, err := s.Put(ctx, "o", m); !errors.Is(err, ErrProtected) {
		t.Fatalf("a model replaced the person's fragment: %v", err)
	}
	if f, _ := s.Get(ctx, "o", "", "default_shipping"); string(f.Value) != `"SF-Express"` {
		t.Fatalf("%s", f.Value)
	}
	for i := range MaxModelForever {
		w := write(fmt.Sprintf("m%d", i), `1`, "forever")
		w.Source = SourceModel
		if _, err := s.Put(ctx, "o", w); err != nil {
			t.Fatal(err)
		}
	}
	w := write("one_more", `1`, "forever")
	w.Source = SourceModel
	if _, err := s.Put(ctx, "o", w); !errors.Is(err, ErrProtected) {
		t.Fatalf("forever fragment %d of a model: %v", MaxModelForever+1, err)
	}
	// Replacing one of its own is no new one.
	w = write("m0", `2`, "forever")
	w.Source = SourceModel
	if _, err := s.Put(ctx, "o", w); err != nil {
		t.Fatal(err)
	}
	sess := Write{Session: "s1", Type: "t", Key: "only_in_s1", Value: json.RawMessage(`1`), Lifespan: "session"}
	if _, err := s.Put(ctx, "o", sess); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "o", "", "only_in_s1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the owner's key read another session's fragment: %v", err)
	}
	if _, err := s.Get(ctx, "o", "s2", "only_in_s1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("session s2 read s1's fragment: %v", err)
	}
}
