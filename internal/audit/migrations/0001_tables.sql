-- The audit trail: what the record says happened, projected into tables. Every row is keyed by
-- ids of the record, so projecting a message again changes nothing.

-- One row per request: who asked, what for, and how it ended.
CREATE TABLE hermes_requests (
    request_id    text PRIMARY KEY,
    session_id    text,
    intent        text,
    created_at    timestamptz,
    -- success, partial_success or failed once answered; NULL until then.
    status        text,
    -- why a request failed as a whole (its response's error code).
    error_code    text,
    responded_at  timestamptz,
    calls         bigint,
    serial        boolean,
    caller_id     text,
    caller_name   text,
    caller_role   text,
    end_user      text,
    -- the blueprint run the request is a step of; the approval it runs a call under.
    run_id        text,
    approval_id   text,
    cancelled_by  text,
    cancel_reason text,
    cancelled_at  timestamptz,
    -- a trial of the contract sandbox (its session is sandbox-<tool>), not a caller's.
    sandbox       boolean NOT NULL DEFAULT false,
    -- where the record keeps the request.
    stream        text,
    seq           bigint
);
CREATE INDEX hermes_requests_created ON hermes_requests (created_at);
CREATE INDEX hermes_requests_session ON hermes_requests (session_id);

-- One row per tool call of a request: where it went, when it ran, how it ended. Of its
-- arguments and its result only a summary: kind, size, count, field names; never a value.
CREATE TABLE hermes_steps (
    request_id        text NOT NULL,
    tool_call_id      text NOT NULL,
    tool_name         text,
    route             text,
    action_kind       text,
    fast_lane         boolean NOT NULL DEFAULT false,
    -- a trial call of the contract sandbox, not a caller's.
    sandbox           boolean NOT NULL DEFAULT false,
    -- the request or the dispatch named the tool (tool_name): not only a worker.
    requested         boolean NOT NULL DEFAULT false,
    dispatched_at     timestamptz,
    start_time        timestamptz,
    end_time          timestamptz,
    -- tries the call's result counts; tries: those whose start is recorded.
    attempts          bigint,
    tries             bigint,
    -- ok or error once the call has its result; NULL until then.
    status            text,
    error_code        text,
    error_origin      text,
    tool_error_code   text,
    execution_ms      bigint,
    contract_version  bigint,
    arguments_summary jsonb,
    result_summary    jsonb,
    -- the transaction and fencing token of the call's turn on the resource it changes.
    tx                text,
    fence             bigint,
    -- the result is the dead-letter processor's answer (a re-driven call's own replaces it).
    dead_answer       boolean NOT NULL DEFAULT false,
    result_seq        bigint,
    PRIMARY KEY (request_id, tool_call_id)
);
CREATE INDEX hermes_steps_end ON hermes_steps (end_time);
CREATE INDEX hermes_steps_tool ON hermes_steps (tool_name, end_time);

-- Every retried try of a call: the error code the try before it failed with.
CREATE TABLE hermes_retries (
    request_id   text NOT NULL,
    tool_call_id text NOT NULL,
    attempt      bigint NOT NULL,
    tool_name    text,
    error_code   text,
    at           timestamptz,
    -- a retry of a call the contract sandbox tried, not a caller's
    sandbox      boolean NOT NULL DEFAULT false,
    PRIMARY KEY (request_id, tool_call_id, attempt)
);
CREATE INDEX hermes_retries_at ON hermes_retries (at);

-- Every decision a tool's policy made about a call: on its dispatch, on its refusal, and the
-- events between (a wait, an approval asked for and decided).
CREATE TABLE hermes_policy_decisions (
    key          text PRIMARY KEY,
    request_id   text NOT NULL,
    tool_call_id text NOT NULL,
    tool_name    text,
    decision     text NOT NULL,
    rule         text,
    source       text,
    version      bigint,
    approval_id  text,
    decided_by   text,
    at           timestamptz
);
CREATE INDEX hermes_policy_request ON hermes_policy_decisions (request_id, tool_call_id);
CREATE INDEX hermes_policy_at ON hermes_policy_decisions (at);

-- Approvals: what was asked, who decided it, when.
CREATE TABLE hermes_approvals (
    approval_id  text PRIMARY KEY,
    request_id   text,
    tool_call_id text,
    tool_name    text,
    rule         text,
    asked_at     timestamptz,
    -- pending, approved, rejected or expired.
    status       text NOT NULL DEFAULT 'pending',
    decided_by   text,
    decided_at   timestamptz
);
CREATE INDEX hermes_approvals_decided ON hermes_approvals (decided_at);

-- Blueprint runs and their steps.
CREATE TABLE hermes_blueprint_runs (
    run_id      text PRIMARY KEY,
    blueprint   text,
    version     bigint,
    -- running until the run ends: succeeded, failed or transferred.
    status      text NOT NULL DEFAULT 'running',
    started_at  timestamptz,
    ended_at    timestamptz,
    error_code  text,
    transfer_to text,
    duration_ms bigint
);

CREATE TABLE hermes_blueprint_steps (
    run_id           text NOT NULL,
    step             text NOT NULL,
    tool_name        text,
    status           text,
    request_id       text,
    tool_call_id     text,
    approval_id      text,
    error_code       text,
    condition        text,
    condition_result boolean,
    started_at       timestamptz,
    updated_at       timestamptz,
    duration_ms      bigint,
    PRIMARY KEY (run_id, step)
);

-- State coordination: each proposal, wait, grant, release, expiry and conflict of a call that
-- changes a resource, with its transaction id and fencing token.
CREATE TABLE hermes_coordination (
    request_id      text NOT NULL,
    tool_call_id    text NOT NULL,
    op              text NOT NULL,
    fence           bigint NOT NULL,
    tool_name       text,
    tx              text,
    position        bigint,
    held_by         text,
    suggested_order text[],
    reason          text,
    at              timestamptz,
    PRIMARY KEY (request_id, tool_call_id, op, fence)
);
CREATE INDEX hermes_coordination_tx ON hermes_coordination (tx);

-- The agent loop's turns: which tools the model was offered and ranked, what it chose.
CREATE TABLE hermes_llm_decisions (
    run               text NOT NULL,
    turn              bigint NOT NULL,
    request_id        text,
    session_id        text,
    backend           text,
    model             text,
    fell_back         boolean,
    tries             bigint,
    offered           text[],
    prefiltered       boolean,
    -- [{name, score, similarity}], best first.
    candidates        jsonb,
    -- [{id, name, client, arguments: summary}]; answered: it answered in words instead.
    chosen            jsonb,
    answered          boolean,
    -- [{kind, tool, field}]
    warnings          jsonb,
    intent_domain     text,
    intent_confidence double precision,
    clarify           boolean,
    prompt_tokens     bigint,
    completion_tokens bigint,
    latency_ms        bigint,
    error             text,
    at                timestamptz,
    PRIMARY KEY (run, turn)
);

-- Records the audit could not project, with why: never a crash, never a silent gap.
CREATE TABLE hermes_audit_errors (
    stream  text NOT NULL,
    seq     bigint NOT NULL,
    subject text,
    size    bigint,
    reason  text NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream, seq)
);

-- How far the audit has projected each record stream.
CREATE TABLE hermes_audit_progress (
    stream     text PRIMARY KEY,
    seq        bigint NOT NULL,
    stored_at  timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);
