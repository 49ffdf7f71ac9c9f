package app

import (
	"fmt"
	"log/slog"

	"github.com/hermesbus/hermes/internal/approvals"
	"github.com/hermesbus/hermes/internal/policies"
	"github.com/hermesbus/hermes/pkg/bus"
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
	pub := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: instance})
	store, events := &approvals.Store{KV: apr}, &approvals.Events{Pub: pub}
	stage := &policies.Stage{Rules: book, Windows: &policies.Windows{KV: windows}, Events: &policies.Events{Pub: pub},
		Approvals: &approvals.Gate{Store: store, Events: events}}
	return book, stage, &approvals.Expirer{Store: store, KV: apr, Events: events, Log: log.With("part", "approvals")}, nil
}
