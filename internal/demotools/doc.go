// Package demotools is an HTTP service of fake but believable tools, so the Hermes examples
// work with nothing else installed: `hermes up` serves it on 127.0.0.1:8081 and
// examples/routes.yaml routes the HTTP demo tools to it (deploy/routes.yaml does the same for
// docker-compose, at http://demo-tools:8081). The seed's meeting tools — calendar_free_slots,
// meeting_book, notify_send — are Go functions served with the SDK (MeetingTools, ServeMeetings):
// both kinds of tool run wherever the demo tools do.
//
// # Tools
//
// The answers are derived from the inputs (a hash of the input picks from believable lists),
// so the same question gets the same answer; dates that must make sense today (next premium,
// order timeline) are computed from the current day.
//
//	tool                 method and path               arguments (* required)
//	get_policy_number    GET  /v1/policy/number        name | customer_name | match_1 (default: the demo customer 张三)
//	get_policy_status    GET  /v1/policy/status        name* | customer_name | match_1
//	weather_search       GET  /v1/weather              city*, date (YYYY-MM-DD, default today)
//	calendar_query       GET  /v1/calendar/activities  type* (indoor_activities|outdoor_activities), city (default 北京), date (default today)
//	order_query          GET  /v1/orders/{order_id}    order_id* (path; /v1/orders?order_id=… also works)
//	logistics_urge       POST /v1/logistics/urge       order_id* or tracking_number*, note
//	address_update       POST /v1/orders/{order_id}/address  order_id*, shipping_address*, hold_ms
//	refund_apply         POST /v1/orders/{order_id}/refund   order_id*, amount, reason, hold_ms
//	echo                 POST /v1/echo (or GET)        anything; see below
//	order_query_broken   GET  /v1/broken/orders        as order_query; an unknown order is "ORDER_NOT_FOUND " (a trailing space)
//	payment_charge_broken POST /v1/broken/payments     amount*, currency*; amount 0 answers text, not JSON
//	                     (and /v1/sandbox/payments, its sandbox reach)
//
// The change tools take the order from the path or, at /v1/orders/address and
// /v1/orders/refund, from the order_id argument alone; see Changing orders.
//
// The two broken tools are there to be refused by the contract sandbox
// (examples/sandbox). The Go meeting tools take the seed's arguments:
//
//	calendar_free_slots  user_id*, date* (YYYY-MM-DD), duration_minutes (default 60)
//	meeting_book         title*, attendees* (ids), start_time* (ISO), duration_minutes (default 60), location
//	notify_send          user_ids*, message*, channel (push|sms|email, default push)
//
// GET / lists the HTTP tools; GET /healthz and GET /health answer {"status":"ok"}.
//
// # Arguments
//
// Arguments arrive as the Hermes tool worker sends them: the query string for GET and DELETE
// (a string as its text, a number or boolean as its JSON text, an array as repeated keys, an
// object as its JSON text) and a JSON object body for POST, PUT and PATCH. Every tool accepts
// both forms. Regex capture groups of a route arrive as extra arguments (match_1, … or by group
// name); get_policy_status takes the holder's name from match_1, as captured by the seed's
// intent_regex. The Idempotency-Key header (request_id/tool_call_id, the same on every retry of
// one call) makes the ids logistics_urge hands out stable across retries; echo counts
// fail_times by it. (meeting_book's event id follows from its arguments.)
//
// # Responses
//
// Every response is JSON with Content-Type application/json and X-Execution-Time, the
// milliseconds the handler took. Request bodies are bounded to 1 MiB (413 beyond).
// Errors have the tools' error shape
//
//	{"error_code": "INVALID_ARGUMENT", "recovery_hint": "provide \"city\": …", "message": "…"}
//
// where the recovery hint names the argument at fault: 400 INVALID_ARGUMENT for bad or missing
// input, 404 NOT_FOUND for an unknown path, 405 METHOD_NOT_ALLOWED, 413 PAYLOAD_TOO_LARGE, and
// the tools' own errors (logistics_urge answers 409 ORDER_DELIVERED for a delivered order,
// refund_apply 409 REFUND_NOT_ALLOWED for an order that is not paid, and both change tools
// 409 STALE_FENCE for a superseded turn).
//
// # Echo
//
// echo answers 200 with exactly the JSON object it received, byte for byte (for GET, the query
// as an object of strings; a repeated key becomes an array of strings). Control arguments stay
// in the echoed object and apply in this order:
//
//   - fail_times N: the first N requests carrying the same Idempotency-Key header (no header
//     counts as the empty key) answer 503 {"error_code":"UNAVAILABLE","recovery_hint":"retry
//     later","message":"failing try k of N"} at once; the later ones go on. The counters live in
//     memory, for the 10 000 most recently used keys.
//   - delay_ms: wait that long before answering; a cancelled request stops waiting.
//   - barrier {"id": string, "count": number, "timeout_ms": number}: answer only once count
//     requests with that barrier id are in flight together, all of them at once. A request
//     whose client goes away leaves the barrier; one that waits timeout_ms (default 10000)
//     answers 504 BARRIER_TIMEOUT. A released id can be reused by a new group; a request
//     giving another count than the group filling under its id is a 400.
//   - status: answer with that HTTP status (200–599) instead of 200, with the echoed object.
//
// # Changing orders
//
// address_update and refund_apply are the seed's state-coordination example (seed 003 §2.3):
// both change an order, and the order they run in matters, since refund_apply refunds to the
// shipping address the order has when the refund is applied. Their contracts name the order
// (resource_key: order_id) and put address_update first (precedence), so Hermes serializes
// them per order. address_update answers {"order_id", "field": "shipping_address", "old",
// "new", "tx", "fence"}; refund_apply moves payment_status from paid to refunding and adds
// "refund_to", or answers 409 REFUND_NOT_ALLOWED when the order is not paid. tx and fence are
// the call's grant, absent for a call made without Hermes.
//
// The orders live in memory. One seen for the first time starts as the seed says: order_123
// with shipping_address "A" and payment_status "paid"; any other id with an address derived
// from the id, and paid. At most 10 000 orders are kept: to make room for a new one, the order
// whose last change began longest ago, among those with no change in flight, is forgotten
// with its fencing token and its audit; when every order has a change in flight the new one
// is refused 503 UNAVAILABLE. hold_ms (0 to 5000) holds a change open between its start and
// its commit, so that tests can make changes overlap; a call whose client goes away meanwhile
// changes nothing.
//
// GET /v1/orders/{order_id}/changes answers an order's audit: {"order_id", "changes": [{"tool",
// "field", "old", "new", "tx", "fence", "started_at", "committed_at"}, …], "overlaps",
// "stale_refused"}, with the last 1 000 committed changes, oldest first. overlaps counts the
// changes that began while another change of the order was in flight, the tools' own evidence
// of interleaving; stale_refused counts the calls refused STALE_FENCE.
//
// # Fencing
//
// Hermes dispatches every call that changes a resource with its turn's grant, in the headers
// X-Hermes-Tx (the transaction id), X-Hermes-Fence (the fencing token, strictly increasing per
// resource) and X-Hermes-Resource. The change tools remember the highest token each order has
// seen and check a call's token twice: when its change starts, and again when it commits,
// under the lock that guards the write. A lower token is refused 409 STALE_FENCE and changes
// nothing: a newer turn has superseded it (Hermes gave up on a slow call and granted the next
// one, say). An equal token is the same turn, since every retry of one call carries the same
// token, and goes through. A call without X-Hermes-Fence is a direct call, made without Hermes,
// and goes through unchecked; a header that is not a positive whole number is a 400
// INVALID_ARGUMENT naming it. The demo keeps the tokens in memory; a restart forgets them.
//
// Any tool that changes state under Hermes must do the same, with the token kept durably
// with the resource (a column of its row, a field of its document) and checked atomically
// with the write, for example by a conditional update that raises it:
//
//	UPDATE orders SET shipping_address = $1, fence = $2 WHERE id = $3 AND fence <= $2
//
// where changing no row refuses the call. A check before the write and apart from it lets a
// stale turn in between; a token kept apart from the resource is lost or rolled back without
// it. docs/fencing.md says the same for those who write tools.
//
// A Handler's state (echo counters, barriers, the changed orders) is its own and safe for
// concurrent use.
package demotools
