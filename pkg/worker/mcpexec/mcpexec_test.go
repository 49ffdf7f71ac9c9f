package mcpexec_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
	"github.com/hermesbus/hermes/pkg/worker/mcpexec"
)

// everything is the path of @modelcontextprotocol/server-everything as test/mcp's npm ci
// installs it; the test is skipped without it (failed under CI=true).
func everything(t *testing.T) string {
	t.Helper()
	path, err := filepath.Abs("../../../test/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no MCP test servers: run npm ci --prefix test/mcp (%v)", err)
		}
		t.Skip("no MCP test servers (npm ci --prefix test/mcp)")
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("no node")
	}
	return path
}

func start(t *testing.T, srv mcpexec.Server, onTools func(string, []mcpexec.Tool)) *mcpexec.Executor {
	t.Helper()
	e, err := mcpexec.New(mcpexec.Config{Servers: []mcpexec.Server{srv}, OnTools: onTools})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(30 * time.Second)
	for !e.Has(srv.Name + "__echo") {
		if time.Now().After(deadline) {
			t.Fatalf("the server never served echo: %+v", e.States())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return e
}

func call(server, tool string, args string) *worker.Call {
	return &worker.Call{RequestID: "r", Attempt: 1, MaxAttempts: 1, Timeout: 20 * time.Second, MaxResultBytes: 1 << 20,
		Dispatch: &protocol.Dispatch{Call: protocol.ToolCall{ToolCallID: "c", Name: server + "__" + tool, Arguments: json.RawMessage(args)},
			Action: protocol.Action{Kind: protocol.ActionMCP, TimeoutMS: 20000, MCP: &protocol.MCPAction{Server: server, Tool: tool}}}}
}

func execute(t *testing.T, e *mcpexec.Executor, c *worker.Call) worker.Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	out, err := e.Execute(ctx, c)
	if err != nil {
		t.Fatalf("execute %s: %v", c.Dispatch.Call.Name, err)
	}
	return out
}

// The reference server over stdio: its tools listed and mapped, a call, a structured result,
// a tool error as the server said it, and a tool the server does not have.
func TestEverythingOverStdio(t *testing.T) {
	path := everything(t)
	// The worker's own secrets are not the server program's: it gets what a program needs to
	// run, and what its configuration gives it.
	t.Setenv("HERMES_API_KEY", "hk_secret_of_the_worker")
	t.Setenv("HERMES_NATS_NKEY", "/secret/seed.nk")
	listed := make(chan []mcpexec.Tool, 4)
	e := start(t, mcpexec.Server{Name: "everything", Command: []string{"node", path, "stdio"}, Env: map[string]string{"GIVEN": "to-the-server"}},
		func(_ string, tools []mcpexec.Tool) { listed <- tools })
	tools := <-listed
	byName := map[string]mcpexec.Tool{}
	for _, tl := range tools {
		byName[tl.Name] = tl
	}
	if tl, ok := byName["everything__get-sum"]; !ok || tl.MCPName != "get-sum" || !strings.Contains(string(tl.InputSchema), `"a"`) || tl.Annotations == nil || !tl.Annotations.ReadOnlyHint {
		t.Fatalf("get-sum listed as %+v (all: %d)", tl, len(tools))
	}
	if tl := byName["everything__get-structured-content"]; len(tl.OutputSchema) == 0 {
		t.Errorf("get-structured-content has no output schema: %+v", tl)
	}
	if st := e.States(); len(st) != 1 || st[0].State != mcpexec.StateConnected || st[0].Tools != len(tools) {
		t.Errorf("states: %+v", st)
	}

	env := execute(t, e, call("everything", "get-env", `{}`))
	if env.Result.Status != protocol.ResultOK || strings.Contains(string(env.Result.Content), "secret") || !strings.Contains(string(env.Result.Content), "to-the-server") {
		t.Errorf("the server's environment: %s", env.Result.Content)
	}
	out := execute(t, e, call("everything", "echo", `{"message":"你好 hermes"}`))
	if out.Result.Status != protocol.ResultOK || !strings.Contains(string(out.Result.Content), "你好 hermes") {
		t.Errorf("echo: %+v %s", out.Result, out.Result.Content)
	}
	out = execute(t, e, call("everything", "get-structured-content", `{"location":"New York"}`))
	var weather map[string]any
	if out.Result.Status != protocol.ResultOK || json.Unmarshal(out.Result.Content, &weather) != nil || weather["temperature"] == nil {
		t.Errorf("structured content: %+v %s", out.Result, out.Result.Content)
	}
	out = execute(t, e, call("everything", "get-sum", `{"a":"one","b":2}`))
	if out.Result.Status != protocol.ResultError || out.Result.ErrorCode != protocol.CodeToolFailed || out.Result.ErrorOrigin != protocol.OriginTool ||
		!strings.Contains(out.Result.RecoveryHint, "the MCP server said") || out.Retryable {
		t.Errorf("a tool error: %+v %s", out.Result, out.Result.Content)
	}
	out = execute(t, e, call("everything", "no-such-tool", `{}`))
	if out.Result.Status != protocol.ResultError || out.Result.ErrorCode != protocol.CodeToolFailed {
		t.Errorf("an unknown tool: %+v %s", out.Result, out.Result.Content)
	}
	c := call("everything", "echo", `{"message":"`+strings.Repeat("x", 4000)+`"}`)
	c.MaxResultBytes = 1000
	if out := execute(t, e, c); out.Result.ErrorCode != protocol.CodeResultTooLarge {
		t.Errorf("an oversized result: %+v", out.Result)
	}
	if out := execute(t, e, call("elsewhere", "echo", `{}`)); out.Result.ErrorCode != protocol.CodeActionUnsupported {
		t.Errorf("a server this worker does not hold: %+v", out.Result)
	}
}

// The same server over Streamable HTTP; killed mid-call, the call is unreachable and retryable,
// and the server is reached again once it is back (restarted with backoff).
func TestEverythingOverStreamableHTTPSurvivesAKill(t *testing.T) {
	path := everything(t)
	port := freePort(t)
	run := func() *exec.Cmd {
		cmd := exec.Command("node", path, "streamableHttp")
		cmd.Env = append(os.Environ(), fmt.Sprintf("PORT=%d", port))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	server := run()
	waitPort(t, port)
	e := start(t, mcpexec.Server{Name: "web", URL: fmt.Sprintf("http://127.0.0.1:%d/mcp", port)}, nil)
	if out := execute(t, e, call("web", "echo", `{"message":"over http"}`)); out.Result.Status != protocol.ResultOK {
		t.Fatalf("echo over http: %+v %s", out.Result, out.Result.Content)
	}
	// A call of 3 s, and the server killed one second in.
	result := make(chan worker.Outcome, 1)
	go func() {
		result <- execute(t, e, call("web", "trigger-long-running-operation", `{"duration":3,"steps":3}`))
	}()
	time.Sleep(time.Second)
	_ = server.Process.Kill()
	_ = server.Wait()
	out := <-result
	if out.Result.ErrorCode != protocol.CodeToolUnreachable || !out.Retryable {
		t.Fatalf("a call whose server died: %+v %s", out.Result, out.Result.Content)
	}
	// While it is down, calls are unreachable and retryable, never the tool's failure.
	if out := execute(t, e, call("web", "echo", `{"message":"down"}`)); out.Result.ErrorCode != protocol.CodeToolUnreachable || !out.Retryable {
		t.Fatalf("a call while the server is down: %+v %s", out.Result, out.Result.Content)
	}
	run()
	deadline := time.Now().Add(40 * time.Second)
	for {
		out := execute(t, e, call("web", "echo", `{"message":"back"}`))
		if out.Result.Status == protocol.ResultOK {
			break
		}
		if !out.Retryable || time.Now().After(deadline) {
			t.Fatalf("after the restart: %+v %s; states %+v", out.Result, out.Result.Content, e.States())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if st := e.States()[0]; st.Restarts == 0 {
		t.Errorf("no restart counted: %+v", st)
	}
}

// A server that does not start is an error state with the reason, tried again; its calls are
// unreachable and retryable.
func TestAServerThatDoesNotStart(t *testing.T) {
	e, err := mcpexec.New(mcpexec.Config{Servers: []mcpexec.Server{{Name: "nothing", Command: []string{"/nonexistent/mcp-server"}}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = e.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for e.States()[0].State != mcpexec.StateError {
		if time.Now().After(deadline) {
			t.Fatalf("states: %+v", e.States())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := e.States()[0]; !strings.Contains(st.Error, "nonexistent") {
		t.Errorf("the reason: %+v", st)
	}
	out, err := e.Execute(ctx, call("nothing", "echo", `{}`))
	if err != nil || out.Result.ErrorCode != protocol.CodeToolUnreachable || !out.Retryable || !strings.Contains(string(out.Result.Content), "nothing is error") {
		t.Errorf("a call: %+v %s %v", out.Result, out.Result.Content, err)
	}
}

// A program that answers what is not MCP is an error state naming the failure, tried again.
func TestAServerThatAnswersGarbage(t *testing.T) {
	e, err := mcpexec.New(mcpexec.Config{Servers: []mcpexec.Server{{Name: "garbage", Command: []string{"sh", "-c", "echo '{not json'; echo 'HTTP/1.1 200 OK'; sleep 60"}}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(40 * time.Second)
	for st := e.States()[0]; st.State != mcpexec.StateError; st = e.States()[0] {
		if time.Now().After(deadline) {
			t.Fatalf("states: %+v", e.States())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if out, err := e.Execute(ctx, call("garbage", "echo", `{}`)); err != nil || out.Result.ErrorCode != protocol.CodeToolUnreachable || !out.Retryable {
		t.Errorf("a call: %+v %v", out.Result, err)
	}
}

// Names an MCP server gives its tools become valid Hermes tool names under the prefix, or are
// refused; a configuration that could run two servers under one prefix is refused.
func TestToolNamesAndConfiguration(t *testing.T) {
	for in, want := range map[string]string{"echo": "s__echo", "get-sum": "s__get-sum", "files/read.v2": "s__files_read_v2", "天气": "s____"} {
		if got, ok := mcpexec.ToolName("s__", in); !ok || got != want {
			t.Errorf("%q → %q %v; want %q", in, got, ok, want)
		}
	}
	if _, ok := mcpexec.ToolName("s__", strings.Repeat("x", 80)); ok {
		t.Error("a name too long was mapped")
	}
	for _, bad := range [][]mcpexec.Server{
		{{Name: "a b", URL: "http://x/mcp"}},
		{{Name: "a"}},
		{{Name: "a", URL: "ftp://x", Command: []string{"x"}}},
		{{Name: "a", URL: "file:///etc/passwd"}},
		{{Name: "a", URL: "http://x/mcp"}, {Name: "a", URL: "http://y/mcp"}},
		{{Name: "a", URL: "http://x/mcp", Prefix: "p_"}, {Name: "b", URL: "http://y/mcp", Prefix: "p_"}},
	} {
		if _, err := mcpexec.New(mcpexec.Config{Servers: bad}); err == nil {
			t.Errorf("accepted %+v", bad)
		}
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func waitPort(t *testing.T, port int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %d", port)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
