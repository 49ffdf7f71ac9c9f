package deadletter

import (
	"strings"
	"testing"
)

func TestDecodeAdvisory(t *testing.T) {
	t.Parallel()
	good := `{"type":"io.nats.jetstream.advisory.v1.max_deliver","stream":"HERMES","consumer":"tool_http-echo","stream_seq":42,"deliveries":3}`
	a, err := decodeAdvisory([]byte(good))
	if err != nil || a.StreamSeq != 42 || a.reason() != "gave up after 3 deliveries" {
		t.Fatalf("%+v %v", a, err)
	}
	term := `{"type":"io.nats.jetstream.advisory.v1.terminated","stream":"HERMES","consumer":"router-requests","stream_seq":7,"deliveries":1,"reason":"protocol: malformed message"}`
	if a, err := decodeAdvisory([]byte(term)); err != nil || !strings.Contains(a.reason(), "malformed") {
		t.Fatalf("%+v %v", a, err)
	}
	for name, bad := range map[string]string{
		"not json":       "{",
		"other type":     `{"type":"io.nats.jetstream.advisory.v1.nak","stream":"HERMES","consumer":"c","stream_seq":1}`,
		"other stream":   `{"type":"io.nats.jetstream.advisory.v1.max_deliver","stream":"KV_x","consumer":"c","stream_seq":1}`,
		"wildcard name":  `{"type":"io.nats.jetstream.advisory.v1.max_deliver","stream":"HERMES","consumer":"*","stream_seq":1}`,
		"no sequence":    `{"type":"io.nats.jetstream.advisory.v1.max_deliver","stream":"HERMES","consumer":"c"}`,
		"dotted name":    `{"type":"io.nats.jetstream.advisory.v1.terminated","stream":"HERMES","consumer":"a.b","stream_seq":1}`,
		"array not json": `[1,2,3]`,
	} {
		if _, err := decodeAdvisory([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// FuzzDecodeAdvisory: advisories are read from a stream anyone with publish rights on
// $JS.EVENT.> could write to; no bytes may panic the processor or name a bad consumer.
func FuzzDecodeAdvisory(f *testing.F) {
	f.Add([]byte(`{"type":"io.nats.jetstream.advisory.v1.max_deliver","stream":"HERMES","consumer":"tool_http-echo","stream_seq":42,"deliveries":3}`))
	f.Add([]byte(`{"type":"io.nats.jetstream.advisory.v1.terminated","stream":"HERMES","consumer":">","stream_seq":1}`))
	f.Add([]byte(`{"stream_seq":18446744073709551615}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := decodeAdvisory(data)
		if err != nil {
			return
		}
		if strings.ContainsAny(a.Consumer, ".*> ") || a.StreamSeq == 0 {
			t.Fatalf("accepted unsafe advisory %+v", a)
		}
		_ = a.reason()
	})
}
