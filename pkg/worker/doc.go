// Package worker is Hermes' public tool worker runtime: what a tool worker is, for any Go
// program that serves tools on a Hermes bus. A Worker pulls the calls of the tools it serves
// from their shared durable consumers, claims each in the call ledger, runs it with the
// Executor for its action kind, and records and publishes its result; any number of workers,
// in any number of processes, share the work.
//
// Executors declare their kind: package httpexec runs http actions (Hermes' own tool worker
// uses it), mcpexec the tools of MCP servers (kind mcp), grpcexec gRPC methods (kind grpc), and
// Funcs tools written as Go functions (kind go).
// Calls of each kind travel on subjects of their own, so a worker pulls only the kinds it runs
// and never takes a call meant for another. Executors are wrapped in Middleware — Standard
// (panic recovery, the try's timeout, the result limit) and any the program adds.
// Package workertest is the conformance suite every Executor must pass.
//
// Guarantees:
//   - Each try of a call is bounded by the route's timeout_ms. A failed try that may succeed
//     later is tried again after a delay computed from the route's retry policy and the try
//     number (the message is nak'ed with that delay), so the retry survives the death of this
//     worker; the last failure becomes an error result with error_code, error_origin,
//     recovery_hint and attempts. Every try of one call carries the same idempotency key,
//     <request_id>/<tool_call_id>.
//   - A call is run by at most one worker at a time and never again once the ledger says it is
//     finished (its result recorded); execution is at least once, results are exactly once.
//     A worker reads no message of the record: the ledger says which calls are finished and
//     who began recording a result, and results are stored without reading
//     (bus.PublishResult).
//   - A cancelled call is not started; a running one has its context ended (a tool's HTTP
//     request is aborted) and is answered CANCELLED, unless it finished first.
//   - Calls run concurrently up to Config.Concurrency per tool, so a slow call never holds up
//     another; a worker pulls only as many calls as it has free slots.
//
// The package depends on pkg/ only: pkg/bus, pkg/protocol, pkg/ledger, pkg/retry and
// pkg/tracing. Metrics come in through Observer.
package worker
