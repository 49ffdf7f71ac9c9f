package protocol

import "strings"

// Keys of Hermes' KV buckets (the buckets are provisioned by package bus). Builders take ids
// already validated by a decoder or CheckID: a valid id holds no '.', so every key below has a
// fixed number of tokens and one id cannot pose as another's key.

// KeyPlan is the hermes-calls key of a request's plan.
func KeyPlan(requestID string) string { return requestID }

// KeyClaim is the hermes-claims key of one call: which worker runs it, its tries, its last
// failure, whether it was cancelled.
func KeyClaim(requestID, callID string) string { return requestID + "." + callID }

// KeyTool is the hermes-tools key listing tool as served by actions of kind.
func KeyTool(kind, tool string) string { return kind + "." + tool }

// ParseKeyTool reads a hermes-tools key (KeyTool). Any other key — a key without a kind, which
// Hermes before action kinds wrote and hermes migrate removes, or an MCP server's state — is
// not ok.
func ParseKeyTool(key string) (kind, tool string, ok bool) {
	kind, tool, found := strings.Cut(key, ".")
	if !found {
		return "", "", false
	}
	return kind, tool, KnownKind(kind) && ValidToken(tool, MaxToolNameLen)
}

// KeyMCPState is where, in hermes-tools, a tool worker keeps the state of the MCP servers it
// holds (instance must be a token); MCPStatePrefix starts every such key.
func KeyMCPState(instance string) string { return MCPStatePrefix + instance }

// MCPStatePrefix starts the keys of KeyMCPState ("mcpstate." is no action kind, so they are no
// tool's).
const MCPStatePrefix = "mcpstate."

// Keys of hermes-sessions, which orders a session's serial requests.

// KeySerialTail holds the last serial request accepted in session.
func KeySerialTail(session string) string { return "tail." + session }

// KeySerialPrev holds the serial request that requestID waits for ("-" for none).
func KeySerialPrev(requestID string) string { return "prev." + requestID }

// KeySerialWent marks that serial request requestID passed the serial stage: once answered,
// it lets its successors go.
func KeySerialWent(requestID string) string { return "went." + requestID }

// Wake keys name what a parked message waits for (package park). They are dot-separated
// tokens, usable in KV keys and subjects.

// WakeOnResponse is woken once requestID has its response.
func WakeOnResponse(requestID string) string { return "response." + requestID }

// WakeAt is a wake key that only a timer wakes; id makes it unique (e.g. a call's request and
// call id joined by '.').
func WakeAt(id string) string { return "timer." + id }

// ReservedRequestID is no request's id: a session's serial order records it where there is no
// previous request.
const ReservedRequestID = "-"

// KeyParked is the hermes-parked key of item waiting under wake key key.
func KeyParked(key, item string) string { return key + "." + item }

// ValidWakeKey reports whether key is one or more valid tokens joined by '.', at most 255
// bytes: safe as a KV key prefix and as subject tokens.
func ValidWakeKey(key string) bool {
	if len(key) == 0 || len(key) > 255 {
		return false
	}
	for t := range strings.SplitSeq(key, ".") {
		if !ValidToken(t, MaxIDLen) {
			return false
		}
	}
	return true
}
