package worker_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestPublicPackagesDependOnPkgOnly: a program outside this module imports pkg/worker (and the
// rest of pkg/) without pulling in anything of internal/: dependencies point one way.
func TestPublicPackagesDependOnPkgOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Deps \" \"}}", "github.com/hermesbus/hermes/pkg/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, " ")
		if !strings.HasPrefix(pkg, "github.com/hermesbus/hermes/pkg/") {
			continue
		}
		checked++
		for _, d := range strings.Fields(deps) {
			if strings.HasPrefix(d, "github.com/hermesbus/hermes/internal/") {
				t.Errorf("%s depends on %s", pkg, d)
			}
		}
	}
	if checked < 8 {
		t.Fatalf("checked %d packages of pkg/; the listing went wrong:\n%s", checked, out)
	}
}
