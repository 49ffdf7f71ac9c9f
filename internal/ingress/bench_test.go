package ingress

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// benchRequest is a client's request of calls calls, each with arguments of about argBytes.
func benchRequest(calls, argBytes int) *protocol.Request {
	req := &protocol.Request{RequestID: "bench_1", SessionID: "bench_s", Intent: "look up a customer's orders"}
	for i := range calls {
		args := fmt.Sprintf(`{"customer_id":"C%06d","fields":["status","total"],"note":%q}`, i, strings.Repeat("x", argBytes))
		req.ToolCalls = append(req.ToolCalls, protocol.ToolCall{ToolCallID: fmt.Sprintf("c%d", i), Name: "order_query", Arguments: json.RawMessage(args)})
	}
	return req
}

// BenchmarkClientRequestDecode is what the ingress spends reading a client's request, as JSON
// (Content-Type: application/json) and as msgpack (the envelope Hermes' services write): the
// rest of its way (admission, the record) is the same for both.
func BenchmarkClientRequestDecode(b *testing.B) {
	for _, size := range []struct {
		name            string
		calls, argBytes int
	}{{"3calls_small", 3, 32}, {"16calls_4KiB", 16, 4 << 10}} {
		req := benchRequest(size.calls, size.argBytes)
		asJSON, err := json.Marshal(req)
		if err != nil {
			b.Fatal(err)
		}
		m, err := protocol.NewMessage(protocol.TypeRequest, req)
		if err != nil {
			b.Fatal(err)
		}
		m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDRequest(req.RequestID), req.RequestID, req.Session()
		asMsgpack, err := protocol.Marshal(m)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(size.name+"/json", func(b *testing.B) {
			b.SetBytes(int64(len(asJSON)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := protocol.DecodeRequestJSON(asJSON, protocol.Limits{}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(size.name+"/msgpack", func(b *testing.B) {
			b.SetBytes(int64(len(asMsgpack)))
			b.ReportAllocs()
			for b.Loop() {
				m, err := protocol.Unmarshal(asMsgpack)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := m.DecodeRequest(protocol.Limits{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
