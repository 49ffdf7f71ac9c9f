package integration

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// hermes replay --blueprint walks the recorded runs of the seed's blueprint again along a
// changed blueprint: one that urges shipped orders too names the shipped order's run, whose
// urge step was skipped and now runs (exit 1), and not the paid order's; the blueprint as
// registered changes nothing (exit 0); a blueprint that does not compile is refused naming
// the step and the field (exit 2). No tool is called meanwhile.
func TestReplayBlueprintWhatIf(t *testing.T) {
	t.Parallel()
	s := start(t, options{routesFile: "../../examples/routes.yaml", callers: true, workers: 1})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser, "root": auth.RoleAdmin})
	seed := seedBlueprint(t)
	if code, body := s.call(http.MethodPost, "/api/v1/blueprints", keys["root"], seed, "Content-Type", "application/json"); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	for _, c := range []struct{ id, order, urge string }{
		{"wi-paid", s.demoOrder(0, "paid", "created"), string(blueprints.StepSucceeded)},
		{"wi-shipped", s.demoOrder(2, "shipped"), string(blueprints.StepSkipped)},
	} {
		code, run, body := s.startRun(keys["ann"], "check_and_urge", c.id, fmt.Sprintf(`{"order_id":%q}`, c.order))
		if code != http.StatusOK || run.Status != blueprints.Succeeded || string(run.Steps[1].Status) != c.urge {
			t.Fatalf("%s: %d %s", c.id, code, body)
		}
	}

	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	toolCalls := func() int {
		n := 0
		for _, m := range s.record() {
			if m.Type == protocol.TypeToolCall {
				n++
			}
		}
		return n
	}
	calls := toolCalls()

	// Shipped orders urged too: the shipped order's run would call logistics_urge.
	const cond = `($.order_data.success.status == 'created' || $.order_data.success.status == 'paid')`
	if !strings.Contains(seed, cond) {
		t.Fatal("the seed's condition changed")
	}
	urgeShipped := file("urge_shipped.json", strings.Replace(seed, cond, `($.order_data.success.status == 'created' || $.order_data.success.status == 'paid' || $.order_data.success.status == 'shipped')`, 1))
	code, out, errOut := hermes(t, app.RunReplay, "--nats", s.srv.URL, "--blueprint", urgeShipped, "--since", "1h")
	t.Logf("urge shipped orders too: exit %d\n%s", code, out)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 1 || len(lines) != 2 ||
		lines[0] != `run wi-shipped: step 1 logistics_urge: recorded skipped (condition false: $.order_data.success.status = "shipped"), now runs (condition true)` ||
		!strings.HasPrefix(lines[1], "1 of 2 recorded runs of check_and_urge would take another path with "+urgeShipped+" (runs created since ") ||
		strings.Contains(out, "wi-paid") {
		t.Fatalf("urge shipped orders too: exit %d, stderr %q, output:\n%s", code, errOut, out)
	}

	// The blueprint as registered: nothing changes.
	same := file("same.json", seed)
	code, out, errOut = hermes(t, app.RunReplay, "--nats", s.srv.URL, "--blueprint", same, "--since", "1h")
	t.Logf("the seed's blueprint: exit %d\n%s", code, out)
	if code != 0 || !strings.HasPrefix(out, "0 of 2 recorded runs of check_and_urge would take another path with "+same) || strings.Count(out, "\n") != 1 {
		t.Fatalf("the seed's blueprint: exit %d, stderr %q, output:\n%s", code, errOut, out)
	}

	// --json: one line per run, then the summary.
	code, out, _ = hermes(t, app.RunReplay, "--nats", s.srv.URL, "--blueprint", urgeShipped, "--json")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if code != 1 || len(lines) != 2 || !strings.Contains(lines[0], `"kind":"changed","run_id":"wi-shipped","version":1`) ||
		!strings.Contains(lines[0], `"step":"1","tool":"logistics_urge"`) || !strings.Contains(lines[1], `"kind":"summary","blueprint":"check_and_urge"`) ||
		!strings.Contains(lines[1], `"runs":2,"changed":1`) {
		t.Fatalf("--json: exit %d:\n%s", code, out)
	}

	// A blueprint that does not compile: its step, field and reason, exit 2.
	bad := file("bad.json", strings.Replace(seed, "$.order_data.success.order_id", "$.later.order_id", 1))
	if code, out, errOut = hermes(t, app.RunReplay, "--nats", s.srv.URL, "--blueprint", bad); code != 2 || out != "" ||
		!strings.Contains(errOut, "steps[1].input_mapping.order_id") || !strings.Contains(errOut, "$.later.order_id") {
		t.Fatalf("bad file: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	if n := toolCalls(); n != calls {
		t.Fatalf("the replays called %d tools", n-calls)
	}
}
