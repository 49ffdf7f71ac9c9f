package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// keyed sends every request with an API key, to the gateways given in turn (one session, any
// replica).
type keyed struct {
	key   string
	bases []string
	n     atomic.Int64
	hosts []string // the host each request went to
}

func (k *keyed) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+k.key)
	base, _ := url.Parse(k.bases[int(k.n.Add(1))%len(k.bases)])
	r.URL.Host, r.Host = base.Host, base.Host
	k.hosts = append(k.hosts, base.Host)
	return http.DefaultTransport.RoundTrip(r)
}

func mcpClient(t *testing.T, rt *keyed) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "hermes-test", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: rt.bases[0] + "/mcp", HTTPClient: &http.Client{Transport: rt}, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func text(r *mcp.CallToolResult) string {
	var parts []string
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// seedAndTwoGateways starts a system with callers admin and alice, the seed's order_query
// registered, and a second gateway (its base URL, and its stop).
func seedAndTwoGateways(t *testing.T) (s *system, keys map[string]string, second string, stop func()) {
	t.Helper()
	s = start(t, options{workers: 1, callers: true})
	keys = callerKeys(t, s, map[string]auth.Role{"admin": auth.RoleAdmin, "alice": auth.RoleUser})
	seed, err := os.ReadFile(seedPath("contract-order-query.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if code, _, body := s.registerContract(keys["admin"], string(seed)); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	second, stop = s.newGateway("gateway-2")
	return s, keys, second, stop
}

// Hermes is an MCP server: tools/list shows the registered tools with their schemas; tools/call
// runs through the bus — a call, the tool's declared error, a schema-invalid call as an error
// result the model can correct; one MCP session alternated between two gateways; a call sent
// again with the same id runs nothing twice; no key, no MCP.
func TestHermesIsAnMCPServer(t *testing.T) {
	t.Parallel()
	s, keys, second, stop := seedAndTwoGateways(t)
	defer stop()
	rt := &keyed{key: keys["alice"], bases: []string{s.base, second}}
	cs := mcpClient(t, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	list, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var found *mcp.Tool
	for _, tl := range list.Tools {
		if tl.Name == "order_query" {
			found = tl
		}
	}
	schema, _ := json.Marshal(found.InputSchema)
	if found == nil || !strings.Contains(string(schema), `"pattern":"^ORD[0-9]{12}$"`) || !strings.Contains(string(schema), `"required":["order_id"]`) {
		t.Fatalf("tools/list: %+v %s", found, schema)
	}

	var ok *mcp.CallToolResult
	waitFor(t, "the contract in use", func() bool {
		ok, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "order_query", Arguments: map[string]any{"order_id": "ORD202603120042"}})
		return err == nil && !ok.IsError
	})
	if !strings.Contains(text(ok), `"order_id":"ORD202603120042"`) || ok.StructuredContent == nil {
		t.Errorf("a call: %s %+v", text(ok), ok)
	}
	missing, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "order_query", Arguments: map[string]any{"order_id": "ORD209901010001"}})
	if err != nil || !missing.IsError || !strings.HasPrefix(text(missing), "ORDER_NOT_FOUND") {
		t.Errorf("the tool's error: %v %s", err, text(missing))
	}
	bad, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "order_query", Arguments: map[string]any{"order_id": "12"}})
	if err != nil || !bad.IsError || !strings.Contains(text(bad), "BAD_ARGUMENTS: order_id: does not match ^ORD[0-9]{12}$") || !strings.Contains(text(bad), "hint:") {
		t.Errorf("a schema-invalid call: %v %s", err, text(bad))
	}
	unknown, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "no such tool!", Arguments: map[string]any{}})
	if err != nil || !unknown.IsError {
		t.Errorf("an unknown tool: %v %+v", err, unknown)
	}
	hosts := map[string]bool{}
	for _, h := range rt.hosts {
		hosts[h] = true
	}
	if len(hosts) != 2 {
		t.Errorf("the session used %d gateways", len(hosts))
	}
	// Each call is a request on the record, in the MCP session's Hermes session.
	calls := 0
	for _, m := range s.record() {
		if m.Type == protocol.TypeRequest && strings.HasPrefix(m.RequestID, "mcp-") && strings.HasPrefix(m.SessionID, "mcp-") {
			calls++
		}
	}
	if calls < 3 {
		t.Errorf("%d MCP calls on the record", calls)
	}

	// Without a key: no MCP at all.
	resp, err := http.Post(s.base+"/mcp", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("without a key: %v %v", err, resp)
	}
	// Malformed bodies get the protocol's errors, never a crash: the gateway answers on.
	var req *http.Request
	for _, body := range []string{`{"jsonrpc":"2.0","id":`, "\xff\x00garbage", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"x"}`,
		`{"jsonrpc":"2.0","id":{"a":1},"method":"tools/call","params":{"name":5}}`, `{"METHOD":"tools/call","ID":1,"jsonrpc":"2.0"}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"order_query","arguments":[1,2]}}`,
		strings.Repeat(`{"a":`, 5000) + "1" + strings.Repeat("}", 5000)} {
		req, _ = http.NewRequest("POST", s.base+"/mcp", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+keys["alice"])
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode/100 == 5 {
			t.Errorf("a malformed body %.40q: %v %v", body, err, resp)
		}
	}
	if list, err := cs.ListTools(ctx, nil); err != nil || len(list.Tools) == 0 {
		t.Errorf("after malformed bodies: %v", err)
	}
	// A batch is refused as the protocol says (each call needs an id of its own).
	req, _ = http.NewRequest("POST", s.base+"/mcp", strings.NewReader(`[{"jsonrpc":"2.0","id":3,"method":"tools/list"},{"jsonrpc":"2.0","id":4,"method":"tools/list"}]`))
	req.Header.Set("Authorization", "Bearer "+keys["alice"])
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a batch: %v %v", err, resp)
	}
	// A client on a protocol with sessions (initialize): its session is kept on the bus, so the
	// other gateway answers it; the same JSON-RPC id sent again — to either — runs once; another
	// caller cannot use the session.
	post := func(base, key, session, body string) (*http.Response, string) {
		req, _ := http.NewRequest("POST", base+"/mcp", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := post(s.base, keys["alice"], "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	session := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != 200 || session == "" {
		t.Fatalf("initialize: %d %s", resp.StatusCode, body)
	}
	callBody := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"order_query","arguments":{"order_id":"ORD202603120042"}}}`
	_, first := post(second, keys["alice"], session, callBody)
	_, again := post(s.base, keys["alice"], session, callBody)
	if !strings.Contains(first, "ORD202603120042") || first != again {
		t.Errorf("one call, two gateways:\n%s\n%s", first, again)
	}
	requests := map[string]bool{}
	for _, m := range s.record() {
		if m.Type == protocol.TypeRequest && m.SessionID == "mcp-"+session {
			requests[m.RequestID] = true
		}
	}
	if len(requests) != 1 {
		t.Errorf("the call sent twice is %d requests on the record", len(requests))
	}
	if resp, _ := post(s.base, keys["admin"], session, `{"jsonrpc":"2.0","id":9,"method":"tools/list"}`); resp.StatusCode != http.StatusNotFound {
		t.Errorf("someone else's session: %d", resp.StatusCode)
	}
	if resp, _ := post(s.base, keys["alice"], "0123456789abcdef0123456789abcdef", `{"jsonrpc":"2.0","id":9,"method":"tools/list"}`); resp.StatusCode != http.StatusNotFound {
		t.Errorf("a session never made: %d", resp.StatusCode)
	}
}

// A call during which the tool worker is SIGKILLed: one result, through the MCP session; the
// tool saw the call twice, under one idempotency key.
func TestAnMCPCallOutlivesItsWorker(t *testing.T) {
	t.Parallel()
	s := start(t, options{callers: true, bus: bus.Config{AckWait: 2 * time.Second}})
	keys := callerKeys(t, s, map[string]auth.Role{"alice": auth.RoleUser})
	victim := s.spawn("toolworker", "victim-worker", append(s.workerArgs(), "--tools", "record")...)
	cs := mcpClient(t, &keyed{key: keys["alice"], bases: []string{s.base}})
	got := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "record", Arguments: map[string]any{"first_delay_ms": 60000}})
		if err != nil {
			t.Errorf("call: %v", err)
		}
		got <- res
	}()
	var key string
	waitFor(t, "the victim to start the call", func() bool {
		for _, k := range s.recorder.idempotencyKeys() {
			if strings.HasPrefix(k, "mcp-") {
				key = k
			}
		}
		return key != "" && len(s.recorder.tries(key)) == 1
	})
	victim.kill()
	s.addWorker("survivor-worker")
	res := <-got
	if res == nil || res.IsError {
		t.Fatalf("the call: %+v", res)
	}
	tries := s.recorder.tries(key)
	if len(tries) != 2 || tries[0].Get("Idempotency-Key") != tries[1].Get("Idempotency-Key") {
		t.Fatalf("the tool saw %d tries", len(tries))
	}
	rid, _, _ := strings.Cut(key, "/")
	if n := s.countRecorded(rid, protocol.TypeToolResult); n != 1 {
		t.Errorf("%d results recorded", n)
	}
}

// The TypeScript SDK's client (npm, run by node): one session alternated between two
// gateways; a call, the tool's error, a schema-invalid call as an error result.
func TestAnNPMClientUsesHermes(t *testing.T) {
	mcpEverything(t) // test/mcp installed
	script, _ := filepath.Abs("../mcp/client.mjs")
	s, keys, second, stop := seedAndTwoGateways(t)
	defer stop()
	calls := `[{"name":"order_query","arguments":{"order_id":"ORD202603120042"}},
		{"name":"order_query","arguments":{"order_id":"ORD209901010001"}},
		{"name":"order_query","arguments":{"order_id":"12"}}]`
	var out struct {
		Session string   `json:"session"`
		Hosts   int      `json:"hosts"`
		Tools   []string `json:"tools"`
		Results []struct {
			IsError bool `json:"isError"`
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"results"`
	}
	var raw []byte
	waitFor(t, "the contract in use", func() bool {
		cmd := exec.Command("node", script, keys["alice"], s.base+"/mcp,"+second+"/mcp", calls)
		var err error
		raw, err = cmd.Output()
		if err != nil {
			t.Fatalf("node client: %v\n%s", err, raw)
		}
		return json.Unmarshal(raw, &out) == nil && len(out.Results) == 3 && !out.Results[0].IsError
	})
	t.Logf("npm client: %s", raw)
	if out.Session == "" || out.Hosts != 2 || !slices.Contains(out.Tools, "order_query") {
		t.Errorf("session %q over %d gateways, tools %v", out.Session, out.Hosts, out.Tools)
	}
	if r := out.Results[0]; r.IsError || !strings.Contains(r.Content[0].Text, "ORD202603120042") {
		t.Errorf("a call: %+v", r)
	}
	if r := out.Results[1]; !r.IsError || !strings.HasPrefix(r.Content[0].Text, "ORDER_NOT_FOUND") {
		t.Errorf("the tool's error: %+v", r)
	}
	if r := out.Results[2]; !r.IsError || !strings.Contains(r.Content[0].Text, "BAD_ARGUMENTS: order_id") {
		t.Errorf("a schema-invalid call: %+v", r)
	}
}

// A call whose client goes away keeps running; sending it again (same session, same id)
// retrieves its result, and the tool ran once.
func TestAnMCPCallOutlivesItsClient(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"alice": auth.RoleUser})
	post := func(session, body string, timeout time.Duration) (*http.Response, string, error) {
		req, _ := http.NewRequest("POST", s.base+"/mcp", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+keys["alice"])
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		resp, err := (&http.Client{Timeout: timeout}).Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b), nil
	}
	resp, body, err := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`, 5*time.Second)
	if err != nil || resp.Header.Get("Mcp-Session-Id") == "" {
		t.Fatalf("initialize: %v %s", err, body)
	}
	session := resp.Header.Get("Mcp-Session-Id")
	call := `{"jsonrpc":"2.0","id":"slow-1","method":"tools/call","params":{"name":"record","arguments":{"delay_ms":1500}}}`
	if _, _, err := post(session, call, 300*time.Millisecond); err == nil {
		t.Fatal("the client did not give up")
	}
	var key string
	waitFor(t, "the call to reach the tool", func() bool {
		for _, k := range s.recorder.idempotencyKeys() {
			if strings.HasPrefix(k, "mcp-") {
				key = k
			}
		}
		return key != ""
	})
	rid, _, _ := strings.Cut(key, "/")
	waitFor(t, "the call answered with nobody waiting for it", func() bool { return s.countRecorded(rid, protocol.TypeResponse) == 1 })
	_, body, err = post(session, call, 10*time.Second)
	if err != nil || !strings.Contains(body, `delay_ms`) || strings.Contains(body, `"isError":true`) {
		t.Fatalf("sent again: %v %s", err, body)
	}
	if n := len(s.recorder.tries(key)); n != 1 {
		t.Errorf("the tool ran %d times", n)
	}
}
