package protocol

import (
	"fmt"
	"strconv"
	"strings"
)

// A record of several streams. One stream is one store loop and, in a cluster, one Raft group
// with one leader: however many nodes, the messages of a one-stream record are stored one after
// another. A record of S streams keeps each session whole in one of them — every message of a
// session in one stream, in the order it was stored — while sessions spread over the streams,
// and so over their leaders.
//
// Stream k (RecordStream) holds the sessions whose hash (RequestPartition(session, S)) is k,
// under subjects of their own: those of stream 0 (HERMES) start with "hermes", those of stream
// k > 0 with "hermes_<k>", the other tokens as in stream 0. A record of one stream is therefore
// the record every Hermes kept before streams could be set, unchanged.
//
// The number of streams is set when the record is provisioned; changing it moves sessions
// between streams (hermes provision --streams).
const (
	// MaxRecordStreams bounds the streams of a record: the permissions of every service role
	// name each stream a record may have (a cluster of up to 8 nodes, one leader each).
	MaxRecordStreams = 8
)

// Layout is where a record of Streams streams keeps each session's messages: the one place
// that decides a record subject's stream. The zero Layout is a record of one stream.
type Layout struct{ streams int }

// one is the layout of a record of one stream, whose subjects the package's free builders
// name.
var one Layout

// NewLayout returns the layout of a record of streams streams.
func NewLayout(streams int) (Layout, error) {
	if streams < 1 || streams > MaxRecordStreams {
		return Layout{}, fmt.Errorf("%d record streams: there must be 1 to %d", streams, MaxRecordStreams)
	}
	return Layout{streams: streams}, nil
}

// Streams is how many streams the record has (at least 1).
func (l Layout) Streams() int { return max(l.streams, 1) }

// StreamOf returns the index of the stream that keeps session's messages.
func (l Layout) StreamOf(session string) int {
	if l.Streams() == 1 {
		return 0
	}
	return RequestPartition(session, l.Streams())
}

// StreamNameOf returns the name of the stream that keeps session's messages.
func (l Layout) StreamNameOf(session string) string { return RecordStream(l.StreamOf(session)) }

// StreamOfPartition returns the index of the stream that holds request partition p: the
// partitions of a session's requests and its stream agree when the number of partitions is a
// multiple of the number of streams (CheckPartitions).
func (l Layout) StreamOfPartition(p int) int { return p % l.Streams() }

// CheckPartitions returns an error when n request partitions cannot be spread over the
// layout's streams: each partition must lie in one stream, so n must be a multiple of them.
func (l Layout) CheckPartitions(n int) error {
	if n%l.Streams() != 0 {
		return fmt.Errorf("%d request partitions over %d record streams: the partitions must be a multiple of the streams", n, l.Streams())
	}
	return nil
}

// RecordStream is the name of record stream k: HERMES, then HERMES_1, HERMES_2, ….
func RecordStream(k int) string {
	if k == 0 {
		return StreamName
	}
	return StreamName + "_" + strconv.Itoa(k)
}

// RecordStreamIndex returns k for the name of record stream k, and false for any other name.
func RecordStreamIndex(name string) (int, bool) {
	if name == StreamName {
		return 0, true
	}
	num, ok := strings.CutPrefix(name, StreamName+"_")
	if !ok {
		return 0, false
	}
	k, ok := streamIndex(num)
	return k, ok && k > 0
}

// streamIndex parses the number of a record stream other than the first, written canonically.
func streamIndex(num string) (int, bool) {
	k, err := strconv.Atoi(num)
	if err != nil || k < 1 || k >= MaxRecordStreams || strconv.Itoa(k) != num {
		return 0, false
	}
	return k, true
}

// RecordRoot is the first token of the subjects record stream k keeps.
func RecordRoot(k int) string {
	if k == 0 {
		return subjectRoot
	}
	return subjectRoot + "_" + strconv.Itoa(k)
}

func (l Layout) root(session string) string { return RecordRoot(l.StreamOf(session)) }

// CanonicalSubject returns a record subject of any stream as stream 0 would hold it (the first
// token "hermes"), what the one-stream builders and parsers speak; any other subject is
// returned as it is.
func CanonicalSubject(subject string) string {
	rest, ok := strings.CutPrefix(subject, subjectRoot+"_")
	if !ok {
		return subject
	}
	num, tail, ok := strings.Cut(rest, ".")
	if _, valid := streamIndex(num); !ok || !valid {
		return subject
	}
	return subjectRoot + "." + tail
}

// SubjectRequest is where a request of session enters the bus (SubjectRequest, in the
// session's stream).
func (l Layout) SubjectRequest(session string) string {
	return l.root(session) + ".request." + session
}

// SubjectToolCall is where calls of tool in session are dispatched (SubjectToolCall, in the
// session's stream).
func (l Layout) SubjectToolCall(kind, tool, session string) string {
	return l.root(session) + ".tool_" + kind + "." + tool + "." + session
}

// SubjectResult is where the one result of a call is recorded (SubjectResult, in the session's
// stream).
func (l Layout) SubjectResult(requestID, callID, session string) string {
	return l.root(session) + ".result." + requestID + ":" + callID + "." + session
}

// SubjectRedrivenResult is where a re-driven result is published again
// (SubjectRedrivenResult, in the session's stream).
func (l Layout) SubjectRedrivenResult(session string) string {
	return l.root(session) + ".result." + session
}

// SubjectResponse is where the one response to requestID is recorded (SubjectResponse, in the
// session's stream).
func (l Layout) SubjectResponse(requestID, session string) string {
	return l.root(session) + ".response." + requestID + "." + session
}

// SubjectEvent carries other events of session (SubjectEvent, in the session's stream).
func (l Layout) SubjectEvent(kind, session string) string {
	return l.root(session) + ".event." + kind + "." + session
}

// SubjectFastRecordedRequest is where the fast lane records a request of session it answered
// (SubjectFastRecordedRequest, in the session's stream).
func (l Layout) SubjectFastRecordedRequest(session string) string {
	return l.root(session) + ".request.fast." + session
}

// FilterSession returns the filters that together match every message of session, in its
// stream.
func (l Layout) FilterSession(session string) []string {
	root := l.root(session)
	return []string{root + ".*." + session, root + ".*.*." + session}
}

// FilterRequestsOf matches every recorded request of session, in its stream.
func (l Layout) FilterRequestsOf(session string) string {
	return l.root(session) + ".request.*." + session
}

// StoredSubjectRequest is the subject a record of n request partitions stores session's
// requests under, in its stream.
func (l Layout) StoredSubjectRequest(session string, n int) string {
	return l.root(session) + ".request." + strconv.Itoa(RequestPartition(session, n)) + "." + session
}

// FilterRequestPartition matches the stored requests of partition p, in its stream
// (StreamOfPartition).
func (l Layout) FilterRequestPartition(p int) string {
	return RecordRoot(l.StreamOfPartition(p)) + ".request." + strconv.Itoa(p) + ".*"
}

// FilterResponseOfIn matches the response of requestID in stream k, whatever its session.
func FilterResponseOfIn(k int, requestID string) string {
	return RecordRoot(k) + ".response." + requestID + ".*"
}

// FilterResultsIn matches every recorded (and re-driven) result in stream k (FilterResults).
func FilterResultsIn(k int) string { return RecordRoot(k) + ".result.>" }

// FilterRequestsIn matches every stored request in stream k (FilterRequests).
func FilterRequestsIn(k int) string { return RecordRoot(k) + ".request.*.*" }

// FilterToolCallsIn matches every call of tool of kind in stream k (FilterToolCalls).
func FilterToolCallsIn(k int, kind, tool string) string {
	return RecordRoot(k) + ".tool_" + kind + "." + tool + ".*"
}

// FilterEventsIn matches every event of kind in stream k (FilterEvents).
func FilterEventsIn(k int, kind string) string { return RecordRoot(k) + ".event." + kind + ".*" }

// FiltersAllToolCallsIn match every tool call of every kind in stream k (FiltersAllToolCalls).
func FiltersAllToolCallsIn(k int) []string {
	var out []string
	for _, kind := range Kinds {
		out = append(out, FilterToolCallsIn(k, kind, "*"))
	}
	return append(out, FilterEventsIn(k, EventFastCall))
}

// RequestTransformIn is record stream k's subject transform for n partitions (RequestTransform).
func RequestTransformIn(k, n int) (source, destination string) {
	root := RecordRoot(k)
	return root + ".request.*", fmt.Sprintf("%s.request.{{partition(%d,1)}}.{{wildcard(1)}}", root, n)
}

// LiveResponseRepublishIn is record stream k's republish rule: every stream announces its
// responses on the same subjects (LiveResponseRepublish).
func LiveResponseRepublishIn(k int) (source, destination string) {
	return RecordRoot(k) + ".response.*.*", subjectRoot + ".live.response.{{wildcard(1)}}.{{wildcard(2)}}"
}

// StreamOfSubject returns the index of the record stream whose subjects subject is one of (by
// its first token), and false when it is no record stream's.
func StreamOfSubject(subject string) (int, bool) {
	root, _, ok := strings.Cut(subject, ".")
	if !ok {
		return 0, false
	}
	if root == subjectRoot {
		return 0, true
	}
	num, ok := strings.CutPrefix(root, subjectRoot+"_")
	if !ok {
		return 0, false
	}
	return streamIndex(num)
}

// Place returns a record subject of session (of any stream, or as stream 0 would hold it) as
// this layout keeps it: in the session's stream. Any other subject is returned as it is.
func (l Layout) Place(subject, session string) string { return InStream(subject, l.StreamOf(session)) }

// InStream returns a record subject (or filter) of any stream as record stream k holds it; any
// other subject is returned as it is.
func InStream(subject string, k int) string {
	if _, ok := StreamOfSubject(subject); !ok {
		return subject
	}
	_, rest, _ := strings.Cut(subject, ".")
	return RecordRoot(k) + "." + rest
}

// SessionOfSubject returns the session a record subject (or filter) names: its last token.
func SessionOfSubject(subject string) string {
	return subject[strings.LastIndexByte(subject, '.')+1:]
}
