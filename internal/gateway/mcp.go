package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Hermes as an MCP server: POST /mcp speaks the Model Context Protocol's Streamable HTTP
// transport (the official Go SDK, run stateless), for any MCP client — Claude Code, Cursor, an
// agent framework. tools/list lists the registered tools' contracts with their input schemas;
// tools/call is a HermesRequest like any other, answered once its response is recorded.
//
// No replica keeps anything of a session: initialize makes a session id that is kept on the bus
// (hermes-sessions, with the caller it belongs to), and any gateway answers any request of it.
// A call's request_id is derived from the caller, the session and the JSON-RPC id, so a call
// sent again (a client that lost its connection, another replica) runs nothing twice and gets
// the first run's result; a call whose client went away keeps running, and sending it again
// retrieves its result. Calls outside a session (a client that skipped initialize) are not
// deduplicated. Server-to-client requests (elicitation, sampling) are not offered: a stateless
// server has no stream to send them on.

// Headers of the MCP transport, and the gateway's own between its handler and the SDK's.
const (
	mcpSessionHeader = "Mcp-Session-Id"
	// mcpCallHeader carries, from the gateway's handler to the SDK's, the token of the call's
	// context (who, which session, which id); a client's own is removed first.
	mcpCallHeader = "X-Hermes-Mcp-Call"
)

// mcpCall is what the gateway knows of one MCP request when the SDK hands it over.
type mcpCall struct {
	actor   actor
	session string // the MCP session ("" for none)
	rpcID   string // the JSON-RPC id, as JSON
	trace   protocol.TraceContext
}

// mcpSession is an MCP session as kept on the bus.
type mcpSession struct {
	Owner   string    `json:"owner"`
	Created time.Time `json:"created"`
}

// mcpKey is where an MCP session is kept in hermes-sessions.
func mcpKey(id string) string { return "mcp." + id }

// mcpServer is the gateway's MCP endpoint.
type mcpServer struct {
	g       *Gateway
	handler http.Handler
	calls   sync.Map // token → *mcpCall, while its HTTP request is served
}

func (g *Gateway) registerMCP() {
	if g.cfg.Bus == nil || g.cfg.Bus.Contracts == nil || g.cfg.Bus.Sessions == nil {
		return
	}
	m := &mcpServer{g: g}
	server := mcp.NewServer(&mcp.Implementation{Name: "hermes", Title: "Hermes", Version: "1"}, &mcp.ServerOptions{
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}},
		Instructions: "Hermes runs each tool call on a durable bus: retried by policy, recorded, and answered once. " +
			"Arguments are checked against each tool's input schema; an error result says which field is wrong.",
	})
	server.AddReceivingMiddleware(m.middleware)
	m.handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true, MaxRequestBodyBytes: g.cfg.MaxBodyBytes})
	g.mux.HandleFunc("POST /mcp", g.require(auth.PermSubmit, m.serve))
	g.mux.HandleFunc("GET /mcp", g.require(auth.PermSubmit, m.handler.ServeHTTP))
	g.mux.HandleFunc("DELETE /mcp", g.require(auth.PermSubmit, m.serve))
}

// serve checks the session, notes who calls, and hands the request to the SDK.
func (m *mcpServer) serve(w http.ResponseWriter, r *http.Request) {
	r.Header.Del(mcpCallHeader)
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.g.cfg.MaxBodyBytes))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, protocol.CodeBodyTooLarge, fmt.Sprintf("an MCP message is at most %d bytes", m.g.cfg.MaxBodyBytes), nil)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if t := bytes.TrimLeft(body, " \t\r\n"); len(t) > 0 && t[0] == '[' {
		// A batch: each of its calls would need an id of its own to be deduplicated, and MCP
		// has had no batches since 2025-06-18.
		writeJSON(w, http.StatusBadRequest, map[string]any{"jsonrpc": "2.0", "id": nil,
			"error": map[string]any{"code": jsonrpc.CodeInvalidRequest, "message": "JSON-RPC batches are not taken: send one message per request"}})
		return
	}
	// The method and id as the SDK reads them: keys matched exactly.
	var fields map[string]json.RawMessage
	_ = json.NewDecoder(bytes.NewReader(body)).Decode(&fields) // the first value, as the SDK reads it; what is not JSON-RPC is its to refuse
	var head struct {
		Method string
		ID     json.RawMessage
	}
	_ = json.Unmarshal(fields["method"], &head.Method)
	head.ID = fields["id"]
	a := actor{caller: CallerOf(r.Context())}
	if head.Method == "tools/call" && a.caller != nil {
		release, ok := m.g.limits.hold(w, a.caller, holdWaiting)
		if !ok {
			return
		}
		defer release()
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	session := r.Header.Get(mcpSessionHeader)
	switch {
	case r.Method == http.MethodDelete:
		if session != "" {
			if err := m.end(ctx, session, a); err != nil {
				m.unknown(w, err)
				return
			}
		}
		w.WriteHeader(http.StatusNoContent)
		return
	case head.Method == "initialize":
		id, err := m.begin(ctx, a)
		if err != nil {
			m.g.log.Warn("keep an MCP session", "err", err)
			writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the session could not be kept; retry", nil)
			return
		}
		w.Header().Set(mcpSessionHeader, id)
		session = ""
	case session != "":
		if err := m.check(ctx, session, a); err != nil {
			m.unknown(w, err)
			return
		}
	}
	trace, _ := traceOf(r)
	var b [16]byte
	_, _ = rand.Read(b[:])
	token := hex.EncodeToString(b[:])
	m.calls.Store(token, &mcpCall{actor: a, session: session, rpcID: string(head.ID), trace: trace})
	defer m.calls.Delete(token)
	r.Header.Set(mcpCallHeader, token)
	m.handler.ServeHTTP(w, r)
}

// errNoSession: the session is not known (ended, expired, never made, or someone else's).
var errNoSession = errors.New("no such MCP session")

func (m *mcpServer) unknown(w http.ResponseWriter, err error) {
	if errors.Is(err, errNoSession) {
		// The transport's answer to an unknown session: the client starts a new one.
		writeError(w, http.StatusNotFound, protocol.CodeNotFound, "no such MCP session: initialize a new one", nil)
		return
	}
	m.g.log.Warn("read an MCP session", "err", err)
	writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the session could not be read; retry", nil)
}

// begin makes a session for a, kept on the bus so that every replica knows it.
func (m *mcpServer) begin(ctx context.Context, a actor) (string, error) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	data, _ := json.Marshal(mcpSession{Owner: a.owner(), Created: time.Now().UTC()})
	_, err := m.g.cfg.Bus.Sessions.Create(ctx, mcpKey(id), data)
	return id, err
}

// check says whether session is one a made.
func (m *mcpServer) check(ctx context.Context, session string, a actor) error {
	if !protocol.ValidToken(session, 64) {
		return errNoSession
	}
	e, err := m.g.cfg.Bus.Sessions.Get(ctx, mcpKey(session))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return errNoSession
	case err != nil:
		return err
	}
	var s mcpSession
	if json.Unmarshal(e.Value(), &s) != nil || s.Owner != a.owner() {
		return errNoSession
	}
	return nil
}

// end forgets a session of a's.
func (m *mcpServer) end(ctx context.Context, session string, a actor) error {
	if err := m.check(ctx, session, a); err != nil {
		return err
	}
	return m.g.cfg.Bus.Sessions.Delete(ctx, mcpKey(session))
}

// middleware answers tools/list and tools/call from Hermes; the SDK answers the rest
// (initialize, ping, …).
func (m *mcpServer) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "tools/list":
			return m.list(ctx)
		case "tools/call":
			var call *mcpCall
			if extra := req.GetExtra(); extra != nil && extra.Header != nil {
				if v, ok := m.calls.Load(extra.Header.Get(mcpCallHeader)); ok {
					call = v.(*mcpCall)
				}
			}
			p, ok := req.GetParams().(*mcp.CallToolParamsRaw)
			if call == nil || !ok {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the call could not be placed"}
			}
			return m.call(ctx, call, p)
		}
		return next(ctx, method, req)
	}
}

// list is tools/list: every registered tool, with its input schema.
func (m *mcpServer) list(ctx context.Context) (mcp.Result, error) {
	entries, _, err := m.g.tools.List(ctx)
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the tools could not be read; retry"}
	}
	out := &mcp.ListToolsResult{Tools: []*mcp.Tool{}}
	for _, e := range entries {
		schema := m.schema(e.Contract, e.Revision)
		if schema == nil {
			continue
		}
		var top struct {
			Type any `json:"type"`
		}
		if json.Unmarshal(schema, &top) != nil || top.Type != "object" {
			// MCP clients take only tools whose arguments are an object (some refuse the
			// whole list otherwise): a contract saying otherwise is not listed here.
			continue
		}
		t := &mcp.Tool{Name: e.Contract.Name, Description: e.Contract.Description, InputSchema: schema}
		switch e.Contract.EffectsOrDefault() {
		case contract.EffectsNone:
			t.Annotations = &mcp.ToolAnnotations{ReadOnlyHint: true}
		case contract.EffectsIdempotent:
			f := false
			t.Annotations = &mcp.ToolAnnotations{IdempotentHint: true, DestructiveHint: &f}
		}
		out.Tools = append(out.Tools, t)
	}
	return out, nil
}

// schema is a contract's input schema as JSON Schema.
func (m *mcpServer) schema(c contract.Contract, revision uint64) json.RawMessage {
	k := m.g.compiled(c, revision)
	if k == nil {
		return nil
	}
	return k.InputJSONSchema()
}

// call is tools/call: one HermesRequest of one call, answered when its response is recorded.
func (m *mcpServer) call(ctx context.Context, c *mcpCall, p *mcp.CallToolParamsRaw) (mcp.Result, error) {
	g := m.g
	if err := protocol.CheckToolName("name", p.Name); err != nil {
		return mcpError("UNKNOWN_TOOL", "no tool "+protocol.Shorten(p.Name, 64)+": "+err.Error(), "call one of the tools tools/list names"), nil
	}
	args := p.Arguments
	if len(bytes.TrimSpace(args)) == 0 || string(bytes.TrimSpace(args)) == "null" {
		args = json.RawMessage(`{}`)
	}
	session, requestID := "", ""
	if c.session != "" {
		// The session's call with this JSON-RPC id, whoever sends it again and wherever.
		session = "mcp-" + c.session
		sum := sha256.Sum256([]byte(c.actor.owner() + "\x00" + c.session + "\x00" + c.rpcID))
		requestID = "mcp-" + hex.EncodeToString(sum[:20])
	} else {
		var b [16]byte
		_, _ = rand.Read(b[:])
		requestID = "mcp-" + hex.EncodeToString(b[:])
		session = requestID
	}
	req := &protocol.Request{RequestID: requestID, SessionID: session, Intent: "mcp tools/call " + p.Name,
		ToolCalls: []protocol.ToolCall{{ToolCallID: "call", Name: p.Name, Arguments: args}}}
	if err := req.Validate(g.cfg.Limits); err != nil {
		return mcpError(protocol.CodeBadArguments, err.Error(), "send the arguments as one JSON object, within the bound the message names"), nil
	}
	sub := submit.Submission{Request: req, Trace: c.trace, Wait: g.cfg.MaxWait, Size: len(args)}
	if c.actor.caller != nil {
		owner, err := g.owners.claim(ctx, session, c.actor.owner(), nil)
		if err != nil || owner != c.actor.owner() {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the session could not be claimed; retry"}
		}
		sub.Caller, sub.Owner = c.actor.record(), owner
	}
	adm, why := g.store.admit(len(args))
	defer adm.close()
	if why != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: *why}
	}
	// Accepted, the call runs to its end whether or not the client stays (Submit finishes
	// accepting and publishing on its own; ctx bounds only the wait).
	out, err := g.submit.Submit(ctx, sub)
	adm.settle(out, err)
	switch {
	case errors.Is(err, submit.ErrConflict):
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "this JSON-RPC id was used in this session for another call"}
	case errors.Is(err, submit.ErrOverBudget):
		return mcpError(protocol.CodeRateLimited, err.Error(), "call again later"), nil
	case errors.Is(err, submit.ErrTooLarge):
		return mcpError(protocol.CodeBodyTooLarge, strings.TrimPrefix(err.Error(), submit.ErrTooLarge.Error()+": "), "send smaller arguments"), nil
	case ctx.Err() != nil:
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the client went away; the call runs on: send it again with the same id to receive its result"}
	case err != nil:
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the call could not be accepted; send it again with the same id"}
	case out.Pending:
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the call is still running; send it again with the same id to receive its result"}
	}
	return mcpResult(out.Response), nil
}

// mcpResult is a response as an MCP client reads it: the tool's answer as text (and as
// structured content when it is a JSON object), or an error result naming the problem.
func mcpResult(resp *protocol.Response) *mcp.CallToolResult {
	if len(resp.Results) == 0 {
		msg := "the call has no result"
		if resp.Error != nil {
			msg = resp.Error.Code + ": " + resp.Error.Message
		}
		return mcpError(protocol.CodeInternal, msg, "")
	}
	r := resp.Results[0]
	if r.Status != protocol.ResultOK {
		var what string
		if json.Unmarshal(r.Content, &what) != nil {
			what = string(r.Content)
		}
		return mcpError(r.ErrorCode, what, r.RecoveryHint)
	}
	res := &mcp.CallToolResult{}
	if c := bytes.TrimSpace(r.Content); len(c) > 0 && c[0] == '[' && bytes.Contains(c, []byte(`"type"`)) {
		// An MCP tool's content blocks (an MCP server's tool through Hermes): passed on as
		// blocks, not as their JSON text.
		var blocks mcp.CallToolResult
		if json.Unmarshal([]byte(`{"content":`+string(c)+`}`), &blocks) == nil && len(blocks.Content) > 0 {
			res.Content = blocks.Content
			return res
		}
	}
	var text string
	if json.Unmarshal(r.Content, &text) != nil {
		text = string(r.Content)
	}
	res.Content = []mcp.Content{&mcp.TextContent{Text: text}}
	if c := bytes.TrimSpace(r.Content); len(c) > 0 && c[0] == '{' {
		res.StructuredContent = json.RawMessage(c)
	}
	return res
}

// mcpError is an error result a model can read and act on.
func mcpError(code, what, hint string) *mcp.CallToolResult {
	text := code + ": " + what
	if hint != "" {
		text += "\nhint: " + hint
	}
	res := &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: strings.TrimSpace(text)}}}
	return res
}
