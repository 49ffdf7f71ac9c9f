package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/auth/authtest"
	"github.com/hermesbus/hermes/pkg/bus"
)

// callerKeys makes an API key per name: role, and act_for_users for names starting "app".
func callerKeys(t *testing.T, s *system, roles map[string]auth.Role) map[string]string {
	t.Helper()
	_, b := s.connect()
	keys := auth.NewKeys(b.Bucket(auth.KeysBucket))
	out := map[string]string{}
	for name, role := range roles {
		key, _, err := keys.Create(context.Background(), auth.NewKey{Name: name, Role: role, ActForUsers: strings.HasPrefix(name, "app")})
		if err != nil {
			t.Fatal(err)
		}
		out[name] = key
	}
	return out
}

// call sends method target with key (and header pairs) and returns status and body.
func (s *system) call(method, target, key, body string, header ...string) (int, string) {
	s.t.Helper()
	req, err := http.NewRequest(method, s.base+target, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// Through a real bus: sessions belong to whoever opened them, listings keep to one's own
// (operators see all), someone else's session is 404 on every endpoint and its event stream is
// not held open, the record names the caller, and a revoked key stops working within the
// verifier's cache.
func TestCallersOwnTheirSessions(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"alice": auth.RoleUser, "bob": auth.RoleUser, "ops": auth.RoleOperator, "app-shop": auth.RoleUser})
	req := func(id, session, extra string) string {
		return fmt.Sprintf(`{"request_id":%q,"session_id":%q%s,"tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{"n":1}}]}`, id, session, extra)
	}
	if code, body := s.call("POST", "/v1/route", "", req("own_0", "own_alice", "")); code != http.StatusUnauthorized {
		t.Fatalf("no key: %d %s", code, body)
	}
	for i := range 2 {
		if code, body := s.call("POST", "/v1/route", keys["alice"], req(fmt.Sprintf("own_a%d", i), "own_alice", "")); code != http.StatusOK {
			t.Fatalf("alice: %d %s", code, body)
		}
	}
	if code, body := s.call("POST", "/v1/route", keys["app-shop"], req("own_s1", "own_shop_carol", `,"user":"carol"`)); code != http.StatusOK {
		t.Fatalf("the shop for carol: %d %s", code, body)
	}
	// Bob, into alice's session: 404, and nothing of his reaches it.
	if code, body := s.call("POST", "/v1/route", keys["bob"], req("own_b1", "own_alice", "")); code != http.StatusNotFound {
		t.Fatalf("bob posts into alice's session: %d %s", code, body)
	}
	for _, target := range []string{"/v1/requests/own_a0", "/v1/sessions/own_alice/events"} {
		start := time.Now()
		if code, body := s.call("GET", target, keys["bob"], ""); code != http.StatusNotFound || time.Since(start) > 5*time.Second {
			t.Errorf("bob GET %s: %d after %s: %s", target, code, time.Since(start), body)
		}
	}
	if code, body := s.call("DELETE", "/v1/requests/own_a0", keys["bob"], ""); code != http.StatusNotFound {
		t.Errorf("bob cancels alice's request: %d %s", code, body)
	}
	if code, body := s.call("GET", "/v1/sessions/own_nobody/events", keys["alice"], ""); code != http.StatusNotFound {
		t.Errorf("a session that does not exist: %d %s", code, body)
	}
	// Listings: one's own; an operator sees all.
	for who, want := range map[string][]string{"alice": {"own_alice"}, "bob": nil, "app-shop": nil, "ops": {"own_alice", "own_shop_carol"}} {
		code, body := s.call("GET", "/v1/sessions", keys[who], "")
		if code != http.StatusOK {
			t.Fatalf("%s lists: %d %s", who, code, body)
		}
		for _, id := range []string{"own_alice", "own_shop_carol"} {
			if listed, wanted := strings.Contains(body, `"`+id+`"`), contains(want, id); listed != wanted {
				t.Errorf("%s's listing has %s: %v, want %v: %s", who, id, listed, wanted, body)
			}
		}
	}
	if _, body := s.call("GET", "/v1/sessions?user=carol", keys["app-shop"], ""); !strings.Contains(body, `"own_shop_carol"`) {
		t.Errorf("the shop lists carol's sessions: %s", body)
	}
	// The record names the caller the gateway authenticated.
	events, err := http.NewRequest("GET", s.base+"/v1/sessions/own_alice/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	events.Header.Set("Authorization", "Bearer "+keys["alice"])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(events.WithContext(ctx))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("alice follows her session: %v %v", resp, err)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	found := false
	for !found && sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "data: ") && strings.Contains(line, `"type":"request.v1"`) {
			found = true
			if !strings.Contains(line, `"caller":{"id":"key:`) || !strings.Contains(line, `"name":"alice","role":"user"`) {
				t.Errorf("the request's event: %s", line)
			}
		}
	}
	resp.Body.Close()
	if !found {
		t.Error("no request event on alice's stream")
	}
	code, out, errOut := hermes(t, app.RunReplay, "--nats", s.srv.URL, "--session", "own_shop_carol")
	if code != 0 || !strings.Contains(out, "by app-shop (key:") || !strings.Contains(out, "for carol") {
		t.Errorf("replay: %d %s %s", code, out, errOut)
	}
	// Someone whose owner record is gone (expired) keeps the session: the record still holds
	// its requests, so nobody else can claim it. Nor a session submitted on the bus directly.
	_, ob := s.connect()
	owners, err := ob.JS.Stream(context.Background(), bus.KVStream(admission.OwnersBucket))
	if err != nil {
		t.Fatal(err)
	}
	if err := owners.Purge(context.Background(), jetstream.WithPurgeSubject(bus.KVSubject(admission.OwnersBucket, "own_alice"))); err != nil {
		t.Fatal(err)
	}
	if code, body := s.call("POST", "/v1/route", keys["bob"], req("own_b2", "own_alice", "")); code != http.StatusNotFound {
		t.Fatalf("bob claims alice's session once its owner record is gone: %d %s", code, body)
	}
	if code, body := s.call("GET", "/v1/sessions/own_alice/events", keys["bob"], ""); code != http.StatusNotFound {
		t.Fatalf("bob follows it: %d %s", code, body)
	}
	if code, out, errOut := hermes(t, app.RunRoute, "--nats", s.srv.URL, "-f", writeTemp(t, req("bus_1", "own_on_bus", ""))); code != 0 {
		t.Fatalf("a request on the bus: %s %s", out, errOut)
	}
	for _, who := range []string{"alice", "bob"} {
		if code, body := s.call("POST", "/v1/route", keys[who], req("own_"+who+"_bus", "own_on_bus", "")); code != http.StatusNotFound {
			t.Errorf("%s claims a session submitted on the bus: %d %s", who, code, body)
		}
	}
	if code := s.streamStatus("/v1/sessions/own_on_bus/events", keys["ops"]); code != http.StatusOK {
		t.Errorf("an operator follows it: %d", code)
	}
	// Reading every session is not writing into them: an operator's request never lands in a
	// session someone else opened (perhaps to catch what the operator sends).
	if code, body := s.call("POST", "/v1/route", keys["ops"], req("own_o1", "own_shop_carol", "")); code != http.StatusNotFound {
		t.Errorf("an operator posts into carol's session: %d %s", code, body)
	}
	// Revoked: refused within the verifier's cache time, and its open event streams end.
	if code, body := s.call("POST", "/v1/route", keys["bob"], req("own_b9", "own_bob", "")); code != http.StatusOK {
		t.Fatalf("bob's own session: %d %s", code, body)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	sreq, _ := http.NewRequestWithContext(sctx, http.MethodGet, s.base+"/v1/sessions/own_bob/events", nil)
	sreq.Header.Set("Authorization", "Bearer "+keys["bob"])
	stream, err := http.DefaultClient.Do(sreq)
	if err != nil || stream.StatusCode != http.StatusOK {
		t.Fatalf("bob follows his session: %v %v", stream, err)
	}
	ended := make(chan time.Time, 1)
	go func() {
		_, _ = io.Copy(io.Discard, stream.Body)
		stream.Body.Close()
		ended <- time.Now()
	}()
	_, b := s.connect()
	if _, err := auth.NewKeys(b.Bucket(auth.KeysBucket)).Revoke(context.Background(), "bob"); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	waitFor(t, "bob's revoked key to be refused", func() bool {
		code, _ := s.call("GET", "/v1/sessions", keys["bob"], "")
		return code == http.StatusUnauthorized
	})
	select {
	case at := <-ended:
		t.Logf("bob's stream ended %s after the revocation", at.Sub(revoked).Round(time.Millisecond))
	case <-sctx.Done():
		t.Error("bob's event stream outlived his revoked key by 30 s")
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Bearer tokens of an OpenID Connect issuer the test runs name callers beside API keys: the
// role comes from the configured claim, a token without one may do nothing (403), an expired
// or foreign one is 401, and a browser can sign in with one.
func TestOIDCCallers(t *testing.T) {
	t.Parallel()
	iss := authtest.NewIssuer(t)
	s := start(t, options{workers: 1, callers: true, oidc: auth.OIDCConfig{Issuer: iss.URL, Audience: authtest.Audience, RoleClaim: "hermes_role"}})
	keys := callerKeys(t, s, map[string]auth.Role{"ops": auth.RoleOperator})
	ann := iss.Token(`"sub":"ann-1","preferred_username":"ann","hermes_role":"user"`)
	body := `{"request_id":"oidc_1","session_id":"oidc_ann","tool_calls":[{"tool_call_id":"c","name":"echo","arguments":{}}]}`
	if code, out := s.call("POST", "/v1/route", ann, body); code != http.StatusOK {
		t.Fatalf("ann's token: %d %s", code, out)
	}
	if code, out := s.call("GET", "/v1/requests/oidc_1", ann, ""); code != http.StatusOK {
		t.Fatalf("ann reads her request: %d %s", code, out)
	}
	if code, out := s.call("GET", "/v1/sessions", keys["ops"], ""); code != http.StatusOK || !strings.Contains(out, `"oidc_ann"`) {
		t.Fatalf("an API key beside tokens: %d %s", code, out)
	}
	code, out, _ := hermes(t, app.RunReplay, "--nats", s.srv.URL, "--session", "oidc_ann")
	if code != 0 || !strings.Contains(out, "by ann (oidc:"+iss.URL+"#ann-1, user)") {
		t.Errorf("replay: %s", out)
	}
	noRole := iss.Token(`"sub":"carl"`)
	if code, out := s.call("POST", "/v1/route", noRole, strings.ReplaceAll(body, "oidc_1", "oidc_2")); code != http.StatusForbidden || !strings.Contains(out, "submit") {
		t.Errorf("a token without a role: %d %s", code, out)
	}
	other := authtest.NewIssuer(t)
	for name, tok := range map[string]string{
		"expired":        iss.Token(fmt.Sprintf(`"sub":"ann-1","hermes_role":"admin","exp":%d`, time.Now().Add(-time.Minute).Unix())),
		"another issuer": other.Token(fmt.Sprintf(`"sub":"ann-1","hermes_role":"admin","iss":%q`, iss.URL)),
		"another aud":    iss.Token(`"sub":"ann-1","hermes_role":"admin","aud":"not-hermes"`),
	} {
		if code, out := s.call("GET", "/v1/sessions", tok, ""); code != http.StatusUnauthorized {
			t.Errorf("%s: %d %s", name, code, out)
		}
	}
	code, out = s.call("POST", "/v1/signin", "", `{"credential":"`+ann+`"}`)
	if code != http.StatusOK || !strings.Contains(out, `"name":"ann"`) {
		t.Errorf("signing in with a token: %d %s", code, out)
	}
}

// writeTemp writes data to a file of the test's and returns its path.
func writeTemp(t *testing.T, data string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "data.json")
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// streamStatus opens an event stream with key and returns the status it answers with.
func (s *system) streamStatus(target, key string) int {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.base+target, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("GET %s: %v", target, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
