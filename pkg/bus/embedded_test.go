package bus_test

import (
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/bus"
)

// TestStartServerClusterConfig: a cluster node is refused, before anything starts, without
// what a JetStream cluster needs.
func TestStartServerClusterConfig(t *testing.T) {
	ok := bus.ClusterConfig{Name: "c", Listen: "127.0.0.1:0", Routes: []string{"nats-route://127.0.0.1:6222"}}
	for name, tc := range map[string]struct {
		node    string
		cluster bus.ClusterConfig
		want    string
	}{
		"no node name":    {"", ok, "name of its own"},
		"no cluster name": {"n1", bus.ClusterConfig{Listen: ok.Listen, Routes: ok.Routes}, "cluster name"},
		"no listen":       {"n1", bus.ClusterConfig{Name: "c", Routes: ok.Routes}, "route listen address"},
		"no routes":       {"n1", bus.ClusterConfig{Name: "c", Listen: ok.Listen}, "routes"},
		"bad listen":      {"n1", bus.ClusterConfig{Name: "c", Listen: "nowhere", Routes: ok.Routes}, "listen address"},
		"bad route":       {"n1", bus.ClusterConfig{Name: "c", Listen: ok.Listen, Routes: []string{"127.0.0.1:6222"}}, "nats-route://"},
	} {
		t.Run(name, func(t *testing.T) {
			c := tc.cluster
			s, err := bus.StartServer(bus.ServerConfig{Name: tc.node, StoreDir: t.TempDir(), Cluster: &c})
			if err == nil {
				s.Close()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}
