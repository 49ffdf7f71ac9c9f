// Package examples holds the example routes and requests, also built into the hermes binary so
// that `hermes up` and `hermes route` work from any directory.
package examples

import "embed"

// Files holds routes.yaml and every request*.json.
//
//go:embed routes.yaml request*.json
var Files embed.FS
