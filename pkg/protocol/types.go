package protocol

import (
	"encoding/json"
	"strings"
	"time"
)

// Request is a HermesRequest: the tool calls an LLM (or any caller) asks for. RequestID and
// every ToolCallID come from the caller and are never regenerated; results are matched to calls
// by (RequestID, ToolCallID).
type Request struct {
	RequestID string `json:"request_id" msgpack:"request_id"`
	// SessionID groups requests of one conversation; empty means the session is RequestID.
	SessionID string     `json:"session_id,omitempty" msgpack:"session_id,omitempty"`
	Intent    string     `json:"intent" msgpack:"intent"`
	ToolCalls []ToolCall `json:"tool_calls" msgpack:"tool_calls"`
	// Serial requests of a session run one at a time, in the order they were accepted: each
	// is dispatched once the session's previous serial request has its response.
	Serial bool `json:"serial,omitempty" msgpack:"serial,omitempty"`
	// User is the end user the request is made for, as its JSON says. Only a caller allowed
	// to act for its users may name one; the gateway then records it in the envelope's
	// Caller, never in this payload.
	User string `json:"user,omitempty" msgpack:"-"`
	// Sandbox, when set, marks a request of the contract sandbox: its calls try one tool under
	// a candidate contract. Only Hermes makes such requests (no edge decodes the field).
	Sandbox *Sandbox `json:"sandbox,omitempty" msgpack:"sandbox,omitempty"`
	// Approval, when set, names the approval its one call runs under: the request Hermes
	// makes when a person approves a call a policy parked (request_id is the approval's id).
	// Only Hermes makes such requests (no edge decodes the field); the router checks the
	// approval again (approved, unused, the same tool, arguments and caller) before the call
	// runs.
	Approval string `json:"approval,omitempty" msgpack:"approval,omitempty"`
	// Recall, when set, marks a request of a door whose caller calls again once a parked
	// call is approved (MCP, the chat loop): an approval its calls open runs the identical
	// call made next, instead of a request Hermes makes on approval. Set by Hermes' doors
	// only.
	Recall bool `json:"recall,omitempty" msgpack:"recall,omitempty"`
	// Run, when set, names the blueprint run this request is a step of: its request_id is
	// RunRequestID(Run, step) and its session RunSession(Run). Only Hermes makes such
	// requests (no edge decodes the field).
	Run string `json:"run,omitempty" msgpack:"run,omitempty"`
}

// ApprovalRequestPrefix starts the ids of approvals, and of the requests Hermes runs approved
// calls in (their request_id is the approval's id); no other request may use one.
const ApprovalRequestPrefix = "apr-"

// RunPrefix starts the sessions of blueprint runs and the ids of their steps' requests; no
// other request may use one (a request run under an approval a step opened keeps the run's
// session).
const RunPrefix = "bpr-"

// MaxRunIDLen bounds a blueprint run's id, so that its session and step ids stay tokens.
const MaxRunIDLen = 96

// RunSession is the session of blueprint run runID.
func RunSession(runID string) string { return RunPrefix + runID }

// RunRequestID is the id of the request that runs step (a token: "1", "2-0", "fallback") of
// blueprint run runID, the same however often the run resumes.
func RunRequestID(runID, step string) string { return RunPrefix + runID + "-" + step }

// Sandbox says what a sandbox request tries: every call calls Tool under the candidate
// contract kept in the contracts' bucket at SandboxKey(Tool), at Revision. The router skips
// the input check (some cases are invalid on purpose) and sends the calls where the
// candidate's sandbox reach says (its reach, or the routes file, without one); workers judge
// the answers under the candidate.
type Sandbox struct {
	Tool     string `json:"tool" msgpack:"tool"`
	Revision uint64 `json:"revision" msgpack:"revision"`
	// Probe is the tool_call_id of the call that asks the tool's /health instead of calling
	// it; "" when none does.
	Probe string `json:"probe,omitempty" msgpack:"probe,omitempty"`
}

// SandboxSessionPrefix starts the sessions of the contract sandbox, SandboxSession(tool); no
// other request may use one (Validate), so that what the record, the metrics and the web view
// show of them is the sandbox's alone.
const SandboxSessionPrefix = "sandbox-"

// SandboxSession is the session the sandbox's requests trying tool are recorded under.
func SandboxSession(tool string) string { return SandboxSessionPrefix + tool }

// IsSandboxSession reports whether session is one of the sandbox's.
func IsSandboxSession(session string) bool { return strings.HasPrefix(session, SandboxSessionPrefix) }

// MemorySessionPrefix starts the sessions that hold owners' memory history (memory.v1
// events, one session per owner): no request may use one (Validate), so nobody claims another
// owner's history as a session of their own.
const MemorySessionPrefix = "memory-"

// IsMemorySession reports whether session is one of memory's.
func IsMemorySession(session string) bool { return strings.HasPrefix(session, MemorySessionPrefix) }

// SandboxKey is where a tool's candidate contract is kept in the contracts' bucket while the
// sandbox tries it: beside the tool's own key (tool names hold no dots, so no tool has it).
func SandboxKey(tool string) string { return "sandbox." + tool }

// Session returns the request's session id: SessionID, or RequestID when it has none.
func (r *Request) Session() string {
	if r.SessionID != "" {
		return r.SessionID
	}
	return r.RequestID
}

// ToolCall is one call an LLM asked for.
type ToolCall struct {
	ToolCallID string `json:"tool_call_id" msgpack:"tool_call_id"`
	Name       string `json:"name" msgpack:"name"`
	// Arguments is the call's JSON object, byte for byte as received (compacted).
	Arguments json.RawMessage `json:"arguments" msgpack:"arguments"`
}

// Response statuses. A response is never a bare error: a call that fails is reported in its
// result, and the response says how many calls succeeded.
const (
	StatusSuccess        = "success"         // every call ok
	StatusPartialSuccess = "partial_success" // some calls ok
	StatusFailed         = "failed"          // no call ok
)

// Result statuses of one call.
const (
	ResultOK    = "ok"
	ResultError = "error"
)

// Error origins: who failed.
const (
	OriginHermes = "hermes" // no route, timeout, unreachable, refused by policy
	OriginTool   = "tool"   // the tool answered with an error
)

// Response is a HermesResponse: one result per tool call, in the request's call order.
type Response struct {
	RequestID string       `json:"request_id" msgpack:"request_id"`
	SessionID string       `json:"session_id" msgpack:"session_id"`
	Status    string       `json:"status" msgpack:"status"`
	Results   []ToolResult `json:"results" msgpack:"results"`
	// Error explains a response that failed as a whole, e.g. a request no router could accept;
	// Results may then be empty.
	Error *ResponseError `json:"error,omitempty" msgpack:"error,omitempty"`
}

// ResponseError says why a request failed as a whole.
type ResponseError struct {
	Code    string `json:"code" msgpack:"code"`
	Message string `json:"message" msgpack:"message"`
}

// ToolResult is the final outcome of one tool call.
type ToolResult struct {
	ToolCallID string `json:"tool_call_id" msgpack:"tool_call_id"`
	Name       string `json:"name,omitempty" msgpack:"name,omitempty"`
	Status     string `json:"status" msgpack:"status"`
	// Content is the tool's JSON value (a JSON string when the tool answered text), or for an
	// error a description of it.
	Content json.RawMessage `json:"content" msgpack:"content"`
	// ExecutionTimeMS is the tool's own figure when it sends X-Execution-Time, else measured.
	ExecutionTimeMS int64 `json:"execution_time_ms" msgpack:"execution_time_ms"`
	// Attempts counts tries of the tool (0 when it was never tried, e.g. NO_ROUTE).
	Attempts int `json:"attempts" msgpack:"attempts"`
	// ErrorCode is Hermes' code for the failure: one of codes.go's result codes, whoever
	// failed (ErrorOrigin).
	ErrorCode   string `json:"error_code,omitempty" msgpack:"error_code,omitempty"`
	ErrorOrigin string `json:"error_origin,omitempty" msgpack:"error_origin,omitempty"`
	// ToolErrorCode is the tool's own code for its failure, when it gave a valid one (ToolCode).
	ToolErrorCode string `json:"tool_error_code,omitempty" msgpack:"tool_error_code,omitempty"`
	RecoveryHint  string `json:"recovery_hint,omitempty" msgpack:"recovery_hint,omitempty"`
	// Route is the name of the rule that routed the call.
	Route string `json:"route,omitempty" msgpack:"route,omitempty"`
	// ContractVersion is the version of the tool's contract the call ran under (0: none).
	ContractVersion int `json:"contract_version,omitempty" msgpack:"contract_version,omitempty"`
	// Rejected is an answer the tool gave that broke its contract (CONTRACT_VIOLATION): kept in
	// the record's result for whoever debugs the tool, never in a response.
	Rejected json.RawMessage `json:"rejected_content,omitempty" msgpack:"rejected_content,omitempty"`
	// Policy is what the tool's policy decided when it kept the call from running (denied,
	// limited, waiting for approval): the rule and the policy's version.
	Policy *PolicyDecision `json:"policy,omitempty" msgpack:"policy,omitempty"`
	// Grant is the turn on a resource the call ran under, when its tool changes one: the
	// transaction id and fencing token the tool was given.
	Grant *Grant `json:"grant,omitempty" msgpack:"grant,omitempty"`
	// SuggestedOrder, on a CONFLICT_RESOLVE_REQUIRED result, lists the conflicting calls'
	// tools in the order their contracts' precedence puts them.
	SuggestedOrder []string `json:"suggested_order,omitempty" msgpack:"suggested_order,omitempty"`
	// Retried, on a result a worker answered on the fast lane after more than one try, are the
	// error codes the tries before the last failed with, in order: the record's starts of those
	// tries say them (ToolStarted.Retrying). Kept in the record, never in a response.
	Retried []string `json:"-" msgpack:"retried,omitempty"`
}

// PolicyDecision is what a tool's policy decided about one call (package policy), as the
// record keeps it: on the dispatch of a call it let run, on the result of one it kept from
// running, and in a policy event for what happened in between (a wait, an approval).
type PolicyDecision struct {
	// Decision is one of the Policy* decisions.
	Decision string `msgpack:"decision" json:"decision"`
	// Rule names the rule that decided (allowed_roles, rate_limit, max_recipients,
	// confirm_required); "" when the call was allowed by every rule.
	Rule string `msgpack:"rule,omitempty" json:"rule,omitempty"`
	// Source says where the policy is written: "policy" (applied through the policies' API)
	// or "contract" (the tool contract's policy block); Version is its version there.
	Source  string `msgpack:"source" json:"source"`
	Version int    `msgpack:"version" json:"version"`
	// Reason says why, in words.
	Reason string `msgpack:"reason,omitempty" json:"reason,omitempty"`
	// RetryAt is when a call over its rate limit may be tried again.
	RetryAt time.Time `msgpack:"retry_at,omitempty" json:"retry_at,omitempty"`
	// ApprovalID names the call's approval (confirm_required).
	ApprovalID string `msgpack:"approval_id,omitempty" json:"approval_id,omitempty"`
	// By names who decided an approval.
	By string `msgpack:"by,omitempty" json:"by,omitempty"`
}

// PolicyEvent is the payload of a policy_decision message: what a tool's policy decided about
// one call of the request the envelope names.
type PolicyEvent struct {
	ToolCallID string         `msgpack:"tool_call_id" json:"tool_call_id"`
	Tool       string         `msgpack:"tool" json:"tool"`
	Decision   PolicyDecision `msgpack:"decision" json:"decision"`
	// At is when it was decided.
	At time.Time `msgpack:"at" json:"at"`
}

// BlueprintStep is the payload of a blueprint_step message: a step of a blueprint run that
// started, ended or was skipped, or (Step empty) the run as it ended.
type BlueprintStep struct {
	RunID     string `msgpack:"run_id" json:"run_id"`
	Blueprint string `msgpack:"blueprint" json:"blueprint"`
	Version   int    `msgpack:"version" json:"version"`
	// Step is the step's place ("1", "2.0", "1.fallback"); empty for the run.
	Step string `msgpack:"step,omitempty" json:"step,omitempty"`
	Tool string `msgpack:"tool,omitempty" json:"tool,omitempty"`
	// Status is the step's (running, succeeded, failed, skipped, waiting_approval) or, for the
	// run, the run's (succeeded, failed, transferred).
	Status string `msgpack:"status" json:"status"`
	// Condition is the step's condition as evaluated, with the values its paths found (JSON).
	Condition  *StepCondition `msgpack:"condition,omitempty" json:"condition,omitempty"`
	RequestID  string         `msgpack:"request_id,omitempty" json:"request_id,omitempty"`
	ToolCallID string         `msgpack:"tool_call_id,omitempty" json:"tool_call_id,omitempty"`
	ApprovalID string         `msgpack:"approval_id,omitempty" json:"approval_id,omitempty"`
	ErrorCode  string         `msgpack:"error_code,omitempty" json:"error_code,omitempty"`
	Error      string         `msgpack:"error,omitempty" json:"error,omitempty"`
	// Message and TransferTo are the fallback the run took (the run's event).
	Message    string    `msgpack:"message,omitempty" json:"message,omitempty"`
	TransferTo string    `msgpack:"transfer_to,omitempty" json:"transfer_to,omitempty"`
	DurationMS int64     `msgpack:"duration_ms,omitempty" json:"duration_ms,omitempty"`
	At         time.Time `msgpack:"at" json:"at"`
}

// StepCondition is a step's condition as evaluated.
type StepCondition struct {
	Expr   string          `msgpack:"expr" json:"expr"`
	Result bool            `msgpack:"result" json:"result"`
	Values json.RawMessage `msgpack:"values,omitempty" json:"values,omitempty"`
}

// MaxBlueprintTextBytes bounds each text of a blueprint step's event; MaxConditionValuesBytes
// the values its condition read.
const (
	MaxBlueprintTextBytes   = 4096
	MaxConditionValuesBytes = 16 << 10
)

// Policy decisions.
const (
	PolicyAllowed     = "allowed"     // every rule let the call run
	PolicyDenied      = "denied"      // a rule kept it from running (POLICY_DENIED)
	PolicyLimited     = "limited"     // over its rate limit, refused (RATE_LIMITED)
	PolicyWaited      = "waited"      // over its rate limit, parked until the window allows it
	PolicyUnavailable = "unavailable" // the policy could not be decided (POLICY_UNAVAILABLE)
	PolicyParked      = "parked"      // waits as an approval (APPROVAL_REQUIRED)
	PolicyApproved    = "approved"    // a person approved it
	PolicyRejected    = "rejected"    // a person denied it
	PolicyExpired     = "expired"     // nobody decided it in time
)

// ResponseStatus derives a response status from its results.
func ResponseStatus(results []ToolResult) string {
	ok := 0
	for i := range results {
		if results[i].Status == ResultOK {
			ok++
		}
	}
	switch {
	case ok == len(results) && ok > 0:
		return StatusSuccess
	case ok > 0:
		return StatusPartialSuccess
	default:
		return StatusFailed
	}
}

// Dispatch is the payload of a tool_call message: one call with the action resolved by the
// router, ready for a tool worker.
type Dispatch struct {
	Call ToolCall `msgpack:"call" json:"call"`
	// Route is the name of the rule that matched.
	Route string `msgpack:"route" json:"route"`
	// Params are the route's regex captures; an argument of the same name wins over them.
	Params map[string]string `msgpack:"params,omitempty" json:"params,omitempty"`
	Action Action            `msgpack:"action" json:"action"`
	// ReadOnly says the call only reads: its route says read_only, or its contract effects
	// none. Only such calls take the fast lane.
	ReadOnly bool `msgpack:"read_only,omitempty" json:"read_only,omitempty"`
	// Contract names the contract version the call runs under, when its tool has one: the
	// worker checks the tool's answer against that version, whatever is registered since.
	Contract *ContractRef `msgpack:"contract,omitempty" json:"contract,omitempty"`
	// Policy is what the tool's policy decided, when it has one.
	Policy *PolicyDecision `msgpack:"policy,omitempty" json:"policy,omitempty"`
	// Grant is the call's turn on the resource it changes, when its tool changes one: the
	// worker passes its transaction id and fencing token to the tool (HeaderTx, HeaderFence).
	Grant *Grant `msgpack:"grant,omitempty" json:"grant,omitempty"`
}

// ContractRef names one version of a tool's contract.
type ContractRef struct {
	Name    string `msgpack:"name" json:"name"`
	Version int    `msgpack:"version" json:"version"`
	// Revision is the version's revision in the contracts' bucket, where it is read.
	Revision uint64 `msgpack:"revision" json:"revision"`
	// ResourceLevel and Effects are the contract's, for what schedules or guards calls.
	ResourceLevel string `msgpack:"resource_level,omitempty" json:"resource_level,omitempty"`
	Effects       string `msgpack:"effects,omitempty" json:"effects,omitempty"`
	// Sandbox: the version is a candidate the sandbox tries, kept at SandboxKey(Name).
	Sandbox bool `msgpack:"sandbox,omitempty" json:"sandbox,omitempty"`
}

// Key is where the version is kept in the contracts' bucket.
func (r *ContractRef) Key() string {
	if r.Sandbox {
		return SandboxKey(r.Name)
	}
	return r.Name
}

// ToolStarted is the payload of a tool_started event, published when a try begins.
type ToolStarted struct {
	ToolCallID string    `msgpack:"tool_call_id" json:"tool_call_id"`
	Name       string    `msgpack:"name" json:"name"`
	Attempt    int       `msgpack:"attempt" json:"attempt"`
	StartedAt  time.Time `msgpack:"started_at" json:"started_at"`
	// Retrying, on a try after a failed one, is the error code the try before it failed with
	// (when its worker said): what retries are for.
	Retrying string `msgpack:"retrying,omitempty" json:"retrying,omitempty"`
}

// Cancel is the payload of a cancel message: the request was cancelled. Calls that had not
// finished get CANCELLED results, running ones are told to stop, and the request's response
// says so.
type Cancel struct {
	// By names who asked: the caller as the edge knew it (e.g. "http 127.0.0.1:51234").
	By string `msgpack:"by" json:"by"`
	// Reason is the caller's own words, if any.
	Reason string `msgpack:"reason,omitempty" json:"reason,omitempty"`
	// At is when the cancellation was accepted.
	At time.Time `msgpack:"at" json:"at"`
}

// LLMDecision is one turn of the agent loop, as the record keeps it (seed 001 §5.2): the
// messages the model read that the record did not hold yet, the tools it was offered, and what
// it chose — calls with their arguments as it wrote them, or an answer — with what was wrong
// with its choice. Its envelope's request id is the turn's (<run>-<turn>); it is recorded under
// hermes.event.llm.<session> before the turn's calls are dispatched. Nothing secret is in it:
// backend keys never leave the client that sends them.
type LLMDecision struct {
	// Run names the conversation turn the loop answers; Turn counts the model's turns in it
	// from 1.
	Run  string `msgpack:"run" json:"run"`
	Turn int    `msgpack:"turn" json:"turn"`
	// Backend and Model say who decided (the fallback, when it did: FellBack).
	Backend  string `msgpack:"backend" json:"backend"`
	Model    string `msgpack:"model" json:"model"`
	FellBack bool   `msgpack:"fell_back,omitempty" json:"fell_back,omitempty"`
	Tries    int    `msgpack:"tries,omitempty" json:"tries,omitempty"`
	// Input is the person's message the run answers (on its first turn).
	Input string `msgpack:"input,omitempty" json:"input,omitempty"`
	// FromRecord says the conversation before the run was read from the record (POST
	// /v1/chat), which summaries shorten: the summarizer summarizes such sessions only.
	FromRecord bool `msgpack:"from_record,omitempty" json:"from_record,omitempty"`
	// Messages are the messages sent to the model that no earlier decision of the session
	// holds; Prompt counts all it was sent.
	Messages []LLMMessage `msgpack:"messages,omitempty" json:"messages,omitempty"`
	Prompt   int          `msgpack:"prompt" json:"prompt"`
	// Offered names the tools the model could call.
	Offered []string `msgpack:"offered,omitempty" json:"offered,omitempty"`
	// Prefiltered says the registered tools were narrowed to Candidates (ranked, best first)
	// before the model chose: coarse, then fine (seed 001 §2.2). An empty list means none
	// qualified, and the model was told so.
	Prefiltered bool           `msgpack:"prefiltered,omitempty" json:"prefiltered,omitempty"`
	Candidates  []LLMCandidate `msgpack:"candidates,omitempty" json:"candidates,omitempty"`
	// Memory names the fragments remembered about the user that the prompt carried (on the
	// first turn), each at the version given: their values are on the owner's memory history.
	Memory []LLMMemory `msgpack:"memory,omitempty" json:"memory,omitempty"`
	// Intent is the turn's intent as the model classified it (on the first turn), when intents
	// are configured.
	Intent *LLMIntent `msgpack:"intent,omitempty" json:"intent,omitempty"`
	// Chosen are the calls the model made; Answer its text when it answered instead.
	Chosen   []LLMCall    `msgpack:"chosen,omitempty" json:"chosen,omitempty"`
	Answer   string       `msgpack:"answer,omitempty" json:"answer,omitempty"`
	Warnings []LLMWarning `msgpack:"warnings,omitempty" json:"warnings,omitempty"`
	Usage    LLMUsage     `msgpack:"usage" json:"usage"`
	// LatencyMS is how long the model took, retries included.
	LatencyMS int64 `msgpack:"latency_ms" json:"latency_ms"`
	// Error says why the model gave no choice (a backend down, an answer that did not parse).
	Error string `msgpack:"error,omitempty" json:"error,omitempty"`
}

// LLMSummary is a summary of a session's conversation (seed 001 §2.3): it stands for the
// messages of every decision of the session stored up to sequence Through in the prompts
// after it — the next turn reads it and the messages since. It covers whole decisions, so a
// tool call and its result are never parted. The messages it stands for stay in the record.
type LLMSummary struct {
	// Through is the stream sequence of the last decision it covers; Since that of the
	// summary it carries on (0 for the session's first).
	Through uint64 `msgpack:"through" json:"through"`
	Since   uint64 `msgpack:"since,omitempty" json:"since,omitempty"`
	// Tail is the stream sequence of the decision that holds the person's last message among
	// those it covers (0: none): the last exchange, which the next prompt holds word for word
	// after the summary.
	Tail uint64 `msgpack:"tail,omitempty" json:"tail,omitempty"`
	// Messages counts the conversation's messages it covers, all summaries before it
	// included; New those since the summary before it.
	Messages int    `msgpack:"messages" json:"messages"`
	New      int    `msgpack:"new" json:"new"`
	Text     string `msgpack:"text" json:"text"`
	// Backend and Model say who summarized, Usage and LatencyMS at what cost.
	Backend   string   `msgpack:"backend" json:"backend"`
	Model     string   `msgpack:"model" json:"model"`
	Usage     LLMUsage `msgpack:"usage" json:"usage"`
	LatencyMS int64    `msgpack:"latency_ms" json:"latency_ms"`
}

// LLMMemory is a remembered fragment a prompt carried.
type LLMMemory struct {
	Type    string `msgpack:"type" json:"type"`
	Key     string `msgpack:"key" json:"key"`
	Session string `msgpack:"session_id,omitempty" json:"session_id,omitempty"`
	Version int    `msgpack:"version" json:"version"`
}

// LLMIntent is a turn's intent: its business domain and how sure the model was, and what
// Hermes did about it.
type LLMIntent struct {
	Domain     string  `msgpack:"domain" json:"domain"`
	Confidence float64 `msgpack:"confidence" json:"confidence"`
	// Clarify says the confidence was below the threshold: Hermes asked instead of acting.
	Clarify bool `msgpack:"clarify,omitempty" json:"clarify,omitempty"`
	// Lifetime is how long the intent's context lives (the domain's decay; 0: the session's).
	LifetimeSeconds int64 `msgpack:"lifetime_s,omitempty" json:"lifetime_s,omitempty"`
}

// MaxDecisionMemory bounds the fragments one decision names.
const MaxDecisionMemory = 64

// LLMCandidate is a tool the prefilter ranked for a message, with its scores: the lexical
// one (BM25; 0 when the lexical ranking did not put it forward: no word matched, or it fell
// below the threshold or the top k) and, when the semantic ranking put it forward, the cosine
// similarity of the message's and the tool's embeddings.
type LLMCandidate struct {
	Name       string  `msgpack:"name" json:"name"`
	Score      float64 `msgpack:"score" json:"score"`
	Similarity float64 `msgpack:"similarity,omitempty" json:"similarity,omitempty"`
}

// LLMMessage is one chat message as the record keeps it.
type LLMMessage struct {
	Role       string    `msgpack:"role" json:"role"`
	Content    string    `msgpack:"content,omitempty" json:"content,omitempty"`
	ToolCallID string    `msgpack:"tool_call_id,omitempty" json:"tool_call_id,omitempty"`
	ToolCalls  []LLMCall `msgpack:"tool_calls,omitempty" json:"tool_calls,omitempty"`
}

// LLMCall is one tool call a model made, its arguments as it wrote them.
type LLMCall struct {
	ID        string `msgpack:"id" json:"id"`
	Name      string `msgpack:"name" json:"name"`
	Arguments string `msgpack:"arguments" json:"arguments"`
	// Client marks a tool of the client's: returned to it, not run by Hermes.
	Client bool `msgpack:"client,omitempty" json:"client,omitempty"`
}

// Warning kinds of an LLMDecision.
const (
	WarnUnknownTool     = "unknown_tool"     // the model called a tool it was not offered
	WarnMissingArgument = "missing_argument" // a required argument is missing (Field)
	WarnBadArguments    = "bad_arguments"    // the arguments break the tool's contract
	WarnNotJSON         = "not_json"         // the arguments are not a JSON object
	WarnHistory         = "history"          // the client's history differs from the record
	WarnCallID          = "call_id"          // a call's id was empty, repeated or unusable: Hermes named it
	WarnEmbeddings      = "embeddings"       // the embedding model failed: the tools were prefiltered lexically only
)

// LLMWarning is something wrong with a model's choice: fed back to it as a tool error it can
// correct.
type LLMWarning struct {
	Kind    string `msgpack:"kind" json:"kind"`
	Tool    string `msgpack:"tool,omitempty" json:"tool,omitempty"`
	CallID  string `msgpack:"call_id,omitempty" json:"call_id,omitempty"`
	Field   string `msgpack:"field,omitempty" json:"field,omitempty"`
	Message string `msgpack:"message" json:"message"`
}

// LLMUsage is the tokens a turn took.
type LLMUsage struct {
	Prompt     int64 `msgpack:"prompt" json:"prompt_tokens"`
	Completion int64 `msgpack:"completion" json:"completion_tokens"`
	Total      int64 `msgpack:"total" json:"total_tokens"`
}
