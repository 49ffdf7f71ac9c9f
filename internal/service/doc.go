// Package service is how Hermes' processes run their parts: each a Service with a name, a
// check of its configuration, and Run until its context ends; and the loop every consumer of
// the bus runs in (Consume), which finds its consumer again when it is missing or fails.
package service
