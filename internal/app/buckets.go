package app

import (
	"slices"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/approvals"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/internal/coordination"
	"github.com/hermesbus/hermes/internal/erasure"
	"github.com/hermesbus/hermes/internal/memory"
	"github.com/hermesbus/hermes/internal/policies"
	"github.com/hermesbus/hermes/pkg/bus"
)

// Buckets are the buckets Hermes' own services keep their state in beside the bus's, for a bus
// configured with cfg: callers' credentials (auth.Buckets) and sessions' owners
// (admission.Bucket), policies and their rate windows (policies.Buckets), and approvals
// (approvals.Buckets), blueprints and their runs, the resources' turns (coordination), memory (memory.Buckets) and the erasures owners ask
// for (erasure.Buckets). Every process provisions and opens them (Connect), and every NATS
// user's permissions say who may touch them.
func Buckets(cfg bus.Config) []bus.Bucket {
	return slices.Concat(auth.Buckets(), []bus.Bucket{admission.Bucket(cfg)}, policies.Buckets(), approvals.Buckets(), blueprints.Buckets(), coordination.Buckets(), memory.Buckets(0), erasure.Buckets())
}

// withBuckets is cfg with Buckets(cfg).
func withBuckets(cfg bus.Config) bus.Config {
	cfg.Buckets = Buckets(cfg)
	return cfg
}

// apiKeys are the API keys kept on b.
func apiKeys(b *bus.Bus) *auth.Keys { return auth.NewKeys(b.Bucket(auth.KeysBucket)) }
