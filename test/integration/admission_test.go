package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/chat"
	"github.com/hermesbus/hermes/internal/llm"
	"github.com/hermesbus/hermes/internal/scriptedllm"
	"github.com/hermesbus/hermes/internal/scriptedllm/scriptedllmtest"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// A door is one way into Hermes, asked one thing as a caller (key) in a session, with extra
// headers; it answers a status, the Hermes error code its dialect carries ("" where the dialect
// has none: Ollama's errors are a message alone) and Retry-After.
type door struct {
	name string
	ask  func(t *testing.T, s *system, key, session string, header map[string]string) doorAnswer
}

type doorAnswer struct {
	status     int
	code       string
	retryAfter string
	body       string
}

// doors are every door a client reaches Hermes through over HTTP. Each asks for one echo
// call, or one model turn that answers at once.
func doors() []door {
	post := func(path, body string) func(*testing.T, *system, string, string, map[string]string) doorAnswer {
		return func(t *testing.T, s *system, key, session string, header map[string]string) doorAnswer {
			return send(t, s, "POST", path, strings.ReplaceAll(body, "SESSION", session), key, header)
		}
	}
	chatPost := func(path, body string) func(*testing.T, *system, string, string, map[string]string) doorAnswer {
		return func(t *testing.T, s *system, key, session string, header map[string]string) doorAnswer {
			h := map[string]string{"X-Hermes-Session-ID": session}
			for k, v := range header {
				h[k] = v
			}
			return send(t, s, "POST", path, body, key, h)
		}
	}
	var n int
	return []door{
		{"POST /v1/route", func(t *testing.T, s *system, key, session string, header map[string]string) doorAnswer {
			n++
			return post("/v1/route", fmt.Sprintf(`{"request_id":"adm_%d_%d","session_id":"SESSION","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{}}]}`,
				time.Now().UnixNano(), n))(t, s, key, session, header)
		}},
		{"POST /v1/chat/completions", chatPost("/v1/chat/completions", `{"model":"scripted","messages":[{"role":"user","content":"hello"}]}`)},
		{"POST /api/chat", chatPost("/api/chat", `{"model":"scripted","messages":[{"role":"user","content":"hello"}],"stream":false}`)},
		{"POST /v1/chat", post("/v1/chat", `{"session_id":"SESSION","message":"hello"}`)},
		{"POST /mcp", func(t *testing.T, s *system, key, session string, header map[string]string) doorAnswer {
			// session is an MCP session (Mcp-Session-Id), "" for a call outside one.
			h := map[string]string{"Accept": "application/json, text/event-stream"}
			if session != "" {
				h["Mcp-Session-Id"] = session
			}
			for k, v := range header {
				h[k] = v
			}
			a := send(t, s, "POST", "/mcp", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{}}}`, key, h)
			var rpc struct {
				Error *struct {
					Data struct{ Status int }
				}
			}
			if a.status == http.StatusOK && json.Unmarshal([]byte(a.body), &rpc) == nil && rpc.Error != nil && rpc.Error.Data.Status != 0 {
				a.status = rpc.Error.Data.Status // a call refused: JSON-RPC's error, with the status in its data
			}
			return a
		}},
		{"GET /v1/sessions/{id}/events", func(t *testing.T, s *system, key, session string, header map[string]string) doorAnswer {
			return send(t, s, "GET", "/v1/sessions/"+session+"/events", "", key, header)
		}},
	}
}

// send asks s's gateway and reads the answer's code from the dialect's error object: {"error":
// {"code"}} (Hermes', OpenAI's), or JSON-RPC's error data. An event stream that opens is
// closed at once. The header "From" names the loopback address to send from (failed
// credentials are counted per address).
func send(t *testing.T, s *system, method, path, body, key string, header map[string]string) doorAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, s.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{}
	if from := header["From"]; from != "" {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		client.Transport = &http.Transport{DialContext: d.DialContext}
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range header {
		switch k {
		case "Host":
			req.Host = v
		case "From":
		default:
			req.Header.Set(k, v)
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var data []byte
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		data, _ = io.ReadAll(resp.Body)
	}
	a := doorAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(data)}
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(data, &e) == nil && len(e.Error) > 0 {
		var obj struct {
			Code any `json:"code"`
			Data struct {
				Code string `json:"code"`
			} `json:"data"`
		}
		if json.Unmarshal(e.Error, &obj) == nil {
			if c, ok := obj.Code.(string); ok {
				a.code = c
			} else if obj.Data.Code != "" {
				a.code = obj.Data.Code
			}
		}
	}
	return a
}

// startDoors starts a system whose gateway serves every door, callers needing keys, and makes
// keys: alice and bob (users), app (a user that acts for its users), flood, revoked.
func startDoors(t *testing.T, opts options) (*system, map[string]string) {
	t.Helper()
	_, base := scriptedllmtest.Start(t, &scriptedllm.Script{Otherwise: &scriptedllm.Turn{Content: "hello to you"}}, "")
	c, err := llm.New(llm.Config{Backend: llm.Backend{Name: "scripted", BaseURL: base, Model: "scripted"}})
	if err != nil {
		t.Fatal(err)
	}
	opts.workers, opts.callers = 1, true
	opts.chat = &app.ChatConfig{Config: chat.Config{LLM: c, Model: "scripted"}}
	s := start(t, opts)
	keys := callerKeys(t, s, map[string]auth.Role{"alice": auth.RoleUser, "bob": auth.RoleUser, "appkey": auth.RoleUser,
		"flood": auth.RoleUser, "revoked": auth.RoleUser})
	_, b := s.connect()
	if _, err := auth.NewKeys(b.Bucket(auth.KeysBucket)).Revoke(t.Context(), "revoked"); err != nil {
		t.Fatal(err)
	}
	return s, keys
}

// mcpSession opens an MCP session as key and returns its id.
func mcpSession(t *testing.T, s *system, key string) string {
	t.Helper()
	req, _ := http.NewRequest("POST", s.base+"/mcp", strings.NewReader(
		`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	id := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || id == "" {
		t.Fatalf("initialize: HTTP %d, session %q", resp.StatusCode, id)
	}
	return id
}

// Every attack on identities (the callers issue's list) gets the same answer at every door —
// POST /v1/route, the three chat dialects, /mcp, the session event streams — each in its
// dialect, and is refused at the bus ingress for external NATS clients too: one admission
// path decides for all of them (package admission).
func TestEveryDoorAdmitsAlike(t *testing.T) {
	t.Parallel()
	s, keys := startDoors(t, options{callerLimits: admission.CallerLimits{RequestsPerSecond: 0.001, Burst: 60}})
	aliceMCP, bobMCP := mcpSession(t, s, keys["alice"]), mcpSession(t, s, keys["bob"])
	sessionOf := func(d door, owner string) string {
		if d.name == "POST /mcp" {
			return map[string]string{"alice": aliceMCP, "bob": bobMCP}[owner]
		}
		return "adm_" + owner
	}
	// What each caller may do works at every door (and alice's session is hers from then on).
	for _, d := range doors() {
		if a := d.ask(t, s, keys["alice"], sessionOf(d, "alice"), nil); a.status != http.StatusOK {
			t.Fatalf("%s: alice in her own session: HTTP %d %s", d.name, a.status, a.body)
		}
	}
	for range 60 { // flood spends its allowance
		s.call("GET", "/v1/whoami", keys["flood"], "")
	}
	attacks := []struct {
		name   string
		key    string
		owner  string // whose session
		header map[string]string
		status int
		code   string
		retry  bool
	}{
		{"no credential", "", "alice", nil, http.StatusUnauthorized, protocol.CodeUnauthenticated, false},
		// Each from an address of its own: ten failures from one address slow it down.
		{"a revoked key", keys["revoked"], "alice", map[string]string{"From": "127.0.0.2"}, http.StatusUnauthorized, protocol.CodeUnauthenticated, false},
		{"a guessed key", "hk_guessed_guessed_guessed_guessed", "alice", map[string]string{"From": "127.0.0.3"}, http.StatusUnauthorized, protocol.CodeUnauthenticated, false},
		{"someone else's session", keys["bob"], "alice", nil, http.StatusNotFound, protocol.CodeNotFound, false},
		{"naming an end user without act_for_users", keys["bob"], "bob", map[string]string{admission.HeaderUser: "mallory"},
			http.StatusForbidden, protocol.CodeForbidden, false},
		{"over its rate", keys["flood"], "flood", nil, http.StatusTooManyRequests, protocol.CodeRateLimited, true},
		{"a host the gateway does not serve (DNS rebinding)", keys["alice"], "alice", map[string]string{"Host": "rebind.attacker.example"},
			http.StatusMisdirectedRequest, protocol.CodeHostNotServed, false},
		{"a page of another site", keys["alice"], "alice", map[string]string{"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
			http.StatusForbidden, protocol.CodeCrossOrigin, false},
	}
	for _, at := range attacks {
		for _, d := range doors() {
			if at.code == protocol.CodeCrossOrigin && strings.HasPrefix(d.name, "GET") {
				continue // a read: nothing a page of another site could change (and it cannot read the answer)
			}
			session := sessionOf(d, at.owner)
			if at.owner == "flood" { // flood, refused first for its rate, asks into a session of its own
				session = "adm_flood"
				if d.name == "POST /mcp" {
					session = "" // a call outside an MCP session
				}
			}
			a := d.ask(t, s, at.key, session, at.header)
			want := at.code
			if d.name == "POST /api/chat" && a.status >= 400 && !strings.Contains(a.body, `"code"`) {
				want = "" // Ollama's errors are a message alone
			}
			if a.status != at.status || a.code != want || (at.retry && a.retryAfter == "") {
				t.Errorf("%s at %s: HTTP %d code %q Retry-After %q; want %d %q (%s)", at.name, d.name, a.status, a.code, a.retryAfter, at.status, want, a.body)
			}
		}
	}

	// The bus ingress: a NATS client without credentials is not let in; one that publishes
	// into alice's session has nothing accepted; what it claims to be in the message is not
	// believed (TestExternalClientsPublishRequestsAsThemselves).
	if nc, err := nats.Connect(s.srv.Plain, nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Error("a NATS client without credentials was let in")
	}
	js := clientJS(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	publishClientRequest(ctx, t, js, "adm_alice", &protocol.Request{RequestID: "adm_nats_1", SessionID: "adm_alice",
		ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: "echo", Arguments: []byte(`{}`)}}}, nil)
	publishClientRequest(ctx, t, js, "adm_nats", &protocol.Request{RequestID: "adm_nats_2", SessionID: "adm_nats",
		ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: "echo", Arguments: []byte(`{}`)}}}, nil)
	_, admin := s.connect()
	waitFor(t, "the client's own request answered", func() bool { _, _, err := admin.Response(ctx, "adm_nats_2", "adm_nats"); return err == nil })
	if _, err := admin.Plan(ctx, "adm_nats_1"); err == nil {
		t.Error("a NATS client's request into alice's session was accepted")
	}
}

// When the record is near its limit, every door refuses new requests alike: 503 STORE_FULL
// with Retry-After (an MCP call: JSON-RPC's error, the status and code in its data); an
// external NATS client's request waits.
func TestEveryDoorRefusesWhenTheRecordIsFull(t *testing.T) {
	t.Parallel()
	s, keys := startDoors(t, options{bus: bus.Config{MaxMsgs: 240}})
	aliceMCP := mcpSession(t, s, keys["alice"])
	for i := 0; ; i++ {
		code, body := s.call("POST", "/v1/route?timeout=10s", keys["alice"],
			fmt.Sprintf(`{"request_id":"fill_%d","session_id":"adm_alice","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{}}]}`, i))
		if code == http.StatusServiceUnavailable && strings.Contains(body, protocol.CodeStoreFull) {
			break
		}
		if code != http.StatusOK || i > 200 {
			t.Fatalf("filling the record, request %d: HTTP %d %s", i, code, body)
		}
		time.Sleep(60 * time.Millisecond) // the gateway looks every 50 ms
	}
	for _, d := range doors() {
		if strings.HasPrefix(d.name, "GET") {
			continue // reading takes no room
		}
		session := "adm_alice"
		if d.name == "POST /mcp" {
			session = aliceMCP
		}
		a := d.ask(t, s, keys["alice"], session, nil)
		want := protocol.CodeStoreFull
		if d.name == "POST /api/chat" {
			want = "" // Ollama's errors are a message alone
		}
		if a.status != http.StatusServiceUnavailable || a.code != want || (d.name != "POST /mcp" && a.retryAfter == "") {
			t.Errorf("%s with the record full: HTTP %d code %q Retry-After %q (%s)", d.name, a.status, a.code, a.retryAfter, a.body)
		}
	}
	js := clientJS(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	publishClientRequest(ctx, t, js, "adm_nats", &protocol.Request{RequestID: "adm_nats_full", SessionID: "adm_nats",
		ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: "echo", Arguments: []byte(`{}`)}}}, nil)
	// The ingress takes it at once and puts it off (for 30 s): once it was delivered, and was
	// decided on (the decision comes before the message is settled: a plan, had it been
	// accepted, would be written first), no plan is there.
	_, admin := s.connect()
	waitFor(t, "the NATS client's request delivered to the ingress", func() bool {
		c, err := admin.ClientConsumer(ctx)
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.Delivered.Consumer >= 1
	})
	for deadline := time.Now().Add(500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, err := admin.Plan(ctx, "adm_nats_full"); err == nil {
			t.Fatal("a NATS client's request was accepted into a full record")
		}
	}
}
