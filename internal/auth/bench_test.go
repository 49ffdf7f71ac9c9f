package auth

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/auth/authtest"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
)

// BenchmarkVerify is what naming a caller costs a gateway per request: an API key read from
// the key store (an embedded server on loopback) or remembered (auth.Cached, as the gateway
// runs it), and an OIDC token's signature checked (ES256) or remembered.
func BenchmarkVerify(b *testing.B) {
	ctx := context.Background()
	js, err := jetstream.New(bustest.NewServer(b).Connect(b))
	if err != nil {
		b.Fatal(err)
	}
	bucket, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "hermes-keys-bench"})
	if err != nil {
		b.Fatal(err)
	}
	keys := NewKeys(bucket)
	key, _, err := keys.Create(ctx, NewKey{Name: "bench", Role: RoleUser})
	if err != nil {
		b.Fatal(err)
	}
	iss := authtest.NewIssuer(b)
	tokens, err := NewOIDC(OIDCConfig{Issuer: iss.URL, Audience: authtest.Audience})
	if err != nil {
		b.Fatal(err)
	}
	token := iss.Token(`"sub":"bench","roles":"user"`)
	for _, c := range []struct {
		name string
		v    Verifier
		cred string
	}{
		{"APIKey/store", keys, key},
		{"APIKey/cached", &Cached{Next: keys}, key},
		{"JWT/verified", tokens, token},
		{"JWT/cached", &Cached{Next: tokens}, token},
	} {
		b.Run(c.name, func(b *testing.B) {
			if _, err := c.v.Verify(ctx, c.cred); err != nil { // discovery and keys fetched once
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.v.Verify(ctx, c.cred); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
