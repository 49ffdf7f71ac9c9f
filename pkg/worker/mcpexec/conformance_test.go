package mcpexec_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
	"github.com/hermesbus/hermes/pkg/worker/mcpexec"
	"github.com/hermesbus/hermes/pkg/worker/workertest"
)

// behaving is an MCP server, in this process over Streamable HTTP, whose one tool, behave, does
// what each call's arguments ask (a workertest.Behavior), and remembers which calls the worker
// aborted.
//
// Two behaviors are the transport's, not the tool's, as an MCP server shows them: a retryable
// failure is the endpoint answering 503 (an overloaded server), and a crash is the endpoint
// dropping the call's HTTP exchange (a panic in its handler, which net/http recovers). A
// panic in the tool's handler itself would end this test's process, as it ends a server's.
type behaving struct {
	mu      sync.Mutex
	aborted map[string]bool
}

const behaveTool = "behave"

// newBehaving serves a behaving MCP server until the test ends.
func newBehaving(t *testing.T) (*behaving, *httptest.Server) {
	t.Helper()
	b := &behaving{aborted: map[string]bool{}}
	server := mcp.NewServer(&mcp.Implementation{Name: "behaving", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: behaveTool, Description: "does what the call asks",
		InputSchema: json.RawMessage(`{"type":"object"}`)}, b.behave)
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	srv := httptest.NewUnstartedServer(b.transport(mcpHandler))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the crashes are the test's own
	srv.Start()
	t.Cleanup(srv.Close)
	return b, srv
}

// behave is the tool: it answers the call's Answer (or a string of Size bytes) as structured
// content, or fails as the tool's error (isError), after the call's Delay.
func (b *behaving) behave(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	id, s, err := workertest.ReadScript(req.Params.Arguments)
	if err != nil {
		return nil, err
	}
	if err := s.Wait(ctx); err != nil { // the worker ended the call
		b.mu.Lock()
		b.aborted[id] = true
		b.mu.Unlock()
		return nil, err
	}
	if s.Fail == workertest.FailPermanent {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "no such order"}}}, nil
	}
	answer := s.Answer
	if s.Size > 0 {
		answer, _ = json.Marshal(strings.Repeat("x", s.Size))
	}
	return &mcp.CallToolResult{StructuredContent: answer, Content: []mcp.Content{&mcp.TextContent{Text: string(answer)}}}, nil
}

// transport serves next, answering a call of behave that asks for a retryable failure with 503
// and dropping the exchange of one that asks for a crash.
func (b *behaving) transport(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			Method string `json:"method"`
			Params struct {
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			} `json:"params"`
		}
		if json.Unmarshal(body, &msg) == nil && msg.Method == "tools/call" && msg.Params.Name == behaveTool {
			if _, s, err := workertest.ReadScript(msg.Params.Arguments); err == nil {
				switch {
				case s.Panic:
					panic("tool bug") // net/http drops the connection
				case s.Fail == workertest.FailRetryable:
					http.Error(w, "overloaded", http.StatusServiceUnavailable)
					return
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

func (b *behaving) wasAborted(id string) bool {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		b.mu.Lock()
		ok := b.aborted[id]
		b.mu.Unlock()
		if ok {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// Every executor's conformance, against a real MCP server of the official SDK.
func TestConformance(t *testing.T) {
	tool, srv := newBehaving(t)
	const name = "conf"
	e, err := mcpexec.New(mcpexec.Config{Servers: []mcpexec.Server{{Name: name, URL: srv.URL}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	hermesName, _ := mcpexec.ToolName(name+"__", behaveTool)
	deadline := time.Now().Add(10 * time.Second)
	for !e.Has(hermesName) {
		if time.Now().After(deadline) {
			t.Fatalf("the server never served %s: %+v", behaveTool, e.States())
		}
		time.Sleep(10 * time.Millisecond)
	}
	workertest.Run(t, workertest.Harness{
		Executor: e,
		Call: func(t *testing.T, id string, b workertest.Behavior) *worker.Call {
			return &worker.Call{RequestID: "req_conf", SessionID: "s", Dispatch: &protocol.Dispatch{
				Call:  protocol.ToolCall{ToolCallID: id, Name: hermesName, Arguments: workertest.Script(id, b)},
				Route: hermesName,
				Action: protocol.Action{Kind: protocol.ActionMCP, TimeoutMS: 10_000,
					MCP: &protocol.MCPAction{Server: name, Tool: behaveTool}},
			}}
		},
		Aborted: func(t *testing.T, id string) bool { return tool.wasAborted(id) },
		// The SDK decodes structured content into Go values, whose numbers are float64: an
		// MCP answer's numbers come back as doubles (an integer beyond 2^53 is rounded).
		Carried: func(answer json.RawMessage) json.RawMessage {
			var v any
			if err := json.Unmarshal(answer, &v); err != nil {
				t.Fatal(err)
			}
			b, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
	})
}
