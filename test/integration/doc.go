// Package integration runs Hermes' real services in-process against an embedded JetStream
// server and drives them over HTTP, as a user would.
package integration
