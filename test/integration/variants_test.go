package integration

import "testing"

// variant marks a test that go test -short skips even when -run names it: a further case of a
// door that another integration test proves, whose logic in-package tests prove. covered names
// what else proves it: in-package tests, which run under -short, and end-to-end tests, which
// run in the full run (.ci/run) or when -run names them; the full run runs the variant as well.
func variant(t *testing.T, covered string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("a variant, run in the full suite; also covered by %s", covered)
	}
}
