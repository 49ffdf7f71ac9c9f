package gateway

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/policies"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Twelve bytes of arguments, {"delay_ms":1e999999}, were accepted and cost a megabyte on the
// record once a contract's bound printed the number: the door refuses them, naming the field.
func TestRouteRefusesNumbersBeyondBounds(t *testing.T) {
	f := &fakeSubmitter{outcome: &submit.Outcome{Response: okResponse("r1")}}
	body := `{"request_id":"r1","tool_calls":[{"tool_call_id":"c","name":"sleep","arguments":{"delay_ms":1e999999}}]}`
	rec := serve(t, f, http.MethodPost, "/v1/route", body)
	e := apiErr(t, rec)
	if rec.Code != http.StatusBadRequest || e.Error.Code != protocol.CodeInvalidRequest || e.Error.Field != "tool_calls[0].arguments.delay_ms" ||
		!strings.Contains(e.Error.Message, "at most 64 significant digits and an exponent within ±324") {
		t.Errorf("HTTP %d %+v", rec.Code, e.Error)
	}
	if len(f.submitted) != 0 {
		t.Error("the request was submitted")
	}
}

func TestRouteOverBudgetIs429(t *testing.T) {
	err := &submit.BudgetError{Caller: "key:u", Budget: submit.Budget{Bytes: 64 << 20, Window: time.Minute}, Cost: 20 << 10, RetryAfter: 1500 * time.Millisecond}
	rec := serve(t, &fakeSubmitter{err: err}, http.MethodPost, "/v1/route", goodRequest)
	e := apiErr(t, rec)
	if rec.Code != http.StatusTooManyRequests || e.Error.Code != protocol.CodeRateLimited || rec.Header().Get("Retry-After") != "2" ||
		!strings.Contains(e.Error.Message, "64 MiB of requests per 1m0s") {
		t.Errorf("HTTP %d Retry-After %q %+v", rec.Code, rec.Header().Get("Retry-After"), e.Error)
	}
}

// Through a gateway and its Submitter on a real bus: a caller past its budget gets 429 naming
// it, nothing of that request is accepted, and another caller goes on.
func TestCallerBudgetThroughTheGateway(t *testing.T) {
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{Buckets: append([]bus.Bucket{admission.Bucket(bus.Config{})}, policies.Buckets()...)})
	g, err := New(Config{Conn: srv.Connect(t), Bus: b, Instance: "test", PublicHosts: testHosts, Callers: fakeVerifier{},
		CallerLimits: admission.CallerLimits{Budget: submit.Budget{Bytes: 40 << 10, Window: time.Hour}}}) // two one-call requests
	if err != nil {
		t.Fatal(err)
	}
	post := func(key, id string) *httptest.ResponseRecorder {
		body := fmt.Sprintf(`{"request_id":%q,"tool_calls":[{"tool_call_id":"c","name":"echo","arguments":{"n":1}}]}`, id)
		req := httptest.NewRequest(http.MethodPost, "/v1/route?timeout=10ms", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		rec := httptest.NewRecorder()
		g.Handler().ServeHTTP(rec, req)
		return rec
	}
	for _, id := range []string{"u1", "u2"} { // accepted; no router answers, so 504 pending
		if rec := post("user-key", id); rec.Code != http.StatusGatewayTimeout {
			t.Fatalf("%s: HTTP %d %s", id, rec.Code, rec.Body)
		}
	}
	rec := post("user-key", "u3")
	e := apiErr(t, rec)
	retry, _ := strconv.Atoi(rec.Header().Get("Retry-After"))
	if rec.Code != http.StatusTooManyRequests || e.Error.Code != protocol.CodeRateLimited || retry < 1 ||
		!strings.Contains(e.Error.Message, "budget of 40 KiB of requests per 1h0m0s") {
		t.Fatalf("over budget: HTTP %d Retry-After %q %+v", rec.Code, rec.Header().Get("Retry-After"), e.Error)
	}
	if _, err := b.Plan(t.Context(), "u3"); err == nil {
		t.Error("the request over budget was accepted")
	}
	if rec := post("other-key", "b1"); rec.Code != http.StatusGatewayTimeout {
		t.Errorf("another caller: HTTP %d %s", rec.Code, rec.Body)
	}
}
