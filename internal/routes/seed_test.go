package routes

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// sharedSeeds holds the canonical seed examples when the repository sits beside shared/ (as in
// CI); testdata/ holds byte-for-byte copies so the tests run without it.
const sharedSeeds = "../../../shared/seed-examples"

var seedFiles = []string{"routes-insurance.yaml", "routes-knowledge.yaml"}

// seedDirs returns the directories holding the seed files: testdata always, shared when present.
func seedDirs(t *testing.T) []string {
	t.Helper()
	dirs := []string{"testdata"}
	if _, err := os.Stat(sharedSeeds); err == nil {
		dirs = append(dirs, sharedSeeds)
	} else {
		t.Logf("%s not found; testing the testdata copies only", sharedSeeds)
	}
	return dirs
}

func TestSeedCopiesAreUnchanged(t *testing.T) {
	if _, err := os.Stat(sharedSeeds); err != nil {
		t.Skipf("%s not found", sharedSeeds)
	}
	for _, name := range seedFiles {
		want, err := os.ReadFile(filepath.Join(sharedSeeds, name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("testdata/%s differs from %s/%s; copy it again byte for byte", name, sharedSeeds, name)
		}
	}
}

// TestSeedInsurance checks the insurance seed and the seed's four route tests (seed 000 §4.3).
func TestSeedInsurance(t *testing.T) {
	for _, dir := range seedDirs(t) {
		t.Run(dir, func(t *testing.T) {
			path := filepath.Join(dir, "routes-insurance.yaml")
			tab, err := Load(path)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if tab.File != path || tab.Version != "1.0" || len(tab.Rules) != 2 {
				t.Fatalf("table = {File %q, Version %q, %d rules}; want {%q, 1.0, 2 rules}", tab.File, tab.Version, len(tab.Rules), path)
			}
			wantHTTP := &protocol.HTTPAction{
				URL:     "http://policy-service:8000/v1/policy/number",
				Method:  "GET",
				Headers: map[string]string{"X-Auth-Token": "${env.POLICY_TOKEN}"},
			}
			r := tab.Rules[0]
			if r.Name != "get_policy_number_by_name" || r.Line != 3 || r.Action.TimeoutMS != 3000 ||
				r.Action.Kind != protocol.ActionHTTP || !reflect.DeepEqual(r.Action.HTTP, wantHTTP) {
				t.Errorf("rules[0] = %+v, http %+v", r, r.Action.HTTP)
			}
			if r.Action.Retry != defaultRetry() {
				t.Errorf("rules[0].Action.Retry = %+v; want the defaults %+v", r.Action.Retry, defaultRetry())
			}
			if got := tab.Rules[1]; got.Name != "get_policy_status_by_name" || got.Line != 15 || got.Action.TimeoutMS != 4000 {
				t.Errorf("rules[1] = %+v", got)
			}

			tests := []struct {
				tool, intent string
				wantRule     string // "" for no match
				wantParams   map[string]string
			}{
				{"get_policy_number", "我的保单号是多少", "get_policy_number_by_name", nil},
				{"get_policy_number", "张三的保单状态是什么", "", nil},
				{"get_policy_status", "查询王五的保单状态", "get_policy_status_by_name", map[string]string{"match_1": "王五"}},
				{"get_policy_status", "保单状态查询", "", nil},
			}
			for _, tt := range tests {
				checkMatch(t, tab, tt.tool, tt.intent, tt.wantRule, tt.wantParams)
			}
		})
	}
}

func TestSeedKnowledge(t *testing.T) {
	for _, dir := range seedDirs(t) {
		t.Run(dir, func(t *testing.T) {
			tab, err := Load(filepath.Join(dir, "routes-knowledge.yaml"))
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if len(tab.Rules) != 2 {
				t.Fatalf("%d rules; want 2", len(tab.Rules))
			}
			want := protocol.Action{
				Kind:      protocol.ActionHTTP,
				TimeoutMS: 5000,
				Retry: protocol.RetryPolicy{
					MaxAttempts: 2, BackoffFactor: 1.5, JitterMS: 200,
					InitialIntervalMS: protocol.DefaultInitialIntervalMS, MaxIntervalMS: protocol.DefaultMaxIntervalMS,
				},
				HTTP: &protocol.HTTPAction{
					URL:     "http://knowledge-service:8000/v1/search",
					Method:  "POST",
					Headers: map[string]string{"X-Auth-Token": "${env.KNOWLEDGE_TOKEN}"},
				},
			}
			if got := tab.Rules[0].Action; !reflect.DeepEqual(got, want) {
				t.Errorf("rules[0].Action = %+v (http %+v); want %+v (http %+v)", got, got.HTTP, want, want.HTTP)
			}
			wantGRPC := protocol.Action{
				Kind:      protocol.ActionGRPC,
				TimeoutMS: 3000,
				Retry:     defaultRetry(),
				GRPC:      &protocol.GRPCAction{Service: "customer.ProfileService", Method: "GetProfile"},
			}
			if got := tab.Rules[1].Action; !reflect.DeepEqual(got, wantGRPC) {
				t.Errorf("rules[1].Action = %+v (grpc %+v); want %+v", got, got.GRPC, wantGRPC)
			}
			checkMatch(t, tab, "search_knowledge_base", "这个理赔怎么办", "insurance_knowledge_search", nil)
			checkMatch(t, tab, "get_customer_profile", "查询客户信息", "customer_profile_fetch", nil)
			checkMatch(t, tab, "get_customer_profile", "查询客户信息吧", "", nil)
			if got, want := tab.ToolNames(), []string{"get_customer_profile", "search_knowledge_base"}; !reflect.DeepEqual(got, want) {
				t.Errorf("ToolNames() = %q; want %q", got, want)
			}
		})
	}
}

func defaultRetry() protocol.RetryPolicy {
	return protocol.RetryPolicy{
		MaxAttempts:       protocol.DefaultMaxAttempts,
		BackoffFactor:     protocol.DefaultBackoffFactor,
		InitialIntervalMS: protocol.DefaultInitialIntervalMS,
		MaxIntervalMS:     protocol.DefaultMaxIntervalMS,
	}
}

// checkMatch asserts what tab.Match returns for one call; wantRule "" means no match.
func checkMatch(t *testing.T, tab *Table, tool, intent, wantRule string, wantParams map[string]string) {
	t.Helper()
	rule, params, ok := tab.Match(tool, intent)
	if wantRule == "" {
		if ok || rule != nil || params != nil {
			t.Errorf("Match(%q, %q) = %v, %v, %v; want no match", tool, intent, ruleName(rule), params, ok)
		}
		return
	}
	if !ok || rule == nil || rule.Name != wantRule {
		t.Errorf("Match(%q, %q) = %v, %v; want rule %s", tool, intent, ruleName(rule), ok, wantRule)
		return
	}
	if rule.Match.ToolName != tool {
		t.Errorf("Match(%q, %q) returned a rule for tool %q", tool, intent, rule.Match.ToolName)
	}
	if len(params) != len(wantParams) || (len(wantParams) > 0 && !reflect.DeepEqual(params, wantParams)) {
		t.Errorf("Match(%q, %q) params = %v; want %v", tool, intent, params, wantParams)
	}
}

func ruleName(r *Rule) string {
	if r == nil {
		return "<nil>"
	}
	return r.Name
}
