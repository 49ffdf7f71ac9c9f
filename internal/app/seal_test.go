package app

import (
	"crypto/ed25519"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/bus"
)

// TestSealFlagsRefuseHalfConfigurations: a worker that seals its results must check the
// results it finds (or it would defer to one put before its own), a router or gateway that
// checks must seal (or it would refuse its own), and a worker's key must be among the trusted.
// Trusted keys files take comments and refuse what is not a key line.
func TestSealFlagsRefuseHalfConfigurations(t *testing.T) {
	dir := t.TempDir()
	routerLine, err := newSealKey(filepath.Join(dir, "router.key"), "router-1")
	if err != nil {
		t.Fatal(err)
	}
	workerLine, err := newSealKey(filepath.Join(dir, "worker.key"), "worker-1")
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	both := write("both", "# the deployment's keys\n"+routerLine+"  # a router\n"+workerLine+" tools=echo,crm_lookup\n")
	routerOnly := write("router-only", routerLine+"\n")
	log := slog.New(slog.DiscardHandler)
	for _, c := range []struct {
		name, key, trusted string
		role               bus.Role
		want               string // "" for accepted
	}{
		{"a worker that seals and checks", "worker.key", both, bus.RoleWorker, ""},
		{"a router that seals and checks", "router.key", both, bus.RoleRouter, ""},
		{"a worker that seals but does not check", "worker.key", "", bus.RoleWorker, "--seal-key needs --trusted-seals"},
		{"a router that checks but does not seal", "", both, bus.RoleRouter, "--trusted-seals needs --seal-key"},
		{"a gateway that checks but does not seal", "", both, bus.RoleGateway, "--trusted-seals needs --seal-key"},
		{"a worker whose key is not trusted", "worker.key", routerOnly, bus.RoleWorker, "is not among --trusted-seals"},
		{"a worker trusting no router", "worker.key", write("workers-only", workerLine+" tools=*\n"), bus.RoleWorker, "no router's key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := sealFlags{role: c.role, registered: true, trusted: c.trusted}
			if c.key != "" {
				s.key = filepath.Join(dir, c.key)
			}
			k, tr, err := s.load()
			if err == nil {
				err = s.apply(&bus.Bus{}, k, tr, log)
			}
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got %v, want an error saying %q", err, c.want)
			}
		})
	}
	tr, err := readTrust(both)
	if err != nil {
		t.Fatal(err)
	}
	if w := tr.results["worker-1"]; len(w.Tools) != 2 || tr.calls["worker-1"] != nil || len(tr.calls["router-1"]) != ed25519.PublicKeySize {
		t.Fatalf("read %+v", tr)
	}
	for _, bad := range []string{routerLine + " tools=", routerLine + " tools=a.b", routerLine + " extra", "hermes-seal-public x notbase64", routerLine + "\n" + routerLine} {
		if _, err := readTrust(write("bad", bad+"\n")); err == nil {
			t.Errorf("took %q", bad)
		}
	}
}
