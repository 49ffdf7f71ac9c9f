package app

import (
	"fmt"
	"log/slog"

	"github.com/hermesbus/hermes/internal/policies"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// policyStage is a router's policy stage on b, and the book of applied policies it follows
// (start it before the router takes requests).
func policyStage(b *bus.Bus, instance string, log *slog.Logger) (*policies.Book, *policies.Stage, error) {
	kv, windows := b.Bucket(policies.PoliciesBucket), b.Bucket(policies.WindowsBucket)
	if kv == nil || windows == nil {
		return nil, nil, fmt.Errorf("router: the bus has no policies' buckets (%s, %s): open it with app.Connect", policies.PoliciesBucket, policies.WindowsBucket)
	}
	book := policies.NewBook(kv, log)
	pub := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: instance})
	return book, &policies.Stage{Rules: book, Windows: &policies.Windows{KV: windows}, Events: &policies.Events{Pub: pub}}, nil
}
