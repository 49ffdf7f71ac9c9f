package bustest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// TestCluster: a bucket replicated on three nodes keeps taking writes when the record stream's
// leader stops, and the stopped node comes back on the same port with its store and catches
// up. (test/integration runs Hermes through the same faults, and through a lost quorum.)
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a cluster test: skipped under -short")
	}
	c := bustest.NewCluster(t)
	b := c.Provision(t, bus.Config{Replicas: bustest.ClusterSize})
	ctx := context.Background()
	put := func(key string) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := b.Calls.Create(ctx, key, []byte("x"))
		return err
	}
	if err := put("before"); err != nil {
		t.Fatal(err)
	}
	leader := c.WaitStreamLeader(protocol.StreamName)
	c.Stop(leader)
	if leader.Running() || c.StreamLeader(protocol.StreamName) == leader {
		t.Fatalf("%s still leads after Stop", leader)
	}
	if l := c.WaitStreamLeader(protocol.StreamName); l == leader {
		t.Fatalf("stream leader %s was stopped", l)
	}
	// The bucket's own stream may have lost its leader too: writes resume once it has a new one.
	deadline := time.Now().Add(30 * time.Second)
	// (A write that timed out may have been applied: then the retry finds the key.)
	for err := put("during"); err != nil && !errors.Is(err, jetstream.ErrKeyExists); err = put("during") {
		if time.Now().After(deadline) {
			t.Fatalf("no write accepted with %s stopped: %v", leader, err)
		}
	}
	c.Restart(leader)
	c.WaitHealthy()
	if s := leader.Server(); s == nil || s.ClientURL() != leader.URL() {
		t.Fatalf("%s did not restart on %s", leader, leader.URL())
	}
	if c.WaitMetaLeader() == nil {
		t.Fatal("no meta leader")
	}
	if err := put("after"); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"before", "during", "after"} {
		if _, err := b.Calls.Get(ctx, key); err != nil {
			t.Errorf("%s: %v", key, err)
		}
	}
}
