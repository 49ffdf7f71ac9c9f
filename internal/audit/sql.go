package audit

// The projection's statements. Each is an upsert keyed by ids of the record whose outcome does
// not depend on how often it runs: a column takes the first value seen (coalesce), the earliest
// time (least), or the value of the message that decides it (a call's counted result, an
// approval's decision). Replaying the record leaves the same rows.

const sqlRequest = `INSERT INTO hermes_requests AS r (request_id, session_id, intent, created_at, calls, serial,
	caller_id, caller_name, caller_role, end_user, run_id, approval_id, stream, seq, sandbox)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
ON CONFLICT (request_id) DO UPDATE SET
	sandbox = r.sandbox OR excluded.sandbox,
	session_id = coalesce(r.session_id, excluded.session_id),
	intent = coalesce(r.intent, excluded.intent),
	created_at = least(r.created_at, excluded.created_at),
	calls = coalesce(r.calls, excluded.calls),
	serial = coalesce(r.serial, excluded.serial),
	caller_id = coalesce(r.caller_id, excluded.caller_id),
	caller_name = coalesce(r.caller_name, excluded.caller_name),
	caller_role = coalesce(r.caller_role, excluded.caller_role),
	end_user = coalesce(r.end_user, excluded.end_user),
	run_id = coalesce(r.run_id, excluded.run_id),
	approval_id = coalesce(r.approval_id, excluded.approval_id),
	stream = coalesce(r.stream, excluded.stream),
	seq = coalesce(r.seq, excluded.seq)`

// sqlResponse: a request's one response (the record keeps the first).
const sqlResponse = `INSERT INTO hermes_requests AS r (request_id, session_id, status, error_code, responded_at,
	caller_id, caller_name, caller_role, end_user)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (request_id) DO UPDATE SET
	session_id = coalesce(r.session_id, excluded.session_id),
	status = coalesce(r.status, excluded.status),
	error_code = CASE WHEN r.status IS NULL THEN excluded.error_code ELSE r.error_code END,
	responded_at = coalesce(r.responded_at, excluded.responded_at),
	caller_id = coalesce(r.caller_id, excluded.caller_id),
	caller_name = coalesce(r.caller_name, excluded.caller_name),
	caller_role = coalesce(r.caller_role, excluded.caller_role),
	end_user = coalesce(r.end_user, excluded.end_user)`

const sqlCancel = `INSERT INTO hermes_requests AS r (request_id, session_id, cancelled_by, cancel_reason, cancelled_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (request_id) DO UPDATE SET
	session_id = coalesce(r.session_id, excluded.session_id),
	cancelled_by = coalesce(r.cancelled_by, excluded.cancelled_by),
	cancel_reason = coalesce(r.cancel_reason, excluded.cancel_reason),
	cancelled_at = least(r.cancelled_at, excluded.cancelled_at)`

// sqlCall: a call as its request asks for it, before anything happens to it (a call parked,
// refused or not routed has no dispatch). The request and the dispatch name the call's tool
// (requested); what a worker says of it (a start, a result) names it only until they do.
const sqlCall = `INSERT INTO hermes_steps AS s (request_id, tool_call_id, tool_name, arguments_summary, sandbox, requested)
VALUES ($1, $2, $3, $4, $5, true)
ON CONFLICT (request_id, tool_call_id) DO UPDATE SET
	tool_name = excluded.tool_name,
	requested = true,
	arguments_summary = coalesce(s.arguments_summary, excluded.arguments_summary),
	sandbox = s.sandbox OR excluded.sandbox`

// sqlDispatch: the router's dispatch of a call (again, when re-driven: the first stands).
const sqlDispatch = `INSERT INTO hermes_steps AS s (request_id, tool_call_id, tool_name, route, action_kind, fast_lane,
	dispatched_at, contract_version, arguments_summary, tx, fence, sandbox, requested)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, true)
ON CONFLICT (request_id, tool_call_id) DO UPDATE SET
	requested = true,
	sandbox = s.sandbox OR excluded.sandbox,
	tool_name = excluded.tool_name,
	route = CASE WHEN ` + firstDispatch + ` THEN coalesce(excluded.route, s.route) ELSE coalesce(s.route, excluded.route) END,
	action_kind = CASE WHEN ` + firstDispatch + ` THEN coalesce(excluded.action_kind, s.action_kind) ELSE coalesce(s.action_kind, excluded.action_kind) END,
	fast_lane = s.fast_lane OR excluded.fast_lane,
	dispatched_at = least(s.dispatched_at, excluded.dispatched_at),
	contract_version = CASE WHEN ` + firstDispatch + ` THEN coalesce(excluded.contract_version, s.contract_version) ELSE coalesce(s.contract_version, excluded.contract_version) END,
	arguments_summary = coalesce(s.arguments_summary, excluded.arguments_summary),
	tx = CASE WHEN ` + firstDispatch + ` THEN coalesce(excluded.tx, s.tx) ELSE coalesce(s.tx, excluded.tx) END,
	fence = CASE WHEN ` + firstDispatch + ` THEN coalesce(excluded.fence, s.fence) ELSE coalesce(s.fence, excluded.fence) END`

// firstDispatch holds, in sqlDispatch's update, when the dispatch written is the first of its
// call (the earliest) and no result said its own route and grant yet: whatever order two
// dispatches of a call are written in, the first stands, and a counted result's grant over both.
const firstDispatch = `(s.result_seq IS NULL AND (s.dispatched_at IS NULL OR excluded.dispatched_at < s.dispatched_at))`

// sqlStarted: a try of a call began.
const sqlStarted = `INSERT INTO hermes_steps AS s (request_id, tool_call_id, tool_name, start_time, tries, sandbox)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (request_id, tool_call_id) DO UPDATE SET
	sandbox = s.sandbox OR excluded.sandbox,
	tool_name = coalesce(s.tool_name, excluded.tool_name),
	start_time = least(s.start_time, excluded.start_time),
	tries = greatest(s.tries, excluded.tries)`

// sqlRetry: a try that retries a failed one.
const sqlRetry = `INSERT INTO hermes_retries (request_id, tool_call_id, attempt, tool_name, error_code, at, sandbox)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (request_id, tool_call_id, attempt) DO NOTHING`

// sqlResult: a call's result that counts — the first on its subject, or a re-driven call's own
// after the dead-letter processor's answer — whatever order they are written in: a tool's
// result wins over the dead-letter processor's, and of two alike the one recorded first; the
// route, contract version and grant it names are the step's.
const sqlResult = `INSERT INTO hermes_steps AS s (request_id, tool_call_id, tool_name, route, end_time, attempts, status,
	error_code, error_origin, tool_error_code, execution_ms, contract_version, result_summary, tx, fence, dead_answer, result_seq, sandbox)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)
ON CONFLICT (request_id, tool_call_id) DO UPDATE SET
	sandbox = s.sandbox OR excluded.sandbox,
	tool_name = coalesce(s.tool_name, excluded.tool_name),
	route = coalesce(excluded.route, s.route),
	end_time = excluded.end_time,
	attempts = excluded.attempts,
	status = excluded.status,
	error_code = excluded.error_code,
	error_origin = excluded.error_origin,
	tool_error_code = excluded.tool_error_code,
	execution_ms = excluded.execution_ms,
	contract_version = coalesce(excluded.contract_version, s.contract_version),
	result_summary = excluded.result_summary,
	tx = coalesce(excluded.tx, s.tx),
	fence = coalesce(excluded.fence, s.fence),
	dead_answer = excluded.dead_answer,
	result_seq = excluded.result_seq
WHERE s.result_seq IS NULL OR (s.dead_answer AND NOT excluded.dead_answer)
	OR (s.dead_answer = excluded.dead_answer AND excluded.result_seq < s.result_seq)`

const sqlPolicy = `INSERT INTO hermes_policy_decisions (key, request_id, tool_call_id, tool_name, decision, rule, source, version,
	approval_id, decided_by, at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (key) DO NOTHING`

const sqlApprovalAsked = `INSERT INTO hermes_approvals AS a (approval_id, request_id, tool_call_id, tool_name, rule, asked_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (approval_id) DO UPDATE SET
	request_id = coalesce(a.request_id, excluded.request_id),
	tool_call_id = coalesce(a.tool_call_id, excluded.tool_call_id),
	tool_name = coalesce(a.tool_name, excluded.tool_name),
	rule = coalesce(a.rule, excluded.rule),
	asked_at = least(a.asked_at, excluded.asked_at)`

// sqlApprovalDecided: the first decision of an approval (the earliest, whatever order they are
// written in) is its decision.
const sqlApprovalDecided = `INSERT INTO hermes_approvals AS a (approval_id, request_id, tool_call_id, tool_name, status, decided_by, decided_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (approval_id) DO UPDATE SET
	request_id = coalesce(a.request_id, excluded.request_id),
	tool_call_id = coalesce(a.tool_call_id, excluded.tool_call_id),
	tool_name = coalesce(a.tool_name, excluded.tool_name),
	status = excluded.status,
	decided_by = excluded.decided_by,
	decided_at = excluded.decided_at
WHERE a.decided_at IS NULL OR excluded.decided_at < a.decided_at
	OR (excluded.decided_at = a.decided_at AND excluded.status < a.status)`

const sqlRunSeen = `INSERT INTO hermes_blueprint_runs AS r (run_id, blueprint, version, started_at)
VALUES ($1, $2, $3, $4)
ON CONFLICT (run_id) DO UPDATE SET started_at = least(r.started_at, excluded.started_at)`

const sqlRunEnded = `INSERT INTO hermes_blueprint_runs AS r (run_id, blueprint, version, status, ended_at, error_code, transfer_to, duration_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (run_id) DO UPDATE SET
	status = excluded.status,
	ended_at = excluded.ended_at,
	error_code = excluded.error_code,
	transfer_to = excluded.transfer_to,
	duration_ms = excluded.duration_ms`

// sqlStep: a blueprint step's latest event decides its status (of two at the same time, the
// one that ends it).
const sqlStep = `INSERT INTO hermes_blueprint_steps AS s (run_id, step, tool_name, status, request_id, tool_call_id, approval_id,
	error_code, condition, condition_result, started_at, updated_at, duration_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
ON CONFLICT (run_id, step) DO UPDATE SET
	tool_name = coalesce(s.tool_name, excluded.tool_name),
	request_id = coalesce(s.request_id, excluded.request_id),
	tool_call_id = coalesce(s.tool_call_id, excluded.tool_call_id),
	approval_id = coalesce(s.approval_id, excluded.approval_id),
	condition = coalesce(s.condition, excluded.condition),
	condition_result = coalesce(s.condition_result, excluded.condition_result),
	started_at = least(s.started_at, excluded.started_at),
	status = CASE WHEN ` + laterStep + ` THEN excluded.status ELSE s.status END,
	error_code = CASE WHEN ` + laterStep + ` THEN excluded.error_code ELSE s.error_code END,
	duration_ms = CASE WHEN ` + laterStep + ` THEN excluded.duration_ms ELSE s.duration_ms END,
	updated_at = CASE WHEN ` + laterStep + ` THEN excluded.updated_at ELSE s.updated_at END`

// laterStep holds, in sqlStep's update, when the event written is a later one of its step than
// the row's (or, at the same instant, one that ends it): its status stands, whatever order the
// events are written in; what any event says once (its request, its start) is kept.
const laterStep = `(s.updated_at IS NULL OR excluded.updated_at > s.updated_at
	OR (excluded.updated_at = s.updated_at AND excluded.status <> 'running'
		AND (s.status = 'running' OR excluded.status < s.status)))`

const sqlCoordination = `INSERT INTO hermes_coordination (request_id, tool_call_id, op, fence, tool_name, tx, position, held_by,
	suggested_order, reason, at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (request_id, tool_call_id, op, fence) DO NOTHING`

const sqlDecision = `INSERT INTO hermes_llm_decisions (run, turn, request_id, session_id, backend, model, fell_back, tries, offered,
	prefiltered, candidates, chosen, answered, warnings, intent_domain, intent_confidence, clarify, prompt_tokens,
	completion_tokens, latency_ms, error, at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22)
ON CONFLICT (run, turn) DO NOTHING`

const sqlError = `INSERT INTO hermes_audit_errors (stream, seq, subject, size, reason)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (stream, seq) DO NOTHING`

const sqlProgress = `INSERT INTO hermes_audit_progress AS p (stream, seq, stored_at)
VALUES ($1, $2, $3)
ON CONFLICT (stream) DO UPDATE SET
	seq = greatest(p.seq, excluded.seq),
	stored_at = greatest(p.stored_at, excluded.stored_at),
	updated_at = now()`

// sqlToolsOf reads the tools of calls ($1 request ids, $2 call ids, pairwise) as their
// requests and dispatches name them: a result sealed by a key trusted with some tools only
// counts for those.
const sqlToolsOf = `SELECT s.request_id, s.tool_call_id, s.tool_name FROM hermes_steps s
JOIN unnest($1::text[], $2::text[]) AS c(request_id, tool_call_id) USING (request_id, tool_call_id)
WHERE s.requested`
