// Package examples holds the example routes and requests, also built into the hermes binary so
// that `hermes up` and `hermes route` work from any directory.
package examples

import "embed"

// Files holds routes.yaml, every request*.json and the demo tools' contracts (contracts/).
//
//go:embed routes.yaml request*.json contracts/*.yaml
var Files embed.FS
