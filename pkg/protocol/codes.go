package protocol

// Error codes Hermes sets on failed results (ToolResult.ErrorCode with ErrorOrigin "hermes",
// or "tool" where a tool's own failure is classified). A tool may report codes of its own;
// Hermes' codes are these and only these.
const (
	CodeNoRoute           = "NO_ROUTE"
	CodeActionUnsupported = "ACTION_UNSUPPORTED"
	CodeToolTimeout       = "TOOL_TIMEOUT"
	CodeToolUnreachable   = "TOOL_UNREACHABLE"
	CodeToolHTTP5xx       = "TOOL_HTTP_5XX"
	CodeToolHTTP4xx       = "TOOL_HTTP_4XX"
	CodeToolRateLimited   = "TOOL_RATE_LIMITED"
	CodeToolRedirected    = "TOOL_REDIRECTED"
	CodeToolBadResponse   = "TOOL_BAD_RESPONSE"
	CodeToolFailed        = "TOOL_FAILED"
	CodeResultTooLarge    = "RESULT_TOO_LARGE"
	CodeEnvNotAllowed     = "ENV_NOT_ALLOWED"
	CodeEnvUnset          = "ENV_UNSET"
	CodeBadArguments      = "BAD_ARGUMENTS"
	CodeDeadlineExceeded  = "DEADLINE_EXCEEDED"
	// CodeToolGRPCStatus: a gRPC tool answered a status other than OK (its code in
	// tool_error_code, its message in the hint and content).
	CodeToolGRPCStatus = "TOOL_GRPC_STATUS"
	// CodeRouteIncomplete: the route that matched lacks what its action needs to run (a grpc
	// action without a target); the field is named.
	CodeRouteIncomplete = "ROUTE_INCOMPLETE"
	// CodeGRPCMethodUnknown: a gRPC tool's method could not be found: the server offers no
	// reflection and the route names no descriptor set, or neither knows the method.
	CodeGRPCMethodUnknown = "GRPC_METHOD_UNKNOWN"
	// CodeDeadLettered: Hermes gave up on the call or request (see hermes dlq).
	CodeDeadLettered = "DEAD_LETTERED"
	// CodeCancelled: the request was cancelled before the call finished.
	CodeCancelled = "CANCELLED"
	// CodeDestinationRefused: the call's URL leads to an address workers never call
	// (link-local and cloud metadata, or loopback through a name).
	CodeDestinationRefused = "DESTINATION_REFUSED"
	// CodeContractViolation: the tool answered outside its contract (origin tool); the
	// answer is kept in the record's result, not delivered.
	CodeContractViolation = "CONTRACT_VIOLATION"
	// CodeContractUnavailable: the contract version the call was routed under could not be
	// read, so the call was not made (its answer could not have been checked).
	CodeContractUnavailable = "CONTRACT_UNAVAILABLE"
	// CodePolicyDenied: the tool's policy does not let this call run (the caller's role, too
	// many recipients); the result names the rule and the policy's version (ToolResult.Policy).
	CodePolicyDenied = "POLICY_DENIED"
	// CodePolicyUnavailable: the tool's policy could not be decided (its rate window could not
	// be read), and the tool may change something, so the call was not made.
	CodePolicyUnavailable = "POLICY_UNAVAILABLE"
	// CodeApprovalRequired: the tool's policy asks a person to confirm the call first; it
	// waits as an approval (ToolResult.Policy.ApprovalID) and runs once approved.
	CodeApprovalRequired = "APPROVAL_REQUIRED"
	// CodeApprovalExpired: nobody decided the call's approval in time.
	CodeApprovalExpired = "APPROVAL_EXPIRED"
	// CodeApprovalDenied: a person denied the call's approval.
	CodeApprovalDenied = "APPROVAL_DENIED"
	// CodeConflictResolveRequired: calls of one request change the same resource, and their
	// tools' contracts ask the caller to order them (ToolResult.SuggestedOrder says how).
	CodeConflictResolveRequired = "CONFLICT_RESOLVE_REQUIRED"
	// CodeResourceKeyMissing: a call of a tool that changes a resource does not name it (the
	// contract's resource_key argument is missing or empty): it is never run unserialized.
	CodeResourceKeyMissing = "RESOURCE_KEY_MISSING"
	// CodeResourceBusy: too many calls already wait for the resource the call changes.
	CodeResourceBusy = "RESOURCE_BUSY"
	// A call over its tool's rate limit is CodeRateLimited (origin hermes), with the time it may
	// be tried again (ToolResult.Policy.RetryAt).
)

// Error codes of the HTTP API's JSON errors ({"error": {"code", "message", "field"}}).
const (
	CodeInvalidRequest    = "INVALID_REQUEST"
	CodeBodyTooLarge      = "BODY_TOO_LARGE"
	CodeRequestIDConflict = "REQUEST_ID_CONFLICT"
	CodeTimeout           = "TIMEOUT"
	CodeBusUnavailable    = "BUS_UNAVAILABLE"
	CodeNotFound          = "NOT_FOUND"
	CodeMethodNotAllowed  = "METHOD_NOT_ALLOWED"
	// CodeUnavailable: busy or shutting down; see Retry-After.
	CodeUnavailable = "UNAVAILABLE"
	// CodeAlreadyFinished: the request has its response; it can no longer be cancelled.
	CodeAlreadyFinished = "ALREADY_FINISHED"
	// CodeAlreadyDecided: the approval was approved, denied or used before (409).
	CodeAlreadyDecided = "ALREADY_DECIDED"
	// CodeInternal: Hermes failed in a way that is its own bug; the message says where.
	CodeInternal = "INTERNAL"
	// CodeUnauthenticated: no valid credentials (401, with WWW-Authenticate).
	CodeUnauthenticated = "UNAUTHENTICATED"
	// CodeForbidden: the caller lacks the permission the endpoint needs (403); the message
	// names it.
	CodeForbidden = "FORBIDDEN"
	// CodeUnsupportedMediaType: a state-changing request sent as text or a form (415), which a
	// page on another site could send without asking; send JSON.
	CodeUnsupportedMediaType = "UNSUPPORTED_MEDIA_TYPE"
	// CodeCrossOrigin: a state-changing request from a page on another origin (403).
	CodeCrossOrigin = "CROSS_ORIGIN"
	// CodeHostNotServed: the Host header names no host the gateway serves (421): a DNS
	// rebinding attempt, or a missing --public-host.
	CodeHostNotServed = "HOST_NOT_SERVED"
	// CodeMemoryFull: a memory fragment cannot be kept (507): its owner's memory holds only
	// forever fragments beside it, or the memory bucket is full; the message says which.
	CodeMemoryFull = "MEMORY_FULL"
	// CodeRateLimited: the caller is over one of its limits (429, with Retry-After).
	CodeRateLimited = "RATE_LIMITED"
	// CodeStoreFull: the record (or the plans' bucket) is near its byte limit; new requests
	// are refused until there is room (503, with Retry-After); accepted ones still finish.
	CodeStoreFull = "STORE_FULL"
	// CodeInvalidContract: a tool contract that does not parse or compile (with its line and
	// field).
	CodeInvalidContract = "INVALID_CONTRACT"
	// CodeInvalidPolicy: a tool policy (or policy file) that does not parse, or names an
	// unknown tool or role (with its field and, where known, its line).
	CodeInvalidPolicy = "INVALID_POLICY"
	// CodeSandboxRefused: the sandbox tried a tool and it broke its contract, or could not be
	// reached; nothing was registered (422, with the sandbox's report).
	CodeSandboxRefused = "SANDBOX_REFUSED"
	// CodeInvalidBlueprint: a blueprint that does not parse or compile, or names an unknown
	// tool (with the step, its field and, where known, its line).
	CodeInvalidBlueprint = "INVALID_BLUEPRINT"
	// CodeRunIDConflict: a run_id already names another run.
	CodeRunIDConflict = "RUN_ID_CONFLICT"
	// CodeTooManyRuns: the caller has as many blueprint runs going as it may (429).
	CodeTooManyRuns = "TOO_MANY_RUNS"
)
