package integration

import "testing"

// variant marks a test that go test -short skips even when -run names it: a further case of a
// door that another integration test proves, whose logic in-package tests prove. covered names
// what proves it under -short; the full run (.ci/run) runs the variant as well.
func variant(t *testing.T, covered string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("a variant, run in the full suite; under -short it is covered by %s", covered)
	}
}
