// Package deadletter handles the messages Hermes' consumers give up on. When a consumer of the
// record terminates a message (it can never be handled: undecodable, invalid) or exhausts its
// deliveries (it failed every time, or its worker died on the last one), the server publishes
// an advisory, which the HERMES_DLQ stream captures, so none is lost while no processor runs.
// The Processor turns each advisory into a dead letter on hermes.dlq.<consumer> — the original
// bytes with the reason, the original subject, stream sequence and delivery count in headers —
// and answers whoever waits: a dead tool call gets an error result (error_code DEAD_LETTERED,
// or the call's last real failure), a dead request gets a failed response. Both are written
// with the same deterministic ids as real ones, so a late real answer cannot double them.
//
// Retry re-drives a dead letter: it publishes the original message again to its subject.
package deadletter
