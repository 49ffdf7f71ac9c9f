// Package authtest runs an OpenID Connect issuer for tests: discovery and keys over HTTP on
// loopback, and tokens signed with its key.
package authtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/coreos/go-oidc/v3/oidc/oidctest"
)

// Audience is the audience Token puts in tokens unless told otherwise.
const Audience = "hermes"

// Issuer is a running test issuer.
type Issuer struct {
	// URL is the issuer's URL, as its tokens name it.
	URL string
	key *ecdsa.PrivateKey
	srv *httptest.Server
}

// NewIssuer starts an issuer, stopped when the test ends.
func NewIssuer(t testing.TB) *Issuer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s := &oidctest.Server{PublicKeys: []oidctest.PublicKey{{PublicKey: key.Public(), KeyID: "k1", Algorithm: oidc.ES256}},
		Algorithms: []string{oidc.ES256}}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	s.SetIssuer(srv.URL)
	return &Issuer{URL: srv.URL, key: key, srv: srv}
}

// Close stops the issuer.
func (i *Issuer) Close() { i.srv.Close() }

// Token signs claims — a JSON object's members, without braces — with iss, aud (Audience) and
// exp (an hour from now) added unless given.
func (i *Issuer) Token(claims string) string {
	full := claims
	if !strings.Contains(claims, `"iss"`) {
		full += fmt.Sprintf(`,"iss":%q`, i.URL)
	}
	if !strings.Contains(claims, `"aud"`) {
		full += fmt.Sprintf(`,"aud":%q`, Audience)
	}
	if !strings.Contains(claims, `"exp"`) {
		full += fmt.Sprintf(`,"exp":%d`, time.Now().Add(time.Hour).Unix())
	}
	return oidctest.SignIDToken(i.key, "k1", oidc.ES256, "{"+strings.TrimPrefix(full, ",")+"}")
}
