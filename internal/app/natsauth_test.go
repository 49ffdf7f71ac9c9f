package app

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/hermesbus/hermes/pkg/bus"
)

// hermes nats-auth --worker NAME=TOOL,TOOL makes a tool worker user for those tools only: its
// permissions in auth.conf are bus.WorkerAccessFor's, its inbox its own, its seal key trusted
// with their results only; the output says how it connects; a later run keeps it as made.
func TestNATSAuthMakesWorkersOfSomeTools(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "auth")
	tools := []string{"crm_lookup", "order_query"}
	out := runNATSAuth(t, "--out", dir, "--worker", "billing="+strings.Join(tools, ","), "--worker", "stock=stock_count", "--client", "crm")

	// The output, read back: each user's line names its inbox, a worker's its tools.
	said := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[1] == "role" {
			said[f[0]] = line
		}
	}
	for name, want := range map[string]string{
		"billing":    "role toolworker seed " + filepath.Join(dir, "billing.nk") + "  (connect with --nats-inbox _INBOX_billing; serves crm_lookup,order_query only: run with --tools crm_lookup,order_query)",
		"stock":      "(connect with --nats-inbox _INBOX_stock; serves stock_count only: run with --tools stock_count)",
		"toolworker": "role toolworker seed " + filepath.Join(dir, "toolworker.nk") + "  (connect with --nats-inbox _INBOX_toolworker)",
		"router":     "(connect with --nats-inbox _INBOX_router)",
		"crm":        "role client     seed " + filepath.Join(dir, "crm.nk") + "  (connect with --nats-inbox _INBOX_crm)",
	} {
		if !strings.HasSuffix(said[name], want) {
			t.Errorf("%s: said %q, want it to end in %q", name, said[name], want)
		}
	}
	if !strings.Contains(out, filepath.Join(dir, "billing.seal")+" (--seal-key; trusted with the results of crm_lookup,order_query only)") {
		t.Errorf("no seal key said for billing:\n%s", out)
	}

	checkUsers := func() {
		t.Helper()
		opts, err := server.ProcessConfigFile(filepath.Join(dir, authConfFile))
		if err != nil {
			t.Fatal(err)
		}
		perms := map[string]*server.Permissions{}
		for _, u := range opts.Nkeys {
			perms[u.Nkey] = u.Permissions
		}
		for name, tools := range map[string][]string{"billing": tools, "stock": {"stock_count"}, "toolworker": nil} {
			want, err := bus.WorkerAccessFor(name, tools)
			if tools == nil {
				want, err = bus.AccessOf(bus.RoleWorker, name)
			}
			if err != nil {
				t.Fatal(err)
			}
			p := perms[publicKey(t, filepath.Join(dir, name+".nk"))]
			if p == nil {
				t.Fatalf("auth.conf has no user %s", name)
			}
			if !slices.Equal(p.Publish.Allow, want.Publish) || !slices.Equal(p.Subscribe.Allow, want.Subscribe) || !slices.Equal(p.Publish.Deny, want.DenyPublish) {
				t.Errorf("%s's permissions in auth.conf:\n%q\n%q\nwant\n%q\n%q", name, p.Publish.Allow, p.Subscribe.Allow, want.Publish, want.Subscribe)
			}
		}
		tr, err := readTrust(filepath.Join(dir, trustedSealsFile))
		if err != nil {
			t.Fatal(err)
		}
		if k := tr.results["billing"]; !slices.Equal(k.Tools, tools) {
			t.Errorf("billing's seal key is trusted with %q", k.Tools)
		}
		if _, ok := tr.calls["billing"]; ok {
			t.Error("billing's seal key is trusted with calls")
		}
		if k, err := readSealKey(filepath.Join(dir, "billing.seal")); err != nil || k.ID != "billing" || !k.Key.Public().(ed25519.PublicKey).Equal(tr.results["billing"].Key) {
			t.Errorf("billing.seal: %v", err)
		}
	}
	checkUsers()

	// Run again with no --worker: the workers stay workers of their tools (not clients).
	seed, _ := os.ReadFile(filepath.Join(dir, "billing.nk"))
	again := runNATSAuth(t, "--out", dir)
	if !strings.Contains(again, "(connect with --nats-inbox _INBOX_billing; serves crm_lookup,order_query only") {
		t.Errorf("a later run forgot billing's tools:\n%s", again)
	}
	if now, _ := os.ReadFile(filepath.Join(dir, "billing.nk")); !bytes.Equal(seed, now) {
		t.Error("a later run replaced billing's seed")
	}
	checkUsers()

	for _, args := range [][]string{
		{"--worker", "crm=crm_lookup"},                        // a client made earlier
		{"--client", "billing"},                               // a worker made earlier
		{"--worker", "new=a", "--client", "new"},              // both
		{"--worker", "router=crm_lookup"},                     // a role
		{"--worker", "Toolworker=crm_lookup"},                 // a role, another case
		{"--worker", "new=a.b"},                               // no tool name
		{"--worker", "new=*"},                                 // every tool: the toolworker role
		{"--worker", "new="},                                  // no tool
		{"--worker", "new"},                                   // no tools at all
		{"--worker", "new=a", "--worker", "new=b"},            // twice
		{"--worker", strings.Repeat("w", 65) + "=crm_lookup"}, // too long for its seal key's id
	} {
		err := RunNATSAuth(context.Background(), append([]string{"--out", dir}, args...), Env{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}})
		var exit *ExitError
		if !errors.As(err, &exit) || exit.Code != 2 {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
	checkUsers()
}

func runNATSAuth(t *testing.T, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := RunNATSAuth(context.Background(), args, Env{Stdout: &out, Stderr: &errOut}); err != nil {
		t.Fatalf("nats-auth %q: %v\n%s", args, err, errOut.String())
	}
	return out.String()
}

func publicKey(t *testing.T, seedFile string) string {
	t.Helper()
	data, err := os.ReadFile(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.ParseDecoratedNKey(data)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}
