package mcpserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// initialize makes a session kept in the KV with the caller it belongs to; its owner uses it,
// anyone else is told it is not known (404), as is a session never made or not an id.
func TestInitializeKeepsTheSessionWithItsOwner(t *testing.T) {
	h := newHarness(t, nil)
	session := h.initialized("alice")
	var kept mcpSession
	if err := json.Unmarshal(h.kv.Value(mcpKey(session)), &kept); err != nil || kept.Owner != "key:alice" || kept.Created.IsZero() {
		t.Fatalf("kept %s: %v", h.kv.Value(mcpKey(session)), err)
	}
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	if r := h.send(http.MethodPost, "alice", session, list); r.code != http.StatusOK || !strings.Contains(r.body, `"lookup"`) {
		t.Errorf("its owner: %d %s", r.code, r.body)
	}
	for name, session := range map[string]string{"someone else's": session, "never made": strings.Repeat("0", 32), "not an id": "not an id!"} {
		caller := "alice"
		if name == "someone else's" {
			caller = "bob"
		}
		r := h.send(http.MethodPost, caller, session, list)
		if e, _ := r.json(t)["error"].(map[string]any); r.code != http.StatusNotFound || e["code"] != protocol.CodeNotFound {
			t.Errorf("%s: %d %s", name, r.code, r.body)
		}
	}
	// The bus away: the session can be neither read nor made.
	h.kv.Err = bustest.ErrUnreachable
	for what, r := range map[string]reply{"read": h.send(http.MethodPost, "alice", session, list), "made": h.send(http.MethodPost, "alice", "", initialize)} {
		if e, _ := r.json(t)["error"].(map[string]any); r.code != http.StatusServiceUnavailable || e["code"] != protocol.CodeBusUnavailable {
			t.Errorf("%s: %d %s", what, r.code, r.body)
		}
	}
}

// DELETE ends a session of the caller's; someone else's is not known; without a session it
// does nothing.
func TestDeleteEndsTheSession(t *testing.T) {
	h := newHarness(t, nil)
	session := h.initialized("alice")
	if r := h.send(http.MethodDelete, "bob", session, ""); r.code != http.StatusNotFound {
		t.Errorf("someone else's: %d %s", r.code, r.body)
	}
	if r := h.send(http.MethodDelete, "alice", session, ""); r.code != http.StatusNoContent || h.kv.Value(mcpKey(session)) != nil {
		t.Errorf("its owner's: %d %s", r.code, r.body)
	}
	if r := h.send(http.MethodPost, "alice", session, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); r.code != http.StatusNotFound {
		t.Errorf("after it ended: %d %s", r.code, r.body)
	}
	if r := h.send(http.MethodDelete, "alice", "", ""); r.code != http.StatusNoContent {
		t.Errorf("no session: %d %s", r.code, r.body)
	}
}

// What is refused before the SDK reads it: a batch (JSON-RPC's invalid request), a body over
// the bound, an end user the caller may not name.
func TestRefusedBeforeTheProtocol(t *testing.T) {
	h := newHarness(t, func(e *Env) { e.MaxBodyBytes = 512 })
	r := h.send(http.MethodPost, "alice", "", ` [{"jsonrpc":"2.0","id":3,"method":"tools/list"},{"jsonrpc":"2.0","id":4,"method":"tools/list"}]`)
	out := r.json(t)
	if e, _ := out["error"].(map[string]any); r.code != http.StatusBadRequest || out["id"] != nil || e["code"] != float64(jsonrpc.CodeInvalidRequest) {
		t.Errorf("a batch: %d %s", r.code, r.body)
	}
	r = h.send(http.MethodPost, "alice", "", callBody("1", "book", `{"x":"`+strings.Repeat("x", 600)+`"}`))
	if e, _ := r.json(t)["error"].(map[string]any); r.code != http.StatusRequestEntityTooLarge || e["code"] != protocol.CodeBodyTooLarge {
		t.Errorf("too large: %d %s", r.code, r.body)
	}
	r = h.send(http.MethodPost, "alice", "", initialize, admission.HeaderUser, "carol")
	if e, _ := r.json(t)["error"].(map[string]any); r.code != http.StatusForbidden || e["code"] != protocol.CodeForbidden {
		t.Errorf("an end user: %d %s", r.code, r.body)
	}
	if len(h.sub.submitted()) != 0 || len(h.kv.Keys()) != 0 {
		t.Error("something refused was done")
	}
}

// tools/list lists the registered tools whose arguments are an object, with their input
// schemas, annotated by their effects; the contracts unreadable, it is a JSON-RPC error.
func TestToolsList(t *testing.T) {
	h := newHarness(t, nil)
	cs := h.client("alice")
	list, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*mcp.Tool{}
	var names []string
	for _, tl := range list.Tools {
		byName[tl.Name] = tl
		names = append(names, tl.Name)
	}
	if fmt.Sprint(names) != "[lookup book pay]" {
		t.Fatalf("listed %v", names)
	}
	schema, _ := json.Marshal(byName["lookup"].InputSchema)
	if !strings.Contains(string(schema), `"required":["id"]`) || byName["lookup"].Description != "looks up" {
		t.Errorf("lookup %s", schema)
	}
	if a := byName["lookup"].Annotations; a == nil || !a.ReadOnlyHint {
		t.Errorf("effects none: %+v", a)
	}
	if a := byName["book"].Annotations; a == nil || !a.IdempotentHint || a.DestructiveHint == nil || *a.DestructiveHint {
		t.Errorf("idempotent: %+v", a)
	}
	if a := byName["pay"].Annotations; a != nil {
		t.Errorf("side effects: %+v", a)
	}
	h.contracts.err = errors.New("the registry is away")
	if _, err := cs.ListTools(t.Context(), nil); err == nil || !strings.Contains(err.Error(), "could not be read") {
		t.Errorf("contracts unreadable: %v", err)
	}
}

// tools/list offers a caller only the tools Env.Offers lets its role see.
func TestToolsListOffersByRole(t *testing.T) {
	var mu sync.Mutex
	var asked []string
	h := newHarness(t, func(env *Env) {
		env.Offers = func(tool string, _ *contract.Compiled, role string) bool {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, tool+":"+role)
			return tool != "book" || role == "admin"
		}
	})
	list, err := h.client("alice").ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range list.Tools {
		names = append(names, tl.Name)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(names) != "[lookup pay]" || !slices.Contains(asked, "book:user") {
		t.Errorf("listed %v, asked %v", names, asked)
	}
}

// text is a result's text contents, joined.
func text(r *mcp.CallToolResult) string {
	var parts []string
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// tools/call is one request. Outside a session (the SDK's client, which needs none), each call
// is a request of its own in a session of its own; in an MCP session, a request of its Hermes
// session named by the caller, the session and the JSON-RPC id: the same id again is the same
// request. Its answer is the tool's, as text (and structured content when it is an object), MCP
// content blocks passed on as blocks, a tool's error as an error result naming the code and
// the hint.
func TestToolsCall(t *testing.T) {
	h := newHarness(t, func(e *Env) { e.MaxWait = 7 * time.Second })
	cs := h.client("alice")
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "book", Arguments: map[string]any{"room": "A"}})
	if err != nil || res.IsError || text(res) != `{"room":"A"}` || res.StructuredContent == nil {
		t.Fatalf("%v %+v", err, res)
	}
	subs := h.sub.submitted()
	req := subs[0].Request
	if req.SessionID != req.RequestID || !strings.HasPrefix(req.RequestID, "mcp-") || req.Intent != "mcp tools/call book" ||
		len(req.ToolCalls) != 1 || req.ToolCalls[0].ToolCallID != "call" || subs[0].Wait != 7*time.Second || subs[0].Owner != "key:alice" ||
		subs[0].Caller == nil || subs[0].Caller.ID != "key:alice" {
		t.Errorf("submitted %+v %+v", subs[0], req)
	}
	// Admitted twice: the HTTP request, holding one of the caller's waiting requests; the call,
	// into its session with its size.
	asks := h.adm.asked()
	var hold, call int
	for _, a := range asks {
		switch {
		case a.Hold == admission.HoldWaiting && a.Mode == admission.NoSession && a.Store == admission.StoreNone && a.Need == auth.PermSubmit:
			hold++
		case a.Session == req.SessionID && a.Size == len(`{"room":"A"}`) && a.Actor.Owner() == "key:alice":
			call++
		}
	}
	if hold != 1 || call != 1 {
		t.Errorf("asked %+v", asks)
	}

	// Sent again with the same JSON-RPC id in an MCP session: the same request.
	session := h.initialized("alice")
	for range 2 {
		if r := h.send(http.MethodPost, "alice", session, callBody(`"same"`, "book", `{"room":"B"}`)); r.code != http.StatusOK {
			t.Fatalf("%d %s", r.code, r.body)
		}
	}
	subs = h.sub.submitted()
	sum := sha256.Sum256([]byte("key:alice\x00" + session + "\x00" + `"same"`))
	if a, b := subs[1].Request, subs[2].Request; a.RequestID != b.RequestID || a.RequestID != "mcp-"+hex.EncodeToString(sum[:20]) || a.SessionID != "mcp-"+session {
		t.Errorf("requests %+v %+v", a, b)
	}
	// Arguments null are none.
	if r := h.send(http.MethodPost, "alice", "", callBody("9", "book", `null`)); r.code != http.StatusOK {
		t.Fatalf("%d %s", r.code, r.body)
	}
	subs = h.sub.submitted()
	if last := subs[len(subs)-1].Request; string(last.ToolCalls[0].Arguments) != `{}` {
		t.Errorf("null arguments: %+v", last)
	}

	for _, tc := range []struct {
		name   string
		result protocol.ToolResult
		want   string
		isErr  bool
		blocks bool
	}{
		{"text", protocol.ToolResult{Status: protocol.ResultOK, Content: json.RawMessage(`"plain text"`)}, "plain text", false, false},
		{"content blocks", protocol.ToolResult{Status: protocol.ResultOK, Content: json.RawMessage(`[{"type":"text","text":"a block"}]`)}, "a block", false, true},
		{"a list", protocol.ToolResult{Status: protocol.ResultOK, Content: json.RawMessage(`[1,2]`)}, "[1,2]", false, false},
		{"the tool's error", protocol.ToolResult{Status: protocol.ResultError, ErrorCode: "ORDER_NOT_FOUND", Content: json.RawMessage(`"no such order"`),
			RecoveryHint: "check the id"}, "ORDER_NOT_FOUND: no such order\nhint: check the id", true, false},
		{"an error not a string", protocol.ToolResult{Status: protocol.ResultError, ErrorCode: protocol.CodeToolFailed, Content: json.RawMessage(`{"why":1}`)},
			`TOOL_FAILED: {"why":1}`, true, false},
	} {
		h.sub.set(func(_ context.Context, sub submit.Submission) (*submit.Outcome, error) {
			return answered(sub, tc.result), nil
		})
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "book", Arguments: map[string]any{}})
		if err != nil || res.IsError != tc.isErr || text(res) != tc.want || (res.StructuredContent != nil) {
			t.Errorf("%s: %v %q %+v", tc.name, err, text(res), res)
		}
	}
	// A response without results (a request failed as a whole).
	h.sub.set(func(_ context.Context, sub submit.Submission) (*submit.Outcome, error) {
		return &submit.Outcome{Response: &protocol.Response{RequestID: sub.Request.RequestID, Status: protocol.StatusFailed,
			Error: &protocol.ResponseError{Code: protocol.CodeNoRoute, Message: "nothing routes book"}}}, nil
	})
	if res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "book"}); err != nil || !res.IsError || text(res) != "INTERNAL: NO_ROUTE: nothing routes book" {
		t.Errorf("no results: %v %q", err, text(res))
	}
}
