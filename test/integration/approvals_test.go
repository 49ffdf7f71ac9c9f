package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/approvals"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/policies"
	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// applyPolicy applies the policy in js to tool through the bus, as the policies' API does.
func (s *system) applyPolicy(tool, js string) {
	s.t.Helper()
	var p policy.Policy
	if err := json.Unmarshal([]byte(js), &p); err != nil {
		s.t.Fatal(err)
	}
	_, b := s.connect()
	e, _, err := policies.NewStore(b.Bucket(policies.PoliciesBucket)).Apply(context.Background(), tool, &p, "test")
	if err != nil {
		s.t.Fatal(err)
	}
	// A router sees the change when the server delivers it to its watch; the test's next call
	// must go under it.
	waitFor(s.t, "every router follows "+tool+"'s policy", func() bool {
		for _, r := range s.routers {
			if rule, err := r.Policies().Rule(tool, nil); err != nil || rule == nil || rule.Version < e.Version {
				return false
			}
		}
		return true
	})
}

// approvalView is what the approvals' API answers of one.
type approvalView struct {
	ID           string          `json:"id"`
	State        string          `json:"state"`
	Tool         string          `json:"tool"`
	Arguments    json.RawMessage `json:"arguments"`
	CanDecide    bool            `json:"can_decide"`
	RunRequestID string          `json:"run_request_id"`
	DecidedBy    string          `json:"decided_by"`
	Reason       string          `json:"reason"`
	UsedBy       string          `json:"used_by"`
}

func (s *system) approval(key, id string) (int, approvalView) {
	s.t.Helper()
	code, body := s.call(http.MethodGet, "/v1/approvals/"+id, key, "")
	var v approvalView
	if code == http.StatusOK {
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			s.t.Fatalf("%s: %v", body, err)
		}
	}
	return code, v
}

// routeAs posts a request of one call of tool with args as key, and returns the call's result.
func (s *system) routeOne(key, id, session, tool, args string) protocol.ToolResult {
	s.t.Helper()
	code, body := s.call(http.MethodPost, "/v1/route?wait=10s", key,
		`{"request_id":"`+id+`","session_id":"`+session+`","intent":"test","tool_calls":[{"tool_call_id":"c1","name":"`+tool+`","arguments":`+args+`}]}`)
	if code != http.StatusOK {
		s.t.Fatalf("route %s: %d %s", id, code, body)
	}
	return result(s.t, decodeResponse(s.t, []byte(body)), "c1")
}

// policyEvents are the policy events recorded of session, by decision.
func (s *system) policyEvents(session string) map[string][]protocol.PolicyEvent {
	s.t.Helper()
	out := map[string][]protocol.PolicyEvent{}
	for _, m := range s.record() {
		if m.Type != protocol.TypePolicy || m.SessionID != session {
			continue
		}
		e, err := m.DecodePolicyEvent()
		if err != nil {
			s.t.Fatal(err)
		}
		out[e.Decision.Decision] = append(out[e.Decision.Decision], *e)
	}
	return out
}

// A call whose policy asks for confirmation is answered APPROVAL_REQUIRED and runs — once —
// when its requester approves it; nobody else sees the approval, approving twice is 409, and
// every step is on the record.
func TestApprovalRunsTheParkedCallOnce(t *testing.T) {
	t.Parallel()
	s := start(t, options{callers: true, workers: 1})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser, "bob": auth.RoleUser})
	s.applyPolicy("record", `{"confirm_required":true,"expires_in":"5m"}`)

	res := s.routeOne(keys["ann"], "par-r1", "par-s1", "record", `{"n":1}`)
	if res.ErrorCode != protocol.CodeApprovalRequired || res.ErrorOrigin != protocol.OriginHermes || res.Policy == nil ||
		res.Policy.Decision != protocol.PolicyParked || res.Policy.ApprovalID == "" || res.Policy.Version != 1 {
		t.Fatalf("parked: %+v %s", res, res.Content)
	}
	id := res.Policy.ApprovalID
	if n := len(s.recorder.idempotencyKeys()); n != 0 {
		t.Fatalf("the tool ran %d times before approval", n)
	}
	if code, _ := s.approval(keys["bob"], id); code != http.StatusNotFound {
		t.Fatalf("another user sees the approval: %d", code)
	}
	if code, body := s.call(http.MethodPost, "/v1/approvals/"+id+"/approve", keys["bob"], ""); code != http.StatusNotFound {
		t.Fatalf("another user approved: %d %s", code, body)
	}
	code, v := s.approval(keys["ann"], id)
	if code != http.StatusOK || v.State != "pending" || !v.CanDecide || string(v.Arguments) != `{"n":1}` {
		t.Fatalf("the requester's view: %d %+v", code, v)
	}
	code, body := s.call(http.MethodGet, "/v1/approvals?state=pending", keys["ann"], "")
	if code != http.StatusOK || !strings.Contains(body, id) {
		t.Fatalf("listing: %d %s", code, body)
	}
	if _, body := s.call(http.MethodGet, "/v1/approvals", keys["bob"], ""); strings.Contains(body, id) {
		t.Fatalf("another user lists it: %s", body)
	}
	code, body = s.call(http.MethodPost, "/v1/approvals/"+id+"/approve", keys["ann"], `{"reason":"yes, book it"}`)
	if code != http.StatusOK {
		t.Fatalf("approve: %d %s", code, body)
	}
	var approved approvalView
	_ = json.Unmarshal([]byte(body), &approved)
	if approved.RunRequestID != id {
		t.Fatalf("approved: %s", body)
	}
	waitForWithin(t, "the approved call ran", 10*time.Second, func() bool {
		code, body := s.call(http.MethodGet, "/v1/requests/"+id, keys["ann"], "")
		return code == http.StatusOK && strings.Contains(body, `"status":"success"`)
	})

	if code, body := s.call(http.MethodPost, "/v1/approvals/"+id+"/approve", keys["ann"], ""); code != http.StatusConflict || !strings.Contains(body, protocol.CodeAlreadyDecided) {
		t.Fatalf("approved twice: %d %s", code, body)
	}
	if _, v := s.approval(keys["ann"], id); v.State != "used" || v.UsedBy != id+"/c1" {
		t.Fatalf("after the run: %+v", v)
	}
	if n := len(s.recorder.idempotencyKeys()); n != 1 {
		t.Fatalf("the tool ran %d times; once", n)
	}
	ev := s.policyEvents("par-s1")
	if len(ev[protocol.PolicyParked]) != 1 || len(ev[protocol.PolicyApproved]) != 1 || ev[protocol.PolicyApproved][0].Decision.By == "" {
		t.Fatalf("events: %+v", ev)
	}
	// The run's dispatch carries the decision it ran under.
	found := false
	for _, m := range s.record() {
		if m.Type == protocol.TypeToolCall && m.RequestID == id {
			d, err := m.DecodeDispatch()
			if err != nil {
				t.Fatal(err)
			}
			found = d.Policy != nil && d.Policy.Decision == protocol.PolicyApproved && d.Policy.ApprovalID == id
		}
	}
	if !found {
		t.Fatal("the run's dispatch does not name the approval it ran under")
	}
}

// With approvers, only a caller of their roles who is not the requester decides (four eyes);
// a denial is final and recorded with its reason; an undecided approval expires, with an event,
// and cannot be approved after.
func TestApprovalsFourEyesDenialAndExpiry(t *testing.T) {
	t.Parallel()
	s := start(t, options{callers: true, workers: 1})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleAdmin, "boss": auth.RoleAdmin, "op": auth.RoleOperator})
	s.applyPolicy("record", `{"confirm_required":true,"approvers":["admin"],"expires_in":"2s"}`)
	res := s.routeOne(keys["ann"], "fe-1", "fe-s", "record", `{"n":1}`)
	id := res.Policy.ApprovalID
	if code, body := s.call(http.MethodPost, "/v1/approvals/"+id+"/approve", keys["ann"], ""); code != http.StatusForbidden {
		t.Fatalf("the requester approved its own call: %d %s", code, body)
	}
	if code, body := s.call(http.MethodPost, "/v1/approvals/"+id+"/approve", keys["op"], ""); code != http.StatusForbidden {
		t.Fatalf("a role not among the approvers approved: %d %s", code, body)
	}
	if code, body := s.call(http.MethodPost, "/v1/approvals/"+id+"/deny", keys["boss"], `{"reason":"not today"}`); code != http.StatusOK {
		t.Fatalf("deny: %d %s", code, body)
	}
	if code, body := s.call(http.MethodPost, "/v1/approvals/"+id+"/approve", keys["boss"], ""); code != http.StatusConflict {
		t.Fatalf("approved after a denial: %d %s", code, body)
	}
	if _, v := s.approval(keys["ann"], id); v.State != "denied" || v.Reason != "not today" || v.DecidedBy == "" {
		t.Fatalf("denied: %+v", v)
	}
	res = s.routeOne(keys["ann"], "fe-2", "fe-s", "record", `{"n":2}`)
	id2 := res.Policy.ApprovalID
	waitForWithin(t, "the approval expired", 15*time.Second, func() bool {
		_, v := s.approval(keys["ann"], id2)
		return v.State == "expired"
	})
	if code, body := s.call(http.MethodPost, "/v1/approvals/"+id2+"/approve", keys["boss"], ""); code != http.StatusConflict || !strings.Contains(body, protocol.CodeApprovalExpired) {
		t.Fatalf("approved after expiry: %d %s", code, body)
	}
	waitFor(t, "the expiry and the denial recorded", func() bool {
		ev := s.policyEvents("fe-s")
		return len(ev[protocol.PolicyExpired]) == 1 && len(ev[protocol.PolicyRejected]) == 1
	})
	if n := len(s.recorder.idempotencyKeys()); n != 0 {
		t.Fatalf("the tool ran %d times", n)
	}
}

// A gateway that stops between recording an approval and starting its run leaves an approved
// call no one has started: every gateway's starter starts it once its decider's grace has
// passed, and it runs once. The decision is written straight to the bucket here, as the
// stopped gateway's Decide did, with no run after it.
func TestApprovedCallRunsWhenItsDeciderStoppedBeforeRunningIt(t *testing.T) {
	t.Parallel()
	s := start(t, options{callers: true, workers: 1})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser})
	s.applyPolicy("record", `{"confirm_required":true,"expires_in":"5m"}`)
	res := s.routeOne(keys["ann"], "unstarted-r1", "unstarted-s1", "record", `{"n":1}`)
	if res.ErrorCode != protocol.CodeApprovalRequired || res.Policy == nil || res.Policy.ApprovalID == "" {
		t.Fatalf("not parked: %+v %s", res, res.Content)
	}
	id := res.Policy.ApprovalID
	kv, err := s.js.KeyValue(s.ctx, approvals.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	store := &approvals.Store{KV: kv}
	a, _, err := store.Get(s.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Decide(s.ctx, id, approvals.Decider{Caller: a.Requester}, true, "", time.Now()); err != nil {
		t.Fatal(err)
	}
	waitForWithin(t, "the approved call ran", 20*time.Second, func() bool {
		code, body := s.call(http.MethodGet, "/v1/requests/"+id, keys["ann"], "")
		return code == http.StatusOK && strings.Contains(body, `"status":"success"`)
	})
	waitFor(t, "the approval used", func() bool {
		_, v := s.approval(keys["ann"], id)
		return v.State == "used" && v.UsedBy == id+"/c1"
	})
	time.Sleep(2 * time.Second) // a second start, had there been one, would have run by now
	if n := len(s.recorder.tries(id + "/c1")); n != 1 {
		t.Errorf("the approved call ran %d times; once", n)
	}
}
