package protocol

import (
	"hash/fnv"
	"strconv"
	"strings"
)

// Subjects. The session id is always the last token, so one consumer filtering on
// "hermes.*.<session>" and "hermes.*.*.<session>" reads a session's whole record in order.
// Builders take ids already validated by a decoder or CheckID; they do not validate again.
// The record's builders here name the subjects of a record of one stream (stream 0: the zero
// Layout's); a record of several keeps each session in one of them, under subjects its Layout
// builds.
const (
	// StreamName is the JetStream stream that records every message of every session: the
	// first record stream, the only one of a record of one (RecordStream).
	StreamName = "HERMES"

	subjectRoot = "hermes"
)

// StreamSubjects are the subjects the record stream captures. Each has a fixed number of
// tokens, so a publish to a malformed subject is refused by the server rather than recorded.
func StreamSubjects() []string { return StreamSubjectsOf(0) }

// StreamSubjectsOf are the subjects record stream k (RecordStream) captures: those of root k.
func StreamSubjectsOf(k int) []string {
	root := RecordRoot(k)
	s := []string{
		root + ".request.*",
		root + ".request.fast.*",
		root + ".result.*",
		root + ".result.*.*",
		root + ".response.*.*",
		root + ".event.*.*",
	}
	for _, kind := range Kinds {
		s = append(s, root+".tool_"+kind+".*.*")
	}
	return s
}

// SubjectRequest is where a request of session enters the bus. The stream stores it under
// StoredSubjectRequest: its subject transform adds the session's partition.
func SubjectRequest(session string) string { return one.SubjectRequest(session) }

// External clients' requests: an external NATS client may publish on
// hermes.client.<user>.<session> alone, its own NATS user's name in the subject (the server
// refuses it any other), so the subject says who sent a request. They wait in a stream of their
// own (ClientStreamName), never in the record: a gateway takes each from there, names the user
// as the request's caller and submits it (hermes.request.<session>), and only what it accepts
// is recorded.
const (
	// ClientStreamName is the stream external clients' requests wait in until a gateway
	// takes them (a work queue).
	ClientStreamName = "HERMES_CLIENTS"
	// FilterClientRequests matches every request of an external client.
	FilterClientRequests = subjectRoot + ".client.*.*"

	prefixClient = subjectRoot + ".client."
)

// SubjectClientRequest is where external client user publishes a request of session.
func SubjectClientRequest(user, session string) string { return prefixClient + user + "." + session }

// ClientOfSubject returns the user and session a SubjectClientRequest names.
func ClientOfSubject(subject string) (user, session string, ok bool) {
	rest, ok := strings.CutPrefix(subject, prefixClient)
	if !ok {
		return "", "", false
	}
	user, session, ok = strings.Cut(rest, ".")
	if !ok || user == "" || session == "" || strings.Contains(session, ".") {
		return "", "", false
	}
	return user, session, true
}

// The NATS micro service "hermes" that external clients call (request/reply, JSON): client
// user calls endpoint on SubjectClientService(user, endpoint) — five tokens, so no request of
// the clients' stream is one, and a client's permissions allow its own name only.
const (
	// ServiceName is the micro service's name (nats micro ls).
	ServiceName = "hermes"
	// EndpointRequest submits a request and answers its response.
	EndpointRequest = "request"
	// EndpointResponse answers the response of a request the client published.
	EndpointResponse = "response"
	// EndpointFollow sends the client a session's messages (SubjectClientSession).
	EndpointFollow = "follow"
	// FilterClientServices matches every client's call of every endpoint.
	FilterClientServices = subjectRoot + ".client.*.svc.*"
)

// What Hermes sends each external client on subjects of its own (the clients' account imports
// them; each client may subscribe to its own only): the responses of its requests as JSON.
const (
	// FilterClientOut matches everything sent to every client.
	FilterClientOut = subjectRoot + ".out.>"
	prefixClientOut = subjectRoot + ".out."
)

// SubjectClientResponse is where client user is sent the response of its request requestID of
// session, as JSON, once it is recorded.
func SubjectClientResponse(user, session, requestID string) string {
	return prefixClientOut + user + ".response." + session + "." + requestID
}

// SubjectClientSession is where client user is sent the messages of its session it follows.
func SubjectClientSession(user, session string) string {
	return prefixClientOut + user + ".session." + session
}

// FilterClientOutOf matches everything sent to client user.
func FilterClientOutOf(user string) string { return prefixClientOut + user + ".>" }

// SubjectClientService is where client user calls endpoint of the service ServiceName.
func SubjectClientService(user, endpoint string) string {
	return prefixClient + user + ".svc." + endpoint
}

// ClientOfService returns the user and endpoint a SubjectClientService names.
func ClientOfService(subject string) (user, endpoint string, ok bool) {
	rest, ok := strings.CutPrefix(subject, prefixClient)
	if !ok {
		return "", "", false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 || parts[0] == "" || parts[1] != "svc" || parts[2] == "" {
		return "", "", false
	}
	return parts[0], parts[2], true
}

// Requests are spread over partitions by a hash of the session id (the server's partition
// function), in the record stream's subject transform. Requests of one partition are routed one
// at a time, in stream order, so each session's requests are dispatched in the order they were
// accepted while other partitions proceed in parallel: the number of partitions is how many
// requests a whole deployment routes at once. It is set when the record is provisioned (the
// stream's transform holds it, RequestPartitionsOf); changing it re-partitions sessions.
const (
	// DefaultRequestPartitions is the fewest partitions a record is provisioned with by
	// default, and the number every record had before it could be set.
	DefaultRequestPartitions = 16
	// MaxRequestPartitions bounds the partitions: each is a consumer of the record, and named in
	// the permissions of every service role.
	MaxRequestPartitions = 128
)

// RequestTransform is the record stream's subject transform for n partitions:
// hermes.request.<session> is stored as hermes.request.<partition>.<session>.
func RequestTransform(n int) (source, destination string) { return RequestTransformIn(0, n) }

// RequestPartitionsOf returns the number of partitions a RequestTransform destination spreads
// requests over, and false for any other destination.
func RequestPartitionsOf(destination string) (int, bool) {
	rest, ok := strings.CutPrefix(CanonicalSubject(destination), subjectRoot+".request.{{partition(")
	if !ok {
		return 0, false
	}
	num, tail, ok := strings.Cut(rest, ",1)}}.{{wildcard(1)}}")
	n, err := strconv.Atoi(num)
	if !ok || tail != "" || err != nil || n < 1 || n > MaxRequestPartitions || strconv.Itoa(n) != num {
		return 0, false
	}
	return n, true
}

// RequestPartition is the partition of n the stream's transform puts session's requests in: the
// server's partition function (FNV-1a of the session id, modulo n).
func RequestPartition(session string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(session))
	return int(h.Sum32() % uint32(n))
}

// StoredSubjectRequest is the subject a record of n partitions stores session's requests under.
func StoredSubjectRequest(session string, n int) string {
	return one.StoredSubjectRequest(session, n)
}

// PrefixRequests starts the stored subject of every request.
const PrefixRequests = subjectRoot + ".request."

// FilterRequestPartition matches the stored requests of partition p.
func FilterRequestPartition(p int) string { return one.FilterRequestPartition(p) }

// SubjectToolCall is where calls of tool in session are dispatched when their action is of
// kind: hermes.tool_<kind>.<tool>.<session>. Each kind has subjects and consumers of its own,
// so a worker pulls only calls of the kinds it runs.
func SubjectToolCall(kind, tool, session string) string {
	return one.SubjectToolCall(kind, tool, session)
}

// SubjectResult is where the one result of call callID of requestID (of session) is recorded:
// hermes.result.<request_id>:<tool_call_id>.<session> — one token for the call, as ids hold no
// ':', so that the session stays the fourth and last token. The record holds at most one message
// on it: it is written with an expected last subject sequence of 0, so the first result wins.
func SubjectResult(requestID, callID, session string) string {
	return one.SubjectResult(requestID, callID, session)
}

// SubjectRedrivenResult is where a result given another round of aggregation (a re-drive of a
// dead letter) is published again: hermes.result.<session>, so that its call's subject
// (SubjectResult) keeps the one result recorded for the call. What is published there is never
// taken for its call's result: it only makes the routers aggregate the request again.
func SubjectRedrivenResult(session string) string { return one.SubjectRedrivenResult(session) }

// SubjectResponse is where the one response to requestID (of session) is recorded:
// hermes.response.<request_id>.<session>. The record holds at most one message on it: it is
// written with an expected last subject sequence of 0, so the first response wins.
func SubjectResponse(requestID, session string) string {
	return one.SubjectResponse(requestID, session)
}

// FilterResponseOf matches the response of requestID, whatever its session.
func FilterResponseOf(requestID string) string { return FilterResponseOfIn(0, requestID) }

// Live responses: the record stream republishes every response it stores to
// hermes.live.response.<request_id>.<session>, outside the stream, for callers awaiting one. A
// response that was not recorded (it lost to an earlier one) never reaches them.
const (
	// FilterLiveResponses matches every live response.
	FilterLiveResponses = subjectRoot + ".live.response.*.*"

	prefixResponse     = subjectRoot + ".response."
	prefixResult       = subjectRoot + ".result."
	prefixLiveResponse = subjectRoot + ".live.response."
)

// LiveResponseRepublish is the record stream's republish rule: source and destination.
func LiveResponseRepublish() (source, destination string) { return LiveResponseRepublishIn(0) }

// LiveResponseRequest returns the request_id a SubjectLiveResponse names.
func LiveResponseRequest(subject string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, prefixLiveResponse)
	if !ok {
		return "", false
	}
	id, session, ok := strings.Cut(rest, ".")
	if !ok || id == "" || session == "" || strings.Contains(session, ".") {
		return "", false
	}
	return id, true
}

// SubjectLiveResponse is where the recorded response of requestID is announced.
func SubjectLiveResponse(requestID, session string) string {
	return subjectRoot + ".live.response." + requestID + "." + session
}

// Event kinds (the fourth token of hermes.event.<kind>.<session>).
const (
	// EventToolStarted is the event kind of tool_started messages.
	EventToolStarted = "tool_started"
	// EventCancel is the event kind of cancel messages: a request was cancelled, and by whom.
	EventCancel = "cancel"
	// EventLLM is the event kind of llm_decision messages: one turn of the agent loop.
	EventLLM = "llm"
	// EventSummary is the event kind of llm_summary messages: a session's conversation,
	// summarized.
	EventSummary = "summary"
	// EventPolicy is the event kind of policy_decision messages: what a tool's policy decided
	// about a call between its request and its result.
	EventPolicy = "policy"
	// EventBlueprint is the event kind of blueprint_step messages: a blueprint run's steps.
	EventBlueprint = "blueprint"
	// EventCoordination is the event kind of coordination messages: a call's proposal, wait,
	// grant, release or conflict on the resource it changes.
	EventCoordination = "coordination"
	// EventFastCall is the event kind of the tool calls the fast lane dispatched: recorded
	// where no worker's consumer takes them (a worker ran them already, over request/reply).
	EventFastCall = "fast_call"
)

// SubjectEvent carries other events of session, e.g. EventToolStarted.
func SubjectEvent(kind, session string) string { return one.SubjectEvent(kind, session) }

// Filters for consumers and subscriptions.
const (
	// FilterRequests matches every stored request (hermes.request.<partition>.<session>).
	FilterRequests = subjectRoot + ".request.*.*"
)

// FilterResults matches every recorded result (hermes.result.<request_id>:<tool_call_id>.<session>),
// and every re-driven result (SubjectRedrivenResult): one filter, which the server matches
// faster than two.
const FilterResults = prefixResult + ">"

// FilterToolCalls matches every call of tool of kind, whatever the session; "*" for tool
// matches every tool of the kind.
func FilterToolCalls(kind, tool string) string { return FilterToolCallsIn(0, kind, tool) }

// FiltersAllToolCalls match every tool call of every kind: those dispatched on the bus, and
// those the fast lane recorded (EventFastCall).
func FiltersAllToolCalls() []string { return FiltersAllToolCallsIn(0) }

// FilterEvents matches every event of kind, whatever the session.
func FilterEvents(kind string) string { return FilterEventsIn(0, kind) }

// FilterSession returns the filters that together match every message of session.
func FilterSession(session string) []string { return one.FilterSession(session) }

// Deterministic message ids: the same logical message always gets the same id, so a retried
// publish is dropped by the stream's duplicate window.

// MsgIDRequest identifies the request message of requestID.
func MsgIDRequest(requestID string) string { return "request:" + requestID }

// MsgIDToolCall identifies the dispatch of one call.
func MsgIDToolCall(requestID, callID string) string { return "tool_call:" + requestID + ":" + callID }

// MsgIDFastRequest is the stream message id under which the fast lane records requestID: its
// own, so that a request the durable path takes later (the fast lane's record was cut short) is
// not taken for a duplicate of it.
func MsgIDFastRequest(requestID string) string { return "fast:request:" + requestID }

// MsgIDFastCall is the stream message id under which the fast lane records a call it sent.
func MsgIDFastCall(requestID, callID string) string {
	return "fast:tool_call:" + requestID + ":" + callID
}

// MsgIDToolStarted identifies the start of one try of a call.
func MsgIDToolStarted(requestID, callID string, attempt int) string {
	return "tool_started:" + requestID + ":" + callID + ":" + strconv.Itoa(attempt)
}

// MsgIDToolResult identifies the final result of one call.
func MsgIDToolResult(requestID, callID string) string {
	return "tool_result:" + requestID + ":" + callID
}

// MsgIDRedrivenResult identifies the result of a call re-driven from the dead letters
// (redrive is the re-drive's id): the id of the first answer is spent in the duplicate window.
func MsgIDRedrivenResult(requestID, callID, redrive string) string {
	return MsgIDToolResult(requestID, callID) + ":redrive:" + redrive
}

// MsgIDPolicy is the message id of a policy event: decision about requestID's call callID,
// the n-th of its kind (a call may wait for its rate window more than once).
func MsgIDPolicy(requestID, callID, decision string, n int64) string {
	return "policy:" + requestID + ":" + callID + ":" + decision + ":" + strconv.FormatInt(n, 10)
}

// MsgIDBlueprintStep is the message id of a blueprint run's event: step (empty for the run
// itself) reaching status.
func MsgIDBlueprintStep(runID, step, status string) string {
	return "blueprint:" + runID + ":" + step + ":" + status
}

// MsgIDResponse identifies the response to requestID.
func MsgIDResponse(requestID string) string { return "response:" + requestID }

// MsgIDCancel identifies the cancellation of requestID.
func MsgIDCancel(requestID string) string { return "cancel:" + requestID }

// MsgIDLLMDecision is the message id of turn's decision in the agent loop's run.
func MsgIDLLMDecision(run string, turn int) string { return "llm:" + run + ":" + strconv.Itoa(turn) }

// MsgIDLLMSummary identifies the summary of session's conversation through the decision
// stored at sequence through: summarized twice, it is recorded once.
func MsgIDLLMSummary(session string, through uint64) string {
	return "summary:" + session + ":" + strconv.FormatUint(through, 10)
}

// MsgIDWoken identifies a parked message published again when it is woken: msgID is the
// parked message's own id (a woken id counts as the id it was made from), and parking (the
// revision of its parking place) tells one wake-up from the next, so a message parked and
// woken twice is published twice.
func MsgIDWoken(msgID string, parking uint64) string {
	if base, _, found := strings.Cut(msgID, ":woken:"); found {
		msgID = base
	}
	return msgID + ":woken:" + strconv.FormatUint(parking, 10)
}

// MsgIDRedrive identifies a re-drive of a dead letter (redrive is the re-drive's id).
func MsgIDRedrive(redrive string) string { return "redrive:" + redrive }

// RedriveID names a re-drive of dead letter seq made at nanos (time.UnixNano), by hand.
func RedriveID(seq uint64, nanos int64) string {
	return strconv.FormatUint(seq, 10) + "-" + strconv.FormatInt(nanos, 10)
}

// MsgIDDeadLetter identifies the dead letter of the message consumer of stream gave up at
// stream sequence seq. The record's consumers have the same names in each of its streams, so
// the ids of the second and later record streams name the stream; the others' do not (as they
// did before a record had more than one).
func MsgIDDeadLetter(stream, consumer string, seq uint64) string {
	if k, ok := RecordStreamIndex(stream); ok && k > 0 {
		consumer = stream + ":" + consumer
	}
	return "dlq:" + consumer + ":" + strconv.FormatUint(seq, 10)
}

// Dead letters.
const (
	// DLQStreamName is the stream of dead letters: messages a consumer gave up on, with why.
	DLQStreamName = "HERMES_DLQ"
	// FilterDeadLetters matches every dead letter.
	FilterDeadLetters = subjectRoot + ".dlq.*"

	prefixDeadLetters = subjectRoot + ".dlq."
)

// SubjectDeadLetter is where messages given up by consumer are kept.
func SubjectDeadLetter(consumer string) string { return prefixDeadLetters + consumer }

// IsDeadLetter reports whether subject is where dead letters are kept (not an advisory).
func IsDeadLetter(subject string) bool { return strings.HasPrefix(subject, prefixDeadLetters) }

// Timers: the wake-ups of parked messages that wait for a time (see TimerStreamName).
const (
	// TimerStreamName is the stream of timers: a schedule per parking place, which the server
	// turns into a message on SubjectTimerDue at its time; consumed, that message is removed.
	TimerStreamName = "HERMES_TIMERS"
	// FilterTimersDue matches every timer that went off.
	FilterTimersDue = subjectRoot + ".timer.due.>"

	prefixTimerAt  = subjectRoot + ".timer.at."
	prefixTimerDue = subjectRoot + ".timer.due."
)

// TimerSubjects are the subjects the timer stream captures.
func TimerSubjects() []string { return []string{prefixTimerAt + ">", prefixTimerDue + ">"} }

// SubjectTimer holds the one schedule of wake key (a WakeKey: dot-separated tokens). A later
// schedule of the same key replaces it.
func SubjectTimer(key string) string { return prefixTimerAt + key }

// SubjectTimerDue is where the server puts the wake-up of key when its time comes.
func SubjectTimerDue(key string) string { return prefixTimerDue + key }

// WakeKeyOfTimer returns the wake key a due timer's subject names.
func WakeKeyOfTimer(subject string) (string, bool) { return strings.CutPrefix(subject, prefixTimerDue) }

// The fast lane (package fastlane): requests and read-only calls over core NATS request/reply,
// outside the record; what they did is recorded after they are answered.
const (
	// FilterFastRequests matches what a gateway asks a router on the fast lane:
	// hermes.fast.request.<session>, one request each.
	FilterFastRequests = subjectRoot + ".fast.request.*"
	// FilterFastCalls matches the tool calls a router sends a worker on the fast lane:
	// hermes.fast.call.<kind>.<tool>.
	FilterFastCalls = subjectRoot + ".fast.call.>"
	// FastQueue is the queue group of the fast lane's subscribers: one router, one worker
	// of a tool, answers each.
	FastQueue = "hermes-fastlane"
	// FastReplies is where workers answer the calls routers send them on the fast lane
	// (_INBOX_fastlane.<router's token>.<call's token>): a reply subject of its own, so that a
	// worker may answer there and nowhere else — not into any inbox of anyone's it learns.
	FastReplies = "_INBOX_fastlane"
)

// What a fast-lane answer says it is, in its Hermes-Fast header (bus.HeaderFast).
const (
	// FastAnswered: the body is the answer (a worker's sealed tool_result message; a
	// router's response).
	FastAnswered = "answered"
	// FastDeclined: not taken (a call that changes something, a request that must wait,
	// the record's buffer full, no worker free): nothing was run; take the durable path.
	FastDeclined = "declined"
	// FastRetry: the call ran once and failed in a way another try may fix: take the
	// durable path, where tries are retried.
	FastRetry = "retry"
	// FastRefused: not run, and never to be (no trusted seal, the wrong tool); the body
	// says why.
	FastRefused = "refused"
	// FastConflict: the request_id was accepted before for a different request.
	FastConflict = "conflict"
	// FastDurable: the router took the request (its plan is recorded) and, unable to finish
	// it on the fast lane, put it on the durable path itself: wait for its response there.
	FastDurable = "durable"
	// FastReplayed: the request_id was answered before; the body is that response.
	FastReplayed = "replayed"
)

// FilterFastRecordedRequests matches the requests the fast lane answered, as recorded:
// hermes.request.fast.<session>, beside the partitions' hermes.request.<partition>.<session>
// (FilterRequests matches both), where no router's consumer takes them.
const FilterFastRecordedRequests = subjectRoot + ".request.fast.*"

// SubjectFastRecordedRequest is where the fast lane records a request of session it answered.
func SubjectFastRecordedRequest(session string) string {
	return one.SubjectFastRecordedRequest(session)
}

// FilterRequestsOf matches every recorded request of session: a partition's and the fast
// lane's.
func FilterRequestsOf(session string) string { return one.FilterRequestsOf(session) }

// SubjectFastRequest is where a gateway asks a router to answer a request of session on the
// fast lane.
func SubjectFastRequest(session string) string { return subjectRoot + ".fast.request." + session }

// SubjectFastCall is where a router sends a read-only call of tool, of kind, to a worker.
func SubjectFastCall(kind, tool string) string {
	return subjectRoot + ".fast.call." + kind + "." + tool
}

// FilterFastCallsOf matches the fast-lane calls of tool, whatever their kind.
func FilterFastCallsOf(tool string) string { return subjectRoot + ".fast.call.*." + tool }
