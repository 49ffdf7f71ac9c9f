// Package chat is the agent loop's front doors: the OpenAI-compatible POST
// /v1/chat/completions (and GET /v1/models), Ollama's POST /api/chat (and GET /api/tags), and
// Hermes' own POST /v1/chat. Each dialect decodes its requests and writes its answers (a wire);
// the run between is one: admitted like every request (package admission), the model asked
// (package agent), the tools it chooses run on the bus one request per turn, each turn's
// decision recorded first. The doors work against small interfaces — a Submitter, an Admitter,
// the contracts followed — and are served by the gateway (gateway.Mount), which authenticates
// each request first.
package chat

import (
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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/agent"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/internal/httpapi"
	"github.com/hermesbus/hermes/internal/llm"
	"github.com/hermesbus/hermes/internal/memory"
	"github.com/hermesbus/hermes/internal/prefilter"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/blueprint"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// The agent loop behind an OpenAI-compatible front door: POST /v1/chat/completions runs the
// loop server-side. The model is offered the registered tools (their contracts' input schemas)
// and the client's own; calls to Hermes' tools run on the bus, one request per model turn
// (<run>-<turn>, one after another), each turn's decision recorded first (llm_decision.v1);
// calls to the client's tools come back to it as ordinary tool_calls, never run here, and the
// run continues when the client sends their results. Calls Hermes runs are never streamed as
// tool_calls deltas: a stream tells of them in chunks with an empty delta and a "hermes" field
// (ignored by OpenAI clients).
//
// A conversation is a session: named by the X-Hermes-Session-ID header or
// metadata.hermes_session_id, else one of its own per request. A client that sends the whole
// history again is matched to what the session's record holds (kept in hermes-sessions as the
// digests of the messages the client has seen) and only the rest is recorded. A POST with an
// Idempotency-Key is run once: a retry gets the first run's answer (X-Hermes-Replayed), waiting
// for it while it runs.

// Config configures the agent loop's front doors.
type Config struct {
	// LLM asks the model. Required.
	LLM *llm.Client
	// Model is the name clients ask for (GET /v1/models lists it); "hermes" names it too.
	Model string
	// MaxTurns bounds a run's model turns (default 8; a request's max_turns may lower it);
	// MaxCorrections the calls fed back to the model as errors (default 3).
	MaxTurns, MaxCorrections int
	// RunTimeout bounds a whole run, model and tools (default 5 min).
	RunTimeout time.Duration
	// Prefilter narrows the registered tools offered to those a message is about.
	Prefilter PrefilterConfig
}

// PrefilterConfig says how the registered tools are narrowed before the model chooses (seed
// 001 §2.2): the TopK best by the lexical prefilter (package prefilter) scoring at least
// Threshold — and, with an Embedder, by meaning too: the tools whose embedding's cosine with
// the message's is at least MinSimilarity, both rankings fused. TopK 0 offers every
// registered tool. An embedder that fails leaves the lexical ranking, and the decision says so.
type PrefilterConfig struct {
	TopK      int
	Threshold float64
	// Embedder, when set, makes the semantic ranking (the LLM client's embedding model).
	Embedder      prefilter.Embedder
	MinSimilarity float64
	// SemanticTimeout bounds what the semantic ranking may add to a message (default 2 s;
	// the tools' vectors are asked for ahead, when the tool set changes).
	SemanticTimeout time.Duration
}

var _ prefilter.Embedder = (*llm.Client)(nil)

// Submitter submits a turn's request, and cancels it when the run ends first
// (submit.Submitter).
type Submitter interface {
	Submit(ctx context.Context, sub submit.Submission) (*submit.Outcome, error)
	Cancel(ctx context.Context, requestID string, c submit.Cancellation) (*protocol.Response, bool, error)
}

// Admitter admits a request (admission.Admitter).
type Admitter interface {
	Admit(ctx context.Context, ask admission.Ask) (*admission.Ticket, error)
}

// Publisher records a message (bus.Publisher).
type Publisher interface {
	Publish(ctx context.Context, subject string, m *protocol.Message) (*jetstream.PubAck, error)
}

// Contracts are the registered tools' contracts as they are now (registry.Live).
type Contracts interface {
	Tools(ctx context.Context) ([]*contract.Compiled, error)
}

// KV is what a door keeps of its sessions and runs in hermes-sessions (jetstream.KeyValue).
type KV interface {
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
	Put(ctx context.Context, key string, value []byte) (uint64, error)
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
}

// Env is what the doors work with.
type Env struct {
	Submit    Submitter
	Admit     Admitter
	Publisher Publisher // the decisions' (as the gateway records)
	Contracts Contracts
	Sessions  KV // hermes-sessions
	// Approvals decide the confirmation round's approvals; nil: a call a policy parks ends
	// the turn with its approval's id, to be approved through /v1/approvals.
	Approvals Approvals
	Record    jetstream.JetStream // where /v1/chat reads a session's record
	// Limits bound each request; zero fields take protocol.DefaultLimits.
	Limits protocol.Limits
	// MaxBodyBytes bounds a request body (default 1 MiB); MaxWait a turn's wait for its
	// results (default 5 min, and never past the run's deadline).
	MaxBodyBytes int64
	MaxWait      time.Duration
	// Offers, when set, says whether a caller of role is offered tool (its contract k): the
	// model is offered only the registered tools it allows the run's caller (the gateway's,
	// by the tool's policy). Nil offers every tool.
	Offers func(tool string, k *contract.Compiled, role string) bool
	// Blueprints, when set, are the blueprints a caller of role may run (the gateway's
	// Blueprints): the model is offered each as a tool, and a call of one runs it through
	// RunBlueprint (the gateway's), then required.
	Blueprints   func(ctx context.Context, role string) ([]*blueprint.Blueprint, error)
	RunBlueprint func(ctx context.Context, a admission.Actor, ask blueprints.Ask) (*blueprints.Run, bool, error)
	// Memory, when set, keeps what the loop remembers about people (memory_write, and the
	// fragments each prompt carries); MemoryConfig filters what is stored and classifies
	// intents; MemoryBudget bounds what a prompt carries, in tokens (default
	// DefaultMemoryBudget).
	Memory       *memory.Store
	MemoryConfig *memory.Config
	MemoryBudget int
	// Builtin, when set, decides the tool policies of the tools the loop runs itself
	// (memory_write) before each call runs (the gateway's BuiltinPolicies).
	Builtin Guard
	Logger  *slog.Logger
}

// Guard decides the policy of a call of a tool the loop runs itself (policies.Local): the
// decision it runs under (nil: no policy), or the result it is answered with instead.
type Guard interface {
	Decide(ctx context.Context, call *protocol.ToolCall, requestID string, caller *protocol.Caller) (*protocol.PolicyDecision, *protocol.ToolResult)
}

// Server serves the chat doors.
type Server struct {
	env Env
	cfg Config
	log *slog.Logger

	mu           sync.Mutex
	schemas      map[*contract.Compiled]map[string]any // each contract's input schema, as the model is offered it
	prefilter    *prefilter.Index                      // the registered tools' index, for prefilterSig's tool set
	prefilterSig string
	semantic     *prefilter.Semantic   // nil without an embedder
	running      map[string]int        // runs this process is running (by run id): their last turn's calls may be waiting for results
	warm         chan *prefilter.Index // a new tool set's index, whose vectors to ask for ahead
}

const (
	headerSession   = "X-Hermes-Session-ID"
	headerIdemKey   = "Idempotency-Key"
	chatModelAlias  = "hermes"
	maxSeenMessages = 4096
	// maxPendingBytes bounds what a run waiting for the client's results keeps.
	maxPendingBytes = 256 << 10
)

// New returns the chat doors for cfg (cfg.LLM required) working with env (every field but
// Limits, MaxBodyBytes, MaxWait and Logger required).
func New(cfg Config, env Env) (*Server, error) {
	if cfg.LLM == nil || env.Submit == nil || env.Admit == nil || env.Publisher == nil || env.Contracts == nil || env.Sessions == nil || env.Record == nil {
		return nil, errors.New("chat: Config.LLM and every Env field but Limits, MaxBodyBytes, MaxWait and Logger are required")
	}
	if env.Blueprints != nil && env.RunBlueprint == nil {
		return nil, errors.New("chat: Env.Blueprints needs Env.RunBlueprint")
	}
	if cfg.MaxTurns <= 0 {
		cfg.MaxTurns = 8
	}
	if cfg.RunTimeout <= 0 {
		cfg.RunTimeout = 5 * time.Minute
	}
	if cfg.Model == "" {
		cfg.Model = chatModelAlias
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
	s := &Server{cfg: cfg, env: env, log: env.Logger, schemas: map[*contract.Compiled]map[string]any{}, running: map[string]int{}}
	if cfg.Prefilter.Embedder != nil {
		if cfg.Prefilter.SemanticTimeout <= 0 {
			s.cfg.Prefilter.SemanticTimeout = 2 * time.Second
		}
		s.semantic, s.warm = prefilter.NewSemantic(cfg.Prefilter.Embedder), make(chan *prefilter.Index, 1)
	}
	return s, nil
}

// Routes are the doors' endpoints, each needing auth.PermSubmit.
func (s *Server) Routes() []httpapi.Route {
	return []httpapi.Route{
		{Pattern: "POST /v1/chat/completions", Need: auth.PermSubmit, Handler: s.serve},
		{Pattern: "GET /v1/models", Need: auth.PermSubmit, Handler: s.models},
		{Pattern: "POST /api/chat", Need: auth.PermSubmit, Handler: func(w http.ResponseWriter, r *http.Request) { s.serveWire(w, r, ollamaWire{}) }},
		{Pattern: "GET /api/tags", Need: auth.PermSubmit, Handler: s.tags},
		{Pattern: "POST /v1/chat", Need: auth.PermSubmit, Handler: func(w http.ResponseWriter, r *http.Request) { s.serveWire(w, r, hermesWire{}) }},
	}
}

// Run asks the embedding model for each new tool set's vectors ahead of the messages that rank
// it, until ctx ends (nothing to do without an embedder).
func (s *Server) Run(ctx context.Context) error {
	if s.semantic != nil {
		s.warmVectors(ctx)
	}
	return nil
}

// models is GET /v1/models: the model clients may ask for, under its name and "hermes".
func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	var data []map[string]any
	for _, id := range s.servedModels() {
		data = append(data, map[string]any{"id": id, "object": "model", "created": 0, "owned_by": "hermes"})
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// tags is Ollama's GET /api/tags: the model, under its name and "hermes".
func (s *Server) tags(w http.ResponseWriter, _ *http.Request) {
	var models []map[string]any
	for _, id := range s.servedModels() {
		models = append(models, map[string]any{"name": id, "model": id, "modified_at": time.Time{}.Format(time.RFC3339), "size": 0, "digest": "",
			"details": map[string]any{"family": "hermes"}})
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"models": models})
}

// servedModels are the names clients may ask for: the model's, and "hermes".
func (s *Server) servedModels() []string {
	if s.cfg.Model == chatModelAlias {
		return []string{chatModelAlias}
	}
	return []string{s.cfg.Model, chatModelAlias}
}

// writeChatError answers as OpenAI does: {"error":{"message","type","param","code"}}.
func writeChatError(w http.ResponseWriter, e *chatError) {
	body := map[string]any{"message": e.Message, "type": e.Type, "param": nil, "code": nil}
	if e.Param != "" {
		body["param"] = e.Param
	}
	if e.Code != "" {
		body["code"] = e.Code
	}
	writeRetryAfter(w, e)
	httpapi.WriteJSON(w, e.Status, map[string]any{"error": body})
}

// chatRun is one POST: who asks, in which session, under which run id.
type chatRun struct {
	s       *Server
	wire    wire
	a       admission.Actor
	session string
	// named: the client named the session (header or metadata); a session Hermes made for
	// one POST keeps no state, as no client could continue it unnamed.
	named    bool
	run      string
	body     string // the request body's digest, for Idempotency-Key retries
	trace    protocol.TraceContext
	progress func(map[string]any) // a stream's progress, nil when not streaming
	// dispatched: a turn's request was submitted (something may have run).
	dispatched atomic.Bool
	// key is the run id its Idempotency-Key names ("" without one); attempt counts the runs
	// of the key (a run that ran nothing may be retried as the next).
	key     string
	attempt int

	// intent is the person's last message; classified its intent, when intents are
	// configured.
	intent     string
	classified *protocol.LLMIntent

	mu    sync.Mutex
	calls []map[string]any // what each call Hermes ran came to, in order
}

// wire is a front door's format: how its requests are read and its answers written. The run
// between is the same.
type wire interface {
	// decode reads a request; what is wrong is a *chatError.
	decode(body []byte) (*chatRequest, error)
	writeError(w http.ResponseWriter, e *chatError)
	// answer writes a run's answer (an OpenAI completion or error object, as complete makes
	// it) whole; stream begins a streamed answer.
	answer(w http.ResponseWriter, status int, body map[string]any)
	stream(w http.ResponseWriter, run, model string) answerStream
	// unknownModel is the answer to a request for a model not served here.
	unknownModel(model, served string) *chatError
}

// answerStream is a streamed answer: progress while the loop runs, then the answer.
type answerStream interface {
	progress(ev map[string]any)
	finish(status int, body map[string]any, includeUsage bool)
}

// openAIWire is POST /v1/chat/completions.
type openAIWire struct{}

func (openAIWire) decode(body []byte) (*chatRequest, error)       { return decodeChatRequest(body) }
func (openAIWire) writeError(w http.ResponseWriter, e *chatError) { writeChatError(w, e) }
func (openAIWire) answer(w http.ResponseWriter, status int, body map[string]any) {
	httpapi.WriteJSON(w, status, body)
}
func (openAIWire) stream(w http.ResponseWriter, run, model string) answerStream {
	return newChatStream(w, run, model)
}
func (openAIWire) unknownModel(model, served string) *chatError {
	return &chatError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
		Message: fmt.Sprintf("The model %q does not exist here: ask for %q (GET /v1/models)", protocolShort(model), served)}
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) { s.serveWire(w, r, openAIWire{}) }

func (s *Server) serveWire(w http.ResponseWriter, r *http.Request, wf wire) {
	writeChatError := wf.writeError
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.env.MaxBodyBytes))
	if err != nil {
		writeChatError(w, &chatError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
			Message: fmt.Sprintf("the body is larger than %d bytes", s.env.MaxBodyBytes)})
		return
	}
	req, err := wf.decode(body)
	if err != nil {
		writeChatError(w, err.(*chatError))
		return
	}
	if req.Model != s.cfg.Model && req.Model != chatModelAlias {
		writeChatError(w, wf.unknownModel(req.Model, s.cfg.Model))
		return
	}
	trace, err := httpapi.TraceOf(r)
	if err != nil {
		writeChatError(w, badParam("X-Trace-ID", "%v", err))
		return
	}
	a, refused := admission.ActorOf(r, req.User)
	if refused != nil {
		writeChatError(w, refusalError(refused, ""))
		return
	}
	key := r.Header.Get(headerIdemKey)
	if key != "" && !httpapi.PrintableASCII(key, 255) {
		writeChatError(w, badParam(headerIdemKey, "must be 1 to 255 printable ASCII characters without spaces"))
		return
	}
	session, sessionField := r.Header.Get(headerSession), headerSession
	if session == "" && req.Session != "" {
		sessionField = "metadata.hermes_session_id"
		if req.fromRecord {
			sessionField = "session_id"
		}
	}
	if session == "" {
		session = req.Session
	} else if req.Session != "" && req.Session != session {
		writeChatError(w, badParam("metadata.hermes_session_id", "names another session than the %s header", headerSession))
		return
	}
	run := ""
	if key != "" {
		sum := sha256.Sum256([]byte(a.Owner() + "\x00" + session + "\x00" + key))
		run = "chat-" + hex.EncodeToString(sum[:12])
	} else {
		var b [12]byte
		_, _ = rand.Read(b[:])
		run = "chat-" + hex.EncodeToString(b[:])
	}
	named := session != ""
	if !named {
		session = run
	}
	if err := protocol.CheckID(sessionField, session); err != nil {
		writeChatError(w, badParam(sessionField, "%v", err))
		return
	}
	if protocol.IsSandboxSession(session) {
		writeChatError(w, badParam(sessionField, "sessions starting %q are the contract sandbox's", protocol.SandboxSessionPrefix))
		return
	}
	if protocol.IsMemorySession(session) {
		writeChatError(w, badParam(sessionField, "sessions starting %q hold what Hermes remembers about people", protocol.MemorySessionPrefix))
		return
	}
	if trace.TraceID == "" {
		trace.TraceID = run
	}
	w.Header().Set(headerSession, session)
	w.Header().Set("X-Hermes-Run-ID", run)
	t, err := s.env.Admit.Admit(r.Context(), admission.Ask{Actor: a, Need: auth.PermSubmit, Session: session, Hold: admission.HoldWaiting,
		Store: admission.StoreCheck})
	if err != nil {
		if r.Context().Err() == nil {
			writeChatError(w, refusalError(admission.AsRefusal(err), sessionField))
		}
		return
	}
	defer t.Close()
	sum := sha256.Sum256(body)
	c := &chatRun{s: s, wire: wf, a: a, session: session, named: named, run: run, trace: trace, body: hex.EncodeToString(sum[:16])}
	if key != "" {
		c.key = run
		done, ok := c.claimRun(w, r, req)
		if !ok || done {
			return
		}
	}
	c.respond(w, r, req, key != "")
}

// respond runs the loop and answers, whole or as a stream.
func (c *chatRun) respond(w http.ResponseWriter, r *http.Request, req *chatRequest, idempotent bool) {
	var stream answerStream
	if req.Stream {
		stream = c.wire.stream(w, c.run, c.s.cfg.Model)
		c.progress = stream.progress
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.s.cfg.RunTimeout)
	defer cancel()
	status, completion := c.complete(ctx, req)
	if idempotent {
		c.finishRun(status, completion)
	}
	if stream != nil {
		stream.finish(status, completion, req.IncludeUsage)
		return
	}
	c.wire.answer(w, status, completion)
}

// complete runs the conversation and returns the answer's status and body (a completion, or an
// OpenAI error object).
func (c *chatRun) complete(ctx context.Context, req *chatRequest) (int, map[string]any) {
	if req.fromRecord {
		// The conversation is the session's record: the model's decisions hold every message
		// it read, and its answers.
		history, err := c.recordedConversation(ctx)
		if err != nil {
			return chatFailure(&chatError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: protocol.CodeBusUnavailable,
				Message: "the session's record could not be read; retry"})
		}
		return c.converse(ctx, req, append(history, req.Messages[len(req.Messages)-1].param()), len(history), nil, nil, 0)
	}
	state, rev, err := c.loadState(ctx)
	if err != nil {
		return chatFailure(&chatError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: protocol.CodeBusUnavailable,
			Message: "the session's state could not be read; retry"})
	}
	pending, err := c.continued(ctx, state, req.Messages)
	if err != nil {
		return chatFailure(&chatError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: protocol.CodeBusUnavailable,
			Message: "the session's state could not be read; retry"})
	}
	msgs, recorded, warning := state.conversation(req.Messages, pending)
	return c.converse(ctx, req, msgs, recorded, warning, &state, rev)
}

// converse runs the loop on msgs, of which the record holds the first recorded, and answers;
// st, when the client resends its history, is the session's state to keep.
func (c *chatRun) converse(ctx context.Context, req *chatRequest, msgs []openai.ChatCompletionMessageParamUnion, recorded int,
	warning *protocol.LLMWarning, state *chatState, rev uint64) (int, map[string]any) {
	s := c.s
	intent, offerFor := lastUserText(req.Messages, s.env.Limits), ""
	if len(req.Messages) > 0 {
		var err error
		msgs, recorded, offerFor, err = c.confirmation(ctx, intent, req.Messages[len(req.Messages)-1], msgs, recorded)
		if err != nil {
			return chatFailure(c.failure(ctx, err))
		}
	}
	tools, pf, err := c.tools(ctx, req, offerFor)
	if err != nil {
		return chatFailure(&chatError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: protocol.CodeBusUnavailable,
			Message: "the tools could not be read; retry"})
	}
	c.intent = intent
	if n := len(req.Messages); n > 0 && req.Messages[n-1].Role == "user" {
		// A new message of the person: its intent, and what the rules draw from it. A run
		// that carries on (the client's tool results) keeps going as it was.
		c.classified = c.classify(ctx, intent)
		c.applyRules(ctx)
	}
	if !req.NoTools && !slices.ContainsFunc(tools, func(t agent.Tool) bool { return t.Name == MemoryWriteTool }) {
		// Unless the client or a registered tool has the name: the model is never offered
		// two functions of one name.
		tools = append(tools, c.memoryTools()...)
	}
	run := agent.Run{Session: c.session, RequestID: c.run, Messages: msgs, Recorded: recorded, Intent: intent, Tools: tools, Params: req.Params,
		Classified: c.classified}
	if c.classified != nil && c.classified.Clarify {
		// Not sure enough to act: the model asks instead, with no tool to call.
		run.Tools, run.Context = nil, clarifying(c.classified)
	} else {
		run.Context, run.Memory = c.recall(ctx, tools)
	}
	if pf != nil {
		run.Prefiltered, run.Candidates = true, pf.candidates
		if len(pf.candidates) == 0 && len(req.Tools) == 0 {
			run.Messages = append(slices.Clone(run.Messages), openai.SystemMessage(noCandidates))
		}
	}
	maxTurns := s.cfg.MaxTurns
	if req.MaxTurns > 0 && req.MaxTurns < maxTurns {
		maxTurns = req.MaxTurns
	}
	rec := &chatRecorder{c: c, fromRecord: req.fromRecord}
	for _, w := range []*protocol.LLMWarning{warning, pf.warn()} {
		if w != nil {
			rec.warnings = append(rec.warnings, *w)
		}
	}
	loop := &agent.Loop{LLM: s.cfg.LLM, Runner: c, Record: rec, MaxTurns: maxTurns, MaxCorrections: s.cfg.MaxCorrections}
	defer s.runs(c.run)()
	out, err := loop.Run(ctx, run)
	if err != nil {
		return chatFailure(c.failure(ctx, err))
	}
	// What the client now has seen: what it sent, and the answer.
	answer := chatMessage{Role: "assistant", Content: out.Answer.Content}
	pending := []map[string]any{}
	if len(out.Parked) > 0 {
		answer.Content = confirmText(out.Parked, c.named && s.env.Approvals != nil)
		c.keepConfirm(ctx, offerFor, out)
		for _, p := range out.Parked {
			pending = append(pending, map[string]any{"approval_id": p.ApprovalID, "tool": p.Tool, "arguments": p.Arguments, "tool_call_id": p.CallID})
		}
	}
	for _, call := range out.ClientCalls {
		tc := chatToolCall{ID: call.ID, Type: "function"}
		tc.Function.Name, tc.Function.Arguments = call.Function.Name, call.Function.Arguments
		answer.ToolCalls = append(answer.ToolCalls, tc)
	}
	next := chatState{}
	for _, m := range req.Messages {
		next.Seen = append(next.Seen, m.digest())
	}
	next.Seen = append(next.Seen, answer.digest())
	if state != nil && c.saveState(ctx, next, rev) && len(out.ClientCalls) > 0 {
		// The run waits for the client's results: what the loop added, which the client never
		// saw, is kept for the run's next POST, under the answer the client will send back.
		c.keepPending(ctx, out.Messages[min(len(msgs), len(out.Messages)):], answer)
	}
	finish := "stop"
	if len(answer.ToolCalls) > 0 {
		finish = "tool_calls"
	}
	msg := map[string]any{"role": "assistant", "content": answer.Content}
	if len(answer.ToolCalls) > 0 {
		msg["tool_calls"] = answer.ToolCalls
		if answer.Content == "" {
			msg["content"] = nil
		}
	}
	return http.StatusOK, map[string]any{
		"id": c.run, "object": "chat.completion", "created": time.Now().Unix(), "model": s.cfg.Model,
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish, "logprobs": nil}},
		"usage":   map[string]any{"prompt_tokens": out.Usage.PromptTokens, "completion_tokens": out.Usage.CompletionTokens, "total_tokens": out.Usage.TotalTokens},
		"hermes":  map[string]any{"session_id": c.session, "run_id": c.run, "turns": out.Turns, "calls": c.callSummary(), "pending": pending, "intent": c.intentView()},
	}
}

// callSummary is what the calls Hermes ran in the run came to (name, status, duration), for the
// answer.
func (c *chatRun) callSummary() []map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]map[string]any{}, c.calls...)
}

func chatFailure(e *chatError) (int, map[string]any) {
	body := map[string]any{"message": e.Message, "type": e.Type, "param": nil, "code": nil}
	if e.Param != "" {
		body["param"] = e.Param
	}
	if e.Code != "" {
		body["code"] = e.Code
	}
	return e.Status, map[string]any{"error": body}
}

// failure says why a run ended without an answer; the conversation so far is on the record.
func (c *chatRun) failure(ctx context.Context, err error) *chatError {
	var (
		le *llm.Error
		me *agent.ModelError
		tt *turnTimeout
	)
	switch {
	case errors.Is(err, errRunDeadline) || (ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded)):
		return &chatError{Status: http.StatusGatewayTimeout, Type: "server_error", Code: protocol.CodeTimeout,
			Message: fmt.Sprintf("the run did not end within %s; its calls were cancelled", c.s.cfg.RunTimeout)}
	case ctx.Err() != nil:
		return &chatError{Status: 499, Type: "server_error", Code: protocol.CodeCancelled,
			Message: "the client went away; the run's calls were cancelled, and the conversation so far is on the record of session " + c.session}
	case errors.As(err, &tt):
		return &chatError{Status: http.StatusGatewayTimeout, Type: "server_error", Code: protocol.CodeTimeout,
			Message: tt.Error() + "; they were cancelled, and the conversation so far is on the record of session " + c.session}
	case errors.As(err, &me):
		return &chatError{Status: http.StatusBadGateway, Type: "upstream_error", Code: "llm_answer_refused",
			Message: me.Msg + "; the conversation so far is on the record of session " + c.session}
	case errors.Is(err, submit.ErrOverBudget):
		return &chatError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: protocol.CodeRateLimited,
			Message: err.Error() + "; the conversation so far is on the record of session " + c.session}
	case admission.AsRefusal(err) != nil:
		e := refusalError(admission.AsRefusal(err), "")
		e.Message += "; the conversation so far is on the record of session " + c.session
		return e
	case errors.Is(err, agent.ErrTooManyTurns):
		return &chatError{Status: http.StatusUnprocessableEntity, Type: "invalid_request_error", Code: "max_turns_exceeded",
			Message: "the model kept calling tools past the turns allowed; the conversation so far is on the record of session " + c.session}
	case errors.As(err, &le) && le.Status() >= 400 && le.Status() < 500 && !llm.GaveUp(err):
		// The backend refused what it was sent (a conversation too long for it, say): the
		// client's to change.
		return &chatError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "llm_refused",
			Message: le.Error() + "; the conversation so far is on the record of session " + c.session}
	case errors.As(err, &le):
		return &chatError{Status: http.StatusBadGateway, Type: "upstream_error", Code: "llm_unavailable",
			Message: le.Error() + "; the conversation so far is on the record of session " + c.session}
	case strings.Contains(err.Error(), "were refused"):
		return &chatError{Status: http.StatusUnprocessableEntity, Type: "invalid_request_error", Code: "tool_calls_refused",
			Message: err.Error() + "; the conversation so far is on the record of session " + c.session}
	}
	c.s.log.Warn("chat run failed", "session_id", c.session, "run", c.run, "err", err)
	return &chatError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: protocol.CodeBusUnavailable,
		Message: "the run could not go on (" + protocol.Shorten(err.Error(), 300) + "); the conversation so far is on the record of session " + c.session}
}

// lastUserText is the person's last message, bounded as an intent.
func lastUserText(msgs []chatMessage, limits protocol.Limits) string {
	n := limits.MaxIntentBytes
	if n <= 0 {
		n = protocol.DefaultLimits.MaxIntentBytes
	}
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == "user" {
			return protocol.Shorten(msgs[i].Content, n)
		}
	}
	return ""
}

// tools are what the model may call: the registered tools offered to the run's caller
// (Env.Offers) whose arguments are an object (their contract's input schema, checked before
// dispatch), the blueprints it may run (Env.Blueprints), and the client's own. A client's tool
// named as a registered one or a blueprint is the client's: it declared it; a blueprint named
// as a registered tool is not offered: the tool is what the name calls.
func (c *chatRun) tools(ctx context.Context, req *chatRequest, intent string) (tools []agent.Tool, pf *prefiltered, err error) {
	if req.NoTools {
		return nil, nil, nil
	}
	mine := map[string]bool{}
	for _, t := range req.Tools {
		mine[t.Name] = true
		tools = append(tools, agent.Tool{Name: t.Name, Description: t.Description, Parameters: t.Parameters, Client: true})
	}
	contracts, all, err := c.s.contracts(ctx, c.a.Role())
	if err != nil {
		return nil, nil, err
	}
	var theirs []offer
	for _, k := range contracts {
		if c.s.schema(k) != nil {
			theirs = append(theirs, c.s.contractOffer(k))
		}
	}
	bps, err := c.s.blueprintOffers(ctx, c.a.Role(), all)
	if err != nil {
		return nil, nil, err
	}
	theirs = append(theirs, bps...)
	if p := c.s.cfg.Prefilter; p.TopK > 0 && len(theirs) > p.TopK {
		// Coarse, then fine: only the registered tools and blueprints the message is about are
		// offered (the client's, which it declared, always are; one of Hermes' it shadows is
		// not). While there are no more than TopK, every one is.
		ix := c.s.index(theirs)
		cands := ix.Rank(intent, p.TopK+len(mine), p.Threshold)
		pf = &prefiltered{}
		if c.s.semantic != nil {
			sctx, cancel := context.WithTimeout(ctx, p.SemanticTimeout)
			sem, err := c.s.semantic.Rank(sctx, ix, intent, p.TopK+len(mine), p.MinSimilarity)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return nil, nil, ctx.Err()
				}
				why := "the embedding model failed"
				switch {
				case errors.Is(err, prefilter.ErrWarming):
					why = "the tools' vectors were still being asked for"
					c.s.warmAhead(ix)
				case !errors.Is(err, prefilter.ErrPaused):
					c.s.log.Warn("the embedding model failed; the tools are prefiltered lexically", "session", c.session, "err", err)
				}
				pf.warning = &protocol.LLMWarning{Kind: protocol.WarnEmbeddings,
					Message: why + ", so the tools were prefiltered lexically only: " + protocol.Shorten(err.Error(), 300)}
			} else {
				cands = prefilter.Fuse(cands, sem, 0)
			}
		}
		for _, cand := range cands {
			if !mine[cand.Name] && len(pf.candidates) < p.TopK {
				pf.candidates = append(pf.candidates, protocol.LLMCandidate{Name: cand.Name, Score: cand.Score, Similarity: cand.Similarity})
			}
		}
		byName := map[string]offer{}
		for _, o := range theirs {
			byName[o.name] = o
		}
		theirs = theirs[:0]
		for _, cand := range pf.candidates {
			theirs = append(theirs, byName[cand.Name])
		}
	}
	for _, o := range theirs {
		switch {
		case mine[o.name]:
		case o.k != nil:
			tools = append(tools, agent.Tool{Name: o.name, Description: o.description, Parameters: o.schema, Check: c.checkArguments(o.k)})
		default:
			tools = append(tools, agent.Tool{Name: o.name, Description: o.description, Parameters: o.schema, Check: c.checkBounds, Local: c.runBlueprint})
		}
	}
	return tools, pf, nil
}

// offer is one of Hermes' tools the model may be offered: a registered tool (k) or a
// blueprint (bp), with its arguments' schema as the model is offered it.
type offer struct {
	name, description string
	schema            map[string]any
	k                 *contract.Compiled
	bp                *blueprint.Blueprint
	// sig tells this offer from another of the same name (a new version), for the index.
	sig string
}

// contractOffer is the registered tool k as an offer.
func (s *Server) contractOffer(k *contract.Compiled) offer {
	return offer{name: k.Name, description: k.Description, schema: s.schema(k), k: k, sig: fmt.Sprintf("%s\x00%d", k.Name, k.Revision)}
}

// checkArguments is what the model's calls of k are checked with before they are dispatched:
// the bounds every request's arguments keep (their size, each number's digits and exponent),
// so that what a request would be refused for goes back to the model as a correction, then
// k's input schema.
func (c *chatRun) checkArguments(k *contract.Compiled) func(json.RawMessage) error {
	lim := c.s.env.Limits
	return func(args json.RawMessage) error {
		if err := protocol.CheckArguments("arguments", args, lim); err != nil {
			return err
		}
		return k.CheckInput(args)
	}
}

// prefiltered is how the registered tools were narrowed for a message: to candidates, and
// lexically only when the embedding model failed (warning).
type prefiltered struct {
	candidates []protocol.LLMCandidate
	warning    *protocol.LLMWarning
}

// noCandidates tells the model that none of Hermes' tools matches the message, rather than
// offering it none silently or all of them (what it reads, so the record keeps it).
const noCandidates = agent.NoCandidates

// index is the prefilter's index of offers (every registered tool and blueprint the model
// could be offered), built once per tool set, outside the server's lock (concurrent first
// builds are alike).
func (s *Server) index(offers []offer) *prefilter.Index {
	h := sha256.New()
	for _, o := range offers {
		fmt.Fprintf(h, "%s\x00", o.sig)
	}
	sig := string(h.Sum(nil))
	s.mu.Lock()
	ix, same := s.prefilter, s.prefilterSig == sig
	s.mu.Unlock()
	if ix != nil && same {
		return ix
	}
	tools := make([]prefilter.Tool, 0, len(offers))
	for _, o := range offers {
		t := prefilter.Tool{Name: o.name, Description: o.description}
		if props, ok := o.schema["properties"].(map[string]any); ok {
			for name, v := range props {
				desc, _ := v.(map[string]any)["description"].(string)
				t.Args = append(t.Args, prefilter.Arg{Name: name, Description: desc})
			}
		}
		tools = append(tools, t)
	}
	ix = prefilter.New(tools)
	s.mu.Lock()
	s.prefilter, s.prefilterSig = ix, sig
	s.mu.Unlock()
	s.warmAhead(ix)
	return ix
}

// runs counts run as running in this process until the function it returns is called.
func (s *Server) runs(run string) func() {
	s.mu.Lock()
	s.running[run]++
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		if s.running[run]--; s.running[run] <= 0 {
			delete(s.running, run)
		}
		s.mu.Unlock()
	}
}

// isRunning is summarize.Running for a new run's history: a run of this process that is
// running. (A run of another gateway still running then is rare — one session, two runs at
// once, two gateways —; its last turn's calls are told as they stand.)
func (s *Server) isRunning(run string, _ time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running[run] > 0
}

// warmAhead has ix's tools' vectors asked for ahead of the messages that rank it (an older
// tool set waiting is dropped).
func (s *Server) warmAhead(ix *prefilter.Index) {
	s.mu.Lock()
	current := s.prefilter == ix
	s.mu.Unlock()
	if s.warm == nil || !current {
		return // an older tool set's, which a message still held
	}
	select {
	case <-s.warm:
	default:
	}
	select {
	case s.warm <- ix:
	default:
	}
}

// warmVectors asks the embedding model for each new tool set's vectors ahead of the messages
// that rank it, until ctx ends.
func (s *Server) warmVectors(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ix := <-s.warm:
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			if err := s.semantic.Warm(wctx, ix); err != nil && ctx.Err() == nil && !errors.Is(err, prefilter.ErrPaused) {
				s.log.Warn("the tools' vectors could not be asked for ahead; the next message asks again", "tools", ix.Len(), "err", err)
			}
			cancel()
		}
	}
}

// contracts are the registered tools' contracts offered to a caller of role (Env.Offers), and
// all of them.
func (s *Server) contracts(ctx context.Context, role string) (offered, all []*contract.Compiled, err error) {
	all, err = s.env.Contracts.Tools(ctx)
	if err != nil || s.env.Offers == nil {
		return all, all, err
	}
	offered = make([]*contract.Compiled, 0, len(all))
	for _, k := range all {
		if s.env.Offers(k.Name, k, role) {
			offered = append(offered, k)
		}
	}
	return offered, all, nil
}

// schema is k's input schema as the model is offered it; nil when its arguments are not an
// object (OpenAI's tools take objects only). The map is shared: nothing writes to it.
func (s *Server) schema(k *contract.Compiled) map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.schemas[k]; ok {
		return m
	}
	var m map[string]any
	if json.Unmarshal(k.InputJSONSchema(), &m) != nil || m["type"] != "object" {
		m = nil
	}
	if len(s.schemas) > 4096 {
		s.schemas = map[*contract.Compiled]map[string]any{}
	}
	s.schemas[k] = m
	return m
}

// Run runs one turn's calls as one request of the session and waits for its response;
// a run cancelled (the client gone, the deadline passed) cancels the request, so its running
// calls stop.
func (c *chatRun) Run(ctx context.Context, session, requestID, intent string, calls []protocol.ToolCall) ([]protocol.ToolResult, error) {
	s := c.s
	if err := ctx.Err(); err != nil {
		return nil, err // the client went away (or the deadline passed) while the turn was decided
	}
	// Not Serial: the loop waits for each turn's response before the next turn, so a run's
	// requests go one at a time already, in the session's order.
	// Recall: a call a policy parks runs when the person confirms it and the loop calls it again.
	req := &protocol.Request{RequestID: requestID, SessionID: session, Intent: intent, ToolCalls: calls, Recall: true}
	if err := req.Validate(s.env.Limits); err != nil {
		return nil, err
	}
	size := len(intent)
	for _, call := range calls {
		size += len(call.Arguments)
	}
	// A turn waits for its results at most MaxWait, and never past the run's deadline.
	wait, byDeadline := s.env.MaxWait, false
	if d, ok := ctx.Deadline(); ok && time.Until(d) < wait {
		wait, byDeadline = time.Until(d), true
	}
	// Each turn's request is one of the caller's: a POST that runs many turns runs them at the
	// caller's rate. The session was claimed when the run was admitted: a turn does not claim
	// it again.
	t, err := s.env.Admit.Admit(ctx, admission.Ask{Actor: c.a, Need: auth.PermSubmit, Session: session, Mode: admission.Claimed, WaitRate: true, Size: size})
	if err != nil {
		return nil, err
	}
	defer t.Close()
	sub := submit.Submission{Request: req, Trace: c.trace, Wait: max(wait, time.Millisecond), Size: size, Caller: t.Caller, Owner: t.Owner}
	c.dispatched.Store(true)
	out, err := s.env.Submit.Submit(ctx, sub)
	t.Accepted(err == nil && !out.Replayed)
	switch {
	case ctx.Err() != nil || (err == nil && out.Pending):
		by := "chat run " + c.run
		// Pending with ctx not done yet: the turn's wait ran out first (MaxWait, or the run's
		// deadline when that comes sooner: byDeadline).
		reason := "the run's deadline passed"
		switch {
		case errors.Is(ctx.Err(), context.Canceled):
			reason = "the client went away"
		case ctx.Err() == nil && !byDeadline:
			reason = fmt.Sprintf("the turn's calls did not finish within %s", wait)
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if _, _, cerr := s.env.Submit.Cancel(cctx, requestID, submit.Cancellation{By: by, Reason: reason}); cerr != nil && !errors.Is(cerr, submit.ErrFinished) {
			s.log.Warn("cancel a chat run's request", "request_id", requestID, "err", cerr)
		}
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case byDeadline: // the wait, cut to the run's deadline, ran out a moment before it
			return nil, errRunDeadline
		}
		return nil, &turnTimeout{wait: wait}
	case err != nil:
		return nil, err
	}
	var done []map[string]any
	for _, res := range out.Response.Results {
		d := map[string]any{"request_id": requestID, "tool_call_id": res.ToolCallID, "name": res.Name, "status": res.Status,
			"execution_time_ms": res.ExecutionTimeMS}
		if res.ErrorCode != "" {
			d["error_code"] = res.ErrorCode
		}
		done = append(done, d)
	}
	c.mu.Lock()
	c.calls = append(c.calls, done...)
	c.mu.Unlock()
	if c.progress != nil {
		c.progress(map[string]any{"event": "results", "request_id": requestID, "results": done})
	}
	return out.Response.Results, nil
}

// errRunDeadline: a turn's wait, cut to the run's deadline, ran out.
var errRunDeadline = errors.New("the run's deadline passed")

// turnTimeout: a turn's calls did not finish within the turn's wait (Env.MaxWait).
type turnTimeout struct{ wait time.Duration }

func (e *turnTimeout) Error() string {
	return fmt.Sprintf("a turn's calls did not finish within %s", e.wait.Round(time.Millisecond))
}

// chatRecorder records each turn's decision (agent.Recorder).
type chatRecorder struct {
	c          *chatRun
	warnings   []protocol.LLMWarning // the history's and the prefilter's, added to the first decision
	fromRecord bool                  // the conversation is the record's (POST /v1/chat)
}

// warn is the prefilter's warning, if any.
func (pf *prefiltered) warn() *protocol.LLMWarning {
	if pf == nil {
		return nil
	}
	return pf.warning
}

func (r *chatRecorder) Decided(ctx context.Context, session, requestID string, d *protocol.LLMDecision) error {
	c := r.c
	if len(r.warnings) > 0 {
		d.Warnings = append(r.warnings, d.Warnings...)
		r.warnings = nil
	}
	d.FromRecord = r.fromRecord
	m, err := protocol.NewMessage(protocol.TypeLLMDecision, d)
	if err != nil {
		return err
	}
	m.MsgID, m.RequestID, m.SessionID, m.Trace = protocol.MsgIDLLMDecision(d.Run, d.Turn), requestID, session, c.trace
	m.Caller = c.a.Record()
	// A decision is written to the record like a request: refused when the record is near its
	// limit, so that what was accepted can finish.
	// Once a turn has dispatched, the run is one the record accepted: it finishes, counted.
	store := admission.StoreCount
	if c.dispatched.Load() {
		store = admission.StoreAccepted
	}
	// Admission counts a request's footprint, four times its size.
	t, err := c.s.env.Admit.Admit(ctx, admission.Ask{Mode: admission.NoSession, Store: store, Size: len(m.Payload) / 4})
	if err != nil {
		return err
	}
	t.Accepted(true)
	defer t.Close()
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := c.s.env.Publisher.Publish(pctx, protocol.SubjectEvent(protocol.EventLLM, session), m); err != nil {
		return err
	}
	if c.progress != nil {
		ev := map[string]any{"event": "decided", "turn": d.Turn, "request_id": requestID, "model": d.Model}
		var chose []string
		for _, call := range d.Chosen {
			if !call.Client {
				chose = append(chose, call.Name)
			}
		}
		if len(chose) > 0 {
			ev["calls"] = chose
		}
		if len(d.Warnings) > 0 {
			ev["warnings"] = len(d.Warnings)
		}
		c.progress(ev)
	}
	return nil
}

// chatState is what hermes-sessions keeps of a conversation (key chat.<session>).
type chatState struct {
	// Seen are the digests of the messages the client has seen, in order: what it sent and
	// the answers it got. A history that starts with them is on the record up to there.
	Seen []string `json:"seen"`
}

// chatPending is a run that returned the client's tool calls: every message the loop added in
// it — the model's messages with every call (Hermes' too) and Hermes' results, which the client
// never saw — of which the record holds the first Recorded.
type chatPending struct {
	Messages []json.RawMessage `json:"messages"`
	Recorded int               `json:"recorded"`
}

func chatKey(session string) string { return "chat." + session }

// keepPending keeps added, what the loop added in a run that returned the client's calls, under
// those calls: its tool results cut as the record cuts them, at most maxPendingBytes in all
// (more, and the run goes on from what the client has, without Hermes' results of the run).
func (c *chatRun) keepPending(ctx context.Context, added []openai.ChatCompletionMessageParamUnion, answer chatMessage) {
	if !c.named || len(added) == 0 {
		return
	}
	p := chatPending{}
	for i, m := range added {
		if m.OfAssistant != nil {
			p.Recorded = i // the record holds what came before the model's last message
		}
		if m.OfTool != nil {
			m = openai.ToolMessage(agent.CutText(m.OfTool.Content.OfString.Value), m.OfTool.ToolCallID)
		}
		b, err := json.Marshal(m)
		if err != nil {
			return
		}
		p.Messages = append(p.Messages, b)
	}
	data, err := json.Marshal(p)
	if err != nil || len(data) > maxPendingBytes {
		c.s.log.Info("a chat turn waiting for the client's results is too large to keep; it goes on without Hermes' results", "session_id", c.session, "bytes", len(data))
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := c.s.env.Sessions.Put(ctx, pendingKey(c.session, answer), data); err != nil {
		c.s.log.Warn("keep a chat turn waiting for the client's results", "session_id", c.session, "err", err)
	}
}

func (c *chatRun) loadState(ctx context.Context) (chatState, uint64, error) {
	var st chatState
	e, err := c.s.env.Sessions.Get(ctx, chatKey(c.session))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return st, 0, nil
	case err != nil:
		return st, 0, err
	}
	if json.Unmarshal(e.Value(), &st) != nil {
		return chatState{}, e.Revision(), nil // unreadable: matched as a new conversation
	}
	return st, e.Revision(), nil
}

// saveState keeps next as the session's state, and reports whether it did; another run of the
// session that saved first wins (its client's next history is matched against it).
func (c *chatRun) saveState(ctx context.Context, next chatState, rev uint64) bool {
	if !c.named {
		return false
	}
	if len(next.Seen) > maxSeenMessages {
		next.Seen = nil // too long to match: a resend is recorded again, with a warning
	}
	data, err := json.Marshal(next)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	kv := c.s.env.Sessions
	if rev == 0 {
		_, err = kv.Create(ctx, chatKey(c.session), data)
	} else {
		_, err = kv.Update(ctx, chatKey(c.session), data, rev)
	}
	if err != nil {
		c.s.log.Info("a chat session's state was not saved (another run saved first, or the bus is away)", "session_id", c.session, "err", err)
		return false
	}
	return true
}

// conversation is the model's conversation for msgs, how many of its messages the record
// holds, and a warning when the history differs from what the record holds.
func (st chatState) conversation(msgs []chatMessage, pending *chatPending) ([]openai.ChatCompletionMessageParamUnion, int, *protocol.LLMWarning) {
	matched := st.matches(msgs)
	var warning *protocol.LLMWarning
	recorded := 0
	switch {
	case matched:
		recorded = len(st.Seen)
	case len(st.Seen) > 0:
		warning = &protocol.LLMWarning{Kind: protocol.WarnHistory,
			Message: fmt.Sprintf("the history sent differs from the %d messages the session's record holds: recorded again as sent", len(st.Seen))}
	}
	out := make([]openai.ChatCompletionMessageParamUnion, 0, len(msgs))
	for i, m := range msgs {
		if matched && pending != nil && i == len(st.Seen)-1 {
			// The run that returned the client's calls goes on: every message the loop added
			// in it (the model's whole messages and Hermes' results) stands where the client
			// has its part of them.
			var restored []openai.ChatCompletionMessageParamUnion
			for _, raw := range pending.Messages {
				var p openai.ChatCompletionMessageParamUnion
				if json.Unmarshal(raw, &p) != nil {
					restored = nil
					break
				}
				restored = append(restored, p)
			}
			if len(restored) > 0 {
				recorded = len(out) + min(max(pending.Recorded, 0), len(restored))
				out = append(out, restored...)
				continue
			}
		}
		out = append(out, m.param())
	}
	return out, recorded, warning
}

// matches reports whether msgs begins with the messages the record holds.
func (st chatState) matches(msgs []chatMessage) bool {
	ok := len(st.Seen) > 0 && len(st.Seen) <= len(msgs)
	for i := 0; ok && i < len(st.Seen); i++ {
		ok = msgs[i].digest() == st.Seen[i]
	}
	return ok
}

// continued is the pending turn msgs continue, when the last message the record holds is the
// model's message with the client's calls: kept under those calls' ids.
func (c *chatRun) continued(ctx context.Context, st chatState, msgs []chatMessage) (*chatPending, error) {
	if !c.named || !st.matches(msgs) {
		return nil, nil
	}
	m := msgs[len(st.Seen)-1]
	if m.Role != "assistant" || len(m.ToolCalls) == 0 {
		return nil, nil
	}
	e, err := c.s.env.Sessions.Get(ctx, pendingKey(c.session, m))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	}
	var p chatPending
	if json.Unmarshal(e.Value(), &p) != nil {
		return nil, nil
	}
	return &p, nil
}

// pendingKey is where the turn that returned calls to the client is kept: by the session and
// the answer the client got (its calls' ids, names and arguments, and its text), so that no
// other run's state can overwrite it or be taken for it.
func pendingKey(session string, answer chatMessage) string {
	sum := sha256.Sum256([]byte(session + "\x00" + answer.digest()))
	return "chatpend." + hex.EncodeToString(sum[:16])
}

// A run with an Idempotency-Key is kept in hermes-sessions (key chatrun.<run>): running, then
// its answer.
type chatRunState struct {
	State    string          `json:"state"` // running, done, retry
	Attempt  int             `json:"attempt,omitempty"`
	Body     string          `json:"body_digest"`
	Deadline time.Time       `json:"deadline"`
	Status   int             `json:"status,omitempty"`
	Answer   json.RawMessage `json:"answer,omitempty"`
}

func chatRunKey(run string) string { return "chatrun." + run }

// claimRun makes this POST the run of its key, or answers from the run that has it: its
// answer, once it has one (waiting for it while the first runs). done: answered here. A first
// run that ended having run nothing left the key to be retried: this POST then runs as the
// key's next attempt, under a run id of its own (<run>a<attempt>), so that nothing the first
// recorded is taken for its.
func (c *chatRun) claimRun(w http.ResponseWriter, r *http.Request, req *chatRequest) (done, ok bool) {
	kv := c.s.env.Sessions
	ctx := r.Context()
	key := chatRunKey(c.key)
	running := func(attempt int) []byte {
		data, _ := json.Marshal(chatRunState{State: "running", Body: c.body, Attempt: attempt,
			Deadline: time.Now().Add(c.s.cfg.RunTimeout + 30*time.Second).UTC()})
		return data
	}
	if _, err := kv.Create(ctx, key, running(1)); err == nil {
		return false, true
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		c.wire.writeError(w, &chatError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: protocol.CodeBusUnavailable, Message: "nothing was run; retry"})
		return true, false
	}
	for {
		e, err := kv.Get(ctx, key)
		var st chatRunState
		if err == nil && json.Unmarshal(e.Value(), &st) != nil {
			err = errors.New("unreadable")
		}
		switch {
		case err != nil && ctx.Err() != nil:
			return true, false
		case err != nil:
			c.wire.writeError(w, &chatError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: protocol.CodeBusUnavailable, Message: "the first run with this Idempotency-Key could not be read; retry"})
			return true, false
		case st.Body != c.body:
			c.wire.writeError(w, &chatError{Status: http.StatusUnprocessableEntity, Type: "invalid_request_error", Param: headerIdemKey, Code: "idempotency_key_reused",
				Message: "this Idempotency-Key was used for another request body; send a new key"})
			return true, false
		case st.State == "retry":
			next := st.Attempt + 1
			if _, err := kv.Update(ctx, key, running(next), e.Revision()); err == nil {
				c.attempt, c.run = next, fmt.Sprintf("%s-a%d", c.key, next)
				w.Header().Set("X-Hermes-Run-ID", c.run) // the session stays the key's
				return false, true
			}
			continue // another retry took it: wait for its answer
		case st.State == "done":
			w.Header().Set("X-Hermes-Replayed", "true")
			if req.Stream && st.Status == http.StatusOK {
				var body map[string]any
				_ = json.Unmarshal(st.Answer, &body)
				c.wire.stream(w, c.run, c.s.cfg.Model).finish(st.Status, body, req.IncludeUsage)
				return true, true
			}
			var body map[string]any
			_ = json.Unmarshal(st.Answer, &body)
			c.wire.answer(w, st.Status, body)
			return true, true
		case time.Now().After(st.Deadline):
			c.wire.writeError(w, &chatError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "run_abandoned",
				Message: "the run with this Idempotency-Key began on a gateway that stopped before it ended; its calls are on the record: send with a new key to run again"})
			return true, false
		}
		select {
		case <-ctx.Done():
			return true, false
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// finishRun keeps a keyed run's answer for its retries. A run that failed having run nothing
// on the bus leaves the key to be retried: its retry runs (nothing can run twice).
func (c *chatRun) finishRun(status int, body map[string]any) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv := c.s.env.Sessions
	attempt := max(c.attempt, 1)
	st := chatRunState{State: "done", Body: c.body, Status: status, Attempt: attempt}
	if status != http.StatusOK && !c.dispatched.Load() {
		st = chatRunState{State: "retry", Body: c.body, Attempt: attempt}
	} else {
		data, err := json.Marshal(body)
		if err != nil {
			return
		}
		st.Answer = data
	}
	data, _ := json.Marshal(st)
	if _, err := kv.Put(ctx, chatRunKey(c.key), data); err != nil {
		c.s.log.Warn("keep a chat run's answer for its retries", "run", c.run, "err", err)
	}
}
