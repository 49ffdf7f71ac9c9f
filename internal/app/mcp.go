package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"gopkg.in/yaml.v3"

	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker/mcpexec"
)

// MCPConfig is a tool worker's own configuration of the MCP servers it holds (--mcp FILE). It
// is the only place a program to run or a URL to reach is named: calls and contracts name a
// server by its name alone.
//
//	timeout_ms: 30000            # each call's timeout in the tools' contracts (default 30 s)
//	max_attempts: 3              # tries of a call (default 3)
//	servers:
//	  - name: everything         # calls name it: action {mcp: {server: everything, tool: echo}}
//	    prefix: everything__     # Hermes tool names: prefix + the tool's name (default name + "__")
//	    command: [npx, mcp-server-everything, stdio]
//	    env: {LOG_LEVEL: info}
//	  - name: search
//	    url: http://127.0.0.1:3001/mcp
type MCPConfig struct {
	TimeoutMS int `yaml:"timeout_ms"`
	// MaxAttempts is how many tries a call gets in the tools' contracts (default 3: a server
	// that died mid-call is started again and the call tried again, 1 s then 2 s later).
	MaxAttempts int              `yaml:"max_attempts"`
	Servers     []mcpexec.Server `yaml:"servers"`
}

// defaultMCPTimeoutMS is a call's timeout in an MCP tool's contract when the file says none.
const defaultMCPTimeoutMS = 30_000

// LoadMCPConfig reads an MCP configuration file; unknown fields and bad servers are errors naming
// them.
func LoadMCPConfig(path string) (*MCPConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--mcp: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var cfg MCPConfig
	if err := dec.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("--mcp %s: %w", path, err)
	}
	if len(cfg.Servers) == 0 {
		return nil, fmt.Errorf("--mcp %s: names no servers", path)
	}
	if cfg.TimeoutMS == 0 {
		cfg.TimeoutMS = defaultMCPTimeoutMS
	}
	if cfg.TimeoutMS < 1 || cfg.TimeoutMS > protocol.MaxTimeoutMS {
		return nil, fmt.Errorf("--mcp %s: timeout_ms must be from 1 to %d", path, protocol.MaxTimeoutMS)
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = 3
	}
	if cfg.MaxAttempts < 1 || cfg.MaxAttempts > protocol.MaxAttemptsLimit {
		return nil, fmt.Errorf("--mcp %s: max_attempts must be from 1 to %d", path, protocol.MaxAttemptsLimit)
	}
	if _, err := mcpexec.New(mcpexec.Config{Servers: cfg.Servers}); err != nil {
		return nil, fmt.Errorf("--mcp %s: %w", path, err)
	}
	return &cfg, nil
}

// mcpService runs a worker's MCP servers beside it: it registers their tools' contracts through
// a gateway as they are listed, and keeps their states on the bus (hermes mcp ls, the gateway's
// /readyz) and in the metrics.
type mcpService struct {
	exec     *mcpexec.Executor
	cfg      *MCPConfig
	instance string
	tools    jetstream.KeyValue
	gateway  *gatewayAPI // nil: the contracts are registered otherwise
	metrics  *metrics.Metrics
	log      *slog.Logger

	mu      sync.Mutex
	pending map[string][]mcpexec.Tool // by server: the last list, not registered yet
	wake    chan struct{}
}

// newMCPService makes the executor of cfg's servers, registering nothing.
func newMCPService(cfg *MCPConfig, instance string, b *bus.Bus, m *metrics.Metrics, log *slog.Logger) (*mcpService, error) {
	s := &mcpService{cfg: cfg, instance: instance, tools: b.Tools, metrics: m, log: log.With("component", "mcp"),
		pending: map[string][]mcpexec.Tool{}, wake: make(chan struct{}, 1)}
	var err error
	s.exec, err = mcpexec.New(mcpexec.Config{Servers: cfg.Servers, OnTools: s.listed, Logger: s.log})
	return s, err
}

// newMCPServiceFor is newMCPService registering through gateway with key, when both are given.
func newMCPServiceFor(cfg *MCPConfig, instance string, b *bus.Bus, gateway, key string, m *metrics.Metrics, log *slog.Logger) (*mcpService, error) {
	s, err := newMCPService(cfg, instance, b, m, log)
	if err == nil && gateway != "" && key != "" {
		s.gateway = &gatewayAPI{base: gateway, client: &http.Client{Timeout: 30 * time.Second}, key: keyFlag{fixed: key}}
	}
	return s, err
}

// listed takes a server's tools as listed; they are registered by run.
func (s *mcpService) listed(server string, tools []mcpexec.Tool) {
	s.mu.Lock()
	s.pending[server] = tools
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// statePeriod is how often the servers' states are written to the bus.
const statePeriod = 5 * time.Second

// run keeps the servers connected, registers their tools and publishes their states until ctx
// ends; then it removes its state from the bus.
func (s *mcpService) run(ctx context.Context) error {
	done := make(chan struct{})
	go func() { _ = s.exec.Run(ctx); close(done) }()
	tick := time.NewTicker(statePeriod)
	defer tick.Stop()
	for {
		s.publish(ctx)
		changed := s.exec.Changed()
		select {
		case <-changed: // a server connected, went away or listed its tools: said at once
		case <-ctx.Done():
			<-done
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			_ = s.tools.Delete(dctx, mcpStateKey(s.instance))
			cancel()
			return nil
		case <-s.wake:
			s.register(ctx)
		case <-tick.C:
			s.register(ctx) // what failed to register is tried again
		}
	}
}

// mcpStateKey is the key of instance's state: its name with what a key token may not hold as
// '_'.
func mcpStateKey(instance string) string {
	return protocol.KeyMCPState(strings.Map(func(r rune) rune {
		if r < 128 && (r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return r
		}
		return '_'
	}, protocol.Shorten(instance, 128)))
}

// MCPWorkerState is what a worker keeps on the bus of its MCP servers.
type MCPWorkerState struct {
	Worker    string          `json:"worker"`
	UpdatedAt time.Time       `json:"updated_at"`
	Servers   []mcpexec.State `json:"servers"`
}

// mcpStale is how old a worker's state may be before it is shown as stale (the worker gone).
const mcpStale = 4 * statePeriod

func (s *mcpService) publish(ctx context.Context) {
	states := s.exec.States()
	for _, st := range states {
		for _, name := range []string{mcpexec.StateConnecting, mcpexec.StateConnected, mcpexec.StateRestarting, mcpexec.StateError} {
			v := 0.0
			if st.State == name {
				v = 1
			}
			s.metrics.MCPServers.WithLabelValues(st.Server, name).Set(v)
		}
		s.metrics.MCPTools.WithLabelValues(st.Server).Set(float64(st.Tools))
	}
	data, err := json.Marshal(MCPWorkerState{Worker: s.instance, UpdatedAt: time.Now().UTC(), Servers: states})
	if err != nil {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := s.tools.Put(pctx, mcpStateKey(s.instance), data); err != nil && ctx.Err() == nil {
		s.log.Warn("could not keep the MCP servers' state on the bus", "err", err)
	}
}

// register posts the contracts of the tools listed since, through the gateway.
func (s *mcpService) register(ctx context.Context) {
	if s.gateway == nil {
		return
	}
	s.mu.Lock()
	pending := s.pending
	s.pending = map[string][]mcpexec.Tool{}
	s.mu.Unlock()
	for server, tools := range pending {
		var failed bool
		for _, t := range tools {
			if err := s.registerTool(ctx, t); err != nil {
				if ctx.Err() != nil {
					return
				}
				var ae *apiError
				if errors.As(err, &ae) && (ae.Status == http.StatusBadRequest || ae.Status == http.StatusRequestEntityTooLarge || ae.Status == http.StatusUnprocessableEntity) {
					// Refused for what it is (a schema that does not compile, too large): not
					// served by contract until the server lists it otherwise.
					s.log.Error("an MCP tool's contract was refused; the tool has no contract", "tool", t.Name, "err", err)
					continue
				}
				s.log.Warn("could not register an MCP tool's contract; trying again", "tool", t.Name, "err", err)
				failed = true
			}
		}
		if failed {
			s.mu.Lock()
			if _, newer := s.pending[server]; !newer {
				s.pending[server] = tools
			}
			s.mu.Unlock()
		}
	}
}

// mcpContract is the contract of an MCP tool: its schemas as the server gives them, reached
// at the server by its name.
func mcpContract(t mcpexec.Tool, cfg *MCPConfig) map[string]any {
	// Tried again only where that is safe: MCP carries no idempotency key, so a call that
	// reached the server before it went away may have done its work.
	attempts := cfg.MaxAttempts
	if e := mcpEffects(t); e == contract.EffectsSideEffects {
		attempts = 1
	}
	retry := map[string]any{"max_attempts": attempts, "initial_interval_ms": 1000, "backoff_factor": 2}
	doc := map[string]any{"name": t.Name, "description": protocol.Shorten(t.Description, contract.MaxDescriptionBytes),
		"reach":   map[string]any{"mcp": map[string]any{"server": t.Server, "tool": t.MCPName, "timeout_ms": cfg.TimeoutMS, "retry": retry}},
		"effects": string(mcpEffects(t))}
	if len(t.InputSchema) > 0 && string(t.InputSchema) != "null" {
		doc["input_schema"] = t.InputSchema
	}
	if len(t.OutputSchema) > 0 && string(t.OutputSchema) != "null" {
		doc["output_schema"] = t.OutputSchema
	}
	return doc
}

// mcpEffects reads a tool's annotations as MCP defines their defaults: not read-only, and
// destructive unless it says otherwise.
func mcpEffects(t mcpexec.Tool) contract.Effects {
	a := t.Annotations
	switch {
	case a == nil:
		return contract.EffectsSideEffects
	case a.ReadOnlyHint:
		return contract.EffectsNone
	case a.DestructiveHint != nil && !*a.DestructiveHint && a.IdempotentHint:
		return contract.EffectsIdempotent
	}
	return contract.EffectsSideEffects
}

// registerTool registers one tool's contract, not tried by the sandbox: an MCP server's list is
// its own word on its tools (the sandbox would call third-party tools with made-up arguments,
// some asking for capabilities no worker offers), and every call is checked against these
// schemas all the same.
func (s *mcpService) registerTool(ctx context.Context, t mcpexec.Tool) error {
	body, err := json.Marshal(mcpContract(t, s.cfg))
	if err != nil {
		return err
	}
	_, err = s.gateway.registerContract(ctx, body, t.Name, "?try=false")
	return err
}

// mcpStates reads every worker's MCP states from the bus, stale ones marked.
func mcpStates(ctx context.Context, tools jetstream.KeyValue) ([]MCPWorkerState, error) {
	keys, err := tools.ListKeysFiltered(ctx, protocol.MCPStatePrefix+">")
	if err != nil {
		return nil, err
	}
	var out []MCPWorkerState
	for k := range keys.Keys() {
		e, err := tools.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var st MCPWorkerState
		if json.Unmarshal(e.Value(), &st) != nil || mcpStateKey(st.Worker) != k {
			continue // not a worker's state as workers write it
		}
		out = append(out, st)
	}
	return out, nil
}

// RunMCP shows the MCP servers tool workers hold: hermes mcp ls.
func RunMCP(ctx context.Context, args []string, env Env) error {
	if len(args) == 0 || args[0] != "ls" {
		fmt.Fprintln(env.Stderr, "Usage: hermes mcp ls [flags]")
		return errors.New("mcp: say ls")
	}
	fs := newFlagSet("mcp ls", "hermes mcp ls [flags]", env.Stderr)
	var c common
	c.register(fs, "mcp")
	asJSON := fs.Bool("json", false, "print JSON")
	nc, b, err := c.dialAsCLI(ctx, fs, args[1:], env)
	if err != nil {
		return err
	}
	defer nc.Close()
	states, err := mcpStates(ctx, b.Tools)
	if err != nil {
		return fmt.Errorf("mcp ls: %w", err)
	}
	if *asJSON {
		return printJSON(env, states)
	}
	if len(states) == 0 {
		fmt.Fprintln(env.Stdout, "(no tool worker holds MCP servers: give one --mcp FILE)")
		return nil
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "WORKER\tSERVER\tSTATE\tTOOLS\tRESTARTS\tSINCE\tERROR")
	for _, w := range states {
		stale := ""
		if time.Since(w.UpdatedAt) > mcpStale {
			stale = " (stale: last heard " + w.UpdatedAt.Local().Format(time.TimeOnly) + ")"
		}
		for _, st := range w.Servers {
			fmt.Fprintf(tw, "%s\t%s\t%s%s\t%d\t%d\t%s\t%s\n", w.Worker, st.Server, st.State, stale, st.Tools, st.Restarts,
				st.Since.Local().Format(time.TimeOnly), st.Error)
		}
	}
	return nil
}
