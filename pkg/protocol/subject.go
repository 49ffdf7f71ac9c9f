package protocol

import (
	"fmt"
	"hash/fnv"
	"strconv"
)

// Subjects. The session id is always the last token, so one consumer filtering on
// "hermes.*.<session>" and "hermes.*.*.<session>" reads a session's whole record in order.
// Builders take ids already validated by a decoder or CheckID; they do not validate again.
const (
	// StreamName is the JetStream stream that records every message of every session.
	StreamName = "HERMES"

	subjectRoot = "hermes"
)

// StreamSubjects are the subjects the record stream captures. Each has a fixed number of
// tokens, so a publish to a malformed subject is refused by the server rather than recorded.
func StreamSubjects() []string {
	return []string{
		subjectRoot + ".request.*",
		subjectRoot + ".tool.*.*",
		subjectRoot + ".result.*",
		subjectRoot + ".response.*",
		subjectRoot + ".event.*.*",
	}
}

// SubjectRequest is where a request of session enters the bus. The stream stores it under
// StoredSubjectRequest: its subject transform adds the session's partition.
func SubjectRequest(session string) string { return subjectRoot + ".request." + session }

// RequestPartitions is how many partitions the stream spreads requests over, by a hash of the
// session id (the server's partition function). Requests of one partition are routed one at a
// time, in stream order, so each session's requests are dispatched in the order they were
// accepted while other partitions proceed in parallel. Changing it re-partitions sessions.
const RequestPartitions = 16

// RequestTransform is the record stream's subject transform: hermes.request.<session> is
// stored as hermes.request.<partition>.<session>.
func RequestTransform() (source, destination string) {
	return subjectRoot + ".request.*", fmt.Sprintf("%s.request.{{partition(%d,1)}}.{{wildcard(1)}}", subjectRoot, RequestPartitions)
}

// RequestPartition is the partition the stream's transform puts session's requests in: the
// server's partition function (FNV-1a of the session id, modulo RequestPartitions).
func RequestPartition(session string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(session))
	return int(h.Sum32() % RequestPartitions)
}

// StoredSubjectRequest is the subject the stream stores session's requests under.
func StoredSubjectRequest(session string) string {
	return PrefixRequests + strconv.Itoa(RequestPartition(session)) + "." + session
}

// PrefixRequests starts the stored subject of every request.
const PrefixRequests = subjectRoot + ".request."

// FilterRequestPartition matches the stored requests of partition p.
func FilterRequestPartition(p int) string { return PrefixRequests + strconv.Itoa(p) + ".*" }

// SubjectToolCall is where calls of tool in session are dispatched.
func SubjectToolCall(tool, session string) string {
	return subjectRoot + ".tool." + tool + "." + session
}

// SubjectToolResult carries the final result of every tool call of session.
func SubjectToolResult(session string) string { return subjectRoot + ".result." + session }

// SubjectResponse carries the one response to each request of session.
func SubjectResponse(session string) string { return subjectRoot + ".response." + session }

// EventToolStarted is the event kind of tool_started messages.
const EventToolStarted = "tool_started"

// SubjectEvent carries other events of session, e.g. EventToolStarted.
func SubjectEvent(kind, session string) string {
	return subjectRoot + ".event." + kind + "." + session
}

// Filters for consumers and subscriptions.
const (
	// FilterRequests matches every stored request (hermes.request.<partition>.<session>).
	FilterRequests  = subjectRoot + ".request.*.*"
	FilterResults   = subjectRoot + ".result.*"
	FilterResponses = subjectRoot + ".response.*"
)

// FilterToolCalls matches every call of tool, whatever the session.
func FilterToolCalls(tool string) string { return subjectRoot + ".tool." + tool + ".*" }

// FilterSession returns the filters that together match every message of session.
func FilterSession(session string) []string {
	return []string{subjectRoot + ".*." + session, subjectRoot + ".*.*." + session}
}

// Deterministic message ids: the same logical message always gets the same id, so a retried
// publish is dropped by the stream's duplicate window.

// MsgIDRequest identifies the request message of requestID.
func MsgIDRequest(requestID string) string { return "request:" + requestID }

// MsgIDToolCall identifies the dispatch of one call.
func MsgIDToolCall(requestID, callID string) string { return "tool_call:" + requestID + ":" + callID }

// MsgIDToolStarted identifies the start of one try of a call.
func MsgIDToolStarted(requestID, callID string, attempt int) string {
	return "tool_started:" + requestID + ":" + callID + ":" + strconv.Itoa(attempt)
}

// MsgIDToolResult identifies the final result of one call.
func MsgIDToolResult(requestID, callID string) string {
	return "tool_result:" + requestID + ":" + callID
}

// MsgIDResponse identifies the response to requestID.
func MsgIDResponse(requestID string) string { return "response:" + requestID }

// Dead letters.
const (
	// DLQStreamName is the stream of dead letters: messages a consumer gave up on, with why.
	DLQStreamName = "HERMES_DLQ"
	// FilterDeadLetters matches every dead letter.
	FilterDeadLetters = subjectRoot + ".dlq.*"
)

// SubjectDeadLetter is where messages given up by consumer are kept.
func SubjectDeadLetter(consumer string) string { return subjectRoot + ".dlq." + consumer }
