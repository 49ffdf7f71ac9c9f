// Package gateway is Hermes' HTTP edge over package submit: each handler decodes, submits (or
// looks up, or cancels) and renders; accepting, publishing and waiting are submit's.
//
// Endpoints:
//
//	POST /v1/route                 a HermesRequest; answers the HermesResponse (200), or 504 with
//	                               the request_id when the wait (?timeout=, default 30 s) runs out
//	                               while the request keeps running
//	GET  /v1/requests/{request_id} the response once there (200), 202 while pending, 404 unknown
//	DELETE /v1/requests/{request_id}
//	                               cancel (?reason=): 200 with the cancelled response, 409 if it
//	                               had finished, 404 unknown
//	GET  /v1/sessions/{session_id}/events
//	                               server-sent events: the session's recorded messages, its
//	                               history then each new one as it is stored, id = stream
//	                               sequence; Last-Event-ID (or ?after=) resumes after an id
//	GET  /v1/sessions              recent sessions, latest request first (?limit=, default 50)
//	GET  /                         the web UI (with /app.js and /style.css, built in): sessions,
//	                               each request's tool calls as a live waterfall, the messages
//	                               as JSON, a form for POST /v1/route
//	GET  /healthz, /readyz         liveness, and readiness (NATS connected, stream reachable)
//
// Guarantees: a body over the limit gets 413 and malformed input 400 with a JSON error naming
// the field, before anything is published. A request_id is accepted once (its plan, KV Create
// in hermes-calls): posting it again with the same content returns the first response and runs
// nothing twice; with different content it gets 409. A request published but not yet answered
// when the client gives up or the gateway restarts keeps running; its response is kept on the
// record. X-Trace-ID is kept (or made) and echoed back.
//
// While its NATS connection is down (it reconnects by itself), the gateway answers POST
// /v1/route and GET /v1/requests/{request_id} at once with 503 BUS_UNAVAILABLE and
// Retry-After: 1, having accepted nothing; a request already published when the connection
// dropped gets 504 when its wait runs out, and keeps running once the connection is back. An
// answer is 200 only with a response read from the bus or the record, never while unsure.
package gateway
