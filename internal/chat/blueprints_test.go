package chat

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

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/internal/scriptedllm"
	"github.com/hermesbus/hermes/pkg/blueprint"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// fakeBlueprints stands in for the gateway's blueprints: those a role may run, and their runs,
// answered by answer (a succeeded run whose step's output is its input, otherwise).
type fakeBlueprints struct {
	mu     sync.Mutex
	bps    []*blueprint.Blueprint
	asks   []blueprints.Ask
	owners []string
	answer func(ask blueprints.Ask) (*blueprints.Run, error)
}

func (f *fakeBlueprints) list(context.Context, string) ([]*blueprint.Blueprint, error) {
	return f.bps, nil
}

func (f *fakeBlueprints) run(_ context.Context, a admission.Actor, ask blueprints.Ask) (*blueprints.Run, bool, error) {
	f.mu.Lock()
	f.asks, f.owners = append(f.asks, ask), append(f.owners, a.Owner())
	answer := f.answer
	f.mu.Unlock()
	if answer != nil {
		run, err := answer(ask)
		return run, true, err
	}
	return &blueprints.Run{RunID: ask.RunID, Blueprint: ask.Name, Status: blueprints.Succeeded,
		Steps: []blueprints.StepRun{{ID: "0", Tool: "echo", OutputKey: "found", Status: blueprints.StepSucceeded, Output: ask.UserInput}}}, true, nil
}

func (f *fakeBlueprints) asked() ([]blueprints.Ask, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]blueprints.Ask(nil), f.asks...), append([]string(nil), f.owners...)
}

func chatBlueprint(t *testing.T, src string) *blueprint.Blueprint {
	t.Helper()
	b, err := blueprint.Load([]byte(src), nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// blueprintHarness is the doors with two blueprints: find_order (its first step echo's text,
// from user_input.order) and echo, named as a registered tool.
func blueprintHarness(t *testing.T, script *scriptedllm.Script, tweak func(*Config, *Env)) (*harness, *fakeBlueprints) {
	t.Helper()
	f := &fakeBlueprints{bps: []*blueprint.Blueprint{
		chatBlueprint(t, `{"name":"find_order","description":"finds an order and urges its delivery","steps":[{"tool":"echo","input_mapping":{"text":"$.user_input.order"},"output_key":"found"}]}`),
		chatBlueprint(t, `{"name":"echo","description":"a blueprint named as a tool","steps":[{"tool":"echo"}]}`),
	}}
	h := newHarness(t, script, func(c *Config, e *Env) {
		e.Blueprints, e.RunBlueprint = f.list, f.run
		if tweak != nil {
			tweak(c, e)
		}
	})
	return h, f
}

// The model is offered each blueprint its caller may run as a function: its description, its
// user_input's schema typed by the tool its key is passed to; one named as a registered tool
// is not offered (the tool is).
func TestBlueprintsAreOffered(t *testing.T) {
	h, _ := blueprintHarness(t, answers(), nil)
	h.ask("sess_bo", "hello")
	var offered []string
	var find *scriptedllm.Tool
	for i, tl := range h.model.Requests()[0].Tools {
		offered = append(offered, tl.Function.Name)
		if tl.Function.Name == "find_order" {
			find = &h.model.Requests()[0].Tools[i]
		}
	}
	if fmt.Sprint(offered) != "[echo weather_search find_order]" {
		t.Fatalf("offered %v", offered)
	}
	if find.Function.Description != "finds an order and urges its delivery" ||
		string(find.Function.Parameters) != `{"properties":{"order":{"description":"what to echo","type":"string"}},"required":["order"],"type":"object"}` {
		t.Errorf("find_order: %s %s", find.Function.Description, find.Function.Parameters)
	}
}

// Blueprints go through the prefilter with the registered tools.
func TestBlueprintsArePrefiltered(t *testing.T) {
	h, _ := blueprintHarness(t, answers(), func(c *Config, _ *Env) { c.Prefilter = PrefilterConfig{TopK: 1} })
	d := h.ask("sess_bp", "please find my order and urge its delivery")
	offered := h.model.Requests()[0].Tools
	if len(d.Candidates) != 1 || d.Candidates[0].Name != "find_order" || len(offered) != 1 || offered[0].Function.Name != "find_order" {
		t.Errorf("candidates %+v, offered %+v", d.Candidates, offered)
	}
}

// A turn that calls a tool and a blueprint: the tool's call is the turn's request, the
// blueprint runs beside it under a run id that follows from the caller, the turn's request and
// the call; the model reads both under their calls' ids, the blueprint's outputs by output_key.
// The decision records both calls; the answer counts both.
func TestAMixedTurnRunsABlueprintBesideTheRequest(t *testing.T) {
	h, f := blueprintHarness(t, conversation(
		scriptedllm.Turn{ToolCalls: []scriptedllm.ToolCall{call("c_bp", "find_order", map[string]any{"order": "A-1"}), call("c_e", "echo", map[string]any{"text": "hi"})}},
		scriptedllm.Turn{Content: "done"}), nil)
	r := h.post("/v1/chat/completions", `{"model":"scripted","messages":[{"role":"user","content":"find A-1"}]}`, headerSession, "sess_mx")
	if r.code != http.StatusOK {
		t.Fatalf("%d %s", r.code, r.body)
	}
	run := r.header.Get("X-Hermes-Run-ID")
	subs := h.sub.submitted()
	if len(subs) != 1 || len(subs[0].Request.ToolCalls) != 1 || subs[0].Request.ToolCalls[0].Name != "echo" || subs[0].Request.RequestID != run+"-1" {
		t.Fatalf("submitted %+v", subs)
	}
	asks, owners := f.asked()
	sum := sha256.Sum256([]byte("blueprint\x00" + owners[0] + "\x00" + run + "-1\x00c_bp"))
	if len(asks) != 1 || asks[0].Name != "find_order" || string(asks[0].UserInput) != `{"order":"A-1"}` || asks[0].RunID != "chat-"+hex.EncodeToString(sum[:20]) ||
		asks[0].Wait <= 0 || asks[0].Trace.TraceID != run {
		t.Fatalf("asked %+v", asks)
	}
	read := map[string]string{}
	for _, m := range h.model.Requests()[1].Messages {
		if m.Role == "tool" {
			read[m.ToolCallID] = m.Text()
		}
	}
	var bp struct {
		Tool    string
		Status  string
		Content blueprints.Outcome
	}
	if err := json.Unmarshal([]byte(read["c_bp"]), &bp); err != nil || bp.Tool != "find_order" || bp.Status != "ok" || bp.Content.RunID != asks[0].RunID ||
		string(bp.Content.Outputs["found"]) != `{"order":"A-1"}` || bp.Content.Status != blueprints.Succeeded {
		t.Errorf("the model read %q: %v", read["c_bp"], err)
	}
	if !strings.Contains(read["c_e"], `"content":{"text":"hi"}`) {
		t.Errorf("the model read %q", read["c_e"])
	}
	ds := h.pub.published()
	if len(ds) != 2 || len(ds[0].Chosen) != 2 || ds[0].Chosen[0].Name != "find_order" || ds[0].Chosen[1].Name != "echo" {
		t.Errorf("decisions %+v", ds)
	}
	calls := r.json(t)["hermes"].(map[string]any)["calls"].([]any)
	var names []string
	for _, c := range calls {
		names = append(names, c.(map[string]any)["name"].(string))
	}
	if len(names) != 2 || !strings.Contains(fmt.Sprint(names), "find_order") || !strings.Contains(fmt.Sprint(calls), asks[0].RunID) {
		t.Errorf("calls %v", calls)
	}
}

// A run a fallback ended is a failed result naming the fallback; one refused for its input is
// BAD_ARGUMENTS, for the model to correct; the model goes on either way.
func TestABlueprintThatFailsIsAFailedResult(t *testing.T) {
	for _, c := range []struct {
		name string
		run  *blueprints.Run
		err  error
		want []string
	}{
		{"transferred", &blueprints.Run{RunID: "r", Blueprint: "find_order", Status: blueprints.Transferred,
			Steps:    []blueprints.StepRun{{ID: "0", Tool: "echo", Status: blueprints.StepFailed}},
			Fallback: &blueprints.FallbackTaken{Step: "0", Message: "a person will call", TransferTo: "human_agent"},
			Error:    &blueprints.RunError{Step: "0", Code: "NOT_FOUND", Message: "step 0 (echo) failed: no such order"}}, nil,
			[]string{`"status":"error"`, `"error_code":"BLUEPRINT_TRANSFERRED"`, "a person will call", `"transfer_to":"human_agent"`, `"failed_step":"0 (echo)"`}},
		{"refused", nil, &blueprints.Refusal{Status: http.StatusBadRequest, Code: protocol.CodeInvalidRequest, Message: "user_input: $.user_input.order selects nothing"},
			[]string{`"error_code":"BAD_ARGUMENTS"`, "selects nothing"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, f := blueprintHarness(t, conversation(
				scriptedllm.Turn{ToolCalls: []scriptedllm.ToolCall{call("c_bp", "find_order", map[string]any{"order": "A-1"})}},
				scriptedllm.Turn{Content: "sorry"}), nil)
			f.answer = func(blueprints.Ask) (*blueprints.Run, error) { return c.run, c.err }
			if r := h.post("/v1/chat/completions", `{"model":"scripted","messages":[{"role":"user","content":"find A-1"}]}`); r.code != http.StatusOK {
				t.Fatalf("%d %s", r.code, r.body)
			}
			var read string
			for _, m := range h.model.Requests()[1].Messages {
				if m.ToolCallID == "c_bp" {
					read = m.Text()
				}
			}
			for _, w := range c.want {
				if !strings.Contains(read, w) {
					t.Errorf("the model read %s, not %s", read, w)
				}
			}
		})
	}
}
