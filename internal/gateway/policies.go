package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/memory"
	"github.com/hermesbus/hermes/internal/policies"
	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Tools' policies over HTTP (/api/v1/policies): every tool's policy in force read, policies
// applied from a policy file (package pkg/policy) and removed, each change a version kept in
// the bus's policies bucket (package policies). Reading needs a caller who may submit;
// changing needs tools:admin, which a gateway without callers grants nobody.

func (g *Gateway) registerPolicies() {
	if g.cfg.Bus == nil {
		return
	}
	kv := g.cfg.Bus.Bucket(policies.PoliciesBucket)
	if kv == nil {
		return
	}
	g.policies = policies.NewStore(kv)
	g.book = policies.NewBook(kv, g.log.With("part", "policies"))
	g.local = &policies.Local{Rules: g.book}
	if w := g.cfg.Bus.Bucket(policies.WindowsBucket); w != nil {
		g.local.Windows = &policies.Windows{KV: w}
	}
	g.mux.HandleFunc("GET /api/v1/policies", g.require(auth.PermSubmit, g.handleListPolicies))
	g.mux.HandleFunc("GET /api/v1/policies/{tool}", g.require(auth.PermSubmit, g.handleGetPolicy))
	g.mux.HandleFunc("POST /api/v1/policies", g.require(auth.PermToolsAdmin, g.handleApplyPolicies))
	g.mux.HandleFunc("DELETE /api/v1/policies/{tool}", g.require(auth.PermToolsAdmin, g.handleRemovePolicy))
}

// PolicyView is a tool's policy as the API shows it: applied through the API (source
// "policy"), or written in the tool's contract (source "contract").
type PolicyView struct {
	Tool string `json:"tool"`
	// Source is policies.SourcePolicy or policies.SourceContract; Version the policy's version
	// there (for a contract, the contract's).
	Source  string `json:"source"`
	Version int    `json:"version"`
	// Policy is nil on a removal.
	Policy *policy.Policy `json:"policy,omitempty"`
	// Summary says what the policy decides, in a few words.
	Summary   string    `json:"summary,omitempty"`
	AppliedAt time.Time `json:"applied_at"`
	By        string    `json:"by,omitempty"`
	// Removed: the tool's applied policy was removed, and its contract has none.
	Removed bool `json:"removed,omitempty"`
	// Changed (apply only): false when the policy was applied already as it is.
	Changed *bool `json:"changed,omitempty"`
	// History lists every applied version still kept, oldest first (GET of one tool).
	History []PolicyVersion `json:"history,omitempty"`
}

// PolicyVersion is one version in a tool's applied policies.
type PolicyVersion struct {
	Version   int            `json:"version"`
	Policy    *policy.Policy `json:"policy,omitempty"`
	AppliedAt time.Time      `json:"applied_at"`
	By        string         `json:"by,omitempty"`
	Removed   bool           `json:"removed,omitempty"`
}

// PolicyList is GET /api/v1/policies (every tool with a policy, by tool) and the answer of
// POST /api/v1/policies (the tools of the file, in its order).
type PolicyList struct {
	Policies []PolicyView `json:"policies"`
}

func appliedView(e *policies.Entry) PolicyView {
	v := PolicyView{Tool: e.Tool, Source: policies.SourcePolicy, Version: e.Version, Policy: e.Policy, AppliedAt: e.AppliedAt, By: e.By, Removed: e.Removed}
	if e.Policy != nil {
		v.Summary = e.Policy.Summary()
	}
	return v
}

// contractView is the policy block of a registered contract; false when it has none.
func contractView(e *registry.Entry) (PolicyView, bool) {
	p := e.Contract.Policy
	if e.Removed || p.Empty() {
		return PolicyView{}, false
	}
	return PolicyView{Tool: e.Contract.Name, Source: policies.SourceContract, Version: e.Version, Policy: p, Summary: p.Summary(),
		AppliedAt: e.RegisteredAt, By: e.By}, true
}

// Offers reports whether a caller of role is offered tool (its contract k; nil for none): the
// listings of this gateway and of its doors (MCP tools/list, the tools the chat doors offer the
// model) leave out tools whose policy does not allow the role. Until the gateway follows the
// applied policies (Listen), and while a tool's policy cannot be read, the tool is offered to
// nobody. A gateway on a bus without the policies' bucket offers every tool. Safe for
// concurrent use.
func (g *Gateway) Offers(tool string, k *contract.Compiled, role string) bool {
	return g.book == nil || g.book.Offers(tool, k, role)
}

// BuiltinPolicies decides the policies of the tools this gateway's doors run themselves
// (memory_write): nil when the bus keeps no policies.
func (g *Gateway) BuiltinPolicies() *policies.Local { return g.local }

// builtin reports whether tool is one this gateway's doors run themselves, whose policies
// CheckBuiltin bounds.
func (g *Gateway) builtin(tool string) bool { return tool == memory.WriteTool && g.memory != nil }

// roleOf is the role the policies know the caller of r by ("" for none).
func roleOf(r *http.Request) string {
	return admission.Actor{Caller: CallerOf(r.Context())}.Role()
}

// offered reports whether the caller of r is listed tool e: callers who may change tools see
// every tool. errNotFollowing when the applied policies are not known yet.
func (g *Gateway) offered(r *http.Request, e *registry.Entry) (bool, error) {
	if g.book == nil || CallerOf(r.Context()).Can(auth.PermToolsAdmin) {
		return true, nil
	}
	c := e.Contract
	rule, err := g.book.Rule(c.Name, &contract.Compiled{Contract: &c, Version: e.Version})
	switch {
	case errors.Is(err, policies.ErrNotFollowing):
		return false, err
	case err != nil:
		return false, nil // unreadable: offered to nobody, as its calls are refused
	}
	return rule == nil || rule.Policy.Allows(roleOf(r)), nil
}

func (g *Gateway) handleListPolicies(w http.ResponseWriter, r *http.Request) {
	applied, err := g.policies.List(r.Context())
	if err != nil {
		g.log.Error("list policies", "err", err)
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the policies could not be read; retry", nil)
		return
	}
	out := PolicyList{Policies: []PolicyView{}}
	seen := map[string]bool{}
	for _, e := range applied {
		seen[e.Tool] = true
		out.Policies = append(out.Policies, appliedView(e))
	}
	if g.tools != nil {
		entries, _, err := g.tools.List(r.Context())
		if err != nil {
			g.log.Error("list contracts", "err", err)
			writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the contracts could not be read; retry", nil)
			return
		}
		for _, e := range entries {
			if v, ok := contractView(e); ok && !seen[v.Tool] {
				out.Policies = append(out.Policies, v)
			}
		}
	}
	slices.SortFunc(out.Policies, func(a, b PolicyView) int { return strings.Compare(a.Tool, b.Tool) })
	writeJSON(w, http.StatusOK, out)
}

// policyTool reads {tool}, answering 400 when it cannot be a tool's.
func policyTool(w http.ResponseWriter, r *http.Request) (string, bool) {
	tool := r.PathValue("tool")
	if err := protocol.CheckToolName("tool", tool); err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, err.Error(), err)
		return "", false
	}
	return tool, true
}

// handleGetPolicy is GET /api/v1/policies/{tool}: the policy in force (applied, else the
// contract's) with the applied versions kept; 404 when the tool has neither.
func (g *Gateway) handleGetPolicy(w http.ResponseWriter, r *http.Request) {
	tool, ok := policyTool(w, r)
	if !ok {
		return
	}
	hist, err := g.policies.History(r.Context(), tool)
	if err != nil && !errors.Is(err, policies.ErrNotFound) {
		g.log.Error("read a policy", "tool", tool, "err", err)
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the policy could not be read; retry", nil)
		return
	}
	var v PolicyView
	found := false
	if len(hist) > 0 && !hist[len(hist)-1].Removed {
		v, found = appliedView(hist[len(hist)-1]), true
	}
	if !found && g.tools != nil {
		e, err := g.tools.Get(r.Context(), tool)
		switch {
		case err == nil:
			v, found = contractView(e)
		case errors.Is(err, registry.ErrNotFound) || errors.Is(err, registry.ErrDamaged):
		default:
			g.log.Error("read a contract", "tool", tool, "err", err)
			writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the contract could not be read; retry", nil)
			return
		}
	}
	if !found && len(hist) > 0 {
		v, found = appliedView(hist[len(hist)-1]), true // removed, and no contract's policy stands
	}
	if !found {
		writeError(w, http.StatusNotFound, protocol.CodeNotFound, "tool "+tool+" has no policy: none is applied, and its contract has none", nil)
		return
	}
	for _, e := range hist {
		v.History = append(v.History, PolicyVersion{Version: e.Version, Policy: e.Policy, AppliedAt: e.AppliedAt, By: e.By, Removed: e.Removed})
	}
	writeJSON(w, http.StatusOK, v)
}

// handleApplyPolicies is POST /api/v1/policies: a policy file, every policy checked — its
// tool known, its roles known, max_recipients only where the contract names recipients —
// before any is applied. Each policy is applied as a version of its tool's, unless it is the
// one in force already (changed false).
func (g *Gateway) handleApplyPolicies(w http.ResponseWriter, r *http.Request) {
	if !g.toolsAdmin(w) {
		return
	}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if !contractTypes[mt] {
		writeError(w, http.StatusUnsupportedMediaType, protocol.CodeUnsupportedMediaType,
			"a policy file is sent as YAML (Content-Type: application/yaml) or JSON (application/json)", nil)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, policy.MaxFileBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, protocol.CodeBodyTooLarge,
				fmt.Sprintf("a policy file is at most %d bytes", policy.MaxFileBytes), nil)
			return
		}
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, "could not read the request body: "+err.Error(), nil)
		return
	}
	f, err := policy.ParseFile(body)
	if err != nil {
		writePolicyError(w, err)
		return
	}
	if err := g.checkPolicies(r.Context(), f); err != nil {
		var pe *policy.Error
		if !errors.As(err, &pe) {
			g.log.Error("check policies", "err", err)
			writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the tools could not be read to check the policies; nothing was applied; retry", nil)
			return
		}
		writePolicyError(w, err)
		return
	}
	out := PolicyList{Policies: []PolicyView{}}
	status := http.StatusOK
	for i, tool := range f.Tools {
		e, changed, err := g.policies.Apply(r.Context(), tool, f.Policies[tool], byOf(r))
		if err != nil {
			done := ""
			if i > 0 {
				done = " (applied before it: " + strings.Join(f.Tools[:i], ", ") + ")"
			}
			if errors.Is(err, policies.ErrFull) {
				writeError(w, http.StatusInsufficientStorage, protocol.CodeStoreFull, err.Error()+done, nil)
				return
			}
			g.log.Error("apply a policy", "tool", tool, "err", err)
			writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable,
				"the policy of "+tool+" could not be applied"+done+"; retry (applying the file again is safe)", nil)
			return
		}
		v := appliedView(e)
		v.Changed = &changed
		if changed {
			status = http.StatusCreated
			g.log.Info("policy applied", "tool", tool, "version", e.Version, "by", e.By, "policy", e.Policy.Summary())
		}
		out.Policies = append(out.Policies, v)
	}
	writeJSON(w, status, out)
}

// checkPolicies refuses a file naming a tool that is neither registered (a contract) nor
// served (the tools' bucket), a role no caller can have, or max_recipients for a tool whose
// contract names no recipients: a *policy.Error naming the field. Other errors are the bus's.
func (g *Gateway) checkPolicies(ctx context.Context, f *policy.File) error {
	var known []string
	for _, role := range auth.Roles() {
		known = append(known, string(role))
	}
	known = append(known, admission.ClientRole)
	var served map[string]bool // read once, when a tool has no contract
	for _, tool := range f.Tools {
		p, field := f.Policies[tool], "policies."+tool
		if err := p.CheckRoles(field, known); err != nil {
			return err
		}
		if g.builtin(tool) {
			if err := policies.CheckBuiltin(tool, p); err != nil {
				return err
			}
			continue
		}
		var k *contract.Contract
		if g.tools != nil {
			e, err := g.tools.Get(ctx, tool)
			switch {
			case err == nil:
				k = &e.Contract
			case errors.Is(err, registry.ErrDamaged):
				k = &contract.Contract{Name: tool} // registered; what it names is not known now
			case !errors.Is(err, registry.ErrNotFound):
				return err
			}
		}
		if k == nil {
			if served == nil {
				var err error
				if served, err = g.servedTools(ctx); err != nil {
					return err
				}
			}
			if !served[tool] && !g.isBlueprint(ctx, tool) {
				return &policy.Error{Field: field, Reason: fmt.Sprintf("no tool or blueprint %s is known: register its contract (hermes tools register), serve it, or register the blueprint first", tool)}
			}
		}
		if p.MaxRecipients > 0 && (k == nil || len(k.Recipients) == 0) {
			return &policy.Error{Field: field + ".max_recipients", Reason: fmt.Sprintf("counts the recipients the contract of %s names, and it names none: declare recipients in its contract", tool)}
		}
	}
	return nil
}

// servedTools are the tools the bus's tools bucket lists as served (protocol.KeyTool).
func (g *Gateway) servedTools(ctx context.Context) (map[string]bool, error) {
	out := map[string]bool{}
	if g.cfg.Bus.Tools == nil {
		return out, nil
	}
	keys, err := g.cfg.Bus.Tools.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the served tools: %w", err)
	}
	for k := range keys.Keys() {
		if _, tool, ok := protocol.ParseKeyTool(k); ok {
			out[tool] = true
		}
	}
	return out, nil
}

// writePolicyError answers 400 INVALID_POLICY with the field, line and reason of err (a
// *policy.Error).
func writePolicyError(w http.ResponseWriter, err error) {
	var body apiError
	body.Error.Code, body.Error.Message = protocol.CodeInvalidPolicy, err.Error()
	var pe *policy.Error
	if errors.As(err, &pe) {
		body.Error.Field, body.Error.Line = pe.Field, pe.Line
	}
	writeJSON(w, http.StatusBadRequest, &body)
}

// handleRemovePolicy is DELETE /api/v1/policies/{tool}: the applied policy ends (a version of
// its own); the contract's policy block, if any, stands again. 404 when none is applied.
func (g *Gateway) handleRemovePolicy(w http.ResponseWriter, r *http.Request) {
	if !g.toolsAdmin(w) {
		return
	}
	tool, ok := policyTool(w, r)
	if !ok {
		return
	}
	e, err := g.policies.Remove(r.Context(), tool, byOf(r))
	switch {
	case errors.Is(err, policies.ErrNotFound):
		writeError(w, http.StatusNotFound, protocol.CodeNotFound, "no policy is applied to tool "+tool, nil)
		return
	case errors.Is(err, policies.ErrFull):
		writeError(w, http.StatusInsufficientStorage, protocol.CodeStoreFull, err.Error(), nil)
		return
	case err != nil:
		g.log.Error("remove a policy", "tool", tool, "err", err)
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the policy could not be removed; retry", nil)
		return
	}
	g.log.Info("policy removed", "tool", tool, "version", e.Version, "by", e.By)
	writeJSON(w, http.StatusOK, appliedView(e))
}
