package routes

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// FuzzParse checks that Parse never panics, that every error is a *LoadError with a line, and
// that every table it returns is consistent and matches without panicking.
func FuzzParse(f *testing.F) {
	for _, name := range seedFiles {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, "get_policy_status", "查询王五的保单状态")
	}
	f.Add([]byte(matchRoutes), "t", "get milk now")
	f.Add([]byte(lines("version: 1", "rules:", "  - name: a", "    match: {tool_name: t, intent_regex: '(a)|(?P<b>b)'}",
		"    action: {grpc: {service: s, method: m, retry: {max_attempts: 3}}}")), "t", "b")

	f.Fuzz(func(t *testing.T, data []byte, tool, intent string) {
		tab, err := Parse("fuzz.yaml", data)
		if err != nil {
			var le *LoadError
			if !errors.As(err, &le) {
				t.Fatalf("error %T %v is not a *LoadError", err, err)
			}
			if le.Line < 1 || le.File != "fuzz.yaml" || le.Reason == "" {
				t.Fatalf("LoadError without file, line or reason: %#v", le)
			}
			return
		}
		if tab.Version != SupportedVersion || len(tab.Rules) == 0 {
			t.Fatalf("table version %q with %d rules", tab.Version, len(tab.Rules))
		}
		for i := range tab.Rules {
			r := &tab.Rules[i]
			checkAction(t, r.Action)
			// The rule's own tool with any intent, and with a keyword as the intent.
			tab.Match(r.Match.ToolName, intent)
			for _, kw := range r.Match.IntentContains {
				tab.Match(r.Match.ToolName, kw)
			}
		}
		rule, params, ok := tab.Match(tool, intent)
		if ok != (rule != nil) || (!ok && params != nil) {
			t.Fatalf("Match = %v, %v, %v", rule, params, ok)
		}
		if ok && rule.Match.ToolName != tool {
			t.Fatalf("Match(%q) returned a rule for %q", tool, rule.Match.ToolName)
		}
		tab.ToolNames()
	})
}

// checkAction asserts the invariants every loaded action holds.
func checkAction(t *testing.T, a protocol.Action) {
	t.Helper()
	switch {
	case a.Kind == protocol.ActionHTTP && a.HTTP != nil && a.GRPC == nil:
	case a.Kind == protocol.ActionGRPC && a.GRPC != nil && a.HTTP == nil:
	case a.Kind == protocol.ActionGo && a.GRPC == nil && a.HTTP == nil && a.MCP == nil:
	case a.Kind == protocol.ActionMCP && a.MCP != nil && a.Check() == nil && a.GRPC == nil && a.HTTP == nil:
	default:
		t.Fatalf("action kind %q with http %v grpc %v", a.Kind, a.HTTP, a.GRPC)
	}
	p := a.Retry
	if a.TimeoutMS < 1 || a.TimeoutMS > MaxTimeoutMS || p.MaxAttempts < 1 || p.MaxAttempts > protocol.MaxAttemptsLimit ||
		!(p.BackoffFactor >= 1) || p.JitterMS < 0 || p.InitialIntervalMS < 1 || p.MaxIntervalMS < p.InitialIntervalMS ||
		p.MaxIntervalMS > MaxIntervalLimitMS {
		t.Fatalf("action out of bounds: timeout %d, retry %+v", a.TimeoutMS, p)
	}
}
