package integration

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// A call parked for approval survives the loss of everything: every Hermes process — router,
// tool worker, gateway, each a child process — is SIGKILLed and the NATS server is SIGKILLed
// and started again on its store. Once the services are back, the approval is still pending;
// approving it runs the call exactly once (the recorder counts tries by Idempotency-Key
// "<approval id>/<call id>"), the original request never runs it, and approving again — after
// everything is lost once more — is 409.
func TestParkedApprovalSurvivesRestarts(t *testing.T) {
	long(t, "every process and the NATS server killed under a parked approval")
	nats := startNATS(t, "interval")
	// Consumers' acks the killed server had not yet written are delivered again after
	// AckWait, and a session's requests wait behind them: a short one keeps the test short.
	s := start(t, options{natsURL: nats.URL(), routers: -1, workers: 0, bus: bus.Config{AckWait: 2 * time.Second}})
	s.gwStop() // the gateway runs as a child process, to be killed with the rest
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser})
	s.applyPolicy("record", `{"confirm_required":true,"expires_in":"10m"}`)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s.base = "http://" + addr
	// services starts generation gen of the router, the tool worker and the gateway.
	services := func(gen int) []*child {
		t.Helper()
		out := []*child{
			s.spawn("router", fmt.Sprintf("router-%d", gen), "--routes", "testdata/routes.yaml"),
			s.spawn("toolworker", fmt.Sprintf("worker-%d", gen), append(s.workerArgs(), "--tools", "record")...),
			s.spawn("gateway", fmt.Sprintf("gateway-%d", gen), "--http", addr),
		}
		s.waitReady()
		return out
	}

	procs := services(1)
	res := s.routeOne(keys["ann"], "rs-apr-1", "rs-apr-s", "record", `{"n":1}`)
	if res.ErrorCode != protocol.CodeApprovalRequired || res.Policy == nil || res.Policy.ApprovalID == "" {
		t.Fatalf("not parked: %+v %s", res, res.Content)
	}
	id := res.Policy.ApprovalID

	// killAll SIGKILLs every Hermes process and the NATS server, and starts them again.
	killAll := func(gen int) {
		t.Helper()
		for _, p := range procs {
			p.kill()
		}
		nats.kill()
		nats.start()
		procs = services(gen)
	}
	killAll(2)

	code, v := s.approval(keys["ann"], id)
	if code != http.StatusOK || v.State != "pending" || !v.CanDecide || string(v.Arguments) != `{"n":1}` {
		t.Fatalf("after the restarts: %d %+v", code, v)
	}
	if n := len(s.recorder.idempotencyKeys()); n != 0 {
		t.Fatalf("the tool ran %d times before approval", n)
	}
	code, body := s.call(http.MethodPost, "/v1/approvals/"+id+"/approve", keys["ann"], "")
	if code != http.StatusOK {
		t.Fatalf("approve: %d %s", code, body)
	}
	waitForWithin(t, "the approved call ran", 20*time.Second, func() bool {
		code, body := s.call(http.MethodGet, "/v1/requests/"+id, keys["ann"], "")
		return code == http.StatusOK && strings.Contains(body, `"status":"success"`)
	})
	waitFor(t, "the approval used", func() bool {
		_, v := s.approval(keys["ann"], id)
		return v.State == "used" && v.UsedBy == id+"/c1"
	})
	// Used is as durable as pending was: nothing runs it again after another loss of everything.
	killAll(3)
	if code, body := s.call(http.MethodPost, "/v1/approvals/"+id+"/approve", keys["ann"], ""); code != http.StatusConflict || !strings.Contains(body, protocol.CodeAlreadyDecided) {
		t.Fatalf("approved twice: %d %s", code, body)
	}
	if n := len(s.recorder.tries(id + "/c1")); n != 1 {
		t.Errorf("the approved call ran %d times; once", n)
	}
	if keys := s.recorder.idempotencyKeys(); len(keys) != 1 {
		t.Errorf("the tool ran under %v; once, under %s/c1", keys, id)
	}
}
