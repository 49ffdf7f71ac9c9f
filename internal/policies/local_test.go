package policies

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// unreadable is rules whose policies cannot be read.
type unreadable struct{}

func (unreadable) Rule(string, *contract.Compiled) (*Rule, error) { return nil, ErrNotFollowing }

// A tool Hermes runs itself goes under its policy as a routed call does: roles, a rate limit
// counted in the routers' windows (refused, or waited for), and nothing unchecked when the
// policy cannot be known or asks what such a tool cannot honour.
func TestLocalToolsGoUnderTheirPolicies(t *testing.T) {
	t.Parallel()
	_, b := newBus(t)
	windows := &Windows{KV: b.Bucket(WindowsBucket)}
	rule := func(js string) *Rule {
		return &Rule{Tool: "memory_write", Policy: mustPolicy(t, js), Source: SourcePolicy, Version: 3}
	}
	alice := &protocol.Caller{ID: "key-alice", Name: "alice", Role: "user"}
	bob := &protocol.Caller{ID: "key-bob", Name: "bob", Role: "user"}
	call := func(id string) *protocol.ToolCall {
		return &protocol.ToolCall{ToolCallID: id, Name: "memory_write", Arguments: []byte(`{}`)}
	}
	decide := func(l *Local, caller *protocol.Caller, req, id string) (*protocol.PolicyDecision, *protocol.ToolResult) {
		t.Helper()
		return l.Decide(t.Context(), call(id), req, caller)
	}

	if d, res := decide(&Local{Rules: rules{}, Windows: windows}, alice, "r0", "c1"); d != nil || res != nil {
		t.Fatalf("no policy: %+v %+v", d, res)
	}
	roles := &Local{Rules: rules{"memory_write": rule(`{"allowed_roles":["admin"]}`)}, Windows: windows}
	if _, res := decide(roles, alice, "r1", "c1"); res == nil || res.ErrorCode != protocol.CodePolicyDenied || res.Policy.Rule != policy.RuleAllowedRoles {
		t.Fatalf("a role the policy does not allow: %+v", res)
	}
	if d, res := decide(roles, &protocol.Caller{ID: "k", Role: "admin"}, "r1", "c1"); res != nil || d.Decision != protocol.PolicyAllowed || d.Version != 3 {
		t.Fatalf("the role it allows: %+v %+v", d, res)
	}

	limited := &Local{Rules: rules{"memory_write": rule(`{"rate_limit":"1/min","on_limit":"refuse"}`)}, Windows: windows}
	if _, res := decide(limited, alice, "r2", "c1"); res != nil {
		t.Fatalf("the first call in the window: %+v", res)
	}
	if _, res := decide(limited, alice, "r2", "c1"); res != nil {
		t.Fatalf("the same call again is counted once: %+v", res)
	}
	_, res := decide(limited, alice, "r3", "c1")
	if res == nil || res.ErrorCode != protocol.CodeRateLimited || res.Policy.RetryAt.Before(time.Now().Add(50*time.Second)) ||
		!strings.Contains(res.RecoveryHint, "try again after") {
		t.Fatalf("the second call in the window: %+v", res)
	}
	if _, res := decide(limited, bob, "r4", "c1"); res != nil {
		t.Fatalf("another caller's window (scope caller): %+v", res)
	}
	// The window is the routers': a routed call of the same caller counts in it.
	if ok, _, err := windows.Take(t.Context(), WindowKey("memory_write", policy.ScopeCaller, windowCaller(bob)), policy.Rate{Count: 1, Per: time.Minute}, CallID("r5", "c1")); err != nil || ok {
		t.Fatalf("the router's window does not hold the call the gateway counted: ok %v, err %v", ok, err)
	}

	waits := &Local{Rules: rules{"memory_write": rule(`{"rate_limit":"1/s","on_limit":"wait","max_wait":"5s"}`)}, Windows: windows}
	if _, res := decide(waits, alice, "r6", "c1"); res != nil {
		t.Fatalf("the first call: %+v", res)
	}
	began := time.Now()
	if d, res := decide(waits, alice, "r7", "c1"); res != nil || d.Decision != protocol.PolicyAllowed {
		t.Fatalf("a call that may wait for its window: %+v %+v", d, res)
	}
	if waited := time.Since(began); waited < 500*time.Millisecond {
		t.Fatalf("it ran after %v; its window had no room for about a second", waited)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, res := waits.Decide(ctx, call("c1"), "r8", alice); res == nil || res.ErrorCode != protocol.CodeRateLimited {
		t.Fatalf("a wait longer than the request: %+v", res)
	}

	for name, l := range map[string]*Local{
		"confirm_required": {Rules: rules{"memory_write": rule(`{"confirm_required":true}`)}, Windows: windows},
		"no windows":       {Rules: rules{"memory_write": rule(`{"rate_limit":"5/min"}`)}},
		"unreadable":       {Rules: unreadable{}, Windows: windows},
	} {
		if _, res := decide(l, alice, "r9", "c1"); res == nil || res.ErrorCode != protocol.CodePolicyUnavailable || res.Status != protocol.ResultError {
			t.Errorf("%s: the call is not refused POLICY_UNAVAILABLE: %+v", name, res)
		}
	}
}

// The API refuses a built-in tool's policy that asks what it cannot honour, naming the field.
func TestCheckBuiltinNamesTheField(t *testing.T) {
	t.Parallel()
	for js, field := range map[string]string{
		`{"confirm_required":true}`: "policies.memory_write.confirm_required",
		`{"max_recipients":3}`:      "policies.memory_write.max_recipients",
	} {
		var e *policy.Error
		if err := CheckBuiltin("memory_write", mustPolicy(t, js)); !errors.As(err, &e) || e.Field != field {
			t.Errorf("%s: %v", js, err)
		}
	}
	if err := CheckBuiltin("memory_write", mustPolicy(t, `{"allowed_roles":["admin"],"rate_limit":"10/min"}`)); err != nil {
		t.Error(err)
	}
}
