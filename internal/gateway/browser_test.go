package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// memSignins keeps sign-ins in memory.
type memSignins struct {
	mu sync.Mutex
	m  map[string]*auth.Caller
	n  int
}

func (s *memSignins) Create(_ context.Context, c *auth.Caller, until time.Time) (string, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	tok := fmt.Sprintf("hs_token_%d", s.n)
	s.m[tok] = c
	return tok, time.Now().Add(time.Hour), nil
}

func (s *memSignins) Verify(_ context.Context, tok string) (*auth.Caller, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.m[tok]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("%w: unknown sign-in", auth.ErrUnauthenticated)
}

func (s *memSignins) Delete(_ context.Context, tok string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, tok)
	return nil
}

// The attacks a browser can be made to carry: a page on another site posting text/plain or a
// form (the request a CORS-simple fetch sends without asking), or JSON from its own origin, and
// a DNS-rebound host name reading the API. Each is refused, on an open gateway as on one that
// asks for callers; the probes answer whatever the Host.
func TestBrowsersCannotBeTurnedAgainstTheGateway(t *testing.T) {
	for _, callers := range []bool{false, true} {
		f := &fakeSubmitter{outcome: &submit.Outcome{Response: okResponse("r1")}, resp: okResponse("r1"), connected: true}
		cfg := Config{Instance: "test", PublicHosts: []string{"hermes.example.org"}}
		if callers {
			cfg.Callers = fakeVerifier{}
		}
		g := newGateway(cfg, f)
		do := func(method, host, target, body string, hdr ...string) *httptest.ResponseRecorder {
			req := httptest.NewRequest(method, target, strings.NewReader(body))
			req.Host = host
			req.Header.Set("Authorization", "Bearer user-key")
			for i := 0; i+1 < len(hdr); i += 2 {
				req.Header.Set(hdr[i], hdr[i+1])
			}
			rec := httptest.NewRecorder()
			g.Handler().ServeHTTP(rec, req)
			return rec
		}
		for _, c := range []struct {
			name, method, host, target string
			hdr                        []string
			status                     int
			code                       string
		}{
			{"text/plain from evil.example", "POST", "127.0.0.1:8080", "/v1/route", []string{"Content-Type", "text/plain", "Origin", "http://evil.example"}, 403, protocol.CodeCrossOrigin},
			{"text/plain, no origin", "POST", "127.0.0.1:8080", "/v1/route", []string{"Content-Type", "text/plain;charset=UTF-8"}, 415, protocol.CodeUnsupportedMediaType},
			{"a form", "POST", "localhost:8080", "/v1/route", []string{"Content-Type", "application/x-www-form-urlencoded"}, 415, protocol.CodeUnsupportedMediaType},
			{"multipart", "POST", "localhost:8080", "/v1/route", []string{"Content-Type", "multipart/form-data; boundary=x"}, 415, protocol.CodeUnsupportedMediaType},
			{"no content type", "POST", "localhost:8080", "/v1/route", nil, 415, protocol.CodeUnsupportedMediaType},
			{"text/plain cancel", "DELETE", "localhost:8080", "/v1/requests/r1", []string{"Content-Type", "text/plain"}, 415, protocol.CodeUnsupportedMediaType},
			{"JSON from evil.example", "POST", "127.0.0.1:8080", "/v1/route", []string{"Content-Type", "application/json", "Origin", "http://evil.example"}, 403, protocol.CodeCrossOrigin},
			{"JSON, cross-site fetch", "POST", "127.0.0.1:8080", "/v1/route", []string{"Content-Type", "application/json", "Sec-Fetch-Site", "cross-site"}, 403, protocol.CodeCrossOrigin},
			{"cancel from evil.example", "DELETE", "127.0.0.1:8080", "/v1/requests/r1", []string{"Origin", "http://evil.example"}, 403, protocol.CodeCrossOrigin},
			{"sign in from evil.example", "POST", "127.0.0.1:8080", "/v1/signin", []string{"Content-Type", "application/json", "Origin", "http://evil.example"}, 403, protocol.CodeCrossOrigin},
			{"rebound host reads sessions", "GET", "rebind.attacker.example:8080", "/v1/sessions", nil, 421, protocol.CodeHostNotServed},
			{"rebound host posts", "POST", "rebind.attacker.example", "/v1/route", []string{"Content-Type", "application/json"}, 421, protocol.CodeHostNotServed},
			{"rebound host loads the page", "GET", "rebind.attacker.example:8080", "/", nil, 421, protocol.CodeHostNotServed},
		} {
			rec := do(c.method, c.host, c.target, goodRequest, c.hdr...)
			if rec.Code != c.status || apiErr(t, rec).Error.Code != c.code {
				t.Errorf("callers %v, %s: %d %s", callers, c.name, rec.Code, rec.Body)
			}
		}
		if len(f.submitted)+len(f.cancelled) != 0 {
			t.Fatalf("callers %v: an attack got through: %d submitted, %d cancelled", callers, len(f.submitted), len(f.cancelled))
		}
		// What a real client and the page itself send is served.
		for _, c := range []struct {
			name, host string
			hdr        []string
		}{
			{"curl", "127.0.0.1:8080", nil},
			{"the page, same origin", "localhost:8080", []string{"Origin", "http://localhost:8080", "Sec-Fetch-Site", "same-origin"}},
			{"IPv6", "[::1]:8080", nil},
			{"a public host", "hermes.example.org", []string{"Origin", "https://hermes.example.org"}},
		} {
			rec := do("POST", c.host, "/v1/route", goodRequest, append([]string{"Content-Type", "application/json; charset=utf-8"}, c.hdr...)...)
			if rec.Code != http.StatusOK {
				t.Errorf("callers %v, %s: %d %s", callers, c.name, rec.Code, rec.Body)
			}
			f.submitted = nil
		}
		if rec := do("GET", "rebind.attacker.example", "/healthz", ""); rec.Code != http.StatusOK {
			t.Errorf("the probe by another name: %d", rec.Code)
		}
	}
}

// A browser signs in with a key and then calls with an HttpOnly, SameSite=Strict cookie (an
// EventSource cannot send a header); signing out ends it. A wrong key signs nobody in.
func TestSignInAndOut(t *testing.T) {
	f := &fakeSubmitter{outcome: &submit.Outcome{Response: okResponse("r1")}, connected: true}
	g := newGateway(Config{PublicHosts: testHosts, Instance: "test", Callers: fakeVerifier{}, Signins: &memSignins{m: map[string]*auth.Caller{}}}, f)
	do := func(method, target, body string, cookie *http.Cookie, hdr ...string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, target, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if cookie != nil {
			req.AddCookie(cookie)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		rec := httptest.NewRecorder()
		g.Handler().ServeHTTP(rec, req)
		return rec
	}
	if rec := do("GET", "/v1/whoami", "", nil); rec.Code != http.StatusUnauthorized {
		t.Fatalf("whoami, signed out: %d", rec.Code)
	}
	for _, body := range []string{`{"credential":"nope"}`, `{}`, `not json`} {
		if rec := do("POST", "/v1/signin", body, nil); rec.Code != http.StatusUnauthorized && rec.Code != http.StatusBadRequest || rec.Header().Get("Set-Cookie") != "" {
			t.Errorf("sign in with %s: %d %v", body, rec.Code, rec.Header())
		}
	}
	rec := do("POST", "/v1/signin", `{"credential":"user-key"}`, nil, "Origin", "http://example.com")
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"name":"app"`) {
		t.Fatalf("sign in: %d %s", rec.Code, rec.Body)
	}
	set := rec.Header().Get("Set-Cookie")
	for _, want := range []string{SigninCookie + "=hs_", "HttpOnly", "SameSite=Strict", "Path=/"} {
		if !strings.Contains(set, want) {
			t.Errorf("Set-Cookie %q lacks %s", set, want)
		}
	}
	if strings.Contains(set, "user-key") {
		t.Error("the cookie holds the key")
	}
	cookie := rec.Result().Cookies()[0]
	if rec := do("GET", "/v1/whoami", "", cookie); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"role":"user"`) {
		t.Fatalf("whoami by cookie: %d %s", rec.Code, rec.Body)
	}
	if rec := do("POST", "/v1/route", goodRequest, cookie); rec.Code != http.StatusOK {
		t.Fatalf("post by cookie: %d %s", rec.Code, rec.Body)
	}
	rec = do("POST", "/v1/signout", "", cookie)
	if rec.Code != http.StatusNoContent || !strings.Contains(rec.Header().Get("Set-Cookie"), "Max-Age=0") {
		t.Fatalf("sign out: %d %v", rec.Code, rec.Header())
	}
	if rec := do("GET", "/v1/whoami", "", cookie); rec.Code != http.StatusUnauthorized {
		t.Errorf("whoami after signing out: %d %s", rec.Code, rec.Body)
	}
	if rec := do("POST", "/v1/signout", "", nil); rec.Code != http.StatusNoContent {
		t.Errorf("signing out when signed out: %d", rec.Code)
	}
	// Over HTTPS (here: a proxy that says so) the cookie is Secure and __Host-, and only that
	// one is taken.
	rec = do("POST", "/v1/signin", `{"credential":"user-key"}`, nil, "X-Forwarded-Proto", "https")
	set = rec.Header().Get("Set-Cookie")
	if rec.Code != http.StatusOK || !strings.HasPrefix(set, SecureSigninCookie+"=") || !strings.Contains(set, "Secure") {
		t.Fatalf("sign in over HTTPS: %d %q", rec.Code, set)
	}
	secure := rec.Result().Cookies()[0]
	if rec := do("GET", "/v1/whoami", "", secure, "X-Forwarded-Proto", "https"); rec.Code != http.StatusOK {
		t.Errorf("whoami over HTTPS: %d", rec.Code)
	}
	plain := &http.Cookie{Name: SigninCookie, Value: secure.Value}
	if rec := do("GET", "/v1/whoami", "", plain, "X-Forwarded-Proto", "https"); rec.Code != http.StatusUnauthorized {
		t.Errorf("a cookie without the prefix, over HTTPS: %d", rec.Code)
	}
}

// Each caller is held to its rate (429 with Retry-After); another caller is not affected. (Its
// holds: package admission's TestCallerHolds.)
func TestCallerLimits(t *testing.T) {
	f := &fakeSubmitter{outcome: &submit.Outcome{Response: okResponse("r1")}, connected: true}
	g := newGateway(Config{PublicHosts: testHosts, Instance: "test", Callers: fakeVerifier{},
		CallerLimits: admission.CallerLimits{RequestsPerSecond: 0.01, Burst: 3, Waiting: 2, Streams: 1}}, f)
	do := func(key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/v1/whoami", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		rec := httptest.NewRecorder()
		g.Handler().ServeHTTP(rec, req)
		return rec
	}
	for i := range 3 {
		if rec := do("user-key"); rec.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i, rec.Code)
		}
	}
	rec := do("user-key")
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" || apiErr(t, rec).Error.Code != protocol.CodeRateLimited {
		t.Fatalf("over the rate: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	if rec := do("other-key"); rec.Code != http.StatusOK {
		t.Fatalf("another caller: %d", rec.Code)
	}
}
