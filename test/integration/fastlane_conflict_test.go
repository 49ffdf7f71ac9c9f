package integration

import (
	"context"
	"net/http"
	"testing"

	"github.com/hermesbus/hermes/internal/approvals"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// TestFastLaneConflictLeavesNothingBehind: a request refused 409 on the fast lane (its
// request_id is in use) leaves nothing behind: no approval opened, no call run.
func TestFastLaneConflictLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	s := start(t, options{callers: true, workers: 1})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser, "mal": auth.RoleUser})
	if r := s.routeOne(keys["ann"], "fl2-ap", "fl2-ann", "read_echo", `{"who":"ann"}`); r.Status != "ok" {
		t.Fatalf("ann: %+v", r)
	}
	s.applyPolicy("read_record", `{"confirm_required":true,"expires_in":"5m"}`)
	code, body := s.call(http.MethodPost, "/v1/route?wait=5s", keys["mal"],
		`{"request_id":"fl2-ap","session_id":"fl2-mal","intent":"test","tool_calls":[{"tool_call_id":"c1","name":"read_record","arguments":{"who":"mallory"}}]}`)
	t.Logf("mallory, request_id in use: HTTP %d %s", code, body)
	if code != http.StatusConflict {
		t.Fatalf("want 409")
	}
	id := approvals.ID("fl2-ap", "c1")
	c, v := s.approval(keys["mal"], id)
	t.Logf("approval %s after the 409: HTTP %d %+v", id, c, v)
	if c == http.StatusOK {
		t.Errorf("a request refused 409 opened approval %s (state %s, args %s)", id, v.State, v.Arguments)
	}
	if n := len(s.recorder.tries("fl2-ap/c1")); n != 0 {
		t.Errorf("the call of a request refused 409 ran %d times", n)
	}
	for d, evs := range s.policyEvents("fl2-mal") {
		t.Errorf("the refused request left policy events on its session: %s × %d", d, len(evs))
	}
}

// TestFastLaneConflictCannotTakeAnApproval: a request refused 409 on the fast lane cannot take
// the approval of the request that owns the id: the owner's approval holds its own arguments.
func TestFastLaneConflictCannotTakeAnApproval(t *testing.T) {
	t.Parallel()
	s := start(t, options{callers: true, workers: 1})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser, "mal": auth.RoleUser})
	s.applyPolicy("read_record", `{"confirm_required":true,"expires_in":"5m"}`)
	post := func(key, body string) <-chan string {
		ch := make(chan string, 1)
		go func() {
			c, b := s.call(http.MethodPost, "/v1/route?wait=15s", key, body)
			ch <- http.StatusText(c) + " " + b
		}()
		return ch
	}
	_, b := s.connect()
	accepted := func(id string) {
		waitFor(t, id+" accepted", func() bool {
			_, err := b.Plan(context.Background(), id)
			return err == nil
		})
	}
	p := post(keys["ann"], `{"request_id":"fl2-p","session_id":"fl2-anns","serial":true,"intent":"t","tool_calls":[{"tool_call_id":"c0","name":"echo","arguments":{"delay_ms":2500}}]}`)
	accepted("fl2-p")
	r := post(keys["ann"], `{"request_id":"fl2-victim","session_id":"fl2-anns","serial":true,"intent":"t","tool_calls":[{"tool_call_id":"c1","name":"read_record","arguments":{"who":"ann"}}]}`)
	accepted("fl2-victim")
	code, body := s.call(http.MethodPost, "/v1/route?wait=5s", keys["mal"],
		`{"request_id":"fl2-victim","session_id":"fl2-mals","intent":"t","tool_calls":[{"tool_call_id":"c1","name":"read_record","arguments":{"who":"mallory"}}]}`)
	t.Logf("mallory: %d %s", code, body)
	t.Logf("ann P: %s", <-p)
	t.Logf("ann R: %s", <-r)
	id := approvals.ID("fl2-victim", "c1")
	c, v := s.approval(keys["ann"], id)
	t.Logf("ann sees approval %s: HTTP %d state=%s args=%s can_decide=%v", id, c, v.State, v.Arguments, v.CanDecide)
	c, v = s.approval(keys["mal"], id)
	t.Logf("mallory sees approval %s: HTTP %d state=%s args=%s can_decide=%v", id, c, v.State, v.Arguments, v.CanDecide)
	if string(v.Arguments) == `{"who":"mallory"}` {
		t.Errorf("ann's call waits on an approval holding mallory's arguments, which mallory may decide")
	}
}

// TestFastLaneRetryWhileItRuns: the same request sent again while the fast lane runs it (a
// client's retry) waits for the first run: recorded once, its call run once.
func TestFastLaneRetryWhileItRuns(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 2})
	s.waitFastLane()
	req := request("fl2_dup", "", call("c", "read_record", map[string]any{"who": "alice", "delay_ms": 700}))
	a1 := s.postAsync(req, "?timeout=10s")
	waitFor(t, "the first try", func() bool { return len(s.recorder.tries("fl2_dup/c")) == 1 })
	a2 := s.postAsync(req, "?timeout=10s")
	r1, r2 := <-a1, <-a2
	t.Logf("first: %d %s", r1.status, r1.body)
	t.Logf("retry: %d %s", r2.status, r2.body)
	s.recordedOf("fl2_dup")
	s.waitWritten()
	rec := s.recordOf("fl2_dup")
	for typ, subj := range rec {
		t.Logf("record: %s %v", typ, subj)
	}
	t.Logf("tool tries: %d", len(s.recorder.tries("fl2_dup/c")))
	if n := len(rec[protocol.TypeRequest]); n != 1 {
		t.Errorf("the request is recorded %d times", n)
	}
	if n := len(s.recorder.tries("fl2_dup/c")); n != 1 {
		t.Errorf("the call ran %d times", n)
	}
}

// TestFastLaneCallerWaitShorterThanTheRead: a caller's wait shorter than the read: the gateway
// hears the router out, and the request runs and is recorded once.
func TestFastLaneCallerWaitShorterThanTheRead(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 2})
	s.waitFastLane()
	req := request("fl2_short", "", call("c", "read_record", map[string]any{"who": "alice", "delay_ms": 700}))
	status, _, body := s.post(req, "?timeout=400ms")
	t.Logf("caller: %d %s", status, body)
	s.recordedOf("fl2_short")
	s.waitWritten()
	rec := s.recordOf("fl2_short")
	for typ, subj := range rec {
		t.Logf("record: %s %v", typ, subj)
	}
	a, d := s.fastCounts()
	t.Logf("fast lane answered %d declined %d; tool tries: %d", a, d, len(s.recorder.tries("fl2_short/c")))
	if n := len(rec[protocol.TypeRequest]); n != 1 {
		t.Errorf("the request is recorded %d times", n)
	}
	if n := len(s.recorder.tries("fl2_short/c")); n != 1 {
		t.Errorf("the call ran %d times", n)
	}
}
