package auth

import (
	"time"

	"github.com/hermesbus/hermes/pkg/bus"
)

// The buckets callers' credentials are kept in on the bus (bus.Config.Buckets).
const (
	// KeysBucket holds the callers' API keys (key: the key's id), each as a hash of its
	// secret, never the key (Keys). No TTL: a key lives until it is revoked, and a revoked one
	// stays listed.
	KeysBucket = "hermes-keys"
	// SigninsBucket holds browsers' sign-ins (Signins): the caller each stands for and a hash
	// of its secret, never the token. A sign-in lasts 12 hours at most (the bucket's TTL); the
	// bucket is bounded in bytes, refusing new sign-ins when full.
	SigninsBucket = "hermes-signins"
)

// Buckets are the buckets of callers' credentials: API keys, which gateways read and watch
// (hermes keys writes them, as admin), and sign-ins, which gateways write. Both are strict: a
// revocation or a sign-out must be seen by the next read, from whichever gateway.
func Buckets() []bus.Bucket {
	return []bus.Bucket{
		{Name: KeysBucket, Description: "Hermes: callers' API keys, hashed", MaxBytes: 16 << 20, Strict: true, Watchers: []bus.Role{bus.RoleGateway}},
		// Signing out purges a sign-in: a roll-up of its key.
		{Name: SigninsBucket, Description: "Hermes: browsers' sign-ins", MaxBytes: 64 << 20, TTL: 12 * time.Hour, Strict: true, Rollup: true, Writers: []bus.Role{bus.RoleGateway}},
	}
}
