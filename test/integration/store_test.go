package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// A record with a byte limit fills up: before it is full the gateway refuses new requests with
// 503 STORE_FULL naming the limit, and every request it accepted still gets its response
// (nothing accepted is dropped to make room).
func TestAFullRecordRefusesNewRequestsAndFinishesAccepted(t *testing.T) {
	s := start(t, options{workers: 1, bus: bus.Config{MaxBytes: 128 << 10}})
	pad := strings.Repeat("x", 200)
	var accepted []string
	refused := ""
	for i := 0; i < 400 && refused == ""; i++ {
		id := fmt.Sprintf("fill_%d", i)
		code, _, body := s.post(map[string]any{"request_id": id, "intent": pad,
			"tool_calls": []map[string]any{call("c1", "echo", map[string]any{"pad": pad})}}, "?timeout=10s")
		switch code {
		case http.StatusOK:
			var resp protocol.Response
			if err := json.Unmarshal(body, &resp); err != nil || resp.Status != protocol.StatusSuccess {
				t.Fatalf("accepted request %s: %s", id, body)
			}
			accepted = append(accepted, id)
			// Paced so that the gateway (checking every 50 ms here) sees each request's
			// messages before the next: the 10 % it keeps free is for requests in flight.
			time.Sleep(120 * time.Millisecond)
		case http.StatusServiceUnavailable:
			var e struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			_ = json.Unmarshal(body, &e)
			if e.Error.Code != protocol.CodeStoreFull || !strings.Contains(e.Error.Message, "--record-max-bytes") {
				t.Fatalf("request %d: 503 %s", i, body)
			}
			refused = e.Error.Message
		default:
			_, b := s.connect()
			si, _ := b.Stream.Info(t.Context())
			t.Fatalf("request %d: %d %s (record: %d of %d bytes, %d msgs)", i, code, body, si.State.Bytes, si.Config.MaxBytes, si.State.Msgs)
		}
	}
	if refused == "" || len(accepted) == 0 {
		t.Fatalf("%d accepted, refused: %q", len(accepted), refused)
	}
	t.Logf("%d requests accepted, then: %s", len(accepted), refused)
}
