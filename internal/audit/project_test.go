package audit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// FuzzProject feeds the projection hostile bytes: it never panics, and a record becomes
// statements or one audit_errors row, whose every text PostgreSQL can hold.
func FuzzProject(f *testing.F) {
	r := newRecords(&testing.T{})
	demo(r, func(*protocol.Message) {})
	for _, rec := range r.recs {
		f.Add(rec.Subject, rec.Data)
	}
	f.Add("hermes.request.1.x", []byte("\x00\xff"))
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		p := project(Record{Stream: protocol.StreamName, Seq: 1, Subject: subject, Data: data}, protocol.SubjectRedrivenResult, false)
		if p.result != nil {
			(&p).counted(p.result)
		}
		for _, st := range p.stmts {
			if strings.Count(st.sql, "$") < len(st.args) {
				t.Fatalf("%d arguments for %s", len(st.args), st.sql)
			}
			for _, a := range st.args {
				if s, ok := a.(string); ok && (!utf8.ValidString(s) || strings.ContainsRune(s, 0)) {
					t.Fatalf("a text PostgreSQL refuses: %q", s)
				}
			}
		}
	})
}

// load records n requests of two calls each, as a router and workers record them: request,
// two dispatches, two starts, two results, response.
func load(r *records, n int, prefix string) {
	action := protocol.Action{Kind: protocol.ActionHTTP, TimeoutMS: 1000,
		Retry: protocol.RetryPolicy{MaxAttempts: 1, BackoffFactor: 1, MaxIntervalMS: 1}, HTTP: &protocol.HTTPAction{URL: "http://127.0.0.1:1/x"}}
	for i := range n {
		id, sess := fmt.Sprintf("%s-%d", prefix, i), fmt.Sprintf("%s-s%d", prefix, i%64)
		calls := []protocol.ToolCall{{ToolCallID: "a", Name: "echo", Arguments: []byte(`{"q":"x","page":1}`)}, {ToolCallID: "b", Name: "weather", Arguments: []byte(`{"city":"y"}`)}}
		r.add("hermes.request.1."+sess, protocol.TypeRequest, id, sess, protocol.Request{RequestID: id, SessionID: sess, Intent: "bench", ToolCalls: calls})
		for _, c := range calls {
			r.add("hermes.tool_http."+c.Name+"."+sess, protocol.TypeToolCall, id, sess, protocol.Dispatch{Call: c, Route: c.Name, Action: action})
			r.add("hermes.event.tool_started."+sess, protocol.TypeToolStarted, id, sess, protocol.ToolStarted{ToolCallID: c.ToolCallID, Name: c.Name, Attempt: 1, StartedAt: r.at})
			r.add("hermes.result."+id+":"+c.ToolCallID+"."+sess, protocol.TypeToolResult, id, sess, protocol.ToolResult{ToolCallID: c.ToolCallID, Name: c.Name,
				Status: protocol.ResultOK, Attempts: 1, ExecutionTimeMS: 3, Content: []byte(`{"items":[{"id":1,"name":"a"},{"id":2,"name":"b"}],"total":2}`)})
		}
		r.add("hermes.response."+id+"."+sess, protocol.TypeResponse, id, sess, protocol.Response{RequestID: id, SessionID: sess, Status: protocol.StatusSuccess})
	}
}

// BenchmarkWrite measures the projection's writes alone, into a real PostgreSQL: the records
// of requests of two calls (8 each) written in batches of the given size, one transaction
// each. records/s is the figure; the service adds reading from the bus and acking.
func BenchmarkWrite(b *testing.B) {
	for _, size := range []int{50, 500} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			s, _ := newStore(b, nil)
			r := newRecords(b)
			load(r, max(b.N/8, 1)*1, "bench")
			b.ResetTimer()
			for i := 0; i < len(r.recs); i += size {
				if _, err := s.write(context.Background(), r.recs[i:min(i+size, len(r.recs))]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(r.recs))/b.Elapsed().Seconds(), "records/s")
		})
	}
}
