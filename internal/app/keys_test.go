package app

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
)

// hermes keys create prints the key once (stdout, alone, for scripts), ls lists it without
// its hash, revoke by name ends it; bad input is refused before anything is kept.
func TestKeysCommand(t *testing.T) {
	srv := bustest.NewServer(t)
	b := srv.Provision(t, withBuckets(bus.Config{}))
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
	keys := auth.NewKeys(b.Bucket(auth.KeysBucket))
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

// hermes up's admin key: made and kept (0600) on the first start, taken from the file after,
// reported — not replaced — once revoked; and found by the CLI, HERMES_API_KEY first.
func TestAdminKeyFile(t *testing.T) {
	srv := bustest.NewServer(t)
	keys := apiKeys(srv.Provision(t, withBuckets(bus.Config{})))
	path := filepath.Join(t.TempDir(), "data", adminKeyFile)
	first, err := ensureAdminKey(t.Context(), keys, path)
	if err != nil || !first.Made || first.Path != path || first.Problem != "" {
		t.Fatalf("first start: %+v %v", first, err)
	}
	if c, err := keys.Verify(t.Context(), first.Key); err != nil || c.Role != auth.RoleAdmin {
		t.Fatalf("the key made: %+v %v", c, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kept as %v, %v", fi, err)
	}
	again, err := ensureAdminKey(t.Context(), keys, path)
	if err != nil || again.Made || again.Key != first.Key {
		t.Fatalf("second start: %+v %v", again, err)
	}
	if _, err := keys.Revoke(t.Context(), "hermes-up-admin"); err != nil {
		t.Fatal(err)
	}
	revoked, err := ensureAdminKey(t.Context(), keys, path)
	if err != nil || revoked.Key != "" || revoked.Made || !strings.Contains(revoked.Problem, "names no caller") {
		t.Fatalf("after revoking: %+v %v", revoked, err)
	}
	if list, _, _ := keys.List(t.Context()); len(list) != 1 {
		t.Fatalf("a revoked key was replaced: %d keys", len(list))
	}
	if kept, _ := os.ReadFile(path); strings.TrimSpace(string(kept)) != first.Key {
		t.Fatal("the key file was rewritten")
	}
	// An empty file left by a start that died is taken for abandoned once it is old.
	left := filepath.Join(t.TempDir(), adminKeyFile)
	if err := os.WriteFile(left, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Minute)
	if err := os.Chtimes(left, old, old); err != nil {
		t.Fatal(err)
	}
	if k, err := ensureAdminKey(t.Context(), keys, left); err != nil || !k.Made {
		t.Fatalf("an abandoned empty file: %+v %v", k, err)
	}
	if tmp, err := ensureAdminKey(t.Context(), keys, ""); err != nil || !tmp.Made || tmp.Path != "" {
		t.Fatalf("kept nowhere: %+v %v", tmp, err)
	}

	kf := keyFlag{file: path}
	t.Setenv("HERMES_API_KEY", "")
	if k, err := kf.key(); err != nil || k != first.Key {
		t.Fatalf("from the file: %q %v", k, err)
	}
	t.Setenv("HERMES_API_KEY", " hk_from_env ")
	if k, err := kf.key(); err != nil || k != "hk_from_env" {
		t.Fatalf("from the environment: %q %v", k, err)
	}
	t.Setenv("HERMES_API_KEY", "")
	// A file named that is not there is an error; the default one missing is no key.
	if k, err := (&keyFlag{file: filepath.Join(t.TempDir(), "none")}).key(); err == nil {
		t.Fatalf("--key-file naming no file: %q", k)
	}
	t.Chdir(t.TempDir())
	if k, err := (&keyFlag{}).key(); err != nil || k != "" {
		t.Fatalf("no key anywhere: %q %v", k, err)
	}
}

// hermes provision sets a NATS server up; before it, a service with --no-provision refuses to
// start, naming it; after it, such a service starts, and the bus still makes tool consumers.
func TestProvisionThenServicesWithoutIt(t *testing.T) {
	srv := bustest.NewServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, _, err := Connect(ctx, srv.URL, "no-provision", bus.Config{NoProvision: true}, nil)
	if !errors.Is(err, bus.ErrNotProvisioned) || !strings.Contains(err.Error(), "hermes provision") {
		t.Fatalf("--no-provision before provisioning: %v", err)
	}
	var out, errOut bytes.Buffer
	if err := RunProvision(ctx, []string{"--nats", srv.URL}, Env{Stdout: &out, Stderr: &errOut}); err != nil {
		t.Fatal(err, errOut.String())
	}
	if !strings.Contains(out.String(), "Hermes is set up") || !strings.Contains(out.String(), admission.OwnersBucket) {
		t.Fatalf("provision printed %q", out.String())
	}
	nc, b, err := Connect(ctx, srv.URL, "no-provision", bus.Config{NoProvision: true}, nil)
	if err != nil {
		t.Fatalf("--no-provision after provisioning: %v", err)
	}
	defer nc.Close()
	if _, err := b.EnsureToolConsumer(ctx, "http", "new_tool"); err != nil {
		t.Fatalf("a tool consumer under --no-provision: %v", err)
	}
}

// hermes seal-key writes a private key (0600, never over a file) and prints the public line a
// worker's --trusted-seals file holds; the two read back as a pair; malformed files are refused.
func TestSealKeyFiles(t *testing.T) {
	dir := t.TempDir()
	priv := filepath.Join(dir, "router.key")
	var out, errOut bytes.Buffer
	if err := RunSealKey(t.Context(), []string{"--out", priv, "--id", "r-2026"}, Env{Stdout: &out, Stderr: &errOut}); err != nil {
		t.Fatal(err, errOut.String())
	}
	if fi, err := os.Stat(priv); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file %v %v", fi, err)
	}
	pubFile := filepath.Join(dir, "trusted")
	if err := os.WriteFile(pubFile, []byte("# routers\n"+out.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	k, err := readSealKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	trusted, err := readTrustedSeals(pubFile)
	if err != nil || !trusted["r-2026"].Equal(k.Key.Public()) {
		t.Fatalf("the pair does not match: %v", err)
	}
	if err := RunSealKey(t.Context(), []string{"--out", priv}, Env{Stdout: &out, Stderr: &errOut}); err == nil {
		t.Error("a key file was overwritten")
	}
	bad := filepath.Join(dir, "bad")
	for _, content := range []string{"", "hermes-seal-key r1 notbase64!", "hermes-seal-public r1 AAAA", "something else"} {
		_ = os.WriteFile(bad, []byte(content), 0o600)
		if _, err := readSealKey(bad); err == nil {
			t.Errorf("seal key %q accepted", content)
		}
		if _, err := readTrustedSeals(bad); err == nil {
			t.Errorf("trusted keys %q accepted", content)
		}
	}
	// hermes up's pair: made once, then read.
	k1, t1, err := upSealKeys(filepath.Join(dir, "data"))
	if err != nil {
		t.Fatal(err)
	}
	k2, _, err := upSealKeys(filepath.Join(dir, "data"))
	if err != nil || !k1.Key.Equal(k2.Key) || !t1[k1.ID].Equal(k1.Key.Public()) {
		t.Fatalf("hermes up's seal keys changed between starts: %v", err)
	}
}
