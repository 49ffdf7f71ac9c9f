package bus_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// TestStartServerClusterConfig: a cluster node is refused, before anything starts, without
// what a JetStream cluster needs.
func TestStartServerClusterConfig(t *testing.T) {
	t.Parallel()
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

// A server whose file store cannot hold Hermes' byte limits refuses to provision, and the error
// says what to raise or lower.
func TestProvisionExplainsAStoreTooSmall(t *testing.T) {
	t.Parallel()
	s, err := bus.StartServer(bus.ServerConfig{StoreDir: t.TempDir(), MaxFileStore: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	nc, err := nats.Connect("", s.ConnectOption())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	_, err = bus.Provision(t.Context(), js, bus.Config{})
	if err == nil || !strings.Contains(err.Error(), "max_file_store") || !strings.Contains(err.Error(), "--record-max-bytes") {
		t.Fatalf("provisioning 12 GiB of limits on a 1 GiB store: %v", err)
	}
	// Within it, it does.
	if _, err := bus.Provision(t.Context(), js, bus.Config{MaxBytes: 64 << 20, DeadLetterMaxBytes: 16 << 20, StateMaxBytes: 16 << 20, ParkedMaxBytes: 64 << 20}); err != nil {
		t.Fatalf("limits that fit: %v", err)
	}
}

// A store made before the services had users (their streams in the global account) is read
// back when the embedded server starts with users (the services in Hermes' account): nothing
// provisioned before is lost from sight, nothing is provisioned anew beside it.
func TestAStoreFromBeforeUsersIsKept(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	open, err := bus.StartServer(bus.ServerConfig{StoreDir: dir, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(open.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := bus.Provision(ctx, js, bus.Config{Buckets: appBuckets})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Bucket(appKeys).Put(ctx, "k1", []byte("an API key record")); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	open.Close()

	admin, seed, err := bus.NewUser("admin", bus.RoleAdmin)
	if err != nil {
		t.Fatal(err)
	}
	locked, err := bus.StartServer(bus.ServerConfig{StoreDir: dir, Listen: "127.0.0.1:0", Users: []bus.User{admin}})
	if err != nil {
		t.Fatal(err)
	}
	defer locked.Close()
	o, _ := bus.SeedOption(seed)
	nc, err = nats.Connect(locked.ClientURL(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ = jetstream.New(nc)
	b, err = bus.Provision(ctx, js, bus.Config{OpenOnly: true, Buckets: appBuckets})
	if err != nil {
		t.Fatalf("the bus provisioned before users is not there: %v", err)
	}
	if e, err := b.Bucket(appKeys).Get(ctx, "k1"); err != nil || string(e.Value()) != "an API key record" {
		t.Fatalf("the key made before users: %v", err)
	}
}

// Provisioning a record that took external clients' requests itself (as Hermes did for a
// while) hands their subjects to the clients' stream; and a gateway that started before that
// stream existed finds its consumer once it does.
func TestTheClientsStreamComesLater(t *testing.T) {
	t.Parallel()
	s := bustest.NewServer(t)
	b := s.Provision(t, bus.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.JS.DeleteStream(ctx, protocol.ClientStreamName); err != nil {
		t.Fatal(err)
	}
	cfg := b.Stream.CachedInfo().Config
	cfg.Subjects = append(cfg.Subjects, protocol.FilterClientRequests)
	if _, err := b.JS.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(s.Connect(t))
	gw, err := bus.Provision(ctx, js, bus.Config{OpenOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gw.ClientConsumer(ctx); err == nil {
		t.Fatal("the consumer of clients' requests found before it was made")
	}
	if _, err := bus.Provision(ctx, js, bus.Config{}); err != nil {
		t.Fatalf("hermes provision on a record holding the clients' subjects: %v", err)
	}
	if _, err := gw.ClientConsumer(ctx); err != nil {
		t.Fatalf("a gateway started before the clients' stream existed does not find it: %v", err)
	}
}
