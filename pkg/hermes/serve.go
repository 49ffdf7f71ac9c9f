package hermes

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
)

// Config is how Serve reaches Hermes: the bus, as a tool worker's NATS user, and a gateway
// where the tools' contracts are registered.
type Config struct {
	// NATS is the server's URL (tls:// for TLS). Required unless Options say how to connect
	// (an embedded server's in-process connection).
	NATS string
	// Options are more NATS connection options, applied after the credentials.
	Options []nats.Option
	// Credentials: a tool worker's nkey seed file or creds file, the CA, a client certificate
	// (bus.Credentials).
	NKey, Creds, CA, Cert, Key string
	// Inbox is the reply-subject prefix the NATS user's permissions name: default the tool
	// worker role's, bus.RoleInbox(bus.RoleWorker) (_INBOX_toolworker); a worker user made for
	// some tools only (hermes nats-auth --worker NAME=…) has _INBOX_NAME. Options may set it
	// too (nats.CustomInboxPrefix), and win. Serve fails at once, not on its first timeout,
	// when the user may not receive replies under it (bus.ErrInboxRefused).
	Inbox string
	// TrustedSeals are the routers' public keys by key id: only calls they sealed are run.
	TrustedSeals map[string]ed25519.PublicKey
	// SealKey, named SealKeyID, seals every result these tools give (hermes seal-key --tools
	// makes one; the routers trust its public line for these tools): routers that check
	// results refuse unsealed ones. TrustedResults are the keys trusted to seal results (the
	// same file's lines), so that a result someone else put on a call's subject is not taken
	// for the call's; they are used only with SealKey, and must include it.
	SealKeyID      string
	SealKey        ed25519.PrivateKey
	TrustedResults protocol.ResultKeys
	// Gateway is the base URL of a gateway, and APIKey a key with the tools:admin permission:
	// the contracts are registered there before serving. Empty Gateway registers nothing (they
	// must be registered otherwise: hermes tools register).
	Gateway, APIKey string
	// AllowSideEffects lets the gateway's sandbox try tools with side effects (a Go tool has
	// no other reach to be tried at); Force registers a tool the sandbox refuses, with its
	// report.
	AllowSideEffects, Force bool
	// Instance names this worker; default "hermes-sdk".
	Instance string
	// Concurrency bounds calls of one tool at once; Pools the bulkheads (worker.Pools).
	Concurrency int
	Pools       worker.Pools
	// NoFastLane: the tools' calls all come from the bus; otherwise the read-only ones
	// (effects: none) may come from routers over request/reply too (worker.Config.FastLane),
	// which the tool worker role's NATS user may answer.
	NoFastLane bool
	// Logger; nil discards.
	Logger *slog.Logger
}

// Serve runs the tools as a tool worker until ctx ends, registering their contracts (when cfg
// names a gateway) once it serves them: the gateway's sandbox tries each tool through the bus,
// so it must already be served. A tool whose types cannot be said in JSON Schema, or whose
// contract the gateway (or its sandbox) refuses, is an error, and nothing stays served.
func Serve(ctx context.Context, cfg Config, tools ...*Def) error {
	if len(tools) == 0 {
		return errors.New("hermes: Serve needs at least one tool")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	funcs := map[string]worker.Func{}
	for _, t := range tools {
		if t == nil {
			return errors.New("hermes: a nil tool")
		}
		if t.err != nil {
			return t.err
		}
		if _, dup := funcs[t.Name()]; dup {
			return fmt.Errorf("hermes: tool %s is served twice", t.Name())
		}
		funcs[t.Name()] = t.fn
	}
	if cfg.Instance == "" {
		cfg.Instance = "hermes-sdk"
	}
	if cfg.Inbox == "" {
		cfg.Inbox = bus.RoleInbox(bus.RoleWorker)
	}
	opts, err := bus.Credentials{NKeyFile: cfg.NKey, CredsFile: cfg.Creds, CAFile: cfg.CA, CertFile: cfg.Cert, KeyFile: cfg.Key, Inbox: cfg.Inbox}.Options()
	if err != nil {
		return fmt.Errorf("hermes: %w", err)
	}
	nc, err := bus.Connect(ctx, cfg.NATS, cfg.Instance, log, append(opts, cfg.Options...)...)
	if err != nil {
		return fmt.Errorf("hermes: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("hermes: %w", err)
	}
	b, err := bus.Provision(ctx, js, bus.Config{NoProvision: true})
	if err != nil {
		return fmt.Errorf("hermes: %w", err)
	}
	if len(cfg.SealKey) > 0 {
		if len(cfg.SealKey) != ed25519.PrivateKeySize || cfg.SealKeyID == "" {
			return errors.New("hermes: Config.SealKey needs an ed25519 private key and its SealKeyID")
		}
		// The worker's own key must be among those trusted: a key no one trusts seals results
		// no router counts.
		have, ok := cfg.TrustedResults[cfg.SealKeyID]
		if !ok || !have.Key.Equal(cfg.SealKey.Public()) {
			return fmt.Errorf("hermes: Config.TrustedResults must hold this worker's own key %q (and the others trusted): its results would not count even for itself", cfg.SealKeyID)
		}
		b.TrustResults(cfg.TrustedResults)
		b.SealResults(cfg.SealKeyID, cfg.SealKey)
	}
	exec, err := worker.NewFuncs(funcs)
	if err != nil {
		return err
	}
	w, err := worker.New(worker.Config{Bus: b, Instance: cfg.Instance, Executors: []worker.Executor{exec},
		Concurrency: cfg.Concurrency, Pools: cfg.Pools, Contracts: &contract.Versions{KV: b.Contracts},
		Level: levels(tools), TrustedSeals: cfg.TrustedSeals, FastLane: !cfg.NoFastLane, Logger: log})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	log.Info("serving Go tools", "tools", exec.Tools())
	if cfg.Gateway == "" {
		log.Warn("no gateway named: the tools' contracts are not registered here")
	}
	// Registering waits for the gateway's sandbox, which needs this worker running: should the
	// worker stop meanwhile, that is the error, not the sandbox's refusal that follows it.
	registered := make(chan error, 1)
	go func() {
		for _, t := range tools {
			if cfg.Gateway == "" {
				break
			}
			if err := register(ctx, cfg, t, log); err != nil {
				registered <- err
				return
			}
			log.Info("contract registered", "tool", t.Name())
		}
		registered <- nil
	}()
	select {
	case err := <-done:
		cancel(err)
		rerr := <-registered
		if err == nil { // ctx ended while registering: a stop, not a failure
			return nil
		}
		return errors.Join(err, rerr)
	case err := <-registered:
		if err != nil {
			stopped := ctx.Err() != nil // ctx ended while registering: a stop, not a failure
			cancel(err)
			<-done
			if stopped {
				return nil
			}
			return err
		}
	}
	return <-done
}

// levels says each tool's resource level, as its contract here does.
func levels(tools []*Def) func(string) string {
	m := map[string]string{}
	for _, t := range tools {
		if p := t.contract.ExecutionPolicy; p != nil {
			m[t.Name()] = p.ResourceLevel
		}
	}
	return func(tool string) string { return m[tool] }
}

// register posts t's contract to the gateway (as JSON, its reach in a routes file's form).
// registerPatience is how long registering waits for a gateway that is not up yet (refuses
// connections, or answers 503).
const registerPatience = time.Minute

// register posts t's contract, trying again while the gateway is not up yet.
func register(ctx context.Context, cfg Config, t *Def, log *slog.Logger) error {
	start := time.Now()
	for delay := 250 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		retry, err := registerOnce(ctx, cfg, t)
		if err == nil || !retry || time.Since(start)+delay > registerPatience {
			return err
		}
		log.Info("the gateway is not ready; registering again", "tool", t.Name(), "in", delay, "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
	}
}

// registerOnce posts t's contract once; retry says the gateway was not ready.
func registerOnce(ctx context.Context, cfg Config, t *Def) (retry bool, err error) {
	c := t.contract
	doc := map[string]any{"name": c.Name, "description": c.Description, "input_schema": c.InputSchema,
		"output_schema": c.OutputSchema, "reach": map[string]any{"go": map[string]any{"timeout_ms": c.Reach.TimeoutMS,
			"retry": map[string]any{"max_attempts": c.Reach.Retry.MaxAttempts}}}}
	if c.ExecutionPolicy != nil {
		doc["execution_policy"] = c.ExecutionPolicy
	}
	if c.Effects != "" {
		doc["effects"] = c.Effects
	}
	if len(c.Recipients) > 0 {
		doc["recipients"] = c.Recipients
	}
	body, err := json.Marshal(doc)
	if err != nil {
		return false, err
	}
	q := url.Values{}
	if cfg.AllowSideEffects {
		q.Set("allow_side_effects", "true")
	}
	if cfg.Force {
		q.Set("force", "true")
	}
	path := "/api/v1/tools"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(cfg.Gateway, "/")+path, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+cfg.APIKey)
	// The gateway answers once its sandbox has tried the tool (up to five minutes).
	resp, err := (&http.Client{Timeout: 6 * time.Minute}).Do(req)
	if err != nil {
		return errors.Is(err, syscall.ECONNREFUSED), fmt.Errorf("hermes: register the contract of %s: %w", c.Name, err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		return resp.StatusCode == http.StatusServiceUnavailable, fmt.Errorf("hermes: register the contract of %s: %s", c.Name, refusal(resp.StatusCode, answer))
	}
	return false, nil
}

// refusal says why the gateway refused a contract: its error, and the cases its sandbox saw
// broken.
func refusal(status int, answer []byte) string {
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
		Sandbox *struct {
			Cases []struct {
				ID, Kind, Name, Outcome, Detail string
				Arguments                       json.RawMessage
			} `json:"cases"`
		} `json:"sandbox"`
	}
	if json.Unmarshal(answer, &body) != nil || body.Error.Code == "" {
		return fmt.Sprintf("the gateway answered %d: %s", status, bytes.TrimSpace(answer))
	}
	msg := fmt.Sprintf("the gateway answered %d %s: %s", status, body.Error.Code, body.Error.Message)
	if body.Sandbox != nil {
		for _, c := range body.Sandbox.Cases {
			if c.Outcome == "violation" || c.Outcome == "unfinished" {
				msg += fmt.Sprintf("\n  %s %s [%s] %s %s: %s", c.ID, strings.ToUpper(c.Outcome), c.Kind, c.Name, c.Arguments, c.Detail)
			}
		}
	}
	return msg
}
