package app

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// A connection string hermes audit cannot use is refused before anything is dialled, and
// its password is not in the refusal.
func TestAuditRefusesABadConnectionString(t *testing.T) {
	for _, args := range [][]string{
		{"--postgres", "postgres://u:hunter2@127.0.0.1:1/x?sslmode=bogus", "--nats", "nats://127.0.0.1:1"},
		{"--nats", "nats://127.0.0.1:1"},
	} {
		var out bytes.Buffer
		t.Setenv("HERMES_AUDIT_POSTGRES", "")
		err := RunAudit(context.Background(), args, Env{Stdout: &out, Stderr: &out})
		if err == nil || strings.Contains(err.Error(), "nats") || strings.Contains(err.Error()+out.String(), "hunter2") {
			t.Fatalf("%q: %v\n%s", args, err, out.String())
		}
	}
}
