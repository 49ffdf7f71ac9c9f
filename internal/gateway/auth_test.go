package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hermesbus/hermes/internal/admission"
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
	case "other-key":
		return &auth.Caller{ID: "key:b", Name: "bob", Role: auth.RoleUser}, nil
	case "app-key":
		return &auth.Caller{ID: "key:app", Name: "shop", Role: auth.RoleUser, ActForUsers: true}, nil
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
	g := newGateway(Config{PublicHosts: testHosts, Instance: "test", MaxBodyBytes: 1 << 10, Callers: fakeVerifier{}, Gatherer: prometheus.NewRegistry()}, f)
	n := 0
	do := func(method, target, body, authz string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, target, strings.NewReader(body))
		n++
		req.RemoteAddr = fmt.Sprintf("192.0.2.%d:1234", n) // guessing from one address is slowed: TestGuessingIsSlowed
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

// A session belongs to the caller (and end user) that opened it: anyone else gets 404 — as for
// a session that does not exist — on posting into it, following it, and reading or cancelling
// its requests, unless their role reads every session. Only a caller that may act for its users
// names one, and the envelope records the caller the gateway authenticated, never one the body
// claims.
func TestSessionsBelongToTheirCaller(t *testing.T) {
	f := &fakeSubmitter{outcome: &submit.Outcome{Response: okResponse("r1")}, resp: okResponse("r1"), connected: true}
	g := newGateway(Config{PublicHosts: testHosts, Instance: "test", MaxBodyBytes: 1 << 10, Callers: fakeVerifier{}}, f)
	do := func(method, target, body, key string, hdr ...string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, target, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		rec := httptest.NewRecorder()
		g.Handler().ServeHTTP(rec, req)
		return rec
	}
	post := func(id, session, key string, extra string, hdr ...string) *httptest.ResponseRecorder {
		return do("POST", "/v1/route", fmt.Sprintf(`{"request_id":%q,"session_id":%q%s,"tool_calls":[{"tool_call_id":"c","name":"echo","arguments":{}}]}`,
			id, session, extra), key, hdr...)
	}
	if rec := post("r1", "s1", "user-key", ""); rec.Code != http.StatusOK {
		t.Fatalf("the owner opens s1: %d %s", rec.Code, rec.Body)
	}
	got := f.submitted[0]
	if got.Caller == nil || got.Caller.ID != "key:u" || got.Caller.Role != "user" || got.Owner != "key:u" {
		t.Fatalf("recorded caller %+v, owner %q", got.Caller, got.Owner)
	}
	if rec := post("r2", "s1", "user-key", ""); rec.Code != http.StatusOK {
		t.Fatalf("the owner posts again: %d %s", rec.Code, rec.Body)
	}
	// Someone else: 404 everywhere, worded as for what does not exist.
	n := len(f.submitted)
	for _, c := range []struct{ method, target string }{{"POST", ""}, {"GET", "/v1/requests/r1"}, {"DELETE", "/v1/requests/r1"}, {"GET", "/v1/sessions/s1/events"}} {
		var rec *httptest.ResponseRecorder
		if c.method == "POST" {
			rec = post("r3", "s1", "other-key", "")
		} else {
			rec = do(c.method, c.target, "", "other-key")
		}
		if rec.Code != http.StatusNotFound || apiErr(t, rec).Error.Code != protocol.CodeNotFound {
			t.Errorf("bob %s %s: %d %s", c.method, c.target, rec.Code, rec.Body)
		}
	}
	if len(f.submitted) != n || len(f.cancelled) != 0 {
		t.Fatalf("bob's post or cancel went through: %d submitted, %d cancelled", len(f.submitted)-n, len(f.cancelled))
	}
	if rec := do("GET", "/v1/sessions/nobody/events", "", "user-key"); rec.Code != http.StatusNotFound {
		t.Errorf("following a session that does not exist: %d %s", rec.Code, rec.Body)
	}
	// An operator reads every session but writes only into its own.
	if rec := post("r3", "s1", "operator-key", ""); rec.Code != http.StatusNotFound {
		t.Errorf("an operator posts into s1: %d %s", rec.Code, rec.Body)
	}
	// The owner, and an operator, may read it.
	for _, key := range []string{"user-key", "operator-key"} {
		if rec := do("GET", "/v1/requests/r1", "", key); rec.Code != http.StatusOK {
			t.Errorf("%s reads r1: %d %s", key, rec.Code, rec.Body)
		}
	}
	// A client cannot claim a caller, and only an application key names its end users.
	if rec := post("r4", "s4", "user-key", `,"caller":{"id":"key:o"}`); rec.Code != http.StatusBadRequest {
		t.Errorf("a caller in the body: %d %s", rec.Code, rec.Body)
	}
	for _, c := range []struct{ extra, hdr string }{{`,"user":"alice"`, ""}, {"", "alice"}} {
		rec := post("r5", "s5", "user-key", c.extra, admission.HeaderUser, c.hdr)
		if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), string(auth.PermActForUsers)) {
			t.Errorf("a plain key names a user (%q %q): %d %s", c.extra, c.hdr, rec.Code, rec.Body)
		}
	}
	if rec := post("r6", "alice_s", "app-key", `,"user":"alice@example.com"`); rec.Code != http.StatusOK {
		t.Fatalf("the shop for alice: %d %s", rec.Code, rec.Body)
	}
	if c := f.submitted[len(f.submitted)-1]; c.Caller.User != "alice@example.com" || c.Owner != "key:app#alice@example.com" {
		t.Fatalf("for alice: %+v %q", c.Caller, c.Owner)
	}
	if rec := post("r7", "alice_s", "app-key", "", admission.HeaderUser, "bob"); rec.Code != http.StatusNotFound {
		t.Errorf("the shop, for bob, in alice's session: %d %s", rec.Code, rec.Body)
	}
	if rec := post("r8", "alice_s", "app-key", `,"user":"alice@example.com"`, admission.HeaderUser, "bob"); rec.Code != http.StatusBadRequest {
		t.Errorf("two different users named: %d %s", rec.Code, rec.Body)
	}
	if rec := post("r9", "x", "app-key", `,"user":"a b"`); rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "user") {
		t.Errorf("a malformed user: %d %s", rec.Code, rec.Body)
	}
	if rec := do("GET", "/v1/requests/r6?user=alice@example.com", "", "app-key"); rec.Code != http.StatusOK {
		t.Errorf("the shop reads alice's request: %d %s", rec.Code, rec.Body)
	}
	if rec := do("GET", "/v1/requests/r6", "", "app-key"); rec.Code != http.StatusNotFound {
		t.Errorf("the shop, for nobody, reads alice's request: %d %s", rec.Code, rec.Body)
	}
}

// An address that fails too many credentials is slowed to one attempt every few seconds (429
// with Retry-After, the credential not even checked), while callers this gateway has seen
// before from it, and other addresses, go on as usual.
func TestGuessingIsSlowed(t *testing.T) {
	f := &fakeSubmitter{outcome: &submit.Outcome{Response: okResponse("r1")}, connected: true}
	g := newGateway(Config{PublicHosts: testHosts, Instance: "test", Callers: &auth.Cached{Next: fakeVerifier{}}}, f)
	do := func(from, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/v1/whoami", nil)
		req.RemoteAddr = from + ":4000"
		req.Header.Set("Authorization", "Bearer "+key)
		rec := httptest.NewRecorder()
		g.Handler().ServeHTTP(rec, req)
		return rec
	}
	if rec := do("198.51.100.7", "user-key"); rec.Code != http.StatusOK {
		t.Fatalf("a user: %d %s", rec.Code, rec.Body)
	}
	for i := range admission.FailureBurst {
		if rec := do("198.51.100.7", fmt.Sprintf("guess-%d", i)); rec.Code != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d", i, rec.Code)
		}
	}
	rec := do("198.51.100.7", "operator-key")
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" || apiErr(t, rec).Error.Code != protocol.CodeRateLimited {
		t.Fatalf("after %d failures, a key never seen: %d %s", admission.FailureBurst, rec.Code, rec.Body)
	}
	g.signins = nil
	g.cfg.Callers.(*auth.Cached).TTL = time.Nanosecond // the user's answer is stale: checked again
	if rec := do("198.51.100.7", "user-key"); rec.Code != http.StatusOK {
		t.Errorf("the user seen before, from the same address: %d %s", rec.Code, rec.Body)
	}
	if rec := do("203.0.113.9", "operator-key"); rec.Code != http.StatusOK {
		t.Errorf("another address: %d %s", rec.Code, rec.Body)
	}
	// Guesses sent all at once are held to the same allowance; an IPv6 client's /64 is one
	// address.
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for i := range 50 {
		wg.Go(func() {
			from := fmt.Sprintf("[2001:db8:1:2::%x]", i+1)
			rec := do(from, fmt.Sprintf("burst-%d", i))
			mu.Lock()
			codes[rec.Code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[http.StatusUnauthorized] != admission.FailureBurst || codes[http.StatusTooManyRequests] != 50-admission.FailureBurst {
		t.Errorf("50 guesses at once from one /64: %v", codes)
	}
}

// A canceller's description fits what the record keeps of it, whatever the caller's id.
func TestDescribeFitsTheRecord(t *testing.T) {
	a := admission.Actor{Caller: &auth.Caller{ID: "oidc:https://issuer.example/" + strings.Repeat("長", 200) + "#sub", Name: "名前", Role: auth.RoleUser}, User: "u"}
	s := describe(a, httptest.NewRequest("DELETE", "/", nil))
	if len(s) > protocol.MaxCancelTextBytes || !utf8.ValidString(s) || !strings.HasPrefix(s, "名前 (oidc:") {
		t.Fatalf("%d bytes, valid %v: %q", len(s), utf8.ValidString(s), s)
	}
}
