// Package bustest runs an embedded JetStream server, or a three-node JetStream cluster, for
// tests.
package bustest

import (
	"context"
	"crypto/rand"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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
	// URL is the nats:// URL of the server; a locked server's names its admin user and
	// password.
	URL string
	// Plain is the URL without credentials.
	Plain string
	// users of a locked server, by name, with their seeds.
	users   map[string]lockedUser
	log     *violations
	buckets []bus.Bucket
}

// lockedUser is a user of a locked server and its nkey seed.
type lockedUser struct {
	bus.User
	seed []byte
}

// NewServer starts a server for t.
func NewServer(t testing.TB) *Server {
	t.Helper()
	s, err := bus.StartServer(bus.ServerConfig{StoreDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return &Server{Server: s, URL: s.ClientURL(), Plain: s.ClientURL()}
}

// NewLockedServer starts a server for t that lets in only one user per role (bus.Roles, each
// named for its role: the client role's user is "client"), and the users of extra (named and
// with their roles and tools; their nkeys are made here), each with its permissions
// (bus.User.Access), and notes every permission the server refuses (Violations). Connect
// connects as admin; As(role) and AsUser(name) name the user to connect as.
func NewLockedServer(t testing.TB, extra ...bus.User) *Server {
	t.Helper()
	return NewLocked(t, Locked{Users: extra})
}

// Locked says what NewLocked lets in.
type Locked struct {
	// Users are let in beside one per role (NewLockedServer's extra).
	Users []bus.User
	// Buckets are the application's buckets, whose rights the users' permissions include
	// (bus.ServerConfig.Buckets); Provision provisions them.
	Buckets []bus.Bucket
}

// NewLocked starts a locked server for t, as NewLockedServer does, with l's users and the
// rights l's buckets give.
func NewLocked(t testing.TB, l Locked) *Server {
	t.Helper()
	extra := l.Users
	s := &Server{users: map[string]lockedUser{}, log: &violations{}, buckets: l.Buckets}
	var users, wanted []bus.User
	for _, r := range bus.Roles {
		if r != bus.RoleAdmin { // admin has a password, in URL
			wanted = append(wanted, bus.User{Name: string(r), Role: r})
		}
	}
	for _, want := range append(wanted, extra...) {
		u, seed, err := bus.NewUser(want.Name, want.Role)
		if err != nil {
			t.Fatal(err)
		}
		u.Tools = want.Tools
		if _, dup := s.users[u.Name]; dup {
			t.Fatalf("two users named %s", u.Name)
		}
		users, s.users[u.Name] = append(users, u), lockedUser{u, seed}
	}
	pw := rand.Text()
	srv, err := bus.StartServer(bus.ServerConfig{StoreDir: t.TempDir(), Listen: "127.0.0.1:0", Users: users,
		Passwords: []bus.PasswordUser{{Name: "admin", Password: pw, Role: bus.RoleAdmin}}, Buckets: l.Buckets, Logger: slog.New(s.log)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	s.Server, s.Plain = srv, srv.ClientURL()
	s.URL = strings.Replace(s.Plain, "nats://", "nats://admin:"+pw+"@", 1)
	return s
}

// As returns the options that connect to Plain as role's user of a locked server, with the
// inbox prefix its permissions name (none for a server that is not locked).
func (s *Server) As(t testing.TB, role bus.Role) []nats.Option {
	t.Helper()
	return s.AsUser(t, string(role))
}

// AsUser returns the options that connect to Plain as the user named name of a locked server,
// with the inbox prefix its permissions name (none for a server that is not locked, or that
// has no such user).
func (s *Server) AsUser(t testing.TB, name string) []nats.Option {
	t.Helper()
	u, ok := s.users[name]
	if !ok {
		return nil
	}
	o, err := bus.SeedOption(u.seed)
	if err != nil {
		t.Fatal(err)
	}
	a, err := u.Access(s.buckets...)
	if err != nil {
		t.Fatal(err)
	}
	return []nats.Option{o, nats.CustomInboxPrefix(a.Inbox)}
}

// ConnectAs opens a connection to Plain as role's user of a locked server, closed by
// t.Cleanup. The server's refusals are not printed: tests that try what a user may not do
// expect them (Violations lists them).
func (s *Server) ConnectAs(t testing.TB, role bus.Role) *nats.Conn {
	t.Helper()
	return s.ConnectAsUser(t, string(role))
}

// ConnectAsUser is ConnectAs for the user named name.
func (s *Server) ConnectAsUser(t testing.TB, name string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.Plain, append(s.AsUser(t, name), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Violations returns what a locked server refused so far: every publish or subscription a
// user's permissions did not allow.
func (s *Server) Violations() []string {
	if s.log == nil {
		return nil
	}
	return s.log.list()
}

// RefusedSince waits a moment (2 s at most) for the server to report refusing subject among the
// violations after the first before (len(Violations()) taken before trying it).
func (s *Server) RefusedSince(before int, subject string) bool {
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		for _, v := range s.Violations()[before:] {
			if strings.Contains(v, `"`+subject+`"`) {
				return true
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// violations is a log handler keeping the server's permission violations.
type violations struct {
	mu  sync.Mutex
	got []string
}

func (v *violations) Enabled(context.Context, slog.Level) bool { return true }
func (v *violations) WithAttrs([]slog.Attr) slog.Handler       { return v }
func (v *violations) WithGroup(string) slog.Handler            { return v }
func (v *violations) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "Violation") {
		v.mu.Lock()
		v.got = append(v.got, r.Message)
		v.mu.Unlock()
	}
	return nil
}

func (v *violations) list() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.got)
}

// Connect opens a connection to s (URL: as admin on a locked server) closed by t.Cleanup.
func (s *Server) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.URL, nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Provision connects and provisions the Hermes bus with cfg (with the buckets the server was
// started with when cfg names none).
func (s *Server) Provision(t testing.TB, cfg bus.Config) *bus.Bus {
	t.Helper()
	if cfg.Buckets == nil {
		cfg.Buckets = s.buckets
	}
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

// SeedFile writes role's nkey seed to a file of its own (mode 0600) and returns its path,
// for programs given a seed file (--nats-nkey); "" for a server that is not locked.
func (s *Server) SeedFile(t testing.TB, role bus.Role) string {
	t.Helper()
	u, ok := s.users[string(role)]
	if !ok {
		return ""
	}
	path := filepath.Join(t.TempDir(), string(role)+".nk")
	if err := os.WriteFile(path, u.seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
