// Package mcpserver is Hermes as an MCP server: POST /mcp speaks the Model Context Protocol's Streamable HTTP
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
//
// Each call is admitted like every request (package admission): the caller, the end user it
// names, its limits, the session, the record's room.
//
// The blueprints a caller may run (Env.Blueprints) are tools too: tools/list lists each with
// its description and its user_input's schema (blueprint.InputSchema), and tools/call of one
// runs it (Env.RunBlueprint, as POST /v1/blueprints/{name}/runs would) and waits for it up to
// MaxWait: its outputs by output_key, an error result naming the fallback taken and the step
// that failed, or, while it goes on (a step waiting on an approval), where to follow it. In a
// session, the run's id follows from the call's, as a tool call's request id does, so a call
// sent again is the same run. A registered tool and a blueprint of the same name: the tool is
// listed and called, and the blueprint is not offered here.
package mcpserver

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
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/internal/httpapi"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/blueprint"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Headers of the MCP transport, and the gateway's own between its handler and the SDK's.
const (
	mcpSessionHeader = "Mcp-Session-Id"
	// mcpCallHeader carries, from the gateway's handler to the SDK's, the token of the call's
	// context (who, which session, which id); a client's own is removed first.
	mcpCallHeader = "X-Hermes-Mcp-Call"
)

// mcpCall is what the gateway knows of one MCP request when the SDK hands it over.
type mcpCall struct {
	actor   admission.Actor
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

// Submitter submits a call's request (submit.Submitter).
type Submitter interface {
	Submit(ctx context.Context, sub submit.Submission) (*submit.Outcome, error)
}

// Admitter admits a request (admission.Admitter).
type Admitter interface {
	Admit(ctx context.Context, ask admission.Ask) (*admission.Ticket, error)
}

// Contracts are the registered tools' contracts as they are now (registry.Live).
type Contracts interface {
	Tools(ctx context.Context) ([]*contract.Compiled, error)
}

// KV is where MCP sessions are kept (hermes-sessions; jetstream.KeyValue).
type KV interface {
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error
}

// Env is what the server works with.
type Env struct {
	Submit    Submitter
	Admit     Admitter
	Contracts Contracts
	Sessions  KV
	// Limits bound each call; zero fields take protocol.DefaultLimits.
	Limits protocol.Limits
	// MaxBodyBytes bounds an MCP message (default 1 MiB); MaxWait a call's wait for its result
	// (default 5 min).
	MaxBodyBytes int64
	MaxWait      time.Duration
	// Offers, when set, says whether a caller of role is offered tool (its contract k) in
	// tools/list (the gateway's, by the tool's policy); nil offers every tool.
	Offers func(tool string, k *contract.Compiled, role string) bool
	// Blueprints, when set, are the blueprints a caller of role may run (the gateway's
	// Blueprints): tools/list lists each as a tool, and tools/call of one runs it through
	// RunBlueprint (the gateway's), then required.
	Blueprints   func(ctx context.Context, role string) ([]*blueprint.Blueprint, error)
	RunBlueprint func(ctx context.Context, a admission.Actor, ask blueprints.Ask) (*blueprints.Run, bool, error)
	Logger       *slog.Logger
}

// Server is Hermes' MCP endpoint.
type Server struct {
	env     Env
	log     *slog.Logger
	handler http.Handler
	calls   sync.Map // token → *mcpCall, while its HTTP request is served
}

// New returns the MCP endpoint working with env (Submit, Admit, Contracts and Sessions
// required).
func New(env Env) (*Server, error) {
	if env.Submit == nil || env.Admit == nil || env.Contracts == nil || env.Sessions == nil {
		return nil, errors.New("mcpserver: Env.Submit, Admit, Contracts and Sessions are required")
	}
	if env.Blueprints != nil && env.RunBlueprint == nil {
		return nil, errors.New("mcpserver: Env.Blueprints needs Env.RunBlueprint")
	}
	if env.MaxBodyBytes <= 0 {
		env.MaxBodyBytes = 1 << 20
	}
	if env.MaxWait <= 0 {
		env.MaxWait = 5 * time.Minute
	}
	if env.Logger == nil {
		env.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Server{env: env, log: env.Logger}
	server := mcp.NewServer(&mcp.Implementation{Name: "hermes", Title: "Hermes", Version: "1"}, &mcp.ServerOptions{
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}},
		Instructions: "Hermes runs each tool call on a durable bus: retried by policy, recorded, and answered once. " +
			"Arguments are checked against each tool's input schema; an error result says which field is wrong.",
	})
	server.AddReceivingMiddleware(m.middleware)
	m.handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true, MaxRequestBodyBytes: env.MaxBodyBytes})
	return m, nil
}

// Routes are /mcp's methods, each needing auth.PermSubmit.
func (m *Server) Routes() []httpapi.Route {
	return []httpapi.Route{
		{Pattern: "POST /mcp", Need: auth.PermSubmit, Handler: m.serve},
		{Pattern: "GET /mcp", Need: auth.PermSubmit, Handler: m.handler.ServeHTTP},
		{Pattern: "DELETE /mcp", Need: auth.PermSubmit, Handler: m.serve},
	}
}

// serve checks the session, notes who calls, and hands the request to the SDK.
func (m *Server) serve(w http.ResponseWriter, r *http.Request) {
	r.Header.Del(mcpCallHeader)
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.env.MaxBodyBytes))
	if err != nil {
		httpapi.WriteError(w, http.StatusRequestEntityTooLarge, protocol.CodeBodyTooLarge, fmt.Sprintf("an MCP message is at most %d bytes", m.env.MaxBodyBytes), nil)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if t := bytes.TrimLeft(body, " \t\r\n"); len(t) > 0 && t[0] == '[' {
		// A batch: each of its calls would need an id of its own to be deduplicated, and MCP
		// has had no batches since 2025-06-18.
		httpapi.WriteJSON(w, http.StatusBadRequest, map[string]any{"jsonrpc": "2.0", "id": nil,
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
	a, refused := admission.ActorOf(r, "")
	if refused != nil {
		httpapi.WriteRefusal(w, refused)
		return
	}
	if head.Method == "tools/call" {
		// The call waits for its result: it holds one of the caller's waiting requests. Its
		// session and the record's room are admitted with the call (call).
		t, err := m.env.Admit.Admit(r.Context(), admission.Ask{Actor: a, Need: auth.PermSubmit, Mode: admission.NoSession,
			Hold: admission.HoldWaiting, Store: admission.StoreNone})
		if err != nil {
			httpapi.WriteRefusal(w, refusalOf(err))
			return
		}
		defer t.Close()
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
			m.log.Warn("keep an MCP session", "err", err)
			httpapi.WriteError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the session could not be kept; retry", nil)
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
	trace, _ := httpapi.TraceOf(r)
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

func (m *Server) unknown(w http.ResponseWriter, err error) {
	if errors.Is(err, errNoSession) {
		// The transport's answer to an unknown session: the client starts a new one.
		httpapi.WriteError(w, http.StatusNotFound, protocol.CodeNotFound, "no such MCP session: initialize a new one", nil)
		return
	}
	m.log.Warn("read an MCP session", "err", err)
	httpapi.WriteError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the session could not be read; retry", nil)
}

// begin makes a session for a, kept on the bus so that every replica knows it.
func (m *Server) begin(ctx context.Context, a admission.Actor) (string, error) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	data, _ := json.Marshal(mcpSession{Owner: a.Owner(), Created: time.Now().UTC()})
	_, err := m.env.Sessions.Create(ctx, mcpKey(id), data)
	return id, err
}

// check says whether session is one a made.
func (m *Server) check(ctx context.Context, session string, a admission.Actor) error {
	if !protocol.ValidToken(session, 64) {
		return errNoSession
	}
	e, err := m.env.Sessions.Get(ctx, mcpKey(session))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return errNoSession
	case err != nil:
		return err
	}
	var s mcpSession
	if json.Unmarshal(e.Value(), &s) != nil || s.Owner != a.Owner() {
		return errNoSession
	}
	return nil
}

// end forgets a session of a's.
func (m *Server) end(ctx context.Context, session string, a admission.Actor) error {
	if err := m.check(ctx, session, a); err != nil {
		return err
	}
	return m.env.Sessions.Delete(ctx, mcpKey(session))
}

// middleware answers tools/list and tools/call from Hermes; the SDK answers the rest
// (initialize, ping, …).
func (m *Server) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "tools/list":
			return m.list(ctx, m.callOf(req))
		case "tools/call":
			call := m.callOf(req)
			p, ok := req.GetParams().(*mcp.CallToolParamsRaw)
			if call == nil || !ok {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the call could not be placed"}
			}
			return m.call(ctx, call, p)
		}
		return next(ctx, method, req)
	}
}

// callOf is what the gateway's handler knew of req's HTTP request; nil when nothing.
func (m *Server) callOf(req mcp.Request) *mcpCall {
	if extra := req.GetExtra(); extra != nil && extra.Header != nil {
		if v, ok := m.calls.Load(extra.Header.Get(mcpCallHeader)); ok {
			return v.(*mcpCall)
		}
	}
	return nil
}

// list is tools/list: every registered tool offered to c's caller (Env.Offers), with its
// input schema.
func (m *Server) list(ctx context.Context, c *mcpCall) (mcp.Result, error) {
	tools, err := m.env.Contracts.Tools(ctx)
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the tools could not be read; retry"}
	}
	role := ""
	if c != nil {
		role = c.actor.Role()
	}
	out := &mcp.ListToolsResult{Tools: []*mcp.Tool{}}
	registered := map[string]bool{}
	for _, k := range tools {
		registered[k.Name] = true
	}
	for _, k := range tools {
		if m.env.Offers != nil && !m.env.Offers(k.Name, k, role) {
			continue
		}
		schema := k.InputJSONSchema()
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
		t := &mcp.Tool{Name: k.Name, Description: k.Description, InputSchema: schema}
		switch k.EffectsOrDefault() {
		case contract.EffectsNone:
			t.Annotations = &mcp.ToolAnnotations{ReadOnlyHint: true}
		case contract.EffectsIdempotent:
			f := false
			t.Annotations = &mcp.ToolAnnotations{IdempotentHint: true, DestructiveHint: &f}
		}
		out.Tools = append(out.Tools, t)
	}
	bps, err := m.blueprintTools(ctx, role, tools, registered)
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the blueprints could not be read; retry"}
	}
	out.Tools = append(out.Tools, bps...)
	return out, nil
}

// call is tools/call: one HermesRequest of one call, answered when its response is recorded.
func (m *Server) call(ctx context.Context, c *mcpCall, p *mcp.CallToolParamsRaw) (mcp.Result, error) {
	if err := protocol.CheckToolName("name", p.Name); err != nil {
		return mcpError("UNKNOWN_TOOL", "no tool "+protocol.Shorten(p.Name, 64)+": "+err.Error(), "call one of the tools tools/list names"), nil
	}
	args := p.Arguments
	if len(bytes.TrimSpace(args)) == 0 || string(bytes.TrimSpace(args)) == "null" {
		args = json.RawMessage(`{}`)
	}
	switch bp, err := m.isBlueprint(ctx, c, p.Name); {
	case err != nil:
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the blueprints could not be read; nothing ran: send the call again"}
	case bp:
		return m.runBlueprint(ctx, c, p.Name, args)
	}
	session, requestID := "", ""
	if c.session != "" {
		// The session's call with this JSON-RPC id, whoever sends it again and wherever.
		session = "mcp-" + c.session
		sum := sha256.Sum256([]byte(c.actor.Owner() + "\x00" + c.session + "\x00" + c.rpcID))
		requestID = "mcp-" + hex.EncodeToString(sum[:20])
	} else {
		var b [16]byte
		_, _ = rand.Read(b[:])
		requestID = "mcp-" + hex.EncodeToString(b[:])
		session = requestID
	}
	req := &protocol.Request{RequestID: requestID, SessionID: session, Intent: "mcp tools/call " + p.Name,
		ToolCalls: []protocol.ToolCall{{ToolCallID: "call", Name: p.Name, Arguments: args}},
		// A call its policy parks runs when the client calls it again once it is approved.
		Recall: true}
	if err := req.Validate(m.env.Limits); err != nil {
		return mcpError(protocol.CodeBadArguments, err.Error(), "send the arguments as one JSON object, within the bound the message names"), nil
	}
	t, err := m.env.Admit.Admit(ctx, admission.Ask{Actor: c.actor, Need: auth.PermSubmit, Session: session, Size: len(args)})
	if err != nil {
		r := refusalOf(err)
		if r.Status == http.StatusTooManyRequests {
			return mcpError(r.Code, r.Message, "call again later"), nil
		}
		return nil, rpcError(r)
	}
	defer t.Close()
	sub := submit.Submission{Request: req, Trace: c.trace, Wait: m.env.MaxWait, Size: len(args), Caller: t.Caller, Owner: t.Owner}
	// Accepted, the call runs to its end whether or not the client stays (Submit finishes
	// accepting and publishing on its own; ctx bounds only the wait).
	out, err := m.env.Submit.Submit(ctx, sub)
	t.Accepted(err == nil && !out.Replayed)
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

// refusalOf is err as a refusal: an admission's, or the bus failing.
func refusalOf(err error) *admission.Refusal {
	if r := admission.AsRefusal(err); r != nil {
		return r
	}
	return &admission.Refusal{Status: http.StatusServiceUnavailable, Code: protocol.CodeBusUnavailable, Message: "the bus is not reachable; retry",
		RetryAfter: time.Second}
}

// rpcError is a refusal of a call as a JSON-RPC error: its message, and its status and Hermes'
// code as the error's data.
func rpcError(r *admission.Refusal) *jsonrpc.Error {
	data, _ := json.Marshal(map[string]any{"status": r.Status, "code": r.Code})
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: r.Message, Data: data}
}
