package app

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// The admin key hermes up makes is not printed where its output is kept (a log, a pipe, a
// file): the banner names the file it is kept in and how to read it instead.
func TestTheAdminKeyIsNotPrintedToALog(t *testing.T) {
	const key = "hk_0123456789abcdef_secretpartthatmustnotbelogged000000000000000000000"
	sys := &System{GatewayURL: "http://127.0.0.1:8080", Key: SystemKey{Key: key, Made: true, Path: "hermes-data/admin.key"}}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pr.Close() })
	var buf bytes.Buffer
	for name, w := range map[string]*os.File{"a pipe": pw, "a file": mustCreate(t)} {
		if toTerminal(w) {
			t.Errorf("%s taken for a terminal", name)
		}
	}
	pw.Close()
	printBanner(Env{Stdout: &buf, Stderr: &buf}, sys, "none", "in-process", "routes.yaml", 3)
	out := buf.String()
	if strings.Contains(out, key) || strings.Contains(out, "secretpart") {
		t.Errorf("the admin key is in the output:\n%s", out)
	}
	if !strings.Contains(out, "hermes-data/admin.key") || !strings.Contains(out, "mode 0600") || !strings.Contains(out, "cat hermes-data/admin.key") {
		t.Errorf("the output does not say where the key is kept and how to read it:\n%s", out)
	}
}

func mustCreate(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Create(t.TempDir() + "/out")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
