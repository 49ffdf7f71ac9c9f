package protocol

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// matchesAny reports whether subject matches one of patterns.
func matchesAny(patterns []string, subject string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return subjectMatches(p, subject) })
}

func TestALayoutKeepsEachSessionWholeInOneStream(t *testing.T) {
	for _, streams := range []int{1, 2, 3, 4, MaxRecordStreams} {
		l, err := NewLayout(streams)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[int]bool{}
		for i := range 200 {
			s := fmt.Sprintf("session-%d", i)
			k := l.StreamOf(s)
			seen[k] = true
			subjects := []string{l.SubjectRequest(s), l.SubjectToolCall(ActionHTTP, "echo", s), l.SubjectResult("r1", "c1", s),
				l.SubjectRedrivenResult(s), l.SubjectResponse("r1", s), l.SubjectEvent(EventLLM, s), l.SubjectFastRecordedRequest(s)}
			for _, subj := range subjects {
				// Captured by its own stream, and by no other.
				for j := range streams {
					if got := matchesAny(StreamSubjectsOf(j), subj); got != (j == k) {
						t.Fatalf("%d streams: %s captured by stream %d: %t (its session is in %d)", streams, subj, j, got, k)
					}
				}
				if got, ok := StreamOfSubject(subj); !ok || got != k {
					t.Errorf("StreamOfSubject(%s) = %d, %t; want %d", subj, got, ok, k)
				}
				if !matchesAny(l.FilterSession(s), subj) {
					t.Errorf("%s is not matched by its session's filters %v", subj, l.FilterSession(s))
				}
				// As stream 0 holds it: what the one-stream builders make.
				if c := CanonicalSubject(subj); !strings.HasPrefix(c, "hermes.") || l.Place(c, s) != subj {
					t.Errorf("CanonicalSubject(%s) = %s, placed again %s", subj, c, l.Place(c, s))
				}
			}
			// A session's stored requests are in the partition its stream holds.
			if streams <= 16 && 16%streams == 0 {
				p := RequestPartition(s, 16)
				if l.StreamOfPartition(p) != k || !subjectMatches(l.FilterRequestPartition(p), l.StoredSubjectRequest(s, 16)) {
					t.Errorf("%d streams: session %s (stream %d) in partition %d of stream %d", streams, s, k, p, l.StreamOfPartition(p))
				}
			}
		}
		if len(seen) != streams {
			t.Errorf("%d streams: sessions spread over %d of them", streams, len(seen))
		}
	}
}

func TestTheZeroLayoutIsTheRecordOfOneStream(t *testing.T) {
	var l Layout
	s := "s1"
	for _, pair := range [][2]string{
		{l.SubjectRequest(s), SubjectRequest(s)}, {l.SubjectResult("r", "c", s), SubjectResult("r", "c", s)},
		{l.SubjectResponse("r", s), SubjectResponse("r", s)}, {l.SubjectEvent(EventCancel, s), SubjectEvent(EventCancel, s)},
		{l.StoredSubjectRequest(s, 7), StoredSubjectRequest(s, 7)}, {l.FilterRequestPartition(3), FilterRequestPartition(3)},
		{RecordStream(0), StreamName},
	} {
		if pair[0] != pair[1] {
			t.Errorf("%s, want %s", pair[0], pair[1])
		}
	}
	if !slices.Equal(StreamSubjects(), StreamSubjectsOf(0)) {
		t.Errorf("stream 0's subjects changed: %v", StreamSubjectsOf(0))
	}
}

func TestLayoutsRefuseWhatTheyCannotHold(t *testing.T) {
	for _, n := range []int{0, -1, MaxRecordStreams + 1} {
		if _, err := NewLayout(n); err == nil {
			t.Errorf("NewLayout(%d) accepted", n)
		}
	}
	l, _ := NewLayout(4)
	if err := l.CheckPartitions(18); err == nil || !strings.Contains(err.Error(), "multiple") {
		t.Errorf("18 partitions over 4 streams: %v", err)
	}
	if err := l.CheckPartitions(16); err != nil {
		t.Error(err)
	}
	for _, name := range []string{"HERMES_0", "HERMES_8", "HERMES_01", "HERMES_x", "HERMES_DLQ", "HERMES_", "KV_hermes"} {
		if k, ok := RecordStreamIndex(name); ok {
			t.Errorf("RecordStreamIndex(%s) = %d, a record stream", name, k)
		}
	}
	for _, subj := range []string{"hermes_0.request.s", "hermes_8.request.s", "hermes_01.request.s", "hermesx.request.s", "other.request.s", "hermes"} {
		if k, ok := StreamOfSubject(subj); ok {
			t.Errorf("StreamOfSubject(%s) = %d, a record subject", subj, k)
		}
		if c := CanonicalSubject(subj); c != subj {
			t.Errorf("CanonicalSubject(%s) = %s", subj, c)
		}
	}
}

func TestDeadLetterIdsNameTheStreamBeyondTheFirst(t *testing.T) {
	if got := MsgIDDeadLetter(StreamName, "router-results", 7); got != "dlq:router-results:7" {
		t.Errorf("the first stream's: %s (ids of letters written before must not change)", got)
	}
	if got := MsgIDDeadLetter(ClientStreamName, "gateway-clients", 7); got != "dlq:gateway-clients:7" {
		t.Errorf("the clients' stream's: %s", got)
	}
	if a, b := MsgIDDeadLetter(RecordStream(1), "router-results", 7), MsgIDDeadLetter(RecordStream(2), "router-results", 7); a == b || a == MsgIDDeadLetter(StreamName, "router-results", 7) {
		t.Errorf("two streams' letters of the same consumer and sequence share an id: %s, %s", a, b)
	}
}

func FuzzRecordSubjects(f *testing.F) {
	for _, s := range []string{"hermes.request.s", "hermes_3.result.r:c.s", "hermes_7.event.llm.x", "hermes_", "hermes_1", "hermes_99.a", "", "."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, subject string) {
		k, ok := StreamOfSubject(subject)
		if ok && (k < 0 || k >= MaxRecordStreams) {
			t.Fatalf("StreamOfSubject(%q) = %d", subject, k)
		}
		c := CanonicalSubject(subject)
		if c != subject && (!ok || !strings.HasPrefix(c, "hermes.")) {
			t.Fatalf("CanonicalSubject(%q) = %q", subject, c)
		}
		if CanonicalSubject(c) != c {
			t.Fatalf("CanonicalSubject is not stable on %q", subject)
		}
		if ok {
			l, _ := NewLayout(4)
			placed := l.Place(subject, "s")
			if got, _ := StreamOfSubject(placed); got != l.StreamOf("s") {
				t.Fatalf("Place(%q) = %q, in stream %d", subject, placed, got)
			}
		}
	})
}
