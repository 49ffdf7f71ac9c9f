package app

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
)

// hermes keys create prints the key once (stdout, alone, for scripts), ls lists it without
// its hash, revoke by name ends it; bad input is refused before anything is kept.
func TestKeysCommand(t *testing.T) {
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{})
	run := func(args ...string) (string, string, error) {
		var out, errOut bytes.Buffer
		args = append([]string{args[0], "--nats", srv.URL}, args[1:]...)
		err := RunKeys(t.Context(), args, Env{Stdout: &out, Stderr: &errOut})
		return out.String(), errOut.String(), err
	}
	out, msg, err := run("create", "--name", "ci-bot", "--role", "operator")
	if err != nil {
		t.Fatal(err, msg)
	}
	key := strings.TrimSpace(out)
	if !strings.HasPrefix(key, auth.KeyPrefix) || !strings.Contains(msg, "shown this once") {
		t.Fatalf("create printed %q, %q", out, msg)
	}
	keys := auth.NewKeys(b.Keys)
	if c, err := keys.Verify(t.Context(), key); err != nil || c.Role != auth.RoleOperator || c.Name != "ci-bot" {
		t.Fatalf("the key printed: %+v %v", c, err)
	}
	_, secret, _ := auth.ParseKey(key)
	stored, _, err := keys.List(t.Context())
	if err != nil || len(stored) != 1 {
		t.Fatal(stored, err)
	}
	for _, args := range [][]string{{"ls"}, {"ls", "--json"}} {
		out, _, err := run(args...)
		if err != nil || !strings.Contains(out, "ci-bot") || !strings.Contains(out, "operator") || strings.Contains(out, secret) ||
			strings.Contains(out, stored[0].Hash) {
			t.Fatalf("%v: %q %v", args, out, err)
		}
	}
	if out, _, err := run("revoke", "ci-bot"); err != nil || !strings.Contains(out, "revoked key") {
		t.Fatalf("revoke: %q %v", out, err)
	}
	if _, err := keys.Verify(t.Context(), key); !errors.Is(err, auth.ErrUnauthenticated) {
		t.Fatalf("a revoked key: %v", err)
	}
	for _, args := range [][]string{{"create", "--role", "user"}, {"create", "--name", "x", "--role", "root"}, {"create", "--name", "a b", "--role", "user"},
		{"revoke"}, {"revoke", "nobody"}, {"ls", "extra"}, {"rotate"}} {
		if _, _, err := run(args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	if list, _, _ := keys.List(t.Context()); len(list) != 1 {
		t.Fatalf("%d keys kept", len(list))
	}
}
