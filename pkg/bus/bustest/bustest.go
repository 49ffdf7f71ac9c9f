// Package bustest runs an embedded JetStream server, or a three-node JetStream cluster, for
// tests.
package bustest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
)

// Server is an embedded JetStream server listening on a random loopback port, with its store in
// a test temp dir. It is shut down by t.Cleanup.
type Server struct {
	*bus.Server
	// URL is the nats:// URL of the server.
	URL string
}

// NewServer starts a server for t.
func NewServer(t testing.TB) *Server {
	t.Helper()
	s, err := bus.StartServer(bus.ServerConfig{StoreDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return &Server{Server: s, URL: s.ClientURL()}
}

// Connect opens a connection to s closed by t.Cleanup.
func (s *Server) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.URL, nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Provision connects and provisions the Hermes bus with cfg.
func (s *Server) Provision(t testing.TB, cfg bus.Config) *bus.Bus {
	t.Helper()
	return provision(t, s.Connect(t), cfg)
}

// provision provisions the Hermes bus with cfg on nc.
func provision(t testing.TB, nc *nats.Conn, cfg bus.Config) *bus.Bus {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := bus.Provision(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
