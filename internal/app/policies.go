package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/hermesbus/hermes/internal/approvals"
	"github.com/hermesbus/hermes/internal/memory"
	"github.com/hermesbus/hermes/internal/policies"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// policyStage is a router's policy stage on b, the book of applied policies it follows (start
// it before the router takes requests), and the expirer of approvals every router runs.
func policyStage(b *bus.Bus, instance string, log *slog.Logger) (*policies.Book, *policies.Stage, *approvals.Expirer, error) {
	kv, windows, apr := b.Bucket(policies.PoliciesBucket), b.Bucket(policies.WindowsBucket), b.Bucket(approvals.Bucket)
	if kv == nil || windows == nil || apr == nil {
		return nil, nil, nil, fmt.Errorf("router: the bus has no policies' buckets (%s, %s, %s): open it with app.Connect",
			policies.PoliciesBucket, policies.WindowsBucket, approvals.Bucket)
	}
	book := policies.NewBook(kv, log)
	pub := b.NewPublisher(protocol.Sender{Role: protocol.RoleRouter, Instance: instance})
	store, events := &approvals.Store{KV: apr}, &approvals.Events{Pub: pub}
	stage := &policies.Stage{Rules: book, Windows: &policies.Windows{KV: windows}, Events: &policies.Events{Pub: pub},
		Approvals: &approvals.Gate{Store: store, Events: events}}
	return book, stage, &approvals.Expirer{Store: store, KV: apr, Events: events, Log: log.With("part", "approvals")}, nil
}

// applyStartPolicies applies the policy file data at start to each tool it names that never
// had a policy applied: a policy changed through the API since (or removed) stays as it is
// across restarts. It says what it applied, for people.
func applyStartPolicies(ctx context.Context, store *policies.Store, data []byte) (string, error) {
	f, err := policy.ParseFile(data)
	if err != nil {
		return "", fmt.Errorf("the start's policies: %w", err)
	}
	if p, ok := f.Policies[memory.WriteTool]; ok { // hermes up keeps memory: its gateway runs memory_write
		if err := policies.CheckBuiltin(memory.WriteTool, p); err != nil {
			return "", fmt.Errorf("the start's policies: %w", err)
		}
	}
	var applied, kept []string
	for _, tool := range f.Tools {
		if _, err := store.History(ctx, tool); err == nil {
			kept = append(kept, tool)
			continue
		} else if !errors.Is(err, policies.ErrNotFound) {
			return "", err
		}
		if _, _, err := store.Apply(ctx, tool, f.Policies[tool], "hermes up"); err != nil {
			return "", fmt.Errorf("apply the policy of %s: %w", tool, err)
		}
		applied = append(applied, tool)
	}
	slices.Sort(applied)
	desc := "applied to " + strings.Join(applied, ", ")
	if len(applied) == 0 {
		desc = "none applied"
	}
	if len(kept) > 0 {
		desc += "; kept as changed since: " + strings.Join(kept, ", ")
	}
	return desc, nil
}
