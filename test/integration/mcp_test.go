package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/mcptest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// mcpEverything is the reference MCP server (test/mcp's npm ci).
func mcpEverything(t *testing.T) string { return mcptest.Everything(t) }

// An MCP server's tools are Hermes tools: registered as contracts through the gateway as the
// worker holding the server lists them, called through the bus like any other — routed,
// checked against their schemas, recorded — their errors the server's words; its state shown
// by hermes mcp ls. Killed mid-call, the server is started again and the call retried.
func TestMCPServersBecomeTools(t *testing.T) {
	path := mcpEverything(t)
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"admin": auth.RoleAdmin})
	cfgFile := filepath.Join(t.TempDir(), "mcp.yaml")
	if err := os.WriteFile(cfgFile, []byte("timeout_ms: 20000\nservers:\n  - name: everything\n    command: [node, "+path+", stdio]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := app.LoadMCPConfig(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	s.addWorkerWith(app.WorkerConfig{Instance: "mcp-worker", Concurrency: 8, MCP: cfg, Gateway: s.base, APIKey: keys["admin"]})

	waitForWithin(t, "the MCP tools registered", 60*time.Second, func() bool {
		for _, tool := range []string{"everything__echo", "everything__get-sum", "everything__trigger-long-running-operation"} {
			code, body := s.call("GET", "/api/v1/tools/"+tool, keys["admin"], "")
			if code != 200 || !strings.Contains(body, `"kind":"mcp"`) || !strings.Contains(body, "not tried") {
				return false
			}
		}
		return true
	})
	var r *protocol.Response
	waitFor(t, "an MCP tool answers through the bus", func() bool {
		r = s.routeAs(keys["admin"], request(fmt.Sprintf("mcp_%d", time.Now().UnixNano()), "mcp_s",
			call("echo", "everything__echo", map[string]any{"message": "你好 MCP"}),
			call("sum", "everything__get-sum", map[string]any{"a": 2, "b": 40}),
			call("bad", "everything__get-sum", map[string]any{"a": "two", "b": 40})))
		return result(t, r, "echo").Status == protocol.ResultOK
	})
	if echo := result(t, r, "echo"); !strings.Contains(string(echo.Content), "你好 MCP") || echo.Route != "contract:everything__echo" || echo.ContractVersion != 1 {
		t.Errorf("echo: %+v %s", echo, echo.Content)
	}
	if sum := result(t, r, "sum"); sum.Status != protocol.ResultOK || !strings.Contains(string(sum.Content), "42") {
		t.Errorf("sum: %+v %s", sum, sum.Content)
	}
	// The server's input schema, as a contract, stops a bad argument before dispatch.
	if bad := result(t, r, "bad"); bad.ErrorCode != protocol.CodeBadArguments || bad.Attempts != 0 || !strings.Contains(string(bad.Content), "a:") {
		t.Errorf("a schema-invalid call: %+v %s", bad, bad.Content)
	}
	// Through Hermes' own /mcp, an MCP server's tool answers in MCP content blocks.
	cs := mcpClient(t, &keyed{key: keys["admin"], bases: []string{s.base}})
	sumRes, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "everything__get-sum", Arguments: map[string]any{"a": 2, "b": 40}})
	if err != nil || sumRes.IsError || text(sumRes) != "The sum of 2 and 40 is 42." {
		t.Errorf("the MCP tool through /mcp: %v %q", err, text(sumRes))
	}
	// hermes mcp ls shows the worker's server, connected.
	code, out, errOut := hermes(t, app.RunMCP, "ls", "--nats", s.srv.URL, "--nats-nkey", s.srv.SeedFile(t, "admin"))
	if code != 0 || !regexp.MustCompile(`mcp-worker +everything +connected +\d+`).MatchString(out) {
		t.Errorf("mcp ls: exit %d\n%s%s", code, out, errOut)
	}

	// So does the gateway's /readyz, to anyone (no key needed).
	if code, body := s.call("GET", "/readyz", "", ""); code != 200 || !strings.Contains(body, `"mcp":{"servers":{"connected":1},"workers":1}`) {
		t.Errorf("readyz: %d %s", code, body)
	}

	// Killed during a 3-second call: started again, the call tried again, one result.
	done := make(chan *protocol.Response, 1)
	go func() {
		done <- s.routeAs(keys["admin"], request("mcp_kill", "mcp_s", call("long", "everything__trigger-long-running-operation", map[string]any{"duration": 3, "steps": 3})))
	}()
	waitFor(t, "the long call started", func() bool {
		for _, m := range s.record() {
			if m.RequestID == "mcp_kill" && m.Type == protocol.TypeToolStarted {
				return true
			}
		}
		return false
	})
	killServer(t, path)
	r = <-done
	long := result(t, r, "long")
	if long.Status != protocol.ResultOK || long.Attempts < 2 {
		t.Errorf("the call through the kill: %+v %s", long, long.Content)
	}
	results := 0
	for _, m := range s.record() {
		if m.RequestID == "mcp_kill" && m.Type == protocol.TypeToolResult {
			results++
		}
	}
	if results != 1 {
		t.Errorf("%d results recorded for the call", results)
	}
}

// killServer SIGKILLs the node process running the server at path.
func killServer(t *testing.T, path string) {
	t.Helper()
	out, err := exec.Command("pgrep", "-f", path+" stdio").Output()
	if err != nil {
		t.Fatalf("pgrep: %v", err)
	}
	for _, pid := range bytes.Fields(out) {
		var n int
		for _, c := range pid {
			n = n*10 + int(c-'0')
		}
		_ = syscall.Kill(n, syscall.SIGKILL)
	}
}
