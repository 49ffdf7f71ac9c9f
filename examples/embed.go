// Package examples holds the example routes and requests, also built into the hermes binary so
// that `hermes up` and `hermes route` work from any directory.
package examples

import "embed"

// Files holds routes.yaml, every request*.json, the demo tools' contracts (contracts/), the
// seed's tool policies (tool-policies.yaml), which hermes up applies, the example
// blueprints (blueprints/*.json), and the seed's memory filters and intent decay
// (memory.yaml), hermes up's --memory-config.
//
//go:embed routes.yaml request*.json contracts/*.yaml tool-policies.yaml blueprints/*.json memory.yaml
var Files embed.FS
