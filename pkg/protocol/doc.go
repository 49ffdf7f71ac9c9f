// Package protocol defines what Hermes says on the bus and at its HTTP edge: the HermesRequest
// and HermesResponse of a caller, the HermesMessage envelope of every bus event with its
// versioned type names, the subjects and message ids those events travel under, and the codecs
// (msgpack on the bus, JSON at the edge).
//
// Guarantees:
//   - Arguments and content are carried as their exact JSON bytes through both codecs, so
//     64-bit integers and key order survive a round trip unchanged.
//   - Every decoder validates what it returns: ids that become subject tokens match
//     [A-Za-z0-9_-]{1,128}, so a value returned by a decoder is safe to build subjects from.
//     Subject builders do not validate again; callers pass only validated ids.
//   - The msgpack decoder checks every declared length against the bytes that remain and bounds
//     nesting before it allocates, so hostile bytes cannot make it allocate more than a small
//     multiple of their own size.
//   - Validation errors name the offending field, e.g. "tool_calls[1].tool_call_id is required".
//
// The package imports no NATS code, so other programs can use it and it can be fuzzed alone.
package protocol
