// Package egress holds the rules for what leaves a tool worker, whatever the action kind:
// which addresses it dials (never link-local or cloud metadata, loopback only when written),
// where --resolve sends a host:port instead, which ${env.NAME} values it may put in a header
// and the one origin each may go to, and how those values are redacted from what a tool
// answers. The HTTP and gRPC executors both go through it.
package egress
