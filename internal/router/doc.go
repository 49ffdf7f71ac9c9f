// Package router is the Hermes router worker: it takes requests from the bus, runs each through its
// dispatch pipeline, and aggregates the calls' results into exactly one response per request.
//
// The pipeline is a list of Stages, run in order for every delivery of a request: serial (a serial
// request waits, parked, for its session's previous one), plan (record the request's plan; a
// request seen before goes on only with the calls that have no result yet), the stages a deployment
// adds (the contract check, ContractStage; policies, approvals and state coordination plug in the
// same way), and route (match each call against the routes table and resolve its action, or answer
// NO_ROUTE / ACTION_UNSUPPORTED). A stage may settle calls, hold one (the request parks until the
// hold wakes it, while the other calls go), park the whole request, or stop it; at the end the
// outlet records the decided results, publishes the dispatches as one batch and parks for held
// calls. Stages decide again from what is recorded on every delivery, so a redelivery, a repeated
// request or a wake-up changes nothing already done.
//
// A router keeps no request state in memory: the plan lives in the hermes-calls KV bucket, written
// with Create, and each call's result on the record under its call's own subject, where the first
// result that counts is the call's (bus.RecordResult, bus.PublishResult) — so any router instance
// can pick up any request or result, a duplicate result cannot be counted twice, and a router that
// dies mid-request leaves nothing another router could not finish. Requests of one session reach
// the routers in the order they were accepted (one partition consumer, one request in flight).
// Results carry their request's call ids in the envelope's correlation, so aggregation reads the
// plan only for results published without it.
package router
