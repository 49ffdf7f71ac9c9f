// Package router is the Hermes router worker. It reads requests from the bus, matches each
// tool call against the routes table and dispatches it, with the resolved action, to the tool's
// consumer; it reads tool results, records them, and publishes exactly one response per request
// once every call has a result.
//
// A router keeps no request state in memory: a request's plan (its call ids) and each call's
// result live in the hermes-calls KV bucket, written with Create, so any router instance can
// pick up any request or result, a duplicate result cannot be counted twice, and a router that
// dies mid-request leaves nothing another router could not finish. The response is written
// with Create to hermes-responses before it is published with a deterministic message id, so
// concurrent routers completing the same request publish one response.
package router
