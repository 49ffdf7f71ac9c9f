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
	t.Parallel()
	srv := bustest.NewServer(t)
	provision := func(args ...string) (string, error) { return runProvision(t, srv, args...) }
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

func TestProvisionChangesTheStreams(t *testing.T) {
	t.Parallel()
	srv := bustest.NewServer(t)
	provision := func(args ...string) (string, error) { return runProvision(t, srv, args...) }
	if out, err := provision("--partitions", "16"); err != nil || !strings.Contains(out, "stream HERMES,") {
		t.Fatalf("provision: %v\n%s", err, out)
	}
	// 16 partitions do not divide among 3 streams: they change first, to 12.
	out, err := provision("--streams", "3", "--partitions", "12")
	if err != nil || !strings.Contains(out, "3 streams HERMES to HERMES_2") || !strings.Contains(out, "now kept in 3 streams (was 1)") ||
		!strings.Contains(out, "partitions   12 (were 16)") || strings.Contains(out, "configured with") {
		t.Fatalf("provision --streams 3 --partitions 12: %v\n%s", err, out)
	}
	// Without --partitions, a number that does not divide among the streams becomes the
	// default for them.
	if out, err := provision("--streams", "5"); err != nil || !strings.Contains(out, "do not divide among 5 streams") || !strings.Contains(out, "5 streams HERMES to HERMES_4") {
		t.Fatalf("provision --streams 5: %v\n%s", err, out)
	}
	// Back to one, with other partitions: after the streams, where they would not fit before.
	out, err = provision("--streams", "1", "--partitions", "7")
	if err != nil || !strings.Contains(out, "stream HERMES,") || !strings.Contains(out, "partitions   7 (were ") {
		t.Fatalf("provision --streams 1 --partitions 7: %v\n%s", err, out)
	}
}

// runProvision runs hermes provision against srv with args, and returns what it printed.
func runProvision(t *testing.T, srv *bustest.Server, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := RunProvision(t.Context(), append([]string{"--nats", srv.URL}, args...), Env{Stdout: &out, Stderr: &errOut})
	return out.String() + errOut.String(), err
}
