package mcpserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/pkg/blueprint"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// fakeRunner stands in for the gateway's blueprints: those a role may run, and their runs,
// answered by answer (a succeeded run of one step otherwise).
type fakeRunner struct {
	mu     sync.Mutex
	bps    []*blueprint.Blueprint
	roles  []string
	asks   []blueprints.Ask
	answer func(ask blueprints.Ask) (*blueprints.Run, error)
}

func (f *fakeRunner) list(_ context.Context, role string) ([]*blueprint.Blueprint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.roles = append(f.roles, role)
	return f.bps, nil
}

func (f *fakeRunner) run(_ context.Context, _ admission.Actor, ask blueprints.Ask) (*blueprints.Run, bool, error) {
	f.mu.Lock()
	f.asks = append(f.asks, ask)
	answer := f.answer
	f.mu.Unlock()
	if answer != nil {
		run, err := answer(ask)
		return run, true, err
	}
	return &blueprints.Run{RunID: ask.RunID, Blueprint: ask.Name, Status: blueprints.Succeeded,
		Steps: []blueprints.StepRun{{ID: "0", Tool: "lookup", OutputKey: "found", Status: blueprints.StepSucceeded, Output: ask.UserInput}}}, true, nil
}

func (f *fakeRunner) asked() []blueprints.Ask {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]blueprints.Ask(nil), f.asks...)
}

// compiledBlueprint is the blueprint src (JSON), compiled.
func compiledBlueprint(t *testing.T, src string) *blueprint.Blueprint {
	t.Helper()
	b, err := blueprint.Load([]byte(src), nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func blueprintHarness(t *testing.T) (*harness, *fakeRunner) {
	t.Helper()
	f := &fakeRunner{bps: []*blueprint.Blueprint{
		compiledBlueprint(t, `{"name":"find","description":"finds it","steps":[{"tool":"lookup","input_mapping":{"id":"$.user_input.ref"},"output_key":"found"},
			{"tool":"book","input_mapping":{"what":"$.found","note":"$.user_input.note"}}]}`),
		compiledBlueprint(t, `{"name":"book","description":"a blueprint named as a tool","steps":[{"tool":"lookup"}]}`),
	}}
	h := newHarness(t, func(e *Env) {
		e.Blueprints, e.RunBlueprint, e.MaxWait = f.list, f.run, 9*time.Second
	})
	return h, f
}

// tools/list lists the blueprints the caller's role may run beside the tools: each with its
// description and its user_input's schema, typed by the tools' arguments it is passed as; a
// blueprint named as a registered tool is left out.
func TestToolsListListsBlueprints(t *testing.T) {
	h, f := blueprintHarness(t)
	list, err := h.client("alice").ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	var find *mcp.Tool
	for _, tl := range list.Tools {
		names = append(names, tl.Name)
		if tl.Name == "find" {
			find = tl
		}
	}
	if fmt.Sprint(names) != "[lookup book pay find]" || find.Description != "finds it" {
		t.Fatalf("listed %v", names)
	}
	schema, _ := json.Marshal(find.InputSchema)
	if string(schema) != `{"properties":{"note":{},"ref":{"type":"string"}},"required":["ref"],"type":"object"}` {
		t.Errorf("the schema: %s", schema)
	}
	if fmt.Sprint(f.roles) != "[user]" {
		t.Errorf("asked for the blueprints of %v", f.roles)
	}
}

// tools/call of a blueprint runs it, waiting up to MaxWait: in a session, under a run id that
// follows from the caller, the session and the JSON-RPC id (the same call again is the same
// run); outside one, a new run. A run that succeeded is its outputs by output_key; one a
// fallback ended is an error result naming the fallback and the step; one going on says where
// to follow it. A refused run is an error result, or a JSON-RPC error for a reused id. A call
// of a name both a tool and a blueprint calls the tool.
func TestToolsCallRunsABlueprint(t *testing.T) {
	h, f := blueprintHarness(t)
	cs := h.client("alice")
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "find", Arguments: map[string]any{"ref": "A-1"}})
	if err != nil || res.IsError || text(res) != `{"run_id":"","blueprint":"find","status":"succeeded","outputs":{"found":{"ref":"A-1"}}}` || res.StructuredContent == nil {
		t.Fatalf("%v %s %+v", err, text(res), res)
	}
	asks := f.asked()
	if len(asks) != 1 || asks[0].Name != "find" || asks[0].RunID != "" || string(asks[0].UserInput) != `{"ref":"A-1"}` || asks[0].Wait != 9*time.Second {
		t.Errorf("asked %+v", asks)
	}
	if n := len(h.sub.submitted()); n != 0 {
		t.Errorf("%d requests submitted", n)
	}

	session := h.initialized("alice")
	for range 2 {
		if r := h.send(http.MethodPost, "alice", session, callBody(`"b1"`, "find", `{"ref":"A-2"}`)); r.code != http.StatusOK || !strings.Contains(r.body, `\"status\":\"succeeded\"`) {
			t.Fatalf("%d %s", r.code, r.body)
		}
	}
	sum := sha256.Sum256([]byte("blueprint\x00key:alice\x00" + session + "\x00" + `"b1"`))
	asks = f.asked()
	if a, b := asks[1], asks[2]; a.RunID != b.RunID || a.RunID != "mcp-"+hex.EncodeToString(sum[:20]) {
		t.Errorf("run ids %q %q", a.RunID, b.RunID)
	}

	for _, tc := range []struct {
		name   string
		run    *blueprints.Run
		err    error
		isErr  bool
		says   []string
		rpcErr string
	}{
		{"transferred", &blueprints.Run{RunID: "r", Blueprint: "find", Status: blueprints.Transferred,
			Steps:    []blueprints.StepRun{{ID: "0", Tool: "lookup", Status: blueprints.StepFailed}},
			Fallback: &blueprints.FallbackTaken{Step: "0", Message: "a person will call", TransferTo: "human_agent"},
			Error:    &blueprints.RunError{Step: "0", Code: "NOT_FOUND", Message: "step 0 (lookup) failed: no such thing"}}, nil,
			true, []string{"BLUEPRINT_TRANSFERRED", "a person will call", "human_agent", "step 0 (lookup) failed", `"failed_step":"0 (lookup)"`}, ""},
		{"waiting", &blueprints.Run{RunID: "r", Blueprint: "find", Status: blueprints.Waiting,
			Steps: []blueprints.StepRun{{ID: "0", Tool: "lookup", Status: blueprints.StepParked, ApprovalID: "apr-1"}}}, nil,
			false, []string{"BLUEPRINT_RUNNING", "GET /v1/runs/r", "apr-1"}, ""},
		{"bad input", nil, &blueprints.Refusal{Status: http.StatusBadRequest, Code: protocol.CodeInvalidRequest, Message: "user_input: $.user_input.ref selects nothing"},
			true, []string{"BAD_ARGUMENTS: user_input: $.user_input.ref selects nothing", "hint:"}, ""},
		{"policy", nil, &blueprints.Refusal{Status: http.StatusForbidden, Code: protocol.CodePolicyDenied, Message: "not for you"},
			true, []string{"POLICY_DENIED: not for you"}, ""},
		{"a reused id", nil, &blueprints.Refusal{Status: http.StatusConflict, Code: protocol.CodeRunIDConflict, Message: "taken"},
			false, nil, "used in this session for another call"},
	} {
		f.mu.Lock()
		f.answer = func(blueprints.Ask) (*blueprints.Run, error) { return tc.run, tc.err }
		f.mu.Unlock()
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "find", Arguments: map[string]any{"ref": "A-3"}})
		if tc.rpcErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.rpcErr) {
				t.Errorf("%s: %v %+v", tc.name, err, res)
			}
			continue
		}
		if err != nil || res.IsError != tc.isErr {
			t.Errorf("%s: %v %+v", tc.name, err, res)
			continue
		}
		for _, s := range tc.says {
			if !strings.Contains(text(res), s) {
				t.Errorf("%s: %q does not say %q", tc.name, text(res), s)
			}
		}
	}

	// book is a registered tool and a blueprint: the tool is called.
	n := len(f.asked())
	if res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "book", Arguments: map[string]any{"room": "A"}}); err != nil || res.IsError || text(res) != `{"room":"A"}` {
		t.Errorf("book: %v %+v", err, res)
	}
	if len(f.asked()) != n || len(h.sub.submitted()) != 1 {
		t.Errorf("book ran a blueprint")
	}
}

// Env.Blueprints needs Env.RunBlueprint.
func TestBlueprintsNeedARunner(t *testing.T) {
	f := &fakeRunner{}
	if _, err := New(Env{Submit: &fakeSubmitter{}, Admit: &fakeAdmitter{}, Contracts: &fakeContracts{}, Sessions: bustest.NewMemKV(), Blueprints: f.list}); err == nil || !strings.Contains(err.Error(), "RunBlueprint") {
		t.Errorf("without RunBlueprint: %v", err)
	}
}
