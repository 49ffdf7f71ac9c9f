package auth

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hermesbus/hermes/internal/auth/authtest"
)

// Tokens of the configured issuer, for the configured audience, name callers with the role of
// their role claim; anything else — another issuer's key, audience or issuer, an expired token,
// an unsigned one, not a JWT — names nobody, and says so without echoing the token.
func TestOIDCTokens(t *testing.T) {
	iss := authtest.NewIssuer(t)
	v, err := NewOIDC(OIDCConfig{Issuer: iss.URL, Audience: "hermes", RoleClaim: "hermes_roles", ActForUsersClaim: "hermes_act_for_users"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct {
		claims string
		role   Role
		name   string
		act    bool
	}{
		{`"sub":"u1","preferred_username":"ann","hermes_roles":"operator"`, RoleOperator, "ann", false},
		{`"sub":"u2","hermes_roles":["viewer","user","admin"]`, RoleAdmin, "u2", false},
		{`"sub":"u3","hermes_roles":["viewer"]`, "", "u3", false},
		{`"sub":"u4"`, "", "u4", false},
		{`"sub":"app","hermes_roles":"user","hermes_act_for_users":true`, RoleUser, "app", true},
		{`"sub":"u5","hermes_roles":{"admin":true}`, "", "u5", false},
	} {
		got, err := v.Verify(ctx, iss.Token(c.claims))
		if err != nil {
			t.Fatalf("%s: %v", c.claims, err)
		}
		if got.Role != c.role || got.Name != c.name || got.ActForUsers != c.act || !strings.HasPrefix(got.ID, "oidc:"+iss.URL+"#") || got.Expires.IsZero() {
			t.Errorf("%s: %+v", c.claims, got)
		}
	}
	other := authtest.NewIssuer(t)
	forged := other.Token(fmt.Sprintf(`"sub":"x","hermes_roles":"admin","iss":%q`, iss.URL))
	good := iss.Token(`"sub":"x","hermes_roles":"admin"`)
	header, rest, _ := strings.Cut(good, ".")
	_, sig, _ := strings.Cut(rest, ".")
	unsigned := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none"}`)) + "." + strings.Split(good, ".")[1] + "."
	for name, tok := range map[string]string{
		"another issuer's key":  forged,
		"another audience":      iss.Token(`"sub":"x","hermes_roles":"admin","aud":"someone-else"`),
		"another issuer":        iss.Token(`"sub":"x","hermes_roles":"admin","iss":"https://evil.example"`),
		"expired":               iss.Token(fmt.Sprintf(`"sub":"x","hermes_roles":"admin","exp":%d`, time.Now().Add(-time.Minute).Unix())),
		"alg none":              unsigned,
		"claims changed":        header + "." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"x","hermes_roles":"admin","aud":"hermes","exp":9999999999}`)) + "." + sig,
		"not a JWT":             "hello",
		"an API key's shape":    KeyPrefix + strings.Repeat("a", 16) + "_" + strings.Repeat("b", 52),
		"three dots of garbage": "a.b.c",
		"a '#' in the subject":  iss.Token(`"sub":"app#alice","hermes_roles":"user"`),
		"a control character":   iss.Token(`"sub":"u\u001b[31m","hermes_roles":"user"`),
		"a bidi override":       iss.Token(`"sub":"u\u202e","hermes_roles":"user"`),
		"no subject":            iss.Token(`"hermes_roles":"user"`),
	} {
		_, err := v.Verify(ctx, tok)
		if !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("%s: %v", name, err)
		}
		if err != nil && len(tok) > 20 && strings.Contains(err.Error(), tok) {
			t.Errorf("%s: the error repeats the token", name)
		}
	}
	// A long name is cut on a character boundary; an unprintable one is not used.
	long, err := v.Verify(ctx, iss.Token(`"sub":"u9","preferred_username":"`+strings.Repeat("a", 127)+`é"`))
	if err != nil || len(long.Name) > 128 || !utf8.ValidString(long.Name) {
		t.Errorf("a long name: %q %v", long.Name, err)
	}
	if c, err := v.Verify(ctx, iss.Token(`"sub":"u10","preferred_username":"admin\u202e"`)); err != nil || c.Name != "u10" {
		t.Errorf("an unprintable name: %+v %v", c, err)
	}
	// An issuer that cannot be reached is not "unauthenticated": the gateway says 503.
	gone := authtest.NewIssuer(t)
	gone.Close()
	down, _ := NewOIDC(OIDCConfig{Issuer: gone.URL, Audience: "hermes"})
	if _, err := down.Verify(ctx, good); err == nil || errors.Is(err, ErrUnauthenticated) {
		t.Errorf("issuer down: %v", err)
	}
	// … and is not asked again at once: the next requests are answered from memory.
	start := time.Now()
	for range 20 {
		if _, err := down.Verify(ctx, good); err == nil {
			t.Fatal("issuer down: accepted")
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("20 requests while the issuer is down took %s", d)
	}
	if _, err := NewOIDC(OIDCConfig{Issuer: iss.URL}); err == nil {
		t.Error("no audience accepted")
	}
}

// A token remembered by Cached stops naming its caller when it expires, whatever the TTL.
func TestCachedForgetsExpiredTokens(t *testing.T) {
	now := time.Now()
	next := &mapVerifier{callers: map[string]*Caller{"tok": {ID: "oidc:x#1", Role: RoleUser, Expires: now.Add(time.Second)}}}
	c := &Cached{Next: next, TTL: time.Hour, now: func() time.Time { return now }}
	if _, err := c.Verify(context.Background(), "tok"); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Second)
	if _, ok := c.Known("tok"); ok {
		t.Error("an expired token is known")
	}
	_, _ = c.Verify(context.Background(), "tok")
	if next.calls != 2 {
		t.Errorf("asked %d times; an expired token must be asked again", next.calls)
	}
}

// Chain sends API keys to the key store and JWTs to the issuer, nothing else anywhere.
func TestChain(t *testing.T) {
	keys := &mapVerifier{callers: map[string]*Caller{}}
	tokens := &mapVerifier{callers: map[string]*Caller{}}
	ch := Chain{Keys: keys, OIDC: tokens}
	for _, cred := range []string{"hk_x", "a.b.c", "plain", "a.b"} {
		if _, err := ch.Verify(context.Background(), cred); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("%s: %v", cred, err)
		}
	}
	if keys.calls != 1 || tokens.calls != 1 {
		t.Errorf("keys asked %d, tokens %d", keys.calls, tokens.calls)
	}
}

// mapVerifier names the callers of its map and counts what it is asked.
type mapVerifier struct {
	callers map[string]*Caller
	calls   int
}

func (v *mapVerifier) Verify(_ context.Context, cred string) (*Caller, error) {
	v.calls++
	if c, ok := v.callers[cred]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("%w: unknown", ErrUnauthenticated)
}
