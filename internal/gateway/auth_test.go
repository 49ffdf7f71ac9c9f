package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// fakeVerifier knows a user's and an operator's key; "broken" cannot be checked.
type fakeVerifier struct{}

func (fakeVerifier) Verify(_ context.Context, cred string) (*auth.Caller, error) {
	switch cred {
	case "user-key":
		return &auth.Caller{ID: "key:u", Name: "app", Role: auth.RoleUser}, nil
	case "operator-key":
		return &auth.Caller{ID: "key:o", Name: "ops", Role: auth.RoleOperator}, nil
	case "broken":
		return nil, errors.New("the bucket is unreachable")
	}
	return nil, fmt.Errorf("%w: unknown key", auth.ErrUnauthenticated)
}

// With callers required, every endpoint but the probes and the page asks for a credential:
// none or a wrong one is 401 with a challenge and nothing more, a caller without the
// permission 403 naming it, a store that cannot answer 503; the handler sees the caller.
func TestEndpointsNeedACaller(t *testing.T) {
	f := &fakeSubmitter{outcome: &submit.Outcome{Response: okResponse("r1")}, resp: okResponse("r1"), connected: true}
	g := newGateway(Config{Instance: "test", MaxBodyBytes: 1 << 10, Callers: fakeVerifier{}, Gatherer: prometheus.NewRegistry()}, f)
	do := func(method, target, body, authz string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, target, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
		rec := httptest.NewRecorder()
		g.Handler().ServeHTTP(rec, req)
		return rec
	}
	for _, ep := range [][2]string{{"POST", "/v1/route"}, {"GET", "/v1/requests/r1"}, {"DELETE", "/v1/requests/r1"},
		{"GET", "/v1/sessions"}, {"GET", "/v1/sessions/s1/events"}, {"GET", "/metrics"}} {
		for _, authz := range []string{"", "Bearer nope", "Basic dXNlcjpwYXNz", "Bearer ", "user-key"} {
			rec := do(ep[0], ep[1], goodRequest, authz)
			if rec.Code != http.StatusUnauthorized || apiErr(t, rec).Error.Code != protocol.CodeUnauthenticated ||
				!strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), `Bearer realm="hermes"`) {
				t.Errorf("%s %s with %q: %d %s %q", ep[0], ep[1], authz, rec.Code, rec.Body, rec.Header().Get("WWW-Authenticate"))
			}
			if strings.Contains(rec.Body.String(), "unknown key") {
				t.Errorf("the 401 says why: %s", rec.Body)
			}
		}
		if rec := do(ep[0], ep[1], goodRequest, "Bearer broken"); rec.Code != http.StatusServiceUnavailable {
			t.Errorf("%s %s, credentials not checkable: %d", ep[0], ep[1], rec.Code)
		}
	}
	if rec := do("GET", "/metrics", "", "Bearer user-key"); rec.Code != http.StatusForbidden || !strings.Contains(apiErr(t, rec).Error.Message, string(auth.PermMetrics)) {
		t.Errorf("a user on /metrics: %d %s", rec.Code, rec.Body)
	}
	if rec := do("GET", "/metrics", "", "Bearer operator-key"); rec.Code != http.StatusOK {
		t.Errorf("an operator on /metrics: %d %s", rec.Code, rec.Body)
	}
	if rec := do("POST", "/v1/route", goodRequest, "bearer user-key"); rec.Code != http.StatusOK || len(f.submitted) != 1 {
		t.Errorf("a user posts: %d %s", rec.Code, rec.Body)
	}
	// (/readyz asks the bus, which this test has none of.)
	for _, open := range []string{"/healthz", "/", "/app.js"} {
		if rec := do("GET", open, "", ""); rec.Code == http.StatusUnauthorized {
			t.Errorf("GET %s asks for a caller", open)
		}
	}
	var seen *auth.Caller
	g.Handle("GET /whoami", g.require(auth.PermSubmit, func(_ http.ResponseWriter, r *http.Request) { seen = CallerOf(r.Context()) }))
	if do("GET", "/whoami", "", "Bearer user-key"); seen == nil || seen.ID != "key:u" {
		t.Errorf("the handler saw caller %+v", seen)
	}
}
