package app

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// replay --blueprint refuses a blueprint that does not compile, naming the step and the
// field, before it reads anything.
func TestReplayBlueprintRefusesABadFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bad.json")
	doc := `{"name": "b", "steps": [{"tool": "order_query", "output_key": "x", "condition": "$.later.status == 'paid'"}]}`
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := Exec(RunReplay, []string{"--blueprint", file, "--nats", "nats://127.0.0.1:1"}, Env{Stdout: &stdout, Stderr: &stderr})
	if code != 2 || stdout.Len() != 0 || !strings.Contains(stderr.String(), "steps[0].condition: $.later.status reads later") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}
