// Package tool is the Hermes tool worker: it takes tool calls from the shared durable consumer
// of each tool it serves, runs them through the Executor for their action kind (HTTP today),
// and publishes tool_started and tool_result events.
//
// Guarantees: each try of a call is bounded by the route's timeout_ms; a failed try that may
// succeed later (timeout, connection error, 429, 5xx) is nak'ed with a delay computed from the
// route's retry policy and the delivery count, so the retry survives the death of this worker;
// the last failure becomes an error result with error_code, error_origin, recovery_hint and
// attempts. Every try of one call carries the same Idempotency-Key, <request_id>/<tool_call_id>.
// ${env.NAME} placeholders in headers are resolved here and only for names on the worker's
// allow-list; their values never reach the bus, logs or errors. Calls run concurrently up to
// the worker's concurrency per tool, so a slow call never holds up another.
package tool
