package app

import (
	"strings"
	"testing"

	"github.com/hermesbus/hermes/internal/policies"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
)

// hermes up --policies refuses for memory_write (its gateway runs it at once) what the API
// refuses: confirm_required, naming the field, and applies nothing of the file.
func TestStartPoliciesRefuseWhatMemoryWriteCannotHonour(t *testing.T) {
	t.Parallel()
	b := bustest.NewServer(t).Provision(t, withBuckets(bus.Config{}))
	store := policies.NewStore(b.Bucket(policies.PoliciesBucket))
	_, err := applyStartPolicies(t.Context(), store, []byte("policies:\n  book: {rate_limit: 1/s}\n  memory_write: {confirm_required: true}\n"))
	if err == nil || !strings.Contains(err.Error(), "policies.memory_write.confirm_required") {
		t.Fatalf("confirm_required on memory_write: %v", err)
	}
	if list, err := store.List(t.Context()); err != nil || len(list) != 0 {
		t.Fatalf("applied %d of a refused file: %v", len(list), err)
	}
	if desc, err := applyStartPolicies(t.Context(), store, []byte("policies:\n  memory_write: {rate_limit: 10/m}\n")); err != nil || !strings.Contains(desc, "memory_write") {
		t.Fatalf("a rate limit on memory_write: %q %v", desc, err)
	}
}
