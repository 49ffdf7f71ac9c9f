// Package whatif answers "what would this routes file change?" from Hermes' record, without
// running anything: a [Record] collects the recorded requests and how each of their calls was
// actually routed (the rule named by its tool_call message, or NO_ROUTE), and [Record.Compare]
// matches every call again against a new routes table with the router's own matcher
// ([routes.Table.Match] on the call's tool name and the request's intent) and reports the calls
// that would be routed differently.
//
// A call is routed differently when the rule changes (including to or from no route), or when
// the same rule would now send it elsewhere: a different action (URL, method, headers, timeout,
// retry policy, or kind) or different parameters captured by the rule's intent_regex. A call
// whose routing is not on record yet (not dispatched: the request was still in flight, or no
// router ran) cannot be compared and is reported apart.
//
// A request recorded more than once (a redelivery, a client retry after the stream's duplicate
// window) counts once: the first record of a request_id is the request, as it is for the router,
// which ignores a request_id reused for other content.
//
// [Policies] answers the same question of a policy file: it collects the recorded requests and
// the first decision each call's tool policy made (on its dispatch, its refused result, or a
// policy event), and [Policies.Compare] decides every call again under the file's policies
// with the router's own decision logic (package policies: its Replay keeps rate windows in
// memory, on the record's clock), reporting the calls decided differently.
//
// [CompareRuns] answers it of a blueprint: it walks each recorded run of the blueprint (as the
// runs' bucket keeps it: its user_input and every step's input, output, status and condition)
// again along the new blueprint, with the answers the run's own calls got, and reports the
// runs whose path would part from the recorded one: a step run, skipped or failed otherwise,
// a call with other arguments or to a tool the run did not call (whose answer is unknown), or
// another end. No tool is called.
//
// Nothing here reads NATS or publishes anything; a Record is fed from a reading of the record
// (package record) and is not safe for concurrent use.
package whatif
