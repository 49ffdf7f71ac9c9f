package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/policies"
	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// hermes replay --policies decides the recorded calls again under a policy file and reports
// those decided differently (exit 1), nothing when the file decides as the policies in force
// did (exit 0), and refuses a bad file naming the field (exit 2).
func TestReplayPoliciesWhatIf(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	_, admin := s.connect()
	store := policies.NewStore(admin.Bucket(policies.PoliciesBucket))
	ctx := context.Background()
	if _, _, err := store.Apply(ctx, "echo", &policy.Policy{RateLimit: &policy.Rate{Count: 2, Per: time.Minute}, Scope: policy.ScopeTool}, "test"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.Apply(ctx, "policy_probe", &policy.Policy{AllowedRoles: []string{"nobody"}}, "test"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the policies in use", func() bool {
		r := s.route(request(fmt.Sprintf("policy_probe_%d", time.Now().UnixNano()), "", call("c", "policy_probe", map[string]any{})))
		return result(t, r, "c").ErrorCode == protocol.CodePolicyDenied
	})
	const session = "whatif_pol"
	for i := 1; i <= 3; i++ {
		id := fmt.Sprint("whatif_pol_", i)
		r := s.route(withSession(request(id, "", call("c", "echo", map[string]any{"n": i})), session))
		if got := result(t, r, "c").ErrorCode; (i <= 2) != (got == "") || (i == 3 && got != protocol.CodeRateLimited) {
			t.Fatalf("call %d: %q", i, got)
		}
		s.waitRecorded(id)
	}
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// The policies in force: nothing changes.
	same := file("same.yaml", "policies:\n  echo:\n    rate_limit: 2/min\n    scope: tool\n")
	code, out, errOut := hermes(t, app.RunReplay, "--nats", s.srv.URL, "--policies", same, "--session", session)
	if code != 0 || !strings.HasPrefix(out, "0 of 3 calls in 3 requests would be decided differently with "+same) || strings.Count(out, "\n") != 1 {
		t.Fatalf("same policies: exit %d, stderr %q, output:\n%s", code, errOut, out)
	}

	// One call a minute: the second is limited too; no limit at all: the third runs.
	code, out, errOut = hermes(t, app.RunReplay, "--nats", s.srv.URL, "--policies", file("one.yaml", "policies:\n  echo:\n    rate_limit: 1\n    scope: tool\n"), "--session", session)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 1 || len(lines) != 2 || !strings.HasPrefix(lines[0], "whatif_pol_2 c echo: allowed (policy v1) -> limited: rate_limit (file) (over 1/min for all callers together") ||
		!strings.HasPrefix(lines[1], "1 of 3 calls in 3 requests would be decided differently") {
		t.Fatalf("one a minute: exit %d, stderr %q, output:\n%s", code, errOut, out)
	}
	code, out, _ = hermes(t, app.RunReplay, "--nats", s.srv.URL, "--policies", file("none.yaml", "policies:\n  other_tool:\n    rate_limit: 1\n"), "--session", session, "--json")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if code != 1 || len(lines) != 2 || !strings.Contains(lines[0], `"request_id":"whatif_pol_3","session_id":"whatif_pol","tool_call_id":"c","tool":"echo"`) ||
		!strings.Contains(lines[0], `"before":{"decision":"limited","rule":"rate_limit","source":"policy","version":1`) ||
		!strings.Contains(lines[0], `"after":{"decision":"allowed"}`) || !strings.Contains(lines[1], `"kind":"summary"`) {
		t.Fatalf("no limit, --json: exit %d:\n%s", code, out)
	}

	// A bad file: the field and the reason, exit 2.
	bad := file("bad.yaml", "policies:\n  echo:\n    rate_limit: often\n")
	if code, out, errOut = hermes(t, app.RunReplay, "--nats", s.srv.URL, "--policies", bad); code != 2 || out != "" || !strings.Contains(errOut, "policies.echo.rate_limit") {
		t.Fatalf("bad file: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, _, errOut = hermes(t, app.RunReplay, "--nats", s.srv.URL, "--policies", same, "--routes", "testdata/routes.yaml"); code != 2 || !strings.Contains(errOut, "only one of") {
		t.Fatalf("--policies and --routes: exit %d, stderr %q", code, errOut)
	}
}
