package integration

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// TestIntakeSurvivesGatewayRestart: clients that time out retry with the same request_id,
// some across a gateway restart; each request runs once and every client gets the first
// response.
func TestIntakeSurvivesGatewayRestart(t *testing.T) {
	variant(t, "internal/submit's TestSubmit (a request_id submitted again joins the first run, or answers from it) and TestAnotherSubmitterJoinsWhatTheFirstAccepted (so does another gateway's); TestDuplicateRequestIDRunsOnce end to end")
	t.Parallel()
	s := start(t, options{workers: 1})
	const n = 20
	reqs := make([]map[string]any, n)
	for i := range reqs {
		reqs[i] = request(fmt.Sprintf("intake_%02d", i), "", call("c", "record", map[string]any{"first_delay_ms": 1500, "i": i}))
	}
	// First posts time out (the tool takes 1.5 s); then the gateway restarts.
	for _, req := range reqs[:5] {
		if status, _, body := s.post(req, "?timeout=100ms"); status != http.StatusGatewayTimeout {
			t.Fatalf("HTTP %d, want 504: %s", status, body)
		}
	}
	s.restartGateway("gateway-2")
	runs := s.runClients(reqs, 500*time.Millisecond, 0, 30*time.Second)
	counts := s.classify(runs)
	report(t, "clients retrying across a gateway restart", n, counts)
	if counts[outcomeOK]+counts[outcomeResolved] != n {
		t.Fatalf("%v", counts)
	}
	for _, req := range reqs {
		id := req["request_id"].(string)
		if tries := len(s.recorder.tries(id + "/c")); tries != 1 {
			t.Errorf("%s ran %d times, want once", id, tries)
		}
		if c := s.countRecorded(id, protocol.TypeRequest); c != 1 {
			t.Errorf("%s recorded %d times, want once", id, c)
		}
	}
	// Much later (here: at once), the same request_id still answers from the first run.
	status, hdr, _ := s.post(reqs[0], "")
	if status != http.StatusOK || hdr.Get("X-Hermes-Replayed") != "true" {
		t.Fatalf("replay: HTTP %d replayed=%q", status, hdr.Get("X-Hermes-Replayed"))
	}
}
