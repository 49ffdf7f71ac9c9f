package park

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

type fixture struct {
	b   *bus.Bus
	lot *Lot
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	b := bustest.NewServer(t).Provision(t, bus.Config{})
	pub := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: "test"})
	return &fixture{b: b, lot: New(b, pub, nil)}
}

// request encodes a request message of id in session s.
func request(t *testing.T, id, s string) []byte {
	t.Helper()
	m, err := protocol.NewMessage(protocol.TypeRequest, &protocol.Request{RequestID: id, SessionID: s,
		ToolCalls: []protocol.ToolCall{{ToolCallID: "c", Name: "echo"}}})
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDRequest(id), id, s
	m.Sender = protocol.Sender{Role: protocol.RoleGateway, Instance: "gw"}
	raw, err := protocol.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// published returns the messages stored on the record under session's request subject.
func (f *fixture) published(t *testing.T, session string) []*jetstream.RawStreamMsg {
	t.Helper()
	var out []*jetstream.RawStreamMsg
	info, err := f.b.Stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := f.b.Stream.GetMsg(t.Context(), seq)
		if err == nil && m.Subject == f.b.StoredSubjectRequest(session) {
			out = append(out, m)
		}
	}
	return out
}

func TestParkAndWakeByKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	key := protocol.WakeOnResponse("prev")
	a, b := request(t, "r_a", "s1"), request(t, "r_b", "s1")
	for item, raw := range map[string][]byte{"r_a": a, "r_b": b} {
		if _, err := f.lot.Park(ctx, Wait{Key: key}, item, protocol.SubjectRequest("s1"), raw); err != nil {
			t.Fatal(err)
		}
	}
	// Another key's message is not woken with this one.
	if _, err := f.lot.Park(ctx, Wait{Key: protocol.WakeOnResponse("prev2")}, "r_c", protocol.SubjectRequest("s1"), request(t, "r_c", "s1")); err != nil {
		t.Fatal(err)
	}
	if n, err := f.lot.Parked(ctx, key); err != nil || n != 2 {
		t.Fatalf("parked %d, %v", n, err)
	}
	if got := f.published(t, "s1"); len(got) != 0 {
		t.Fatalf("%d published before the wake-up", len(got))
	}
	n, err := f.lot.Wake(ctx, key)
	if err != nil || n != 2 {
		t.Fatalf("woke %d, %v", n, err)
	}
	got := f.published(t, "s1")
	if len(got) != 2 {
		t.Fatalf("published %d, want 2", len(got))
	}
	for _, m := range got {
		orig, err := protocol.Unmarshal(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if orig.Sender.Role != protocol.RoleGateway || orig.MsgID != protocol.MsgIDRequest(orig.RequestID) {
			t.Errorf("the woken message was changed: %+v", orig)
		}
		if m.Header.Get(bus.HeaderWoken) != key || m.Header.Get(jetstream.MsgIDHeader) == orig.MsgID {
			t.Errorf("headers %v: want %s=%s and a message id of its own", m.Header, bus.HeaderWoken, key)
		}
	}
	if n, _ := f.lot.Parked(ctx, key); n != 0 {
		t.Errorf("%d still parked after the wake-up", n)
	}
	if n, _ := f.lot.Parked(ctx, protocol.WakeOnResponse("prev2")); n != 1 {
		t.Errorf("the other key's message: %d parked, want 1", n)
	}
	if n, err := f.lot.Wake(ctx, key); n != 0 || err != nil {
		t.Errorf("a second wake-up woke %d, %v", n, err)
	}
}

// A message parked, woken, parked again and woken again is delivered twice: each wake-up has a
// message id of its own, so the stream's duplicate window does not swallow the second.
func TestParkedTwiceIsWokenTwice(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	raw := request(t, "r_twice", "s2")
	for round := 1; round <= 2; round++ {
		if _, err := f.lot.Park(ctx, Wait{Key: protocol.WakeAt("r_twice")}, "r_twice", protocol.SubjectRequest("s2"), raw); err != nil {
			t.Fatal(err)
		}
		if n, err := f.lot.Wake(ctx, protocol.WakeAt("r_twice")); n != 1 || err != nil {
			t.Fatalf("round %d: woke %d, %v", round, n, err)
		}
		if got := f.published(t, "s2"); len(got) != round {
			t.Fatalf("round %d: %d published", round, len(got))
		}
	}
}

func TestTimerWakesAtItsTime(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.lot.Run(ctx) }()
	key := protocol.WakeAt("r_timed.c1")
	at := time.Now().Add(1500 * time.Millisecond)
	if _, err := f.lot.Park(ctx, Wait{Key: key, At: at}, "r_timed", protocol.SubjectRequest("s3"), request(t, "r_timed", "s3")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	var got []*jetstream.RawStreamMsg
	for len(got) == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		got = f.published(t, "s3")
	}
	if len(got) != 1 {
		t.Fatalf("published %d after the timer, want 1", len(got))
	}
	if got[0].Time.Before(at) {
		t.Errorf("woken at %v, before its time %v", got[0].Time, at)
	}
	if n, _ := f.lot.Parked(ctx, key); n != 0 {
		t.Errorf("%d still parked", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A key woken before its time has its timer removed: timers never outnumber what is parked.
func TestWakeBeforeTheTimeRemovesTheTimer(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	key := protocol.WakeOnResponse("approval_1")
	if _, err := f.lot.Park(ctx, Wait{Key: key, At: time.Now().Add(time.Hour)}, "r_app", protocol.SubjectRequest("s4"), request(t, "r_app", "s4")); err != nil {
		t.Fatal(err)
	}
	info, err := f.b.Timers.Info(ctx)
	if err != nil || info.State.Msgs != 1 {
		t.Fatalf("timers before the wake-up: %v %+v", err, info)
	}
	if n, err := f.lot.Wake(ctx, key); n != 1 || err != nil {
		t.Fatalf("woke %d, %v", n, err)
	}
	if info, err := f.b.Timers.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Fatalf("timers after the wake-up: %v %d", err, info.State.Msgs)
	}
}

func TestParkRefusesBadKeysAndTheBucketHasNoTTL(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	raw := request(t, "r_x", "s5")
	for _, c := range []struct{ key, item string }{{"", "r"}, {"a.*", "r"}, {"a", "r.x"}, {"a", ""}, {"a>", "r"}} {
		if _, err := f.lot.Park(ctx, Wait{Key: c.key}, c.item, protocol.SubjectRequest("s5"), raw); err == nil || !bus.IsPermanent(err) {
			t.Errorf("Park(%q, %q) = %v, want a permanent error", c.key, c.item, err)
		}
	}
	if _, err := f.lot.Wake(ctx, "a.>"); err == nil {
		t.Error("Wake accepted a wildcard key")
	}
	st, err := f.b.Parked.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != 0 {
		t.Errorf("hermes-parked has a TTL of %v; a parked message must never expire", st.TTL())
	}
}

// A parked entry that is not a Hermes message is removed on its wake-up, never published.
func TestWakeDropsUnreadableEntries(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	key := protocol.WakeOnResponse("junk")
	if _, err := f.b.Parked.Put(ctx, protocol.KeyParked(key, "r1"), []byte{0xdd, 0xff, 0xff, 0xff, 0xff}); err != nil {
		t.Fatal(err)
	}
	if n, err := f.lot.Wake(ctx, key); n != 0 || err != nil {
		t.Fatalf("woke %d, %v", n, err)
	}
	if _, err := f.b.Parked.Get(ctx, protocol.KeyParked(key, "r1")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("unreadable entry kept: %v", err)
	}
}

// Woken messages leave nothing behind: the bucket has no TTL to reclaim delete markers.
func TestWokenLeaveNothingBehind(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	for i := range 50 {
		id := fmt.Sprintf("r_%d", i)
		key := protocol.WakeOnResponse(fmt.Sprintf("p_%d", i))
		if _, err := f.lot.Park(ctx, Wait{Key: key}, id, protocol.SubjectRequest("s1"), request(t, id, "s1")); err != nil {
			t.Fatal(err)
		}
		if n, err := f.lot.Wake(ctx, key); err != nil || n != 1 {
			t.Fatal(n, err)
		}
	}
	st, err := f.b.Parked.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Values() != 0 || st.Bytes() != 0 {
		t.Errorf("hermes-parked keeps %d entries (%d bytes) after every message was woken", st.Values(), st.Bytes())
	}
}

// A delete marker left in the lot by an earlier version (which deleted what it woke) is
// listed under its key; a wake-up of the key removes it, and keeps what is parked beside it.
func TestWakeRemovesMarkersOfEarlierVersions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	key := protocol.WakeOnResponse("old")
	if _, err := f.lot.Park(ctx, Wait{Key: key}, "gone", protocol.SubjectRequest("s1"), request(t, "gone", "s1")); err != nil {
		t.Fatal(err)
	}
	if err := f.b.Parked.Delete(ctx, protocol.KeyParked(key, "gone")); err != nil {
		t.Fatal(err)
	}
	if n, err := f.lot.Parked(ctx, key); err != nil || n != 1 {
		t.Fatalf("the marker is listed: %d, %v", n, err)
	}
	if _, err := f.lot.Park(ctx, Wait{Key: protocol.WakeOnResponse("other")}, "stays", protocol.SubjectRequest("s1"), request(t, "stays", "s1")); err != nil {
		t.Fatal(err)
	}
	if n, err := f.lot.Wake(ctx, key); err != nil || n != 0 {
		t.Fatalf("wake: %d, %v", n, err)
	}
	if n, err := f.lot.Parked(ctx, key); err != nil || n != 0 {
		t.Fatalf("after the wake-up: %d listed, %v", n, err)
	}
	if n, err := f.lot.Parked(ctx, protocol.WakeOnResponse("other")); err != nil || n != 1 {
		t.Fatalf("what waits for another key: %d, %v", n, err)
	}
}

// Unpark takes out what Park put, but not what was parked at the same place since.
func TestUnpark(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	key := protocol.WakeOnResponse("prev")
	raw := request(t, "r_u", "s1")
	sp, err := f.lot.Park(ctx, Wait{Key: key}, "r_u", protocol.SubjectRequest("s1"), raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.lot.Unpark(ctx, sp); err != nil {
		t.Fatal(err)
	}
	if n, _ := f.lot.Parked(ctx, key); n != 0 {
		t.Fatalf("%d parked after Unpark", n)
	}
	old, _ := f.lot.Park(ctx, Wait{Key: key}, "r_u", protocol.SubjectRequest("s1"), raw)
	if _, err := f.lot.Park(ctx, Wait{Key: key}, "r_u", protocol.SubjectRequest("s1"), raw); err != nil {
		t.Fatal(err)
	}
	if err := f.lot.Unpark(ctx, old); err != nil {
		t.Fatal(err)
	}
	if n, _ := f.lot.Parked(ctx, key); n != 1 {
		t.Fatalf("%d parked: the newer parking was taken out", n)
	}
}

// A key waited for by two messages goes off at the earlier of their times.
func TestTimerGoesOffAtTheEarliest(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = f.lot.Run(ctx) }()
	key := protocol.WakeAt("shared")
	if _, err := f.lot.Park(ctx, Wait{Key: key, At: time.Now().Add(time.Hour)}, "late", protocol.SubjectRequest("s6"), request(t, "late", "s6")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.lot.Park(ctx, Wait{Key: key, At: time.Now().Add(time.Second)}, "soon", protocol.SubjectRequest("s6"), request(t, "soon", "s6")); err != nil {
		t.Fatal(err)
	}
	// A later time does not push the timer back.
	if _, err := f.lot.Park(ctx, Wait{Key: key, At: time.Now().Add(2 * time.Hour)}, "later", protocol.SubjectRequest("s6"), request(t, "later", "s6")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && len(f.published(t, "s6")) < 3 {
		time.Sleep(50 * time.Millisecond)
	}
	if got := len(f.published(t, "s6")); got != 3 {
		t.Fatalf("%d woken by the earliest timer, want 3", got)
	}
}

// The sweep wakes keys whose wait is over though nothing woke them.
func TestSweepWakesWhatWasMissed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	for _, id := range []string{"answered", "open"} {
		if _, err := f.lot.Park(ctx, Wait{Key: protocol.WakeOnResponse(id)}, "r_"+id, protocol.SubjectRequest("s7"), request(t, "r_"+id, "s7")); err != nil {
			t.Fatal(err)
		}
	}
	f.lot.Settled = func(_ context.Context, key string) (bool, error) {
		return key == protocol.WakeOnResponse("answered"), nil
	}
	if n, err := f.lot.Sweep(ctx); n != 1 || err != nil {
		t.Fatalf("swept %d, %v", n, err)
	}
	if n, _ := f.lot.Parked(ctx, protocol.WakeOnResponse("open")); n != 1 {
		t.Errorf("the open wait was woken")
	}
}

// A message parked while a wake-up is under way, after it listed what to wake, counted on the
// key's timer being set early enough already; the wake-up removes that timer, and sets it
// again for the message it left parked.
func TestWhatIsParkedDuringAWakeUpKeepsATimer(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	key := protocol.WakeAt("during")
	if _, err := f.lot.Park(ctx, Wait{Key: key, At: time.Now().Add(time.Hour)}, "first", protocol.SubjectRequest("s9"), request(t, "first", "s9")); err != nil {
		t.Fatal(err)
	}
	second := time.Now().Add(2 * time.Hour)
	defer func(prev func()) { wakeListed = prev }(wakeListed)
	wakeListed = func() {
		if _, err := f.lot.Park(ctx, Wait{Key: key, At: second}, "second", protocol.SubjectRequest("s9"), request(t, "second", "s9")); err != nil {
			t.Error(err)
		}
	}
	if n, err := f.lot.Wake(ctx, key); n != 1 || err != nil {
		t.Fatalf("woke %d, %v", n, err)
	}
	if n, err := f.lot.Parked(ctx, key); n != 1 || err != nil {
		t.Fatalf("%d parked after the wake-up, %v; want the second", n, err)
	}
	m, err := f.b.Timers.GetLastMsgForSubject(ctx, protocol.SubjectTimer(key))
	if err != nil {
		t.Fatalf("the second has no timer: %v", err)
	}
	at, ok := scheduledAt(m.Header.Get(scheduleHeader))
	if !ok || at.Before(second) || at.After(second.Add(2*time.Second)) {
		t.Fatalf("the timer goes off at %v (%q), want %v", at, m.Header.Get(scheduleHeader), second)
	}
}

// Wake-ups of the same key at once — a response's responder, a cancellation, the sweep —
// each finish promptly, whichever removes a parked message first; and each message is woken.
func TestConcurrentWakeUpsOfOneKeyFinish(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for round := range 30 {
		key := protocol.WakeOnResponse(fmt.Sprintf("cw_%d", round))
		for i := range 5 {
			id := fmt.Sprintf("cw_%d_%d", round, i)
			if _, err := f.lot.Park(t.Context(), Wait{Key: key}, id, protocol.SubjectRequest("cw"), request(t, id, "cw")); err != nil {
				t.Fatal(err)
			}
		}
		errs := make(chan error, 6)
		for range cap(errs) {
			go func() {
				ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
				defer cancel()
				_, err := f.lot.Wake(ctx, key)
				errs <- err
			}()
		}
		for range cap(errs) {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: a wake-up did not finish: %v", round, err)
			}
		}
		if n, err := f.lot.Parked(t.Context(), key); err != nil || n != 0 {
			t.Fatalf("round %d: %d still parked, %v", round, n, err)
		}
	}
	if got := len(f.published(t, "cw")); got < 150 {
		t.Fatalf("%d woken messages published, want every one of 150 at least once", got)
	}
}
