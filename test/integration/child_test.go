package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/audit/pgtest"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
)

// The test binary doubles as the hermes binary: with HERMES_IT_CHILD set it runs that command
// (args in HERMES_IT_ARGS, separated by \x1f) instead of the tests. Crash tests kill such
// children with SIGKILL: a real crash, nothing flushed, no deferred cleanup.
// Under -short the parallel tests run four at once per CPU (bustest.Main).
func TestMain(m *testing.M) {
	if cmd := os.Getenv("HERMES_IT_CHILD"); cmd != "" {
		args := []string{cmd}
		if a := os.Getenv("HERMES_IT_ARGS"); a != "" {
			args = append(args, strings.Split(a, "\x1f")...)
		}
		os.Exit(app.Main(args))
	}
	code := bustest.Main(m)
	pgtest.Close() // the audit tests' PostgreSQL, if one was started
	os.Exit(code)
}

// child is a Hermes process started by a test.
type child struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// spawn starts `hermes <command> --nats <server> --instance <name> args...` as a child process.
func (s *system) spawn(command, name string, args ...string) *child {
	s.t.Helper()
	all := append([]string{"--nats", s.srv.URL, "--instance", name, "--log-level", "debug"}, args...)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "HERMES_IT_CHILD="+command, "HERMES_IT_ARGS="+strings.Join(all, "\x1f"))
	c := &child{t: s.t, name: name, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(c.done) }()
	s.t.Cleanup(func() {
		c.kill()
		if s.t.Failed() {
			s.t.Logf("output of %s:\n%s", name, c.out.String())
		}
	})
	return c
}

// workerArgs are the flags a child tool worker needs to reach the system's tools.
func (s *system) workerArgs() []string {
	var pairs []string
	for from, to := range s.resolve {
		pairs = append(pairs, from+"="+to)
	}
	return []string{"--resolve", strings.Join(pairs, ",")}
}

// kill sends SIGKILL and waits for the process to be gone.
func (c *child) kill() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

func (c *child) String() string { return fmt.Sprintf("%s (pid %d)", c.name, c.cmd.Process.Pid) }
