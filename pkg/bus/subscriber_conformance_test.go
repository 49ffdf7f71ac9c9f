package bus_test

import (
	"testing"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
)

// TestSubscriberConformance runs bustest's subscriber suite on an embedded server: each promise
// of Subscriber's documentation against real JetStream.
func TestSubscriberConformance(t *testing.T) {
	bustest.TestSubscriber(t, bustest.SubscriberSetup{})
}

// TestSubscriberConformanceOnACluster runs the suite on a three-node cluster, with the stream
// and consumers replicated on every node.
func TestSubscriberConformanceOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a cluster test: skipped under -short")
	}
	c := bustest.NewCluster(t)
	bustest.TestSubscriber(t, bustest.SubscriberSetup{Connect: c.Connect, Config: bus.Config{Replicas: bustest.ClusterSize}})
}
