package demotools

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// The change tools of the seed's state-coordination example (seed 003 §2.3,
// seed-examples/state-coordination.json): address_update and refund_apply change the same
// order, so the order they run in matters — a refund goes to the address the order has when
// it is applied. Both keep the grant Hermes dispatches them under (see Fencing in doc.go).

// maxHold bounds hold_ms, the pause between a change's start and its commit.
const maxHold = 5000

// maxAddressLen bounds a shipping address, in characters.
const maxAddressLen = 200

// changeOrderIDPattern is an order id the change tools take: the seed's ("order_123") and
// order_query's ("ORD202603160042") both fit.
var changeOrderIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// grant is the turn Hermes dispatched a call under, as the call's headers carry it: its
// transaction id, its fencing token and the resource the token is for. A call made without
// Hermes has none of them: Fence is 0.
type grant struct {
	Tx       string
	Fence    uint64
	Resource string
}

// readGrant reads a call's grant from its headers (protocol.HeaderTx, HeaderFence,
// HeaderResource). An absent header leaves its field empty. A fencing token that is not a
// positive whole number, a transaction id or resource that is not printable or too long, or
// any of them given twice is a 400 INVALID_ARGUMENT naming the header.
func readGrant(h http.Header) (grant, error) {
	var g grant
	fence, ok, err := oneHeader(h, protocol.HeaderFence, "a positive whole number, the fencing token of the call's turn")
	if err != nil {
		return grant{}, err
	}
	if ok {
		if g.Fence, err = strconv.ParseUint(fence, 10, 64); err != nil || g.Fence == 0 {
			return grant{}, badHeader(protocol.HeaderFence, "a positive whole number, the fencing token of the call's turn",
				quote(fence)+" is not a positive whole number")
		}
	}
	if g.Tx, _, err = oneHeader(h, protocol.HeaderTx, "the call's transaction id, e.g. \"mcp-tx-7a9f2b3c4d5e\""); err != nil {
		return grant{}, err
	}
	if len(g.Tx) > 128 || !protocol.Printable(g.Tx) {
		return grant{}, badHeader(protocol.HeaderTx, "a transaction id of at most 128 printable characters", "not a transaction id")
	}
	if g.Resource, _, err = oneHeader(h, protocol.HeaderResource, "the resource the call's turn is for"); err != nil {
		return grant{}, err
	}
	if len(g.Resource) > protocol.MaxResourceKeyLen || !protocol.Printable(g.Resource) {
		return grant{}, badHeader(protocol.HeaderResource,
			fmt.Sprintf("a resource key of at most %d printable bytes", protocol.MaxResourceKeyLen), "not a resource key")
	}
	return g, nil
}

// oneHeader returns the value of header name, present at most once; want describes a good
// value for the error.
func oneHeader(h http.Header, name, want string) (v string, ok bool, err error) {
	vs := h.Values(name)
	switch len(vs) {
	case 0:
		return "", false, nil
	case 1:
		return strings.TrimSpace(vs[0]), true, nil
	}
	return "", false, badHeader(name, want+", once", "given "+strconv.Itoa(len(vs))+" times")
}

// badHeader reports that header name holds an unusable value; want describes a good value.
func badHeader(name, want, problem string) *toolError {
	return &toolError{Status: http.StatusBadRequest, Code: "INVALID_ARGUMENT",
		Hint:    fmt.Sprintf("set the header %q to %s", name, want),
		Message: fmt.Sprintf("invalid header %q: %s", name, problem)}
}

// changedOrderID reads the id of the order a change tool changes: from the path
// ({order_id}) or the order_id argument; when both are given they must agree, since the
// grant is for the order the argument names.
func changedOrderID(r *http.Request, a args) (string, error) {
	const want = `an order id of 1 to 64 letters, digits, "_" or "-", e.g. "order_123"`
	path := strings.TrimSpace(r.PathValue("order_id"))
	arg, ok, err := a.str("order_id")
	if err != nil {
		return "", err
	}
	id := path
	switch {
	case path != "" && ok && arg != path:
		return "", badArg("order_id", "the order the path names, "+quote(path),
			"the path names "+quote(path)+" and the argument "+quote(arg))
	case path == "" && !ok:
		return "", missingArg("order_id", want)
	case path == "":
		id = arg
	}
	if !changeOrderIDPattern.MatchString(id) {
		return "", badArg("order_id", want, quote(id)+" is not an order id")
	}
	return id, nil
}

// changeCall is what every change of an order reads before it begins: the order, the grant
// and how long to hold the change open.
type changeCall struct {
	orderID string
	grant   grant
	hold    time.Duration
}

// readChangeCall reads the order, hold_ms and the grant of a change call; it changes nothing.
func readChangeCall(r *http.Request, a args) (changeCall, error) {
	var c changeCall
	var err error
	if c.orderID, err = changedOrderID(r, a); err != nil {
		return changeCall{}, err
	}
	ms, _, err := a.integer("hold_ms", 0, maxHold)
	if err != nil {
		return changeCall{}, err
	}
	c.hold = time.Duration(ms) * time.Millisecond
	if c.grant, err = readGrant(r.Header); err != nil {
		return changeCall{}, err
	}
	return c, nil
}

// changeAnswer is a change tool's answer: the field it changed, its value before and after,
// and the grant the change ran under (absent for a call made without Hermes).
type changeAnswer struct {
	OrderID  string   `json:"order_id"`
	Field    string   `json:"field"`
	Old      string   `json:"old"`
	New      string   `json:"new"`
	RefundTo string   `json:"refund_to,omitempty"`
	Amount   *float64 `json:"amount,omitempty"`
	Reason   string   `json:"reason,omitempty"`
	Tx       string   `json:"tx,omitempty"`
	Fence    uint64   `json:"fence,omitempty"`
}

// changeOrder runs one change of an order: it begins the change (refusing a stale fencing
// token), holds it open for c.hold (s.pause), then commits it with apply (refusing the token if a newer
// turn began meanwhile). A call whose client goes away during the hold changes nothing.
func (s *server) changeOrder(r *http.Request, c changeCall, tool, field string, apply func(o *orderFields) (before, after string, err error)) (changeAnswer, error) {
	t, err := s.orders.begin(c.orderID, tool, c.grant, s.now())
	if err != nil {
		return changeAnswer{}, err
	}
	if c.hold > 0 {
		if err := s.pause(r.Context(), c.hold); err != nil {
			s.orders.abandon(t)
			return changeAnswer{}, &toolError{Status: http.StatusServiceUnavailable, Code: "UNAVAILABLE",
				Hint: "call again", Message: "the call was cancelled before its change committed; nothing was changed"}
		}
	}
	ch, err := s.orders.commit(t, s.now(), field, apply)
	if err != nil {
		return changeAnswer{}, err
	}
	s.logger.LogAttrs(r.Context(), slog.LevelDebug, "demo order changed",
		slog.String("tool", tool), slog.String("order_id", c.orderID), slog.String("field", field),
		slog.String("tx", c.grant.Tx), slog.Uint64("fence", c.grant.Fence))
	return changeAnswer{OrderID: c.orderID, Field: field, Old: ch.Old, New: ch.New, Tx: c.grant.Tx, Fence: c.grant.Fence}, nil
}

// addressUpdate is address_update: it sets the order's shipping address.
func (s *server) addressUpdate(r *http.Request, a args) (any, error) {
	c, err := readChangeCall(r, a)
	if err != nil {
		return nil, err
	}
	addr, ok, err := a.str("shipping_address")
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return nil, missingArg("shipping_address", "the new shipping address, e.g. \"上海市人民路 128 号\"")
	case utf8.RuneCountInString(addr) > maxAddressLen:
		return nil, badArg("shipping_address", fmt.Sprintf("an address of at most %d characters", maxAddressLen), "too long")
	}
	return s.changeOrder(r, c, "address_update", "shipping_address", func(o *orderFields) (string, string, error) {
		before := o.ShippingAddress
		o.ShippingAddress = addr
		return before, addr, nil
	})
}

// refundApply is refund_apply: it moves the order's payment from paid to refunding; the refund
// goes to the shipping address the order has at that moment. An order that is not paid is a
// 409 REFUND_NOT_ALLOWED.
func (s *server) refundApply(r *http.Request, a args) (any, error) {
	c, err := readChangeCall(r, a)
	if err != nil {
		return nil, err
	}
	amount, haveAmount, err := a.number("amount", 0.01, 1_000_000)
	if err != nil {
		return nil, err
	}
	reason, _, err := a.str("reason")
	if err != nil {
		return nil, err
	}
	if utf8.RuneCountInString(reason) > 500 {
		return nil, badArg("reason", "a reason of at most 500 characters", "too long")
	}
	var refundTo string
	out, err := s.changeOrder(r, c, "refund_apply", "payment_status", func(o *orderFields) (string, string, error) {
		if o.PaymentStatus != paymentPaid {
			return "", "", &toolError{Status: http.StatusConflict, Code: "REFUND_NOT_ALLOWED",
				Hint:    fmt.Sprintf("order %s is %s, not paid: nothing to refund; check its payment status before refunding", c.orderID, o.PaymentStatus),
				Message: fmt.Sprintf("order %s cannot be refunded: payment_status is %s", c.orderID, o.PaymentStatus)}
		}
		o.PaymentStatus = paymentRefunding
		refundTo = o.ShippingAddress
		return paymentPaid, paymentRefunding, nil
	})
	if err != nil {
		return nil, err
	}
	out.RefundTo, out.Reason = refundTo, reason
	if haveAmount {
		out.Amount = &amount
	}
	return out, nil
}

// orderChanges answers GET /v1/orders/{order_id}/changes: the audit of the order's changes.
func (s *server) orderChanges(r *http.Request, a args) (any, error) {
	id, err := changedOrderID(r, a)
	if err != nil {
		return nil, err
	}
	return s.orders.audit(id), nil
}

// sleep waits for d, or returns ctx's error once ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
