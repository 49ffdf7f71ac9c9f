// Package mcpexec runs calls of kind mcp: tools of MCP servers (the Model Context Protocol) that
// a tool worker holds sessions with, through the official Go SDK (modelcontextprotocol/go-sdk).
//
// The servers come only from the worker's own configuration (Server): a program started over
// stdio, or a Streamable HTTP endpoint. A call names a server by its name and the tool by its
// name there (protocol.MCPAction); nothing in a call can make a worker start a program or reach
// a URL of the caller's choosing.
//
// Guarantees: each server is kept connected — a program that does not start, dies or answers
// what is not MCP is started (or reached) again with backoff (0.5 s doubling to 30 s), and its
// state is always known (States). Its tools are listed on every connect and again when the
// server says its list changed; Has and Changed tell the worker which tools are served here now.
// A call to a server that is not connected, or whose connection ends mid-call, is
// TOOL_UNREACHABLE and retryable (the worker retries it by the route's policy, with the same
// idempotency key); an isError result is the tool's failure (TOOL_FAILED, origin tool) carrying
// the server's text; structured content is the result when the server gives one, its content
// blocks otherwise; a result over the call's MaxResultBytes is RESULT_TOO_LARGE.
package mcpexec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
)

// Server is one MCP server as a worker's configuration names it. Exactly one of Command and
// URL is set.
type Server struct {
	// Name is how calls name the server (a token: letters, digits, '-', '_').
	Name string `yaml:"name" json:"name"`
	// Prefix starts the Hermes name of each of its tools: Prefix + the tool's name, mapped to
	// a valid tool name. Empty: Name + "__".
	Prefix string `yaml:"prefix" json:"prefix,omitempty"`
	// Command runs the server over stdio: the program and its arguments; Env is added to the
	// worker's environment for it, Dir is where it runs.
	Command []string          `yaml:"command" json:"command,omitempty"`
	Env     map[string]string `yaml:"env" json:"-"`
	Dir     string            `yaml:"dir" json:"dir,omitempty"`
	// URL is a Streamable HTTP endpoint (http or https).
	URL string `yaml:"url" json:"url,omitempty"`
}

// Check says what is wrong with s, naming the field.
func (s *Server) Check() error {
	if err := protocol.CheckID("name", s.Name); err != nil {
		return err
	}
	switch {
	case len(s.Command) > 0 && s.URL != "":
		return fmt.Errorf("server %s: give command or url, not both", s.Name)
	case len(s.Command) == 0 && s.URL == "":
		return fmt.Errorf("server %s: give command (stdio) or url (Streamable HTTP)", s.Name)
	case s.URL != "" && !strings.HasPrefix(s.URL, "http://") && !strings.HasPrefix(s.URL, "https://"):
		return fmt.Errorf("server %s: url must be http:// or https://", s.Name)
	case len(s.Command) > 0 && s.Command[0] == "":
		return fmt.Errorf("server %s: command names no program", s.Name)
	}
	if s.Prefix != "" && !protocol.ValidToken(s.Prefix, protocol.MaxToolNameLen/2) {
		return fmt.Errorf("server %s: prefix %q must be letters, digits, '-' and '_', at most %d", s.Name, s.Prefix, protocol.MaxToolNameLen/2)
	}
	return nil
}

func (s *Server) prefix() string {
	if s.Prefix != "" {
		return s.Prefix
	}
	return s.Name + "__"
}

// passedEnv are the worker's environment variables a server program gets (what a program needs
// to run, nothing of Hermes': the worker's keys and credentials stay with the worker; a server
// that needs a secret is given it by its Env).
var passedEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TMPDIR", "TZ", "LANG", "LC_ALL", "LC_CTYPE",
	"SYSTEMROOT", "APPDATA", "NODE_PATH", "NODE_OPTIONS", "PYTHONPATH", "VIRTUAL_ENV"}

// serverEnv is the environment of a server program: passedEnv as the worker has them, and env.
func serverEnv(env map[string]string) []string {
	var out []string
	for _, k := range passedEnv {
		if v, ok := os.LookupEnv(k); ok {
			out = append(out, k+"="+v)
		}
	}
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// Tool is one tool of a server, as Hermes serves it.
type Tool struct {
	// Name is the Hermes tool name: the server's prefix and the tool's name, mapped.
	Name   string `json:"name"`
	Server string `json:"server"`
	// MCPName is the tool's name as the server lists it.
	MCPName      string               `json:"mcp_name"`
	Description  string               `json:"description,omitempty"`
	InputSchema  json.RawMessage      `json:"input_schema,omitempty"`
	OutputSchema json.RawMessage      `json:"output_schema,omitempty"`
	Annotations  *mcp.ToolAnnotations `json:"annotations,omitempty"`
}

// ToolName maps an MCP tool's name to a Hermes tool name with prefix: characters a tool name may
// not hold become '_'. ok is false when the result is empty or too long (the tool is then not
// served, and said so).
func ToolName(prefix, mcpName string) (string, bool) {
	var b strings.Builder
	b.WriteString(prefix)
	for _, r := range mcpName {
		if r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	name := b.String()
	return name, mcpName != "" && protocol.ValidToken(name, protocol.MaxToolNameLen)
}

// The keys of a tools/call request's _meta that carry the call's turn on the resource it
// changes (state coordination): the transaction id, the fencing token (a number) and the
// resource.
const (
	MetaTx       = "hermes/tx"
	MetaFence    = "hermes/fence"
	MetaResource = "hermes/resource"
)

// States of a server's connection.
const (
	StateConnecting = "connecting"
	StateConnected  = "connected"
	StateRestarting = "restarting"
	StateError      = "error"
)

// State is what a worker knows of one server now.
type State struct {
	Server string    `json:"server"`
	State  string    `json:"state"`
	Since  time.Time `json:"since"`
	// Error is the last failure (not connecting, a connection lost), when there was one.
	Error string `json:"error,omitempty"`
	Tools int    `json:"tools"`
	// Skipped names tools whose names could not be mapped to a Hermes tool name.
	Skipped []string `json:"skipped,omitempty"`
	// Restarts counts the connections made again.
	Restarts int `json:"restarts"`
}

// Config configures an Executor.
type Config struct {
	Servers []Server
	// OnTools, when set, is told a server's tools each time they are listed (after a connect,
	// after the server said its list changed). It must not block for long.
	OnTools func(server string, tools []Tool)
	// Logger; nil discards.
	Logger *slog.Logger
}

// Executor runs calls of kind mcp on the configured servers while Run runs. It is safe for
// concurrent use.
type Executor struct {
	cfg     Config
	log     *slog.Logger
	servers map[string]*conn

	mu      sync.Mutex
	changed chan struct{} // closed and replaced when the set of tools changes
}

var (
	_ worker.Executor = (*Executor)(nil)
	_ worker.ToolSet  = (*Executor)(nil)
)

// New checks cfg and returns its executor; nothing connects until Run.
func New(cfg Config) (*Executor, error) {
	e := &Executor{cfg: cfg, log: cfg.Logger, servers: map[string]*conn{}, changed: make(chan struct{})}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	prefixes := map[string]string{}
	for i := range cfg.Servers {
		s := cfg.Servers[i]
		if err := s.Check(); err != nil {
			return nil, fmt.Errorf("mcpexec: servers[%d]: %w", i, err)
		}
		if _, dup := e.servers[s.Name]; dup {
			return nil, fmt.Errorf("mcpexec: server %s is named twice", s.Name)
		}
		if other, dup := prefixes[s.prefix()]; dup {
			return nil, fmt.Errorf("mcpexec: servers %s and %s share the prefix %q", other, s.Name, s.prefix())
		}
		prefixes[s.prefix()] = s.Name
		e.servers[s.Name] = &conn{srv: s, exec: e, state: State{Server: s.Name, State: StateConnecting, Since: time.Now()}}
	}
	return e, nil
}

// Kind is protocol.ActionMCP.
func (e *Executor) Kind() string { return protocol.ActionMCP }

// Has reports whether tool is one of a connected server's tools here.
func (e *Executor) Has(tool string) bool {
	for _, c := range e.servers {
		if c.has(tool) {
			return true
		}
	}
	return false
}

// Changed is closed when the set of tools served here changes.
func (e *Executor) Changed() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.changed
}

func (e *Executor) notify() {
	e.mu.Lock()
	close(e.changed)
	e.changed = make(chan struct{})
	e.mu.Unlock()
}

// States lists each server's state, by name.
func (e *Executor) States() []State {
	out := make([]State, 0, len(e.servers))
	for _, c := range e.servers {
		out = append(out, c.snapshot())
	}
	slices.SortFunc(out, func(a, b State) int { return strings.Compare(a.Server, b.Server) })
	return out
}

// Tools lists the tools of every connected server.
func (e *Executor) Tools() []Tool {
	var out []Tool
	for _, c := range e.servers {
		c.mu.Lock()
		for _, t := range c.tools {
			out = append(out, t)
		}
		c.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b Tool) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Run keeps every server connected until ctx ends, then closes the sessions (stopping the
// programs).
func (e *Executor) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, c := range e.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.run(ctx)
		}()
	}
	wg.Wait()
	return nil
}

// Backoff of reconnections.
const (
	firstBackoff = 500 * time.Millisecond
	maxBackoff   = 30 * time.Second
	// connectTimeout bounds starting a server and its initialization.
	connectTimeout = 30 * time.Second
)

// conn is one server's session, made again whenever it ends.
type conn struct {
	srv  Server
	exec *Executor

	mu      sync.Mutex
	session *mcp.ClientSession
	tools   map[string]Tool // by Hermes name
	state   State
	// listing: a relisting runs; relist: the server told of a change during it.
	listing, relist bool
}

func (c *conn) has(tool string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.tools[tool]
	return ok && c.session != nil
}

func (c *conn) snapshot() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.state
	s.Tools = len(c.tools)
	return s
}

func (c *conn) setState(state string, err error) {
	c.mu.Lock()
	c.state.State, c.state.Since = state, time.Now()
	if err != nil {
		c.state.Error = redact(protocol.Shorten(err.Error(), 512))
	} else if state == StateConnected {
		c.state.Error = ""
	}
	c.mu.Unlock()
}

func (c *conn) run(ctx context.Context) {
	log := c.exec.log.With("mcp_server", c.srv.Name)
	delay := firstBackoff
	for first := true; ; first = false {
		if !first {
			c.mu.Lock()
			c.state.Restarts++
			c.mu.Unlock()
		}
		start := time.Now()
		cs, err := c.connect(ctx)
		if ctx.Err() != nil {
			if cs != nil {
				_ = cs.Close()
			}
			return
		}
		if err != nil {
			log.Warn("MCP server could not be reached; trying again", "in", delay, "err", err)
			c.setState(StateError, err)
		} else {
			log.Info("MCP server connected")
			c.mu.Lock()
			c.session, c.listing = cs, true
			c.mu.Unlock()
			c.setState(StateConnected, nil)
			c.listAll(ctx, cs)
			waited := make(chan error, 1)
			go func() { waited <- cs.Wait() }()
			select {
			case <-ctx.Done():
				_ = cs.Close()
				<-waited
				c.drop()
				return
			case err = <-waited:
			}
			c.drop()
			if err == nil {
				err = errors.New("the server closed the session")
			}
			log.Warn("MCP server connection ended; connecting again", "in", delay, "err", err)
			c.setState(StateRestarting, err)
			if time.Since(start) > 2*maxBackoff {
				delay = firstBackoff // it served a while: a fresh failure
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, maxBackoff)
	}
}

// drop forgets the session and its tools (calls to them are unreachable until the next one).
func (c *conn) drop() {
	c.mu.Lock()
	c.session, c.tools = nil, nil
	c.mu.Unlock()
	c.exec.notify()
}

func (c *conn) connect(ctx context.Context) (*mcp.ClientSession, error) {
	var t mcp.Transport
	if c.srv.URL != "" {
		t = &mcp.StreamableClientTransport{Endpoint: c.srv.URL, MaxRetries: -1, DisableStandaloneSSE: false}
	} else {
		cmd := exec.Command(c.srv.Command[0], c.srv.Command[1:]...)
		cmd.Dir = c.srv.Dir
		cmd.Env = serverEnv(c.srv.Env)
		cmd.Stderr = &logWriter{log: c.exec.log.With("mcp_server", c.srv.Name)}
		t = &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}
	}
	relist := func(ctx context.Context, _ *mcp.ToolListChangedRequest) {
		// One listing at a time per server; a change told during one is listed after it.
		c.mu.Lock()
		cs := c.session
		if c.listing {
			c.relist = true
			cs = nil
		} else if cs != nil {
			c.listing = true
		}
		c.mu.Unlock()
		if cs == nil {
			return
		}
		go c.listAll(context.WithoutCancel(ctx), cs)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "hermes", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{}, ToolListChangedHandler: relist})
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	return client.Connect(cctx, t, nil)
}

// listAll lists the tools of cs (the caller set listing), again while the server told of a
// change meanwhile.
func (c *conn) listAll(ctx context.Context, cs *mcp.ClientSession) {
	for {
		c.list(ctx, cs, c.exec.log.With("mcp_server", c.srv.Name))
		c.mu.Lock()
		if c.session != cs { // a later session lists for itself
			c.mu.Unlock()
			return
		}
		again := c.relist
		c.relist, c.listing = false, again
		c.mu.Unlock()
		if !again {
			return
		}
	}
}

// list reads the server's tools and makes them the ones served.
func (c *conn) list(ctx context.Context, cs *mcp.ClientSession, log *slog.Logger) {
	lctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	tools := map[string]Tool{}
	var skipped []string
	for t, err := range cs.Tools(lctx, nil) {
		if err != nil {
			// A server that cannot list its tools serves none: the session is made again.
			log.Warn("could not list the MCP server's tools; connecting again", "err", err)
			c.setState(StateError, fmt.Errorf("tools/list: %w", err))
			c.reset(cs)
			return
		}
		name, ok := ToolName(c.srv.prefix(), t.Name)
		if !ok || len(t.Name) > protocol.MaxMCPToolNameBytes {
			skipped = append(skipped, protocol.Shorten(t.Name, 64))
			continue
		}
		if other, dup := tools[name]; dup {
			log.Warn("two MCP tools map to one Hermes name; the second is not served", "tool", name, "first", other.MCPName, "second", t.Name)
			skipped = append(skipped, protocol.Shorten(t.Name, 64))
			continue
		}
		in, _ := json.Marshal(t.InputSchema)
		var out json.RawMessage
		if t.OutputSchema != nil {
			out, _ = json.Marshal(t.OutputSchema)
		}
		tools[name] = Tool{Name: name, Server: c.srv.Name, MCPName: t.Name, Description: t.Description, InputSchema: in, OutputSchema: out, Annotations: t.Annotations}
	}
	if len(skipped) > 0 {
		log.Warn("MCP tools whose names cannot be Hermes tool names are not served", "tools", skipped)
	}
	c.mu.Lock()
	if c.session != cs { // a newer session listed meanwhile
		c.mu.Unlock()
		return
	}
	c.tools, c.state.Skipped = tools, skipped
	c.mu.Unlock()
	c.exec.notify()
	if c.exec.cfg.OnTools != nil {
		list := make([]Tool, 0, len(tools))
		for _, t := range tools {
			list = append(list, t)
		}
		slices.SortFunc(list, func(a, b Tool) int { return strings.Compare(a.Name, b.Name) })
		c.exec.cfg.OnTools(c.srv.Name, list)
	}
}

// Execute calls the tool the call's action names on its server.
func (e *Executor) Execute(ctx context.Context, call *worker.Call) (worker.Outcome, error) {
	a := call.Dispatch.Action.MCP
	if a == nil {
		return worker.Failed(protocol.CodeActionUnsupported, protocol.OriginHermes, "route the tool with an mcp action (server, tool)", "the call names no MCP server", false), nil
	}
	c := e.servers[a.Server]
	if c == nil {
		return worker.Failed(protocol.CodeActionUnsupported, protocol.OriginHermes,
			"this worker's configuration names no MCP server "+a.Server+"; check which workers hold it", "no MCP server "+a.Server+" here", false), nil
	}
	c.mu.Lock()
	cs, st := c.session, c.state
	t, listed := c.tools[call.Tool()]
	c.mu.Unlock()
	if listed && t.MCPName != a.Tool {
		// A reach naming another of the server's tools than the one listed under this name.
		return worker.Failed(protocol.CodeActionUnsupported, protocol.OriginHermes,
			"register the tool's contract again: its reach names another tool of the server than the one listed as "+call.Tool(),
			fmt.Sprintf("%s is %s of server %s, not %s", call.Tool(), t.MCPName, a.Server, protocol.Shorten(a.Tool, 64)), false), nil
	}
	if cs == nil {
		why := "MCP server " + a.Server + " is " + st.State
		if st.Error != "" {
			why += ": " + st.Error
		}
		return worker.Failed(protocol.CodeToolUnreachable, protocol.OriginHermes, "the worker is connecting to it again; the call may succeed later", why, true), nil
	}
	args, err := call.Arguments()
	if err != nil {
		return worker.Failed(protocol.CodeBadArguments, protocol.OriginHermes, "send the arguments as a JSON object", err.Error(), false), nil
	}
	start := time.Now()
	params := &mcp.CallToolParams{Name: a.Tool, Arguments: args}
	if g := call.Dispatch.Grant; g != nil {
		// The call's turn on the resource it changes, in the request's _meta: the server
		// refuses a fencing token lower than one it has seen for the resource.
		params.Meta = mcp.Meta{MetaTx: g.Tx, MetaFence: g.Fence, MetaResource: g.Resource}
	}
	res, err := cs.CallTool(ctx, params)
	took := time.Since(start)
	if err != nil {
		if ctx.Err() != nil {
			return worker.Outcome{}, context.Cause(ctx)
		}
		var wire *jsonrpc.Error
		isWire := errors.As(err, &wire)
		switch {
		case isWire && wire.Code == codeRejected:
			// The transport's rejection: the endpoint refused the connection, or answered 502,
			// 503, 504 or 429. The session stays (as the SDK keeps it); a refused connection
			// means the server is gone, and the session is made again.
			if strings.Contains(wire.Message, "connect") || strings.Contains(err.Error(), "connection refused") {
				c.reset(cs)
			}
			return worker.Failed(protocol.CodeToolUnreachable, protocol.OriginHermes, "the MCP server did not answer the call; it may answer later",
				"MCP server "+a.Server+" did not answer: "+redact(protocol.Shorten(err.Error(), 500)), true), nil
		case !isWire && unreadable(err):
			// An answer that could not be read (a content type this SDK does not know, say):
			// the tool's, not the connection's.
			return worker.Failed(protocol.CodeToolBadResponse, protocol.OriginTool, "the MCP server's answer could not be read",
				redact(protocol.Shorten(err.Error(), 1000)), false), nil
		case !isWire:
			// The connection ended (the program died, the stream broke): the session is made
			// again.
			c.reset(cs)
			return worker.Failed(protocol.CodeToolUnreachable, protocol.OriginHermes, "the MCP server went away during the call; the worker is connecting to it again",
				"MCP server "+a.Server+" went away: "+redact(protocol.Shorten(err.Error(), 500)), true), nil
		}
		// The server's answer is a protocol error: the tool is unknown to it, or it refused
		// the call's arguments.
		return worker.Failed(protocol.CodeToolFailed, protocol.OriginTool, "the MCP server refused the call: "+protocol.Shorten(wire.Message, 300),
			protocol.Shorten(err.Error(), 2000), false), nil
	}
	content, err := resultContent(res)
	if err != nil {
		return worker.Failed(protocol.CodeToolBadResponse, protocol.OriginTool, "the MCP server's result could not be read", err.Error(), false), nil
	}
	if call.MaxResultBytes > 0 && int64(len(content)) > call.MaxResultBytes {
		return worker.TooLarge(call.MaxResultBytes), nil
	}
	if res.IsError {
		text := resultText(res)
		out := worker.Failed(protocol.CodeToolFailed, protocol.OriginTool, "the MCP server said: "+protocol.Shorten(text, 300), text, false)
		out.Result.ExecutionTimeMS = took.Milliseconds()
		return out, nil
	}
	out := worker.OK(content, took)
	out.Answered = worker.AnsweredBody
	return out, nil
}

// unreadable reports whether err says an answer arrived that could not be decoded (rather than
// no answer at all).
func unreadable(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, mcp.ErrConnectionClosed) {
		return false
	}
	msg := err.Error()
	for _, s := range []string{"unrecognized content", "unmarshal", "invalid character", "decoding"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// codeRejected is the SDK's JSON-RPC code for a request its transport could not deliver (the
// server not answering at all), as opposed to the server's own refusal.
const codeRejected = -32005

// reset drops cs if it is still the session in use — new calls wait for the next one, and the
// run loop connects again once it is closed — and closes it meanwhile (closing waits for the
// calls in flight on it, which no caller waits for here).
func (c *conn) reset(cs *mcp.ClientSession) {
	c.mu.Lock()
	current := c.session == cs
	if current {
		c.session = nil
		c.state.State, c.state.Since = StateRestarting, time.Now()
	}
	c.mu.Unlock()
	if current {
		go func() { _ = cs.Close() }()
	}
}

// urlPattern finds URLs in error text, whose paths and queries may hold secrets.
var urlPattern = regexp.MustCompile(`https?://[^\s"']+`)

// redact writes each URL in s as its scheme and host only.
func redact(s string) string {
	return urlPattern.ReplaceAllStringFunc(s, func(u string) string {
		if p, err := url.Parse(u); err == nil && p.Host != "" {
			return p.Scheme + "://" + p.Host + "/…"
		}
		return "…"
	})
}

// resultContent is a result as Hermes keeps it: the structured content when the server gives
// one (what an output schema describes), the content blocks otherwise.
func resultContent(res *mcp.CallToolResult) (json.RawMessage, error) {
	if res.StructuredContent != nil {
		return json.Marshal(res.StructuredContent)
	}
	if res.Content == nil {
		return json.RawMessage(`[]`), nil
	}
	return json.Marshal(res.Content)
}

// resultText joins a result's text blocks.
func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	if len(parts) == 0 {
		return "the MCP server reported an error without text"
	}
	return strings.Join(parts, "\n")
}

// logWriter logs a server program's stderr, line by line, bounded.
type logWriter struct {
	log *slog.Logger
	mu  sync.Mutex
	buf []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := slices.Index(w.buf, '\n')
		if i < 0 {
			break
		}
		w.log.Debug("MCP server stderr", "line", protocol.Shorten(string(w.buf[:i]), 1000))
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > 4096 {
		w.log.Debug("MCP server stderr", "line", protocol.Shorten(string(w.buf), 1000))
		w.buf = w.buf[:0]
	}
	return len(p), nil
}
