// Package app turns Hermes' services into processes: it reads flags and environment, sets up
// logging, connects to NATS (or embeds it), provisions the bus, runs the services until a
// signal, and shuts them down in order. The binaries in cmd/ are thin wrappers around it.
package app
