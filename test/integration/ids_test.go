package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Request ids are one namespace for all callers (README, Callers: Ids are one namespace): a
// caller who sends an id someone else used learns that it is taken and nothing more. The 409
// is worded as for one's own id used twice and names nothing of the other's request; the other
// request's very body gets 404, never its response; reading or cancelling it is 404 as for an
// unknown id; an operator reads it under the id its owner gave it.
func TestAnotherCallersRequestIDGivesNothingAway(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"alice": auth.RoleUser, "bob": auth.RoleUser, "ops": auth.RoleOperator})
	req := func(id, session string) string {
		return fmt.Sprintf(`{"request_id":%q,"session_id":%q,"tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{"n":1}}]}`, id, session)
	}
	if code, body := s.call("POST", "/v1/route", keys["alice"], req("ids_a1", "ids_alice"), "X-Trace-ID", "trace-alice-ids"); code != http.StatusOK {
		t.Fatalf("alice: %d %s", code, body)
	}
	_, own := s.call("POST", "/v1/route", keys["alice"], req("ids_a1", "ids_alice_2"))
	code, bobs := s.call("POST", "/v1/route", keys["bob"], req("ids_a1", "ids_bob"))
	if code != http.StatusConflict || !strings.Contains(bobs, protocol.CodeRequestIDConflict) {
		t.Fatalf("bob reuses alice's id: %d %s", code, bobs)
	}
	if bobs != own {
		t.Errorf("bob's conflict differs from alice's own:\n%s\n%s", bobs, own)
	}
	for _, secret := range []string{"ids_alice", "trace-alice-ids", "key:", "alice", `"n"`} {
		if strings.Contains(bobs, secret) {
			t.Errorf("bob's conflict names %q: %s", secret, bobs)
		}
	}
	// Alice's very request, sent by bob: her session is not his to post into.
	if code, body := s.call("POST", "/v1/route", keys["bob"], req("ids_a1", "ids_alice")); code != http.StatusNotFound || strings.Contains(body, `"results"`) {
		t.Errorf("bob sends alice's request: %d %s", code, body)
	}
	for _, method := range []string{"GET", "DELETE"} {
		_, unknown := s.call(method, "/v1/requests/ids_none", keys["bob"], "")
		code, body := s.call(method, "/v1/requests/ids_a1", keys["bob"], "")
		if code != http.StatusNotFound || body != strings.ReplaceAll(unknown, "ids_none", "ids_a1") {
			t.Errorf("bob %s alice's request: %d %s (an unknown one: %s)", method, code, body, unknown)
		}
	}
	if code, body := s.call("GET", "/v1/requests/ids_a1", keys["ops"], ""); code != http.StatusOK || !strings.Contains(body, `"ids_a1"`) {
		t.Errorf("an operator reads alice's request: %d %s", code, body)
	}
}
