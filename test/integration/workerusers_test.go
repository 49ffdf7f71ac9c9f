package integration

import (
	"testing"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// A worker user of some tools only (hermes nats-auth --worker NAME=echo) serves them end to
// end under its own permissions and inbox: the server refuses it nothing (the harness fails on
// any refusal), and the caller gets the tool's answer.
func TestAWorkerUserServesItsTools(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 0, users: []bus.User{{Name: "echo-worker", Role: bus.RoleWorker, Tools: []string{"echo"}}}})
	s.addWorkerAs("echo-worker", app.WorkerConfig{Instance: "echo-worker", Tools: []string{"echo"}})
	r := s.route(request("worker_user_1", "", call("c", "echo", map[string]any{"who": "a worker of echo"})))
	if got := result(t, r, "c"); got.Status != protocol.ResultOK {
		t.Fatalf("echo through its worker user: %+v %s", got, got.Content)
	}
}
