package app

import (
	"bytes"
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/gateway"
	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
)

// oneKey knows one admin's key.
type oneKey string

func (k oneKey) Verify(_ context.Context, cred string) (*auth.Caller, error) {
	if cred != string(k) {
		return nil, auth.ErrUnauthenticated
	}
	return &auth.Caller{ID: "key:ci", Name: "ci", Role: auth.RoleAdmin}, nil
}

// hermes policies apply -f applies the seed's file (again: unchanged), ls and get show what is
// in force and its versions, rm removes it; a file naming an unknown role is refused with the
// field, and nothing is applied.
func TestPoliciesCommand(t *testing.T) {
	srv := bustest.NewServer(t)
	b := srv.Provision(t, withBuckets(bus.Config{}))
	for _, src := range []string{
		`{"name":"meeting_book","description":"books a meeting","input_schema":{"type":"object"}}`,
		`{"name":"notify_send","description":"notifies users","input_schema":{"type":"object"},"recipients":["user_ids"]}`,
	} {
		c, err := registry.Parse([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := registry.NewStore(b.Contracts).Register(t.Context(), c, []byte(src), "test"); err != nil {
			t.Fatal(err)
		}
	}
	g, err := gateway.New(gateway.Config{Conn: srv.Connect(t), Bus: b, Instance: "test", Callers: oneKey("secret")})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(g.Handler())
	t.Cleanup(ts.Close)
	t.Setenv("HERMES_API_KEY", "secret")
	dir := t.TempDir()
	seed := filepath.Join(dir, "tool-policies.yaml")
	if err := os.WriteFile(seed, []byte(seedPolicyFile), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("policies:\n  meeting_book: {allowed_roles: [admin, boss]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := RunPolicies(t.Context(), append(args, "--url", ts.URL), Env{Stdout: &out, Stderr: &errOut})
		return out.String() + errOut.String(), err
	}
	if out, err := run("apply", "-f", bad); err == nil || !strings.Contains(err.Error(), "policies.meeting_book.allowed_roles[1]") ||
		!strings.Contains(err.Error(), "nothing was applied") {
		t.Errorf("bad file: %v %s", err, out)
	}
	out, err := run("apply", "-f", seed)
	if err != nil || !strings.Contains(out, "meeting_book: version 1 applied: allowed_roles [admin], confirm_required") ||
		!strings.Contains(out, "notify_send: version 1 applied: max_recipients 20, rate_limit 10/min per caller (refuse)") {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	if out, err := run("apply", "-f", seed); err != nil || !strings.Contains(out, "meeting_book: unchanged (version 1)") {
		t.Errorf("apply again: %v\n%s", err, out)
	}
	if out, err := run("ls"); err != nil || !strings.Contains(out, "TOOL") || !strings.Contains(out, "notify_send   policy  1") {
		t.Errorf("ls: %v\n%s", err, out)
	}
	if out, err := run("get", "meeting_book"); err != nil || !strings.Contains(out, `"allowed_roles": [`) || !strings.Contains(out, "#   v1 ") {
		t.Errorf("get: %v\n%s", err, out)
	}
	if out, err := run("rm", "meeting_book"); err != nil || !strings.Contains(out, "version 2 records the removal") {
		t.Errorf("rm: %v\n%s", err, out)
	}
	var ae *apiError
	if out, err := run("rm", "meeting_book"); !errors.As(err, &ae) || ae.Status != 404 {
		t.Errorf("rm again: %v\n%s", err, out)
	}
	if _, err := run("get"); err == nil || !strings.Contains(err.Error(), "name the tool") {
		t.Errorf("get without a tool: %v", err)
	}
}

// seedPolicyFile is the seed's policy file (seed-examples/tool-policies.yaml).
const seedPolicyFile = `# Seed 001 §5.3
policies:
  meeting_book:
    confirm_required: true
    allowed_roles: [admin]
  notify_send:
    rate_limit: 10
    max_recipients: 20
`
