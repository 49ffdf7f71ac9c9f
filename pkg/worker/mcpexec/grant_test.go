package mcpexec_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker/mcpexec"
)

// A call that changes a resource carries its turn in the tools/call request's _meta:
// transaction id, fencing token and resource; a call without a grant carries none.
func TestTheCallsGrantTravelsInMeta(t *testing.T) {
	var mu sync.Mutex
	var metas []mcp.Meta
	server := mcp.NewServer(&mcp.Implementation{Name: "orders", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: "address_update", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			mu.Lock()
			metas = append(metas, req.Params.Meta)
			mu.Unlock()
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
		})
	server.AddTool(&mcp.Tool{Name: "echo", InputSchema: json.RawMessage(`{"type":"object"}`)}, // what start waits for
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo"}}}, nil
		})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	t.Cleanup(srv.Close)
	e := start(t, mcpexec.Server{Name: "orders", URL: srv.URL}, nil)
	c := call("orders", "address_update", `{"order_id":"order_123"}`)
	c.Dispatch.Grant = &protocol.Grant{Tx: protocol.TxID("r", "order_123"), Fence: 12, Resource: "order_123"}
	if out := execute(t, e, c); out.Result.Status != protocol.ResultOK {
		t.Fatalf("%+v %s", out.Result, out.Result.Content)
	}
	if out := execute(t, e, call("orders", "address_update", `{}`)); out.Result.Status != protocol.ResultOK {
		t.Fatalf("%+v %s", out.Result, out.Result.Content)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(metas) != 2 {
		t.Fatalf("%d calls", len(metas))
	}
	m := metas[0]
	if m[mcpexec.MetaTx] != protocol.TxID("r", "order_123") || m[mcpexec.MetaFence] != float64(12) || m[mcpexec.MetaResource] != "order_123" {
		t.Fatalf("_meta %v", m)
	}
	for _, k := range []string{mcpexec.MetaTx, mcpexec.MetaFence, mcpexec.MetaResource} {
		if v, ok := metas[1][k]; ok {
			t.Fatalf("without a grant, _meta %s = %v", k, v)
		}
	}
}
