// Package retry is Hermes' one way to space out tries: a Policy (exponential backoff with a
// cap and jitter, delays computed by cenkalti/backoff) and Do, a loop that tries until a
// function succeeds, says stop, or the context ends.
//
// Every retry loop in Hermes uses it: a route's retry policy between tries of a tool call,
// the redelivery delay of a failed handler, a subscriber's pause after a failed pull,
// re-recording a finished call's result through an outage, connecting and provisioning.
package retry
