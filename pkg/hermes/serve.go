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
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/worker"
)

// Config is how Serve reaches Hermes: the bus, as a tool worker's NATS user, and a gateway
// where the tools' contracts are registered.
type Config struct {
	// NATS is the server's URL (tls:// for TLS). Required.
	NATS string
	// Credentials: a tool worker's nkey seed file or creds file, the CA, a client certificate
	// (bus.Credentials).
	NKey, Creds, CA, Cert, Key string
	// TrustedSeals are the routers' public keys by key id: only calls they sealed are run.
	TrustedSeals map[string]ed25519.PublicKey
	// Gateway is the base URL of a gateway, and APIKey a key with the tools:admin permission:
	// the contracts are registered there before serving. Empty Gateway registers nothing (they
	// must be registered otherwise: hermes tools register).
	Gateway, APIKey string
	// Instance names this worker; default "hermes-sdk".
	Instance string
	// Concurrency bounds calls of one tool at once; Pools the bulkheads (worker.Pools).
	Concurrency int
	Pools       worker.Pools
	// Logger; nil discards.
	Logger *slog.Logger
}

// Serve registers the tools' contracts (when cfg names a gateway), then runs them as a tool
// worker until ctx ends. A tool whose types cannot be said in JSON Schema, or whose contract
// the gateway refuses, is an error before anything is served.
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
	if cfg.Gateway != "" {
		for _, t := range tools {
			if err := register(ctx, cfg, t); err != nil {
				return err
			}
		}
	} else {
		log.Warn("no gateway named: the tools' contracts are not registered here")
	}
	if cfg.Instance == "" {
		cfg.Instance = "hermes-sdk"
	}
	opts, err := bus.Credentials{NKeyFile: cfg.NKey, CredsFile: cfg.Creds, CAFile: cfg.CA, CertFile: cfg.Cert, KeyFile: cfg.Key}.Options()
	if err != nil {
		return fmt.Errorf("hermes: %w", err)
	}
	nc, err := bus.Connect(ctx, cfg.NATS, cfg.Instance, log, opts...)
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
	exec, err := worker.NewFuncs(funcs)
	if err != nil {
		return err
	}
	w, err := worker.New(worker.Config{Bus: b, Instance: cfg.Instance, Executors: []worker.Executor{exec},
		Concurrency: cfg.Concurrency, Pools: cfg.Pools, Contracts: &contract.Versions{KV: b.Contracts},
		Level: levels(tools), TrustedSeals: cfg.TrustedSeals, Logger: log})
	if err != nil {
		return err
	}
	log.Info("serving Go tools", "tools", exec.Tools())
	return w.Run(ctx)
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
func register(ctx context.Context, cfg Config, t *Def) error {
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
	body, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(cfg.Gateway, "/")+"/api/v1/tools", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+cfg.APIKey)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("hermes: register the contract of %s: %w", c.Name, err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("hermes: register the contract of %s: the gateway answered %d: %s", c.Name, resp.StatusCode, bytes.TrimSpace(answer))
	}
	return nil
}
