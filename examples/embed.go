// Package examples holds the example routes and requests, also built into the hermes binary so
// that `hermes up` and `hermes route` work from any directory.
package examples

import "embed"

// Files holds routes.yaml, every request*.json, the demo tools' contracts (contracts/), the
// seed's tool policies (tool-policies.yaml), which hermes up applies, and the example
// blueprints (blueprints/*.json).
//
//go:embed routes.yaml request*.json contracts/*.yaml tool-policies.yaml blueprints/*.json
var Files embed.FS
