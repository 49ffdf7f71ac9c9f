package integration

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// A service's user may name any subject as the reply of what it publishes, and the stream then
// writes its acknowledgement there as the server: here a tool worker's user has one written
// over an API key, an owner record and a plan before their first use. Such an entry is damage,
// never data: the key is refused as a damaged record (never taken for another), the session is
// closed to its owner and to others alike, and the request whose plan it took is refused as a
// conflict, no tool called. (The same user can do no more than that: what the server writes there is
// always {"stream":…,"seq":…}.)
func TestAcknowledgementsAServiceHasWrittenGrantNothing(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"alice": auth.RoleUser, "bob": auth.RoleUser, "carol": auth.RoleUser})
	ctx := context.Background()
	_, b := s.connect()
	req := func(id, session string) string {
		return `{"request_id":"` + id + `","session_id":"` + session + `","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{"n":1}}]}`
	}
	carol, _, err := auth.ParseKey(keys["carol"])
	if err != nil {
		t.Fatal(err)
	}
	s.poisoned = "ack_s9"
	nc := s.srv.ConnectAs(t, bus.RoleWorker)
	damaged := map[string]func() ([]byte, error){
		"$KV." + auth.KeysBucket + "." + carol: func() ([]byte, error) {
			e, err := b.Bucket(auth.KeysBucket).Get(ctx, carol)
			return value(e, err)
		},
		"$KV." + admission.OwnersBucket + ".ack_alice": func() ([]byte, error) {
			e, err := b.Bucket(admission.OwnersBucket).Get(ctx, "ack_alice")
			return value(e, err)
		},
		"$KV." + bus.BucketCalls + "." + protocol.KeyPlan("ack_bob_2"): func() ([]byte, error) {
			e, err := b.Calls.Get(ctx, protocol.KeyPlan("ack_bob_2"))
			return value(e, err)
		},
	}
	for reply := range damaged {
		if err := nc.PublishRequest(protocol.SubjectResult("ack_r9", "c1", "ack_s9"), reply, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	for reply, read := range damaged {
		waitFor(t, "the acknowledgement written on "+reply, func() bool {
			v, err := read()
			return err == nil && strings.Contains(string(v), `"seq"`)
		})
	}

	if code, body := s.call("POST", "/v1/route", keys["carol"], req("ack_carol_1", "ack_carol")); code != http.StatusUnauthorized {
		t.Errorf("the damaged key: %d %s", code, body)
	}
	for _, who := range []string{"alice", "bob"} {
		if code, body := s.call("POST", "/v1/route", keys[who], req("ack_"+who+"_0", "ack_alice")); code != http.StatusNotFound {
			t.Errorf("%s into the session whose owner record is damaged: %d %s", who, code, body)
		}
	}
	if code, body := s.call("POST", "/v1/route", keys["bob"], req("ack_bob_1", "ack_bob")); code != http.StatusOK {
		t.Fatalf("bob's own session: %d %s", code, body)
	}
	// Refused as a conflict naming the id, not as an outage a retry would get past.
	if code, body := s.call("POST", "/v1/route", keys["bob"], req("ack_bob_2", "ack_bob")); code != http.StatusConflict || !strings.Contains(body, "ack_bob_2") {
		t.Errorf("the request whose plan was damaged: %d %s", code, body)
	}
	for _, m := range s.record() {
		if m.RequestID == "ack_bob_2" && m.Type == protocol.TypeToolCall {
			t.Errorf("a tool call was dispatched for the request whose plan was damaged: %s", m.MsgID)
		}
	}
}

func value(e jetstream.KeyValueEntry, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	return e.Value(), nil
}
