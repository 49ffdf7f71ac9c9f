package demotools

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// seedTx is a transaction id as Hermes makes them, for the seed's request.
const seedTx = "mcp-tx-7a9f2b000000"

// fenced returns the grant headers of a turn with fencing token fence.
func fenced(fence uint64) []string {
	return []string{protocol.HeaderTx, seedTx, protocol.HeaderFence, strconv.FormatUint(fence, 10),
		protocol.HeaderResource, "order_123"}
}

// updateAddress calls address_update on order_123.
func updateAddress(t *testing.T, h http.Handler, body string, headers ...string) reply {
	t.Helper()
	return do(t, h, "POST", "/v1/orders/order_123/address", body, headers...)
}

// applyRefund calls refund_apply on order_123.
func applyRefund(t *testing.T, h http.Handler, body string, headers ...string) reply {
	t.Helper()
	return do(t, h, "POST", "/v1/orders/order_123/refund", body, headers...)
}

// auditOf reads GET /v1/orders/{id}/changes.
func auditOf(t *testing.T, h http.Handler, id string) orderAudit {
	t.Helper()
	r := do(t, h, "GET", "/v1/orders/"+id+"/changes", "")
	if r.status != http.StatusOK {
		t.Fatalf("changes of %s: %d %s", id, r.status, r.body)
	}
	var a orderAudit
	if err := json.Unmarshal(r.body, &a); err != nil {
		t.Fatal(err)
	}
	return a
}

// wantOK checks r is a 200 and returns its object.
func wantOK(t *testing.T, r reply) map[string]any {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	return r.obj(t)
}

// inflight is how many changes of order id are in flight.
func inflight(s *server, id string) int {
	s.orders.mu.Lock()
	defer s.orders.mu.Unlock()
	if el, ok := s.orders.orders[id]; ok {
		return el.Value.(*liveOrder).inflight
	}
	return 0
}

// gatedPauses makes s's holds wait until the returned function is called (or the request's
// ctx ends), so that tests decide when a held change commits.
func gatedPauses(s *server) (release func()) {
	gate := make(chan struct{})
	s.pause = func(ctx context.Context, _ time.Duration) error {
		select {
		case <-gate:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var once sync.Once
	return func() { once.Do(func() { close(gate) }) }
}

// The seed's two changes in the order its precedence gives (address_update before
// refund_apply): the refund goes to the new address, B.
func TestTheSeedsChangesInOrderRefundToTheNewAddress(t *testing.T) {
	s := newTestServer()
	addr := updateAddress(t, s, `{"order_id":"order_123","shipping_address":"B"}`, fenced(1)...)
	want := `{"order_id":"order_123","field":"shipping_address","old":"A","new":"B","tx":"` + seedTx + `","fence":1}`
	if got := strings.TrimSpace(string(addr.body)); addr.status != http.StatusOK || got != want {
		t.Errorf("address_update answered %d %s, want %s", addr.status, got, want)
	}
	refund := wantOK(t, applyRefund(t, s, `{"order_id":"order_123"}`, fenced(2)...))
	for k, v := range map[string]any{"order_id": "order_123", "field": "payment_status", "old": "paid", "new": "refunding",
		"refund_to": "B", "tx": seedTx, "fence": json.Number("2")} {
		if refund[k] != v {
			t.Errorf("refund_apply %s = %v, want %v", k, refund[k], v)
		}
	}
	a := auditOf(t, s, "order_123")
	if len(a.Changes) != 2 || a.Changes[0].Tool != "address_update" || a.Changes[1].Tool != "refund_apply" ||
		a.Changes[1].Fence != 2 || a.Changes[1].Tx != seedTx || a.Changes[1].Resource != "order_123" || a.Overlaps != 0 || a.StaleRefused != 0 {
		t.Errorf("audit: %+v", a)
	}
}

// Reversed, the refund goes to the old address, A: why Hermes orders them.
func TestTheSeedsChangesReversedRefundToTheOldAddress(t *testing.T) {
	s := newTestServer()
	if refund := wantOK(t, applyRefund(t, s, `{"order_id":"order_123"}`, fenced(1)...)); refund["refund_to"] != "A" {
		t.Errorf("refund_to = %v, want A", refund["refund_to"])
	}
	if addr := wantOK(t, updateAddress(t, s, `{"order_id":"order_123","shipping_address":"B"}`, fenced(2)...)); addr["old"] != "A" || addr["new"] != "B" {
		t.Errorf("address_update: %v", addr)
	}
	// The order is refunding now: a second refund is refused.
	r := applyRefund(t, s, `{"order_id":"order_123"}`, fenced(3)...)
	wantError(t, r, http.StatusConflict, "REFUND_NOT_ALLOWED")
}

// A token lower than the highest the order has seen is refused and changes nothing; an equal
// one is the same turn, and a call without a grant is a direct call: both go through.
func TestTheFenceRefusesOlderTurns(t *testing.T) {
	s := newTestServer()
	wantOK(t, updateAddress(t, s, `{"order_id":"order_123","shipping_address":"B"}`, fenced(5)...))

	r := updateAddress(t, s, `{"order_id":"order_123","shipping_address":"C"}`, fenced(4)...)
	wantError(t, r, http.StatusConflict, "STALE_FENCE")
	if hint, _ := r.obj(t)["recovery_hint"].(string); !strings.Contains(hint, "superseded by a newer turn") {
		t.Errorf("recovery_hint %q does not say the change was superseded", hint)
	}
	wantError(t, applyRefund(t, s, `{"order_id":"order_123"}`, fenced(1)...), http.StatusConflict, "STALE_FENCE")
	a := auditOf(t, s, "order_123")
	if len(a.Changes) != 1 || a.Changes[0].New != "B" || a.StaleRefused != 2 {
		t.Fatalf("after two stale calls: %+v", a)
	}

	if again := wantOK(t, updateAddress(t, s, `{"order_id":"order_123","shipping_address":"B"}`, fenced(5)...)); again["old"] != "B" {
		t.Errorf("the same turn again: %v", again)
	}
	if direct := wantOK(t, applyRefund(t, s, `{"order_id":"order_123"}`)); direct["refund_to"] != "B" || direct["fence"] != nil || direct["tx"] != nil {
		t.Errorf("a call without a grant: %v", direct)
	}
	if a := auditOf(t, s, "order_123"); len(a.Changes) != 3 || a.StaleRefused != 2 || a.Changes[2].Fence != 0 {
		t.Errorf("audit: %+v", a)
	}
}

// Two changes of one order held open together are counted as an overlap, and both commit
// when their tokens are the same turn's.
func TestOverlappingChangesAreCounted(t *testing.T) {
	s := newTestServer()
	release := gatedPauses(s)
	defer release()
	var wg sync.WaitGroup
	replies := make([]reply, 2)
	start := func(i int, call func() reply) {
		wg.Go(func() { replies[i] = call() })
	}
	start(0, func() reply {
		return updateAddress(t, s, `{"order_id":"order_123","shipping_address":"B","hold_ms":100}`, fenced(3)...)
	})
	waitFor(t, "the first change to begin", func() bool { return inflight(s, "order_123") == 1 })
	start(1, func() reply { return applyRefund(t, s, `{"order_id":"order_123","hold_ms":100}`, fenced(3)...) })
	waitFor(t, "the second change to begin", func() bool { return inflight(s, "order_123") == 2 })
	release()
	wg.Wait()
	for _, r := range replies {
		wantOK(t, r)
	}
	a := auditOf(t, s, "order_123")
	if len(a.Changes) != 2 || a.Overlaps != 1 || a.StaleRefused != 0 {
		t.Errorf("audit: %+v", a)
	}
	if inflight(s, "order_123") != 0 {
		t.Error("changes still in flight")
	}
}

// A change held open while a newer turn begins is refused when it commits, and changes nothing.
func TestAStaleTurnIsRefusedAtCommit(t *testing.T) {
	s := newTestServer()
	release := gatedPauses(s)
	defer release()
	held := make(chan reply, 1)
	go func() {
		held <- updateAddress(t, s, `{"order_id":"order_123","shipping_address":"C","hold_ms":5000}`, fenced(1)...)
	}()
	waitFor(t, "the held change to begin", func() bool { return inflight(s, "order_123") == 1 })
	if newer := wantOK(t, updateAddress(t, s, `{"order_id":"order_123","shipping_address":"B"}`, fenced(2)...)); newer["old"] != "A" {
		t.Errorf("the newer turn: %v", newer)
	}
	release()
	r := <-held
	wantError(t, r, http.StatusConflict, "STALE_FENCE")
	a := auditOf(t, s, "order_123")
	if len(a.Changes) != 1 || a.Changes[0].New != "B" || a.Changes[0].Fence != 2 || a.Overlaps != 1 || a.StaleRefused != 1 {
		t.Errorf("audit: %+v", a)
	}
	if refund := wantOK(t, applyRefund(t, s, `{"order_id":"order_123"}`, fenced(3)...)); refund["refund_to"] != "B" {
		t.Errorf("the stale change was applied: refund_to %v", refund["refund_to"])
	}
}

// hold_ms really waits, and a client that goes away during the hold changes nothing.
func TestHoldWaitsAndACancelledChangeChangesNothing(t *testing.T) {
	s := newTestServer()
	began := time.Now()
	wantOK(t, updateAddress(t, s, `{"order_id":"order_123","shipping_address":"B","hold_ms":20}`))
	if d := time.Since(began); d < 20*time.Millisecond {
		t.Errorf("a hold of 20 ms took %v", d)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan reply, 1)
	go func() {
		done <- doCtx(t, ctx, s, "POST", "/v1/orders/order_123/address", `{"shipping_address":"C","hold_ms":5000}`)
	}()
	waitFor(t, "the held change to begin", func() bool { return inflight(s, "order_123") == 1 })
	cancel()
	wantError(t, <-done, http.StatusServiceUnavailable, "UNAVAILABLE")
	if a := auditOf(t, s, "order_123"); len(a.Changes) != 1 || a.Changes[0].New != "B" || inflight(s, "order_123") != 0 {
		t.Errorf("after a cancelled change: %+v", a)
	}
}

// Bad grant headers and bad arguments are 400s naming what is wrong, and change nothing.
func TestBadChangeCallsAreRefused(t *testing.T) {
	s := newTestServer()
	body := `{"order_id":"order_123","shipping_address":"B"}`
	for _, fence := range []string{"abc", "0", "-1", "1.5", "", "18446744073709551616"} {
		wantArgError(t, updateAddress(t, s, body, protocol.HeaderFence, fence), protocol.HeaderFence)
	}
	req := func(headers http.Header) reply {
		t.Helper()
		hr := httptest.NewRequest("POST", "/v1/orders/order_123/address", strings.NewReader(body))
		hr.Header = headers
		return doRequest(t, s, hr)
	}
	wantArgError(t, req(http.Header{protocol.HeaderFence: {"1", "2"}}), protocol.HeaderFence)
	wantArgError(t, req(http.Header{protocol.HeaderTx: {"mcp-tx-\x01"}}), protocol.HeaderTx)
	wantArgError(t, req(http.Header{protocol.HeaderResource: {strings.Repeat("r", protocol.MaxResourceKeyLen+1)}}), protocol.HeaderResource)

	wantArgError(t, updateAddress(t, s, `{"order_id":"order_456","shipping_address":"B"}`), "order_id")
	wantArgError(t, updateAddress(t, s, `{"shipping_address":" "}`), "shipping_address")
	wantArgError(t, updateAddress(t, s, `{"shipping_address":"B","hold_ms":5001}`), "hold_ms")
	wantArgError(t, do(t, s, "POST", "/v1/orders/address", `{"shipping_address":"B"}`), "order_id")
	wantArgError(t, do(t, s, "POST", "/v1/orders/order%20123/refund", `{}`), "order_id")
	wantArgError(t, applyRefund(t, s, `{"amount":0}`), "amount")
	wantArgError(t, applyRefund(t, s, `{"amount":"lots"}`), "amount")
	wantArgError(t, applyRefund(t, s, `{"reason":`+strconv.Quote(strings.Repeat("很", 501))+`}`), "reason")
	wantError(t, do(t, s, "GET", "/v1/orders/order_123/address", ""), http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED")

	if a := auditOf(t, s, "order_123"); len(a.Changes) != 0 || a.StaleRefused != 0 || s.orders.len() != 0 {
		t.Errorf("refused calls changed something: %+v, %d orders", a, s.orders.len())
	}
}

// The order can be named in the body alone, and an order other than the seed's starts from a
// state derived from its id: the same on every server, paid.
func TestOrdersStartFromTheirInitialState(t *testing.T) {
	first := wantOK(t, do(t, newTestServer(), "POST", "/v1/orders/address", `{"order_id":"ORD202603120042","shipping_address":"B"}`))
	again := wantOK(t, do(t, newTestServer(), "POST", "/v1/orders/ORD202603120042/address", `{"shipping_address":"B"}`))
	other := wantOK(t, do(t, newTestServer(), "POST", "/v1/orders/ORD202603120043/address", `{"shipping_address":"B"}`))
	if first["old"] != again["old"] || first["old"] == other["old"] || !strings.Contains(first["old"].(string), "市") {
		t.Errorf("initial addresses: %v, %v, %v", first["old"], again["old"], other["old"])
	}
	s := newTestServer()
	refund := wantOK(t, do(t, s, "POST", "/v1/orders/refund", `{"order_id":"order_9","amount":12.5,"reason":"不想要了"}`))
	if refund["old"] != "paid" || refund["amount"] != json.Number("12.5") || refund["reason"] != "不想要了" || refund["refund_to"] != initialOrder("order_9").ShippingAddress {
		t.Errorf("refund of a new order: %v", refund)
	}
}

// The store keeps at most its bound of orders, forgetting the one whose last change began
// longest ago but never one with a change in flight; each order's audit keeps its last
// maxChangesKept changes.
func TestTheOrderStoreIsBounded(t *testing.T) {
	st := newOrderStore(2, initialOrder)
	now := testNow
	set := func(v string) func(o *orderFields) (string, string, error) {
		return func(o *orderFields) (string, string, error) {
			before := o.ShippingAddress
			o.ShippingAddress = v
			return before, v, nil
		}
	}
	run := func(id, v string) {
		t.Helper()
		tn, err := st.begin(id, "address_update", grant{}, now)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.commit(tn, now, "shipping_address", set(v)); err != nil {
			t.Fatal(err)
		}
	}
	run("a", "a1")
	run("b", "b1")
	run("a", "a2") // b is now the one changed longest ago
	run("c", "c1")
	if st.len() != 2 || len(st.audit("b").Changes) != 0 || len(st.audit("a").Changes) != 2 {
		t.Fatalf("after a third order: %d orders, a %+v, b %+v", st.len(), st.audit("a"), st.audit("b"))
	}

	ta, _ := st.begin("a", "address_update", grant{}, now)
	tc, _ := st.begin("c", "address_update", grant{}, now)
	_, err := st.begin("d", "address_update", grant{}, now)
	if te, ok := err.(*toolError); !ok || te.Status != http.StatusServiceUnavailable {
		t.Fatalf("a new order while every order changes: %v", err)
	}
	st.abandon(tc)
	if _, err := st.commit(ta, now, "shipping_address", set("a3")); err != nil {
		t.Fatal(err)
	}
	run("d", "d1") // c's last change began after a's
	if st.len() != 2 || len(st.audit("a").Changes) != 0 || len(st.audit("c").Changes) != 1 {
		t.Fatalf("after d: %d orders, c %+v", st.len(), st.audit("c"))
	}

	for i := range maxChangesKept + 5 { // d1, then 0 … 1004: the last 1,000 are 5 … 1004
		run("d", strconv.Itoa(i))
	}
	a := st.audit("d")
	if len(a.Changes) != maxChangesKept || a.Changes[0].New != "5" || a.Changes[len(a.Changes)-1].New != strconv.Itoa(maxChangesKept+4) {
		t.Errorf("the audit keeps %d changes, from %s to %s", len(a.Changes), a.Changes[0].New, a.Changes[len(a.Changes)-1].New)
	}
}

// readGrant takes any header values without panicking: a grant it accepts holds what the
// headers said, and a refusal is a 400 naming a grant header.
func FuzzReadGrant(f *testing.F) {
	f.Add("7", "mcp-tx-7a9f2b000000", "order_123")
	f.Add("", "", "")
	f.Add("18446744073709551615", "mcp-tx-7a9f2b", "order:{order_id}")
	f.Add("0", "x", "y")
	f.Add(" 12 ", "\x7f", "z")
	f.Fuzz(func(t *testing.T, fence, tx, resource string) {
		h := http.Header{}
		for name, v := range map[string]string{protocol.HeaderFence: fence, protocol.HeaderTx: tx, protocol.HeaderResource: resource} {
			if v != "" {
				h.Set(name, v)
			}
		}
		g, err := readGrant(h)
		if err != nil {
			te, ok := err.(*toolError)
			if !ok || te.Status != http.StatusBadRequest || te.Code != "INVALID_ARGUMENT" ||
				!(strings.Contains(te.Hint, protocol.HeaderFence) || strings.Contains(te.Hint, protocol.HeaderTx) || strings.Contains(te.Hint, protocol.HeaderResource)) {
				t.Fatalf("refusal %#v", err)
			}
			return
		}
		if fence == "" && g.Fence != 0 || fence != "" && (g.Fence == 0 || strconv.FormatUint(g.Fence, 10) != strings.TrimLeft(strings.TrimSpace(fence), "0")) {
			t.Fatalf("fence %q read as %d", fence, g.Fence)
		}
		if g.Tx != strings.TrimSpace(tx) || g.Resource != strings.TrimSpace(resource) {
			t.Fatalf("read %+v from %q, %q", g, tx, resource)
		}
	})
}

// A forgotten order keeps its fence: a stale turn's late call is refused even after the
// order was dropped to make room.
func TestAForgottenOrderKeepsItsFence(t *testing.T) {
	st := newOrderStore(1, initialOrder)
	tr, err := st.begin("order_1", "address_update", grant{Fence: 9, Resource: "order_1"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	st.abandon(tr)
	if _, err := st.begin("order_2", "address_update", grant{Fence: 1}, time.Now()); err != nil { // forgets order_1
		t.Fatal(err)
	}
	if _, err := st.begin("order_1", "address_update", grant{Fence: 8, Resource: "order_1"}, time.Now()); err == nil {
		t.Fatal("a stale fence of a forgotten order was admitted")
	}
	if _, err := st.begin("order_1", "address_update", grant{Fence: 10, Resource: "order_9"}, time.Now()); err == nil {
		t.Fatal("a turn on another resource was admitted")
	}
}
