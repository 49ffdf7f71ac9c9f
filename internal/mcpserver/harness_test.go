package mcpserver

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// The MCP endpoint's unit tests serve it with httptest behind a stand-in for the gateway's
// authentication (the bearer token names the caller), against fakes: a Submitter answering
// each call as told, an Admitter admitting all unless told otherwise, the contracts of a few
// tools, and the sessions in a bustest.MemKV.

var (
	_ Submitter = (*fakeSubmitter)(nil)
	_ Admitter  = (*fakeAdmitter)(nil)
	_ Contracts = (*fakeContracts)(nil)
	_ KV        = (*bustest.MemKV)(nil)
)

// fakeSubmitter answers each call with answer, or with an ok result of its arguments.
type fakeSubmitter struct {
	mu     sync.Mutex
	answer func(ctx context.Context, sub submit.Submission) (*submit.Outcome, error)
	subs   []submit.Submission
}

func (f *fakeSubmitter) Submit(ctx context.Context, sub submit.Submission) (*submit.Outcome, error) {
	f.mu.Lock()
	f.subs = append(f.subs, sub)
	answer := f.answer
	f.mu.Unlock()
	if answer != nil {
		return answer(ctx, sub)
	}
	return answered(sub, protocol.ToolResult{Status: protocol.ResultOK, Content: sub.Request.ToolCalls[0].Arguments}), nil
}

func (f *fakeSubmitter) set(answer func(ctx context.Context, sub submit.Submission) (*submit.Outcome, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answer = answer
}

func (f *fakeSubmitter) submitted() []submit.Submission {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]submit.Submission(nil), f.subs...)
}

// answered is the response of sub's one call, res.
func answered(sub submit.Submission, res protocol.ToolResult) *submit.Outcome {
	c := sub.Request.ToolCalls[0]
	res.ToolCallID, res.Name = c.ToolCallID, c.Name
	return &submit.Outcome{Response: &protocol.Response{RequestID: sub.Request.RequestID, SessionID: sub.Request.SessionID,
		Status: protocol.StatusSuccess, Results: []protocol.ToolResult{res}}}
}

// fakeAdmitter admits every ask refuse lets through, and keeps the asks.
type fakeAdmitter struct {
	mu     sync.Mutex
	refuse func(ask admission.Ask) error
	asks   []admission.Ask
}

func (f *fakeAdmitter) Admit(_ context.Context, ask admission.Ask) (*admission.Ticket, error) {
	f.mu.Lock()
	f.asks = append(f.asks, ask)
	refuse := f.refuse
	f.mu.Unlock()
	if refuse != nil {
		if err := refuse(ask); err != nil {
			return nil, err
		}
	}
	return &admission.Ticket{Owner: ask.Actor.Owner(), Caller: ask.Actor.Record()}, nil
}

func (f *fakeAdmitter) set(refuse func(ask admission.Ask) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refuse = refuse
}

func (f *fakeAdmitter) asked() []admission.Ask {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]admission.Ask(nil), f.asks...)
}

type fakeContracts struct {
	tools []*contract.Compiled
	err   error
}

func (f *fakeContracts) Tools(context.Context) ([]*contract.Compiled, error) { return f.tools, f.err }

func compiled(tb testing.TB, src string) *contract.Compiled {
	tb.Helper()
	var c contract.Contract
	if err := json.Unmarshal([]byte(src), &c); err != nil {
		tb.Fatal(err)
	}
	k, err := contract.Compile(&c, 1, 1)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

// harness is the MCP endpoint served over HTTP.
type harness struct {
	t         *testing.T
	srv       *Server
	sub       *fakeSubmitter
	adm       *fakeAdmitter
	kv        *bustest.MemKV
	contracts *fakeContracts
	url       string
	handler   http.Handler
}

func newHarness(t *testing.T, tweak func(*Env)) *harness {
	t.Helper()
	h := &harness{t: t, sub: &fakeSubmitter{}, adm: &fakeAdmitter{}, kv: bustest.NewMemKV(), contracts: &fakeContracts{tools: []*contract.Compiled{
		compiled(t, `{"name":"lookup","description":"looks up","effects":"none","input_schema":{"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}}`),
		compiled(t, `{"name":"book","description":"books","input_schema":{"type":"object"}}`),
		compiled(t, `{"name":"pay","description":"pays","effects":"side_effects","input_schema":{"amount":{"type":"integer","required":true}}}`),
		compiled(t, `{"name":"scalar","description":"takes a number","input_schema":{"type":"number"}}`),
	}}}
	env := Env{Submit: h.sub, Admit: h.adm, Contracts: h.contracts, Sessions: h.kv}
	if tweak != nil {
		tweak(&env)
	}
	var err error
	if h.srv, err = New(env); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	for _, r := range h.srv.Routes() {
		mux.HandleFunc(r.Pattern, r.Handler)
	}
	// The gateway's authentication, as far as the endpoint sees it: the caller on the context.
	h.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			r = r.WithContext(admission.WithCaller(r.Context(), &auth.Caller{ID: "key:" + name, Name: name, Role: auth.RoleUser}))
		}
		mux.ServeHTTP(w, r)
	})
	ts := httptest.NewServer(h.handler)
	t.Cleanup(ts.Close)
	h.url = ts.URL + "/mcp"
	return h
}

// bearer sends every request as the caller name.
type bearer struct{ name string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.name)
	return http.DefaultTransport.RoundTrip(r)
}

// client connects the official SDK's client as the caller name.
func (h *harness) client(name string) *mcp.ClientSession {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), 10*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: h.url, HTTPClient: &http.Client{Transport: bearer{name}}, DisableStandaloneSSE: true}, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// reply is a raw answer.
type reply struct {
	code   int
	header http.Header
	body   string
}

// json is the answer as a JSON object.
func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(r.body), &m); err != nil {
		t.Fatalf("not a JSON object (%v): %d %s", err, r.code, r.body)
	}
	return m
}

// send serves one raw request as the caller name, in session (none: ""), with headers given as
// name, value, ….
func (h *harness) send(method, name, session, body string, headers ...string) reply {
	h.t.Helper()
	req := httptest.NewRequestWithContext(h.t.Context(), method, "/mcp", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+name)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	if session != "" {
		req.Header.Set(mcpSessionHeader, session)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	h.handler.ServeHTTP(rec, req)
	return reply{code: rec.Code, header: rec.Header(), body: rec.Body.String()}
}

const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

// initialized is a session of name's, made by a raw initialize.
func (h *harness) initialized(name string) string {
	h.t.Helper()
	r := h.send(http.MethodPost, name, "", initialize)
	id := r.header.Get(mcpSessionHeader)
	if r.code != http.StatusOK || id == "" {
		h.t.Fatalf("initialize: %d %v %s", r.code, r.header, r.body)
	}
	return id
}

// callBody is a tools/call of tool with arguments (JSON) under the JSON-RPC id.
func callBody(id, tool, arguments string) string {
	return `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + arguments + `}}`
}
