package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/record"
	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/internal/sandbox"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// The tool registry over HTTP: contracts registered, read, versioned and removed
// (/api/v1/tools). Reading needs a caller who may submit; changing needs tools:admin, which a
// gateway without callers grants nobody.

// contractTypes are the media types a contract is taken in.
var contractTypes = map[string]bool{"application/yaml": true, "application/x-yaml": true, "text/yaml": true, "application/json": true}

func (g *Gateway) registerTools() {
	if g.cfg.Bus == nil || g.cfg.Bus.Contracts == nil {
		return
	}
	g.tools = registry.NewStore(g.cfg.Bus.Contracts)
	g.sandbox = &sandbox.Sandbox{KV: g.cfg.Bus.Contracts, Submit: g.submit, Log: g.log}
	g.mux.HandleFunc("GET /api/v1/tools", g.require(auth.PermSubmit, g.handleListTools))
	g.mux.HandleFunc("GET /api/v1/tools/{name}", g.require(auth.PermSubmit, g.handleGetTool))
	g.mux.HandleFunc("POST /api/v1/tools", g.require(auth.PermToolsAdmin, g.handleRegisterTool))
	g.mux.HandleFunc("DELETE /api/v1/tools/{name}", g.require(auth.PermToolsAdmin, g.handleRemoveTool))
	g.mux.HandleFunc("POST /api/v1/tools/{name}/check", g.require(auth.PermToolsAdmin, g.handleCheckTool))
}

// ToolView is a tool's contract as the API shows it.
type ToolView struct {
	Name         string    `json:"name"`
	Version      int       `json:"version"`
	Revision     uint64    `json:"revision"`
	RegisteredAt time.Time `json:"registered_at"`
	By           string    `json:"by,omitempty"`
	Removed      bool      `json:"removed,omitempty"`
	// Damaged: what the bucket holds last for the tool is no record (the version shown is the
	// last one that is, still in use); registering the tool again repairs it.
	Damaged bool `json:"damaged,omitempty"`
	// Changed (registration only): false when the contract was registered already as it is.
	Changed  *bool              `json:"changed,omitempty"`
	Contract *contract.Contract `json:"contract,omitempty"`
	Source   string             `json:"source,omitempty"`
	// History lists every version still kept, oldest first (GET of one tool).
	History []ToolVersion `json:"history,omitempty"`
	// Sandbox is what the sandbox said of this version as it was registered.
	Sandbox json.RawMessage `json:"sandbox,omitempty"`
}

// ToolVersion is one version in a tool's history.
type ToolVersion struct {
	Version      int       `json:"version"`
	Revision     uint64    `json:"revision"`
	RegisteredAt time.Time `json:"registered_at"`
	By           string    `json:"by,omitempty"`
	Removed      bool      `json:"removed,omitempty"`
}

func viewOf(e *registry.Entry, withContract bool) ToolView {
	v := ToolView{Name: e.Contract.Name, Version: e.Version, Revision: e.Revision, RegisteredAt: e.RegisteredAt, By: e.By, Removed: e.Removed, Sandbox: e.Sandbox}
	if withContract && !e.Removed {
		c := e.Contract
		v.Contract, v.Source = &c, e.Source
	}
	return v
}

// hideReach hides a reach's header values, and the contract as written, from callers who may
// not change tools (everyone, on a gateway that asks for no key): as the record hides a
// dispatch's header values.
func hideReach(r *http.Request, v *ToolView) {
	if c := CallerOf(r.Context()); c != nil && c.Can(auth.PermToolsAdmin) || v.Contract == nil || v.Contract.Reach == nil {
		return
	}
	cp := *v.Contract
	reach := *cp.Reach
	hide := func(h map[string]string) map[string]string {
		out := make(map[string]string, len(h))
		for k := range h {
			out[k] = record.HiddenHeaderValue
		}
		return out
	}
	if reach.HTTP != nil {
		http := *reach.HTTP
		http.Headers = hide(http.Headers)
		reach.HTTP = &http
	}
	if reach.GRPC != nil {
		grpc := *reach.GRPC
		grpc.Headers = hide(grpc.Headers)
		reach.GRPC = &grpc
	}
	cp.Reach = &reach
	v.Contract, v.Source = &cp, ""
}

// toolsAdmin refuses changes on a gateway that names no callers: nobody there can be known to
// hold tools:admin, and a contract may say where workers call.
func (g *Gateway) toolsAdmin(w http.ResponseWriter) bool {
	if g.cfg.Callers == nil {
		writeError(w, http.StatusForbidden, protocol.CodeForbidden,
			"this gateway asks callers for no key, so nobody holds tools:admin here; change tools through a gateway with keys", nil)
		return false
	}
	return true
}

func (g *Gateway) handleRegisterTool(w http.ResponseWriter, r *http.Request) {
	if !g.toolsAdmin(w) {
		return
	}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if !contractTypes[mt] {
		writeError(w, http.StatusUnsupportedMediaType, protocol.CodeUnsupportedMediaType,
			"a contract is sent as YAML (Content-Type: application/yaml) or JSON (application/json)", nil)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, contract.MaxSourceBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, protocol.CodeBodyTooLarge,
				fmt.Sprintf("a contract is at most %d bytes", contract.MaxSourceBytes), nil)
			return
		}
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, "could not read the request body: "+err.Error(), nil)
		return
	}
	opts, ok := g.sandboxOptions(w, r)
	if !ok {
		return
	}
	force, ok := boolParam(w, r, "force")
	if !ok {
		return
	}
	try, ok := boolParamOr(w, r, "try", true) // try=false: the registrar asks for no sandbox
	if !ok {
		return
	}
	c, err := registry.Parse(body)
	if err != nil {
		writeContractError(w, err)
		return
	}
	cur, next, err := g.tools.Registered(r.Context(), c)
	if err != nil {
		g.log.Error("read a contract", "tool", c.Name, "err", err)
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the contract could not be registered; retry", nil)
		return
	}
	var report []byte
	if cur == nil && !try {
		report = (&sandbox.Report{Tool: c.Name, Verdict: sandbox.Skipped, Reason: "not tried: the registrar asked for no sandbox (try=false)"}).Kept()
	}
	if cur == nil && try { // a new version: tried first
		opts.Version = next
		rep, ok := g.try(w, r, c, opts)
		if !ok {
			return
		}
		if rep.Failed() && !force {
			g.log.Info("contract refused by the sandbox", "tool", c.Name, "reason", rep.Reason)
			var body apiError
			body.Error.Code, body.Error.Message = protocol.CodeSandboxRefused, "the sandbox refused "+c.Name+": "+rep.Reason+"; nothing was registered (fix the tool, or register with force=true to keep the contract and this report)"
			body.Sandbox = rep
			writeJSON(w, http.StatusUnprocessableEntity, &body)
			return
		}
		rep.Forced = rep.Failed()
		report = rep.Kept()
	}
	e, changed, err := g.tools.RegisterTried(r.Context(), c, body, byOf(r), report)
	var ce *contract.Error
	switch {
	case errors.As(err, &ce):
		writeContractError(w, err)
		return
	case errors.Is(err, registry.ErrTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, protocol.CodeBodyTooLarge, err.Error(), nil)
		return
	case errors.Is(err, registry.ErrFull):
		writeError(w, http.StatusInsufficientStorage, protocol.CodeStoreFull, err.Error(), nil)
		return
	case err != nil:
		g.log.Error("register a contract", "tool", c.Name, "err", err)
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the contract could not be registered; retry", nil)
		return
	}
	v := viewOf(e, true)
	v.Changed = &changed
	status := http.StatusOK
	if changed {
		status = http.StatusCreated
		g.log.Info("contract registered", "tool", c.Name, "version", e.Version, "by", e.By)
	}
	w.Header().Set("Location", "/api/v1/tools/"+c.Name)
	writeJSON(w, status, v)
}

// sandboxOptions reads how a sandbox may try a tool: allow_side_effects (true lets a tool
// with side effects be tried where real calls go) and budget (a duration, at most
// sandbox.MaxBudget). When it returns false, it has answered.
func (g *Gateway) sandboxOptions(w http.ResponseWriter, r *http.Request) (sandbox.Options, bool) {
	opts := sandbox.Options{Caller: admission.Actor{Caller: CallerOf(r.Context())}.Record(), MaxCalls: g.cfg.Limits.MaxToolCalls}
	var ok bool
	if opts.AllowSideEffects, ok = boolParam(w, r, "allow_side_effects"); !ok {
		return opts, false
	}
	if q := r.URL.Query().Get("budget"); q != "" {
		d, err := time.ParseDuration(q)
		if err != nil || d <= 0 || d > sandbox.MaxBudget {
			writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, fmt.Sprintf("budget must be a duration from 1s to %s (e.g. 30s)", sandbox.MaxBudget), nil)
			return opts, false
		}
		opts.Budget = d
	}
	return opts, true
}

// try runs the sandbox on c; when it returns false, it has answered.
func (g *Gateway) try(w http.ResponseWriter, r *http.Request, c *contract.Contract, opts sandbox.Options) (*sandbox.Report, bool) {
	rep, err := g.sandbox.Try(r.Context(), c, opts)
	if err != nil {
		g.log.Error("the sandbox could not run", "tool", c.Name, "err", err)
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the sandbox could not try "+c.Name+" (the bus did not answer); retry", nil)
		return nil, false
	}
	return rep, true
}

// boolParam reads query parameter name as true or false (absent: false); when it returns
// false, it has answered.
func boolParam(w http.ResponseWriter, r *http.Request, name string) (value, ok bool) {
	return boolParamOr(w, r, name, false)
}

// boolParamOr is boolParam with def when the parameter is absent.
func boolParamOr(w http.ResponseWriter, r *http.Request, name string, def bool) (value, ok bool) {
	q := r.URL.Query().Get(name)
	if q == "" {
		return def, true
	}
	v, err := strconv.ParseBool(q)
	if err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, name+" must be true or false", nil)
		return false, false
	}
	return v, true
}

// handleCheckTool runs the sandbox on a tool's registered contract (hermes tools check): the
// report says whether the tool still keeps it. Nothing is registered.
func (g *Gateway) handleCheckTool(w http.ResponseWriter, r *http.Request) {
	if !g.toolsAdmin(w) {
		return
	}
	name, ok := toolName(w, r)
	if !ok {
		return
	}
	opts, ok := g.sandboxOptions(w, r)
	if !ok {
		return
	}
	e, err := g.tools.Get(r.Context(), name)
	switch {
	case errors.Is(err, registry.ErrNotFound):
		writeError(w, http.StatusNotFound, protocol.CodeNotFound, "no contract is registered for tool "+name, nil)
		return
	case errors.Is(err, registry.ErrDamaged):
		writeError(w, http.StatusConflict, protocol.CodeContractUnavailable, "the contract of "+name+" is damaged; register it again", nil)
		return
	case err != nil:
		g.log.Error("read a contract", "tool", name, "err", err)
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the contract could not be read; retry", nil)
		return
	}
	opts.Version = e.Version
	rep, ok := g.try(w, r, &e.Contract, opts)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

func writeContractError(w http.ResponseWriter, err error) {
	var body apiError
	body.Error.Code, body.Error.Message = protocol.CodeInvalidContract, err.Error()
	var ce *contract.Error
	if errors.As(err, &ce) {
		body.Error.Field, body.Error.Line = ce.Field, ce.Line
	}
	writeJSON(w, http.StatusBadRequest, &body)
}

// byOf names the caller of r as the registry records who changed a tool.
func byOf(r *http.Request) string {
	c := CallerOf(r.Context())
	if c == nil {
		return ""
	}
	return c.Name + " (" + c.ID + ")"
}

// toolName reads {name}, answering 400 when it cannot be a tool's.
func toolName(w http.ResponseWriter, r *http.Request) (string, bool) {
	name := r.PathValue("name")
	if err := protocol.CheckToolName("name", name); err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, err.Error(), err)
		return "", false
	}
	return name, true
}

// handleListTools is GET /api/v1/tools: every registered tool, less those whose policy does
// not allow the caller's role (a caller who may change tools sees them all).
func (g *Gateway) handleListTools(w http.ResponseWriter, r *http.Request) {
	entries, damaged, err := g.tools.List(r.Context())
	if err != nil {
		g.log.Error("list contracts", "err", err)
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the contracts could not be read; retry", nil)
		return
	}
	out := struct {
		Tools   []ToolView `json:"tools"`
		Damaged []string   `json:"damaged,omitempty"`
	}{Tools: []ToolView{}, Damaged: damaged}
	for _, e := range entries {
		// A tool whose policy does not allow the caller's role is not offered to it.
		ok, err := g.offered(r, e)
		if err != nil {
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the tools' policies are not known yet; retry", nil)
			return
		}
		if !ok {
			continue
		}
		v := viewOf(e, true)
		v.Source = ""
		hideReach(r, &v)
		out.Tools = append(out.Tools, v)
	}
	writeJSON(w, http.StatusOK, out)
}

func (g *Gateway) handleGetTool(w http.ResponseWriter, r *http.Request) {
	name, ok := toolName(w, r)
	if !ok {
		return
	}
	hist, err := g.tools.History(r.Context(), name)
	switch {
	case errors.Is(err, registry.ErrNotFound):
		writeError(w, http.StatusNotFound, protocol.CodeNotFound, "no contract is registered for tool "+name, nil)
		return
	case err != nil:
		g.log.Error("read a contract", "tool", name, "err", err)
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the contract could not be read; retry", nil)
		return
	}
	shown := hist[len(hist)-1]
	if q := r.URL.Query().Get("version"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, "version must be a version number (1, 2, …)", nil)
			return
		}
		shown = nil
		for _, e := range hist {
			if e.Version == n {
				shown = e
			}
		}
		if shown == nil {
			writeError(w, http.StatusNotFound, protocol.CodeNotFound, fmt.Sprintf("tool %s has no version %q kept (the last %d are)", name, q, len(hist)), nil)
			return
		}
	}
	v := viewOf(shown, true)
	if _, err := g.tools.Get(r.Context(), name); errors.Is(err, registry.ErrDamaged) {
		v.Damaged = true // what the bucket holds last is no record: register the tool again
	}
	hideReach(r, &v)
	for _, e := range hist {
		v.History = append(v.History, ToolVersion{Version: e.Version, Revision: e.Revision, RegisteredAt: e.RegisteredAt, By: e.By, Removed: e.Removed})
	}
	writeJSON(w, http.StatusOK, v)
}

func (g *Gateway) handleRemoveTool(w http.ResponseWriter, r *http.Request) {
	if !g.toolsAdmin(w) {
		return
	}
	name, ok := toolName(w, r)
	if !ok {
		return
	}
	e, err := g.tools.Remove(r.Context(), name, byOf(r))
	switch {
	case errors.Is(err, registry.ErrNotFound):
		writeError(w, http.StatusNotFound, protocol.CodeNotFound, "no contract is registered for tool "+name, nil)
		return
	case errors.Is(err, registry.ErrFull):
		writeError(w, http.StatusInsufficientStorage, protocol.CodeStoreFull, err.Error(), nil)
		return
	case err != nil:
		g.log.Error("remove a contract", "tool", name, "err", err)
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the contract could not be removed; retry", nil)
		return
	}
	g.log.Info("contract removed", "tool", name, "version", e.Version, "by", e.By)
	writeJSON(w, http.StatusOK, viewOf(e, false))
}
