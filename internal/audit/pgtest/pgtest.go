// Package pgtest starts a real PostgreSQL server for tests: Debian's package, in a temporary
// directory, on a loopback port, as the user postgres when the tests run as root (initdb
// refuses root). Without PostgreSQL installed a test using it is skipped, or fails when the
// environment variable CI is "true" (.ci/run installs it).
package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is a PostgreSQL server of a test binary. Stop and Start restart it on the same data
// and port (a database restart under load); Database makes an empty database per test.
type Server struct {
	bin, dir, sock string
	port           int
	runAs          string // the user the server runs as; "" for the tests' own

	mu      sync.Mutex
	running bool
	made    int
}

// bins are where Debian's PostgreSQL keeps its programs, newest first.
func bins() string {
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	best, bestVer := "", -1
	for _, m := range matches {
		v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(m))))
		if v > bestVer {
			best, bestVer = filepath.Dir(m), v
		}
	}
	return best
}

var (
	shared     *Server
	sharedErr  error
	sharedOnce sync.Once
)

// Shared returns the server of this test binary, started on first use (Close stops it: call
// it from TestMain). Without PostgreSQL it skips t, or fails it when CI is "true".
func Shared(t testing.TB) *Server {
	t.Helper()
	sharedOnce.Do(func() { shared, sharedErr = New() })
	if sharedErr != nil {
		Unavailable(t, sharedErr)
	}
	return shared
}

// Unavailable skips t because PostgreSQL could not be started (err), or fails it under CI.
func Unavailable(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("PostgreSQL is needed (CI=true): %v", err)
	}
	t.Skipf("PostgreSQL is not available (install Debian's postgresql to run this test): %v", err)
}

// Close stops the shared server, if one was started.
func Close() {
	if shared != nil {
		shared.Close()
	}
}

// New initializes a data directory and starts a server on a free loopback port.
func New() (*Server, error) {
	bin := bins()
	if bin == "" {
		return nil, fmt.Errorf("no /usr/lib/postgresql/*/bin/initdb")
	}
	dir, err := os.MkdirTemp("", "hermes-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir, sock: dir}
	if os.Geteuid() == 0 {
		s.runAs = "postgres"
		u, err := user.Lookup(s.runAs)
		if err != nil {
			return nil, fmt.Errorf("running as root, PostgreSQL needs the user postgres: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
	}
	if s.port, err = freePort(); err != nil {
		return nil, err
	}
	if out, err := s.run("initdb", "-D", s.data(), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"); err != nil {
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	if err := s.Start(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

// run runs one of PostgreSQL's programs, as the server's user.
func (s *Server) run(prog string, args ...string) ([]byte, error) {
	path := filepath.Join(s.bin, prog)
	var cmd *exec.Cmd
	if s.runAs != "" {
		cmd = exec.Command("runuser", append([]string{"-u", s.runAs, "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Dir = s.dir
	return cmd.CombinedOutput()
}

// Start starts the server (again), and waits until it takes connections.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running {
		return nil
	}
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=off -c full_page_writes=off -c max_connections=200", s.port, s.sock)
	if out, err := s.run("pg_ctl", "-D", s.data(), "-o", opts, "-l", filepath.Join(s.dir, "pg.log"), "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "pg.log"))
		return fmt.Errorf("pg_ctl start: %v: %s\n%s", err, out, log)
	}
	s.running = true
	return nil
}

// Stop stops the server at once (fast shutdown: open connections are cut).
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running {
		return nil
	}
	if out, err := s.run("pg_ctl", "-D", s.data(), "-m", "fast", "-w", "-t", "60", "stop"); err != nil {
		return fmt.Errorf("pg_ctl stop: %v: %s", err, out)
	}
	s.running = false
	return nil
}

// Close stops the server and removes its data.
func (s *Server) Close() {
	_ = s.Stop()
	_ = os.RemoveAll(s.dir)
}

// DSN is the connection string of database db.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// Port is the server's port.
func (s *Server) Port() int { return s.port }

// Database makes an empty database for t and returns its DSN; it is dropped when t ends.
func (s *Server) Database(t testing.TB) string {
	t.Helper()
	s.mu.Lock()
	s.made++
	name := fmt.Sprintf("t%d_%s", s.made, strings.ToLower(strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, t.Name())))
	s.mu.Unlock()
	if len(name) > 60 {
		name = name[:60]
	}
	admin := func(sql string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, s.DSN("postgres"))
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := admin("CREATE DATABASE " + name); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() { _ = admin("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)") })
	return s.DSN(name)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
