package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// ConsumerAudit reads everything of a record stream for the audit service (hermes audit), which
// projects the record into PostgreSQL: one per record stream, each the audit's own (RoleAuditor
// may create, take from and ack it, and no other role may touch it).
const ConsumerAudit = "audit"

// The audit's consumers' bounds: time to write a batch of rows, and batches of rows in flight.
const (
	auditAckWait       = 30 * time.Second
	auditMaxAckPending = 4096
)

// AuditConsumer returns the audit's durable consumer of record stream k (0 ≤ k <
// len(b.Streams)), creating it when missing, whatever Config.NoProvision and Config.OpenOnly say:
// it is the audit service's own, made by it as tools' consumers are made by their services. It
// reads every subject of the stream (protocol.RecordRoot(k) + ".>") from the first message the
// stream still holds, explicitly acked within 30 seconds (what a killed audit held comes again
// then), 4096 unacked at most, and is
// delivered again without end: the audit decides what it cannot project, never the server, so
// nothing it reads becomes a dead letter. An existing one is kept as it is.
//
// The audit must never terminate a message (Term): the server announces a terminated message of
// the record as given up on, and the dead-letter processor would answer the request or call it
// is as failed. What it cannot project it acks, and says so.
func (b *Bus) AuditConsumer(ctx context.Context, k int) (jetstream.Consumer, error) {
	if k < 0 || k >= len(b.Streams) {
		return nil, fmt.Errorf("bus: no audit consumer of record stream %d: the record has %d streams, %s to %s",
			k, len(b.Streams), protocol.RecordStream(0), protocol.RecordStream(len(b.Streams)-1))
	}
	stream := b.Streams[k]
	name := protocol.RecordStream(k)
	c, err := stream.Consumer(ctx, ConsumerAudit)
	if err == nil {
		return c, nil
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("bus: look up consumer %s of stream %s: %w", ConsumerAudit, name, err)
	}
	spec := b.consumer(ConsumerAudit, protocol.RecordRoot(k)+".>")
	spec.DeliverPolicy, spec.AckWait, spec.MaxDeliver, spec.MaxAckPending = jetstream.DeliverAllPolicy, auditAckWait, -1, auditMaxAckPending
	// As many replicas as the stream has, whatever the audit process was told.
	spec.Replicas = 0
	c, err = createConsumer(ctx, stream, spec)
	if err != nil {
		return nil, fmt.Errorf("%w (stream %s)", err, name)
	}
	return c, nil
}
