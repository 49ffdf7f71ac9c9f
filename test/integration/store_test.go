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
	variant(t, "TestLargeRequestsBackToBackNeverOverfillTheRecord (accepted requests answered, then STORE_FULL) and internal/admission's TestTheStoreGaugeCountsWhatIsWritten")
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

// Requests larger than the margin the gateway keeps free, sent back to back: each is answered
// or refused with STORE_FULL, none accepted and then left without room to finish — the gateway
// counts what each request it accepts will write, not only what the record held at its last look.
func TestLargeRequestsBackToBackNeverOverfillTheRecord(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, bus: bus.Config{MaxBytes: 512 << 10}})
	blob := strings.Repeat("y", 12<<10) // 48 KiB a request: it writes about 4 times that
	var calls []map[string]any
	for i := range 4 {
		calls = append(calls, call(fmt.Sprintf("c%d", i), "echo", map[string]any{"blob": blob}))
	}
	accepted := 0
	for i := 0; i < 40; i++ {
		code, _, body := s.post(map[string]any{"request_id": fmt.Sprintf("big_%d", i), "tool_calls": calls}, "?timeout=10s")
		switch {
		case code == http.StatusOK:
			accepted++
		case code == http.StatusServiceUnavailable && strings.Contains(string(body), protocol.CodeStoreFull):
			if accepted == 0 {
				t.Fatalf("refused before anything was accepted: %s", body)
			}
			t.Logf("%d accepted, then: %s", accepted, body)
			return
		default:
			t.Fatalf("request %d (after %d accepted): HTTP %d %s", i, accepted, code, body)
		}
	}
	t.Fatal("40 requests of 48 KiB accepted into a 512 KiB record")
}
