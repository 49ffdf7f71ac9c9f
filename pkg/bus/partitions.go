package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// recordPartitions is how many partitions the record's subject transform spreads requests over;
// false when it has none.
func recordPartitions(record jetstream.Stream) (int, bool) {
	t := record.CachedInfo().Config.SubjectTransform
	if t == nil {
		return 0, false
	}
	return protocol.RequestPartitionsOf(t.Destination)
}

// ensureRequestConsumers opens (or creates) the consumer of each request partition.
func (b *Bus) ensureRequestConsumers(ctx context.Context) error {
	for p := range b.partitions {
		spec := b.consumer(RequestConsumer(p), protocol.FilterRequestPartition(p))
		spec.MaxAckPending = 1
		if _, err := b.ensureConsumerSpec(ctx, b.Stream, spec); err != nil {
			return err
		}
	}
	return nil
}

// idleChecks and idleGap: how often, and how far apart, Repartition looks for a router reading
// the partitions. A running router always has a pull waiting on each partition but for a
// moment between two pulls, so three looks apart from each other find it.
const (
	idleChecks = 3
	idleGap    = 200 * time.Millisecond
)

// Repartition changes how many partitions the record spreads requests over to n (1 to
// protocol.MaxRequestPartitions), and returns how many it had: the migration hermes provision
// --partitions runs. Sessions move to other partitions, so it is refused while a router reads
// the partitions or a request waits in one — either would let a session's later request be
// routed before an earlier one. It then changes the stream's transform, creates the partitions
// added, and deletes those beyond n. A request that a gateway still running published meanwhile
// into a partition beyond n keeps that partition, which routers read until it is empty:
// Repartition says so, and deletes it when run again. Nothing accepted is lost.
func (b *Bus) Repartition(ctx context.Context, n int) (int, error) {
	before := b.partitions
	if n < 1 || n > protocol.MaxRequestPartitions {
		return before, fmt.Errorf("bus: %d request partitions: there must be 1 to %d", n, protocol.MaxRequestPartitions)
	}
	if n == before {
		if err := b.ensureRequestConsumers(ctx); err != nil {
			return before, err
		}
		return before, b.dropLeftPartitions(ctx)
	}
	for i := range idleChecks {
		if i > 0 {
			select {
			case <-ctx.Done():
				return before, ctx.Err()
			case <-time.After(idleGap):
			}
		}
		for p := range before {
			info, err := b.requestConsumerInfo(ctx, p)
			if err != nil {
				return before, err
			}
			if info == nil {
				continue
			}
			if waiting := info.NumPending + uint64(info.NumAckPending); waiting > 0 {
				return before, fmt.Errorf("bus: request partition %d holds %d requests not yet routed: stop the gateways, let the routers route them, stop the routers, then change the partitions", p, waiting)
			}
			if info.NumWaiting > 0 {
				return before, fmt.Errorf("bus: a router reads request partition %d: stop the gateways and the routers before changing the partitions (they take the new number when they start again)", p)
			}
		}
	}
	have, err := b.Stream.Info(ctx)
	if err != nil {
		return before, fmt.Errorf("bus: read stream %s: %w", protocol.StreamName, err)
	}
	cfg := have.Config
	src, dest := protocol.RequestTransform(n)
	cfg.SubjectTransform = &jetstream.SubjectTransformConfig{Source: src, Destination: dest}
	stream, err := b.JS.UpdateStream(ctx, cfg)
	if err != nil {
		return before, fmt.Errorf("bus: spread stream %s's requests over %d partitions: %w", protocol.StreamName, n, err)
	}
	b.Stream, b.partitions = stream, n
	if err := b.ensureRequestConsumers(ctx); err != nil {
		return before, err
	}
	return before, b.dropLeftPartitions(ctx)
}

// dropLeftPartitions deletes the consumers of partitions beyond Partitions that hold no
// request. Those that do are kept (routers read them too, RequestConsumers) and named in the
// error: a gateway still running sent them requests while the partitions changed.
func (b *Bus) dropLeftPartitions(ctx context.Context) error {
	left, err := b.leftPartitions(ctx)
	if err != nil {
		return err
	}
	var kept []int
	for _, p := range left {
		info, err := b.requestConsumerInfo(ctx, p)
		if err != nil {
			return err
		}
		if info == nil {
			continue
		}
		if info.NumPending+uint64(info.NumAckPending) > 0 {
			kept = append(kept, p)
			continue
		}
		if err := b.Stream.DeleteConsumer(ctx, RequestConsumer(p)); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("bus: delete request partition %d: %w", p, err)
		}
	}
	if len(kept) > 0 {
		return fmt.Errorf("bus: requests go to %d partitions now, but partitions %v were sent requests while they changed (a gateway still ran): "+
			"they are kept and routers read them until they are empty; run hermes provision --partitions %d again then to delete them", b.partitions, kept, b.partitions)
	}
	return nil
}

// leftPartitions lists the request partitions beyond Partitions whose consumers still exist.
func (b *Bus) leftPartitions(ctx context.Context) ([]int, error) {
	names := b.Stream.ConsumerNames(ctx)
	var left []int
	for name := range names.Name() {
		for p := b.partitions; p < protocol.MaxRequestPartitions; p++ {
			if name == RequestConsumer(p) {
				left = append(left, p)
			}
		}
	}
	if err := names.Err(); err != nil {
		return nil, fmt.Errorf("bus: list the consumers of stream %s: %w", protocol.StreamName, err)
	}
	return left, nil
}

// RequestConsumers returns the consumers of the request partitions, and of those left beyond
// them by a change of the partitions that still hold requests: a router reads all of them.
func (b *Bus) RequestConsumers(ctx context.Context) ([]jetstream.Consumer, error) {
	left, err := b.leftPartitions(ctx)
	if err != nil {
		return nil, err
	}
	var out []jetstream.Consumer
	for p := range b.partitions {
		c, err := b.Consumer(ctx, RequestConsumer(p))
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	for _, p := range left {
		c, err := b.Consumer(ctx, RequestConsumer(p))
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue // deleted meanwhile, empty
		}
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// requestConsumerInfo reads request partition p's consumer; nil when it does not exist.
func (b *Bus) requestConsumerInfo(ctx context.Context, p int) (*jetstream.ConsumerInfo, error) {
	c, err := b.Stream.Consumer(ctx, RequestConsumer(p))
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bus: read request partition %d: %w", p, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("bus: read request partition %d: %w", p, err)
	}
	return info, nil
}
