package demotools

import (
	"container/list"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Bounds of the state the change tools keep.
const (
	// maxLiveOrders bounds the orders orderStore keeps.
	maxLiveOrders = 10_000
	// maxChangesKept bounds the changes an order's audit keeps: the most recent ones.
	maxChangesKept = 1_000
)

// Payment statuses refund_apply reads and writes.
const (
	paymentPaid      = "paid"
	paymentRefunding = "refunding"
)

// seedOrders are the orders of the seed's example (seed 003 §2.3), in their initial state: the
// old values of its two proposals.
var seedOrders = map[string]orderFields{
	"order_123": {ShippingAddress: "A", PaymentStatus: paymentPaid},
}

// orderFields are the fields of an order the change tools change.
type orderFields struct {
	ShippingAddress string
	PaymentStatus   string
}

// liveOrder is an order's mutable state and the record of its changes. Its fields are guarded
// by the lock of the orderStore that holds it.
type liveOrder struct {
	id string
	orderFields
	// fence is the highest fencing token a change of the order has carried.
	fence uint64
	// inflight counts the changes begun and not yet committed or abandoned.
	inflight int
	// changes are the committed changes, oldest first, at most maxChangesKept.
	changes []change
	// overlaps counts the changes that began while another was in flight.
	overlaps int
	// staleRefused counts the changes refused for a fencing token lower than fence.
	staleRefused int
}

// change is one committed change of an order's field, as its audit lists it. Tx and Fence are
// the grant the call carried; a call made without Hermes has neither.
type change struct {
	Tool        string    `json:"tool"`
	Field       string    `json:"field"`
	Old         string    `json:"old"`
	New         string    `json:"new"`
	Tx          string    `json:"tx,omitempty"`
	Fence       uint64    `json:"fence,omitempty"`
	Resource    string    `json:"resource,omitempty"`
	StartedAt   time.Time `json:"started_at"`
	CommittedAt time.Time `json:"committed_at"`
}

// orderAudit is what GET /v1/orders/{order_id}/changes answers.
type orderAudit struct {
	OrderID      string   `json:"order_id"`
	Changes      []change `json:"changes"`
	Overlaps     int      `json:"overlaps"`
	StaleRefused int      `json:"stale_refused"`
}

// orderStore holds the orders the change tools change, keyed by order id. An order seen for
// the first time starts from initial(id). The store keeps at most max orders: to make room for
// a new one it forgets the order whose last change began longest ago among those with no
// change in flight (its fields, its highest fencing token and its audit go with it: changed
// again, it starts over from its initial state); when every order it holds has a change in
// flight it refuses the new one (503 UNAVAILABLE).
// It is safe for concurrent use.
type orderStore struct {
	mu      sync.Mutex
	max     int
	initial func(id string) orderFields
	orders  map[string]*list.Element // each holds a *liveOrder
	recent  *list.List               // by when their last change began, the latest first
	// fences keeps the highest fencing token of every order forgotten: a fence is never
	// forgotten with its order, or a stale turn's late call could commit after it.
	fences map[string]uint64
}

// maxFences bounds the fences of forgotten orders; past it, no order is forgotten.
const maxFences = 100 * maxLiveOrders

func newOrderStore(max int, initial func(id string) orderFields) *orderStore {
	return &orderStore{max: max, initial: initial, orders: make(map[string]*list.Element), recent: list.New(), fences: map[string]uint64{}}
}

// turn is a change that has begun and has not yet been committed or abandoned; its order is
// not forgotten meanwhile. Exactly one of commit and abandon ends it.
type turn struct {
	o       *liveOrder
	tool    string
	g       grant
	started time.Time
}

// begin begins a change of order id by tool under grant g at now. It refuses (409 STALE_FENCE)
// a fencing token lower than the highest the order has seen, changing nothing but the count of
// refusals; otherwise it raises the order's highest token to g's, so that every older turn
// still in flight is refused when it commits.
func (st *orderStore) begin(id, tool string, g grant, now time.Time) (*turn, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	o, err := st.get(id)
	if err != nil {
		return nil, err
	}
	if err := o.admit(g); err != nil {
		return nil, err
	}
	if o.inflight > 0 {
		o.overlaps++
	}
	o.inflight++
	return &turn{o: o, tool: tool, g: g, started: now}, nil
}

// commit ends t: it checks t's fencing token again (a newer turn may have begun since t did)
// and, if it still holds, runs apply on the order as it is now and records the change apply
// reports. apply runs under the store's lock; it returns the field's value before and after,
// or an error, having changed nothing.
func (st *orderStore) commit(t *turn, now time.Time, field string, apply func(o *orderFields) (before, after string, err error)) (change, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	o := t.o
	o.inflight--
	if err := o.admit(t.g); err != nil {
		return change{}, err
	}
	before, after, err := apply(&o.orderFields)
	if err != nil {
		return change{}, err
	}
	c := change{Tool: t.tool, Field: field, Old: before, New: after, Tx: t.g.Tx, Fence: t.g.Fence, Resource: t.g.Resource,
		StartedAt: t.started, CommittedAt: now}
	if len(o.changes) == maxChangesKept {
		o.changes = append(o.changes[:0], o.changes[1:]...)
	}
	o.changes = append(o.changes, c)
	return c, nil
}

// abandon ends t without changing anything.
func (st *orderStore) abandon(t *turn) {
	st.mu.Lock()
	defer st.mu.Unlock()
	t.o.inflight--
}

// audit returns the record of order id's changes; an order the store does not hold has none.
func (st *orderStore) audit(id string) orderAudit {
	st.mu.Lock()
	defer st.mu.Unlock()
	a := orderAudit{OrderID: id, Changes: []change{}}
	if el, ok := st.orders[id]; ok {
		o := el.Value.(*liveOrder)
		a.Changes = append(a.Changes, o.changes...)
		a.Overlaps, a.StaleRefused = o.overlaps, o.staleRefused
	}
	return a
}

// len returns how many orders the store holds.
func (st *orderStore) len() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.orders)
}

// admit refuses g when its fencing token is lower than the highest the order has seen, and
// otherwise raises that to g's. A grant without a token (a call made without Hermes) is
// admitted and raises nothing; an equal token is the same turn (a retry) and is admitted.
func (o *liveOrder) admit(g grant) error {
	if g.Fence == 0 {
		return nil
	}
	if g.Resource != "" && g.Resource != o.id {
		// A turn on another resource says nothing of this order's: taking its token would
		// refuse this order's own turns.
		return &toolError{Status: http.StatusBadRequest, Code: "INVALID_ARGUMENT",
			Hint:    "send " + protocol.HeaderResource + " naming the order the call changes (its order_id), or leave it out",
			Message: "the call's turn is for another resource than order " + o.id}
	}
	if g.Fence < o.fence {
		o.staleRefused++
		return &toolError{Status: http.StatusConflict, Code: "STALE_FENCE",
			Hint: fmt.Sprintf("this change was superseded by a newer turn on order %s (fencing token %d); nothing was changed: "+
				"read the order again and decide whether the change is still wanted, as a new call", o.id, o.fence),
			Message: "fencing token " + strconv.FormatUint(g.Fence, 10) + " is lower than " +
				strconv.FormatUint(o.fence, 10) + ", the highest order " + o.id + " has seen"}
	}
	o.fence = g.Fence
	return nil
}

// get returns order id, moved to the front of st.recent, adding it in its initial state if
// the store does not hold it. The caller holds st.mu.
func (st *orderStore) get(id string) (*liveOrder, error) {
	if el, ok := st.orders[id]; ok {
		st.recent.MoveToFront(el)
		return el.Value.(*liveOrder), nil
	}
	if len(st.orders) >= st.max && !st.forgetOne() {
		return nil, &toolError{Status: http.StatusServiceUnavailable, Code: "UNAVAILABLE",
			Hint:    "retry later: every order the demo tools hold has a change in flight",
			Message: fmt.Sprintf("the demo tools hold %d orders, all of them changing", len(st.orders))}
	}
	o := &liveOrder{id: id, orderFields: st.initial(id), fence: st.fences[id]}
	delete(st.fences, id)
	st.orders[id] = st.recent.PushFront(o)
	return o, nil
}

// forgetOne forgets the order nearest the back of st.recent with no change in flight; false when
// there is none. The caller holds st.mu.
func (st *orderStore) forgetOne() bool {
	for el := st.recent.Back(); el != nil; el = el.Prev() {
		o := el.Value.(*liveOrder)
		if o.inflight == 0 {
			if o.fence > 0 {
				if len(st.fences) >= maxFences {
					return false
				}
				st.fences[o.id] = o.fence
			}
			st.recent.Remove(el)
			delete(st.orders, o.id)
			return true
		}
	}
	return false
}

var addressRoads = []string{"人民路", "中山路", "建设路", "解放路", "长江路", "和平路", "新华路", "科技路", "滨江大道", "学府路"}

// initialOrder is the state an order starts from the first time the change tools see it: the
// seed's for its order, otherwise an address derived from the id and payment_status paid.
func initialOrder(id string) orderFields {
	if f, ok := seedOrders[id]; ok {
		return f
	}
	r := seeded("live-order", id)
	addr := fmt.Sprintf("%s市%s %d 号 %d 栋 %d 室", pick(r, shipCities), pick(r, addressRoads),
		between(r, 1, 999), between(r, 1, 12), between(r, 1, 30)*100+between(r, 1, 4))
	return orderFields{ShippingAddress: addr, PaymentStatus: paymentPaid}
}
