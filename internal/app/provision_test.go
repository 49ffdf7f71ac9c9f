package app

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

func TestProvisionChangesThePartitions(t *testing.T) {
	srv := bustest.NewServer(t)
	provision := func(args ...string) (string, error) {
		t.Helper()
		var out, errOut bytes.Buffer
		err := RunProvision(t.Context(), append([]string{"--nats", srv.URL}, args...), Env{Stdout: &out, Stderr: &errOut})
		return out.String() + errOut.String(), err
	}
	if out, err := provision("--partitions", "5"); err != nil || !strings.Contains(out, "partitions   5") {
		t.Fatalf("provision --partitions 5: %v\n%s", err, out)
	}
	if out, err := provision("--partitions", "9"); err != nil || !strings.Contains(out, "partitions   9 (were 5)") {
		t.Fatalf("provision --partitions 9: %v\n%s", err, out)
	}
	// Without the flag, the record keeps what it has.
	if out, err := provision(); err != nil || !strings.Contains(out, "partitions   9:") {
		t.Fatalf("provision: %v\n%s", err, out)
	}
	// A request waiting to be routed: the change is refused, and nothing changes.
	nc, err := nats.Connect(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.Publish(context.Background(), protocol.SubjectRequest("s_waiting"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	if out, err := provision("--partitions", "3"); err == nil || !strings.Contains(err.Error(), "not yet routed") {
		t.Fatalf("provision --partitions 3 with a request waiting: %v\n%s", err, out)
	}
	if out, err := provision(); err != nil || !strings.Contains(out, "partitions   9:") {
		t.Fatalf("after a refused change: %v\n%s", err, out)
	}
}
