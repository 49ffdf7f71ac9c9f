package demotools

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
)

// The deliberately broken tools the sandbox refuses (seed 003 §3.2), each breaking its
// contract the way the seed tells: examples/sandbox registers them.

// orderQueryBroken is order_query as the seed's broken tool answered: an order that does not
// exist is "ORDER_NOT_FOUND " — with a trailing space its contract's enum does not hold.
func (s *server) orderQueryBroken(r *http.Request, a args) (any, error) {
	v, err := s.orderQuery(r, a)
	var te *toolError
	if errors.As(err, &te) && te.Code == "ORDER_NOT_FOUND" {
		broken := *te
		broken.Code += " "
		return nil, &broken
	}
	return v, err
}

// paymentChargeBroken charges an amount (a test double: nothing is charged anywhere), and at
// the edge value amount = 0 answers plain text instead of JSON, as the seed's payment tool
// did before the sandbox stopped it.
func (s *server) paymentChargeBroken(w http.ResponseWriter, r *http.Request) {
	a, err := requestArgs(r)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"failure": map[string]string{"error_code": "INVALID_AMOUNT", "recovery_hint": err.Error()}})
		return
	}
	text, _, err := a.str("amount")
	amount, perr := strconv.ParseFloat(text, 64)
	switch {
	case err != nil || perr != nil || math.IsNaN(amount) || amount < 0 || amount > 50000:
		writeJSON(w, http.StatusBadRequest, map[string]any{"failure": map[string]string{"error_code": "INVALID_AMOUNT",
			"recovery_hint": "amount must be a number from 0 to 50000"}})
	case amount == 0:
		// The bug: the fee is divided by the amount, and the error escapes as text.
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "runtime error: integer divide by zero in fee calculation")
	default:
		currency, _, _ := a.str("currency")
		r := seeded("payment", text, currency)
		writeJSON(w, http.StatusOK, map[string]any{"success": map[string]any{
			"payment_id": "PAY" + digits(r, 12), "amount": amount, "currency": currency, "status": "charged"}})
	}
}
