package bench_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/bench"
	"github.com/hermesbus/hermes/internal/mcptest"
	"github.com/hermesbus/hermes/pkg/worker/mcpexec"
)

// The reference MCP server's echo, called directly by an MCP client, through Hermes'
// /v1/route, and through Hermes' own /mcp — one client, one call at a time: what Hermes adds
// to an MCP call, with every call durable and recorded.

func everythingServer(b *testing.B) string { return mcptest.Everything(b) }

func startMCPSystem(b *testing.B) *app.System {
	b.Helper()
	path := everythingServer(b)
	return runSystem(b, app.SystemConfig{Instance: "bench-mcp",
		Worker: app.WorkerConfig{Concurrency: 64, MCP: &app.MCPConfig{TimeoutMS: 10000, MaxAttempts: 1,
			Servers: []mcpexec.Server{{Name: "everything", Command: []string{"node", path, "stdio"}}}}}},
		"everything__echo", `{"message":"hi"}`)
}

// timed runs do b.N times and reports p50 and p99.
func timed(b *testing.B, do func(i int) error) { timedTurns(b, 0, do) }

type bearer struct{ key string }

func (k bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+k.key)
	return http.DefaultTransport.RoundTrip(r)
}

func echoOver(b *testing.B, t mcp.Transport) {
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).Connect(ctx, t, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer cs.Close()
	timed(b, func(i int) error {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: toolFor(t), Arguments: map[string]any{"message": fmt.Sprint("hi ", i)}})
		if err == nil && res.IsError {
			err = fmt.Errorf("error result: %+v", res.Content)
		}
		return err
	})
}

func toolFor(t mcp.Transport) string {
	if _, direct := t.(*mcp.CommandTransport); direct {
		return "echo"
	}
	return "everything__echo"
}

func BenchmarkMCPEchoDirect(b *testing.B) {
	path := everythingServer(b)
	echoOver(b, &mcp.CommandTransport{Command: exec.Command("node", path, "stdio")})
}

func BenchmarkMCPEchoHermesRoute(b *testing.B) {
	sys := startMCPSystem(b)
	h := &bench.Hermes{Client: bench.NewClient(1), URL: sys.GatewayURL, Key: sys.Key.Key, Tool: "everything__echo", Calls: 1,
		Args: `{"message":"hi"}`, RunID: fmt.Sprintf("mcp%d-%d", os.Getpid(), runs.Add(1))}
	timed(b, func(i int) error { return h.Do(context.Background(), 0, i) })
}

func BenchmarkMCPEchoHermesMCP(b *testing.B) {
	sys := startMCPSystem(b)
	echoOver(b, &mcp.StreamableClientTransport{Endpoint: sys.GatewayURL + "/mcp", HTTPClient: &http.Client{Transport: bearer{sys.Key.Key}}, DisableStandaloneSSE: true})
}

// The demo HTTP echo through /v1/route, one call at a time: the bus's share of any call, to
// set beside the MCP echo's.
func BenchmarkHTTPEchoHermesRoute(b *testing.B) {
	sys := startMCPSystem(b)
	h := &bench.Hermes{Client: bench.NewClient(1), URL: sys.GatewayURL, Key: sys.Key.Key, Tool: "echo", Calls: 1,
		Args: `{"message":"hi"}`, RunID: fmt.Sprintf("http%d-%d", os.Getpid(), runs.Add(1))}
	timed(b, func(i int) error { return h.Do(context.Background(), 0, i) })
}
