package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/bus"
)

// nodeClient is examples/node/client.mjs, with its packages installed (npm ci --prefix
// examples/node) and node: CI must have them; elsewhere the test is skipped without them.
func nodeClient(t *testing.T) string {
	t.Helper()
	script, _ := filepath.Abs("../../examples/node/client.mjs")
	_, err := os.Stat(filepath.Join(filepath.Dir(script), "node_modules", "nats"))
	if err == nil {
		_, err = exec.LookPath("node")
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no Node client: npm ci --prefix examples/node, and node (%v)", err)
		}
		t.Skip("no Node client (npm ci --prefix examples/node) or no node")
	}
	return script
}

// Another language on the bus: the Node client of examples/node, on the official nats package,
// as the NATS user the system gives external clients, publishes a request as JSON, hears its
// response on its own subject and reads it back, calls the micro service for another, follows
// the session's messages, and is told what is wrong with a bad request.
func TestANodeClientUsesTheBus(t *testing.T) {
	t.Parallel()
	long(t, "the Node client")
	script := nodeClient(t)
	s := start(t, options{workers: 1})
	// The admin is a user with a password here (hermes up's has a seed): its URL names it.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script, s.srv.Plain, s.srv.SeedFile(t, bus.RoleClient), "client", s.srv.URL)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node client: %v\n%s%s", err, out, stderr.String())
	}
	t.Logf("node client:\n%s", out)
	steps := map[string]map[string]any{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("not JSON: %s", sc.Text())
		}
		steps[line["step"].(string)] = line
	}
	if p := steps["published"]; p == nil || p["stream"] != "HERMES_CLIENTS" {
		t.Errorf("published: %v", p)
	}
	if h := steps["heard"]; h == nil || h["status"] != "success" || !strings.HasPrefix(h["subject"].(string), "hermes.out.client.response.") {
		t.Errorf("heard: %v", h)
	}
	fetched, _ := steps["fetched"]["response"].(map[string]any)
	if fetched["status"] != "success" || !strings.Contains(jsonText(fetched["results"]), "published") {
		t.Errorf("fetched: %v", steps["fetched"])
	}
	called, _ := steps["called"]["response"].(map[string]any)
	if steps["called"]["error"] != "" || called["status"] != "success" || len(called["results"].([]any)) != 2 {
		t.Errorf("called: %v", steps["called"])
	}
	if f := steps["followed"]; f == nil || !strings.Contains(jsonText(f["types"]), `"request.v1"`) || !strings.Contains(jsonText(f["types"]), `"response.v1"`) || !strings.Contains(jsonText(f["types"]), `"tool_result.v1"`) {
		t.Errorf("followed: %v", f)
	}
	if w := steps["worker"]; w == nil || w["service"] != "hermes-toolworker" || !strings.HasPrefix(w["endpoint"].(string), "hermes.svc.toolworker.") ||
		!strings.Contains(jsonText(w["figures"]), `"tool":"echo"`) || strings.Contains(jsonText(w["figures"]), `"calls":0`) {
		t.Errorf("the worker's endpoint: %v", w)
	}
	if r := steps["refused"]; r == nil || r["error"] != "400" || !strings.Contains(jsonText(r["body"]), "request_id") {
		t.Errorf("refused: %v", r)
	}
}

func jsonText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
