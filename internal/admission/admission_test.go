package admission

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

var (
	alice = &auth.Caller{ID: "key:alice", Name: "alice", Role: auth.RoleUser}
	bob   = &auth.Caller{ID: "key:bob", Name: "bob", Role: auth.RoleUser}
	ops   = &auth.Caller{ID: "key:ops", Name: "ops", Role: auth.RoleOperator}
	app   = &auth.Caller{ID: "key:app", Name: "app", Role: auth.RoleUser, ActForUsers: true}
)

// refused is the refusal of err, failing the test when err is not one.
func refused(t *testing.T, err error) *Refusal {
	t.Helper()
	r := AsRefusal(err)
	if r == nil {
		t.Fatalf("not a refusal: %v", err)
	}
	return r
}

// A session belongs to the first actor that sends into it: another is answered as for a
// session that does not exist, and takes nothing; the owner comes back with the ticket, and
// the record's caller names who asked.
func TestSessionsBelongToWhoeverSendsFirst(t *testing.T) {
	a := New(Config{})
	ctx := context.Background()
	tk, err := a.Admit(ctx, Ask{Actor: Actor{Caller: alice}, Need: auth.PermSubmit, Session: "s1", Hold: HoldWaiting})
	if err != nil || tk.Owner != "key:alice" || tk.Caller.ID != "key:alice" {
		t.Fatalf("alice: %v %+v", err, tk)
	}
	tk.Close()
	_, err = a.Admit(ctx, Ask{Actor: Actor{Caller: bob}, Session: "s1", Hold: HoldWaiting})
	if r := refused(t, err); r.Status != http.StatusNotFound || r.Code != protocol.CodeNotFound || r.Message != "no session s1 of yours is known" {
		t.Fatalf("bob into alice's session: %+v", r)
	}
	// An application's end users own their sessions apart.
	tk, err = a.Admit(ctx, Ask{Actor: Actor{Caller: app, User: "u1"}, Session: "s2"})
	if err != nil || tk.Owner != "key:app#u1" || tk.Caller.User != "u1" {
		t.Fatalf("app for u1: %v %+v", err, tk)
	}
	if _, err := a.Admit(ctx, Ask{Actor: Actor{Caller: app, User: "u2"}, Session: "s2"}); refused(t, err).Status != http.StatusNotFound {
		t.Fatal("u2 sent into u1's session")
	}
	// Without identities (a door that asks nobody), nothing is claimed nor held.
	if tk, err := a.Admit(ctx, Ask{Session: "s1", Hold: HoldWaiting}); err != nil || tk.Owner != "" || tk.Caller != nil {
		t.Fatalf("nobody: %v %+v", err, tk)
	}
}

// Following a session: one's own, or any owned one for those who read every session; nobody
// else's, and nothing held for a refusal.
func TestFollowingASession(t *testing.T) {
	a := New(Config{Limits: CallerLimits{Streams: 1}})
	ctx := context.Background()
	if _, err := a.Admit(ctx, Ask{Actor: Actor{Caller: alice}, Session: "s1"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		who  *auth.Caller
		want int
	}{{alice, 0}, {ops, 0}, {bob, http.StatusNotFound}} {
		tk, err := a.Admit(ctx, Ask{Actor: Actor{Caller: c.who}, Session: "s1", Mode: Follow, Hold: HoldStream, Store: StoreNone})
		if c.want == 0 && err != nil || c.want != 0 && refused(t, err).Status != c.want {
			t.Fatalf("%s follows alice's session: %v", c.who.Name, err)
		}
		tk.Close() // the one stream each may hold is free again
	}
	// A session nobody owns is known only to those who read every session, and only when
	// the record holds it (no bus here: it holds nothing).
	if _, err := a.Admit(ctx, Ask{Actor: Actor{Caller: ops}, Session: "nobodys", Mode: Follow}); refused(t, err).Status != http.StatusNotFound {
		t.Fatal("an unknown session was followed")
	}
	for _, c := range []struct {
		who  *auth.Caller
		mine bool
	}{{alice, true}, {bob, false}, {ops, true}} {
		if mine, err := a.MayRead(ctx, Actor{Caller: c.who}, "s1"); err != nil || mine != c.mine {
			t.Errorf("%s may read alice's session: %v %v", c.who.Name, mine, err)
		}
	}
}

// A hold is taken for the ticket's time: over the caller's limit it is refused with a
// Retry-After, and a closed ticket gives it back (once, however often it is closed).
func TestATicketHoldsUntilClosed(t *testing.T) {
	a := New(Config{Limits: CallerLimits{Waiting: 1}})
	ctx := context.Background()
	tk, err := a.Admit(ctx, Ask{Actor: Actor{Caller: alice}, Session: "s", Hold: HoldWaiting})
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Admit(ctx, Ask{Actor: Actor{Caller: alice}, Session: "s", Hold: HoldWaiting})
	if r := refused(t, err); r.Status != http.StatusTooManyRequests || r.RetryAfter <= 0 {
		t.Fatalf("over the limit: %+v", r)
	}
	tk.Close()
	tk.Close()
	var nilTicket *Ticket
	nilTicket.Close()
	nilTicket.Accepted(true)
	tk, err = a.Admit(ctx, Ask{Actor: Actor{Caller: alice}, Session: "s", Hold: HoldWaiting})
	if err != nil {
		t.Fatalf("after the hold was given back: %v", err)
	}
	// A refusal further on (someone else's session) takes no hold either.
	if _, err := a.Admit(ctx, Ask{Actor: Actor{Caller: bob}, Session: "s", Hold: HoldWaiting}); refused(t, err).Status != http.StatusNotFound {
		t.Fatal(err)
	}
	tk.Close()
	if _, err := a.Admit(ctx, Ask{Actor: Actor{Caller: bob}, Session: "b", Hold: HoldWaiting}); err != nil {
		t.Fatalf("bob's hold was kept by a refusal: %v", err)
	}
}

// The permission a door needs is checked first, naming it.
func TestThePermissionIsChecked(t *testing.T) {
	a := New(Config{})
	_, err := a.Admit(context.Background(), Ask{Actor: Actor{Caller: alice}, Need: auth.PermMetrics, Session: "s"})
	if r := refused(t, err); r.Status != http.StatusForbidden || r.Code != protocol.CodeForbidden {
		t.Fatalf("%+v", r)
	}
	if Permit(ops, auth.PermMetrics) != nil || Permit(alice, "") != nil {
		t.Fatal("a permission held was refused")
	}
}

// While the record is near its limit, requests that would write to it are refused (503
// STORE_FULL, Retry-After; Never for one larger than the record could ever take), reads are
// not, and the turns of a run the record accepted are counted without being refused.
func TestAFullRecordRefusesNewWrites(t *testing.T) {
	a := New(Config{})
	a.store.limit.Store(1 << 20)
	why := "the record holds 950 KiB of its 1 MiB limit"
	a.store.full.Store(&why)
	ctx := context.Background()
	for _, store := range []Store{StoreCount, StoreCheck} {
		_, err := a.Admit(ctx, Ask{Actor: Actor{Caller: alice}, Session: "s", Store: store, Size: 10})
		if r := refused(t, err); r.Status != http.StatusServiceUnavailable || r.Code != protocol.CodeStoreFull || r.RetryAfter <= 0 || r.Never || a.Full() != why {
			t.Fatalf("store %v: %+v", store, r)
		}
	}
	if _, err := a.Admit(ctx, Ask{Size: 1 << 20}); !refused(t, err).Never {
		t.Fatal("a request four times the record's limit could wait")
	}
	if _, err := a.Admit(ctx, Ask{Actor: Actor{Caller: alice}, Mode: NoSession, Hold: HoldListing, Store: StoreNone}); err != nil {
		t.Fatalf("a read: %v", err)
	}
	if _, err := a.Admit(ctx, Ask{Mode: NoSession, Store: StoreAccepted, Size: 100}); err != nil {
		t.Fatalf("an accepted run's turn was refused: %v", err)
	}
	// With room again: an accepted run's turn counts until its writes are seen; a replay,
	// which wrote nothing new, stops counting when its ticket closes.
	a.store.full.Store(nil)
	tk, err := a.Admit(ctx, Ask{Mode: NoSession, Store: StoreAccepted, Size: 100})
	if err != nil {
		t.Fatal(err)
	}
	tk.Close()
	if a.store.pending.Load() != footprint(100) {
		t.Fatalf("an accepted run's write stopped counting before it was seen: %d", a.store.pending.Load())
	}
	tk, err = a.Admit(ctx, Ask{Size: 100})
	if err != nil {
		t.Fatal(err)
	}
	tk.Accepted(false) // a replay: it wrote nothing new
	tk.Close()
	if a.store.pending.Load() != footprint(100) {
		t.Fatalf("a replay kept counting: %d", a.store.pending.Load())
	}
	// alice's refused writes claimed nothing: the session is still anyone's.
	if _, err := a.Admit(ctx, Ask{Actor: Actor{Caller: bob}, Session: "s"}); err != nil {
		t.Fatalf("a session a refused request named was claimed: %v", err)
	}
}

// The actor of an HTTP request: the caller the edge authenticated, and the end user named in
// the body, X-Hermes-User or ?user= — which must agree, be well formed, and be named only by a
// caller that acts for its users.
func TestActorOf(t *testing.T) {
	req := func(c *auth.Caller, header, query string) *http.Request {
		r := httptest.NewRequest("POST", "/v1/route?user="+query, nil)
		if header != "" {
			r.Header.Set(HeaderUser, header)
		}
		if c != nil {
			r = r.WithContext(WithCaller(r.Context(), c))
		}
		return r
	}
	if a, r := ActorOf(req(app, "u1", ""), "u1"); r != nil || a.User != "u1" || a.Owner() != "key:app#u1" {
		t.Fatalf("%+v %+v", a, r)
	}
	if _, r := ActorOf(req(app, "u1", ""), "u2"); r == nil || r.Status != http.StatusBadRequest || r.Field != HeaderUser {
		t.Fatalf("disagreeing users: %+v", r)
	}
	if _, r := ActorOf(req(app, "", "a%00b"), ""); r == nil || r.Status != http.StatusBadRequest || r.Field != "user" {
		t.Fatalf("a malformed user: %+v", r)
	}
	if _, r := ActorOf(req(alice, "mallory", ""), ""); r == nil || r.Status != http.StatusForbidden {
		t.Fatalf("a user named without act_for_users: %+v", r)
	}
	if a, r := ActorOf(req(nil, "u1", ""), ""); r != nil || a.User != "" || a.Record() != nil || !a.ReadsAll() {
		t.Fatalf("without callers: %+v %+v", a, r)
	}
	c := ClientActor("crm")
	if c.Owner() != "nats:crm" || c.ReadsAll() || c.Record().Role != ClientRole {
		t.Fatalf("a NATS client: %+v", c.Record())
	}
}

// On a bus: a look at the record finds it near its message limit (and the ingress's or a
// door's request is refused), and a session the record holds requests of without an owner is
// nobody's to claim — but an operator follows it.
func TestOnABus(t *testing.T) {
	js, err := jetstream.New(bustest.NewServer(t).Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	b, err := bus.Provision(t.Context(), js, bus.Config{MaxMsgs: 10, Buckets: []bus.Bucket{Bucket(bus.Config{})}})
	if err != nil {
		t.Fatal(err)
	}
	a := New(Config{Bus: b})
	a.Look(t.Context())
	if a.Full() != "" {
		t.Fatalf("an empty record is full: %s", a.Full())
	}
	for i := range 9 {
		m, _ := protocol.NewMessage(protocol.TypeRequest, &protocol.Request{RequestID: fmt.Sprintf("r%d", i), SessionID: "unowned",
			ToolCalls: []protocol.ToolCall{{ToolCallID: "c", Name: "echo", Arguments: []byte(`{}`)}}})
		m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDRequest(fmt.Sprintf("r%d", i)), fmt.Sprintf("r%d", i), "unowned"
		data, _ := protocol.Marshal(m)
		if _, err := js.Publish(t.Context(), protocol.SubjectRequest("unowned"), data); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Admit(t.Context(), Ask{Actor: Actor{Caller: alice}, Session: "unowned"}); refused(t, err).Status != http.StatusNotFound {
		t.Fatalf("a session with requests and no owner was claimed: %v", err)
	}
	if _, err := a.Admit(t.Context(), Ask{Actor: Actor{Caller: ops}, Session: "unowned", Mode: Follow, Store: StoreNone}); err != nil {
		t.Fatalf("an operator follows a session nobody owns: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	a.Look(t.Context())
	if _, err := a.Admit(t.Context(), Ask{Actor: Actor{Caller: alice}, Session: "mine", Size: 10}); refused(t, err).Code != protocol.CodeStoreFull {
		t.Fatalf("a request into a record at 90 %% of its messages: %v (full: %q)", err, a.Full())
	}
}

// A request of a run admitted into its session (a chat run's turn) claims nothing again: it
// takes the run's owner, and no owner is written for it.
func TestATurnOfAnAdmittedRunClaimsNothing(t *testing.T) {
	a := New(Config{})
	ctx := context.Background()
	tk, err := a.Admit(ctx, Ask{Actor: Actor{Caller: alice}, Session: "run", Mode: Claimed, WaitRate: true})
	if err != nil || tk.Owner != "key:alice" {
		t.Fatalf("%v %+v", err, tk)
	}
	if owner, _ := a.owners.of(ctx, "run"); owner != "" {
		t.Fatalf("a turn claimed its session for %s", owner)
	}
}
