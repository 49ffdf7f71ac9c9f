package integration

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
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
// Under -short the parallel tests run four at once per CPU (bustest.Main), and only the smoke
// tests run, unless -run names others.
func TestMain(m *testing.M) {
	if cmd := os.Getenv("HERMES_IT_CHILD"); cmd != "" {
		args := []string{cmd}
		if a := os.Getenv("HERMES_IT_ARGS"); a != "" {
			args = append(args, strings.Split(a, "\x1f")...)
		}
		os.Exit(app.Main(args))
	}
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.run" })
	if testing.Short() && !given {
		if err := flag.Set("test.run", "^("+strings.Join(smoke, "|")+")$"); err != nil {
			panic(err)
		}
	}
	code := bustest.Main(m)
	pgtest.Close() // the audit tests' PostgreSQL, if one was started
	os.Exit(code)
}

// smoke names the tests `go test -short` runs here: one end-to-end path of each capability,
// each a few seconds, so that the daily loop over the whole module stays short. Every test of
// the package runs without -short (the README's test command, .ci/run).
var smoke = []string{
	"TestSeedRequestSucceeds",                 // a request through the gateway, router and worker
	"TestParallelCallsMatchedByID",            // results matched to their call ids
	"TestRetriesAndFailures",                  // retries, timeouts and failed calls
	"TestGatewayRejectsBadInput",              // bad input named
	"TestForgedResultsAreRefused",             // sealed results
	"TestEveryDoorAdmitsAlike",                // one admission path
	"TestApprovalRunsTheParkedCallOnce",       // policies and approvals
	"TestSeedBlueprintRunsBothBranches",       // blueprints
	"TestChangesOfOneResourceNeverInterleave", // state-change coordination
	"TestMemoryIsEachOwnersOwn",               // memory
	"TestExternalClientsPublishJSON",          // the bus as a public API
	"TestClientsCallTheMicroService",          // NATS micro
	"TestFastLaneAnswersReadsAndRecordsThem",  // the fast lane
	"TestHermesChat",                          // the LLM loop
	"TestOllamaFrontDoor",                     // another front door
	"TestHermesIsAnMCPServer",                 // MCP
	"TestGRPCToolsThroughHermes",              // gRPC tools
	"TestComposeCommandsParse",                // docker-compose.yml matches the binaries' flags
	"TestWorkerKilledMidCall",                 // a crash: the call runs again, answered once
	"TestSmokeNamesTests",                     // and each of these names a test
}

// A name in smoke that names no test (one renamed, say), or a test that skips itself under
// -short (long, variant), would leave -short without it, unsaid.
func TestSmokeNamesTests(t *testing.T) {
	files, err := filepath.Glob("*_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("the package's test files: %v", err)
	}
	tests := map[string]*ast.FuncDecl{}
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Test") {
				tests[fn.Name.Name] = fn
			}
		}
	}
	for _, name := range smoke {
		fn := tests[name]
		if fn == nil {
			t.Errorf("smoke names %s, which is no test of this package", name)
			continue
		}
		for _, st := range fn.Body.List {
			if call, ok := st.(*ast.ExprStmt); ok {
				if c, ok := call.X.(*ast.CallExpr); ok {
					if id, ok := c.Fun.(*ast.Ident); ok && (id.Name == "long" || id.Name == "variant") {
						t.Errorf("smoke names %s, which %s skips under -short", name, id.Name)
					}
				}
			}
		}
	}
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
