package bus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/retry"
)

// recordPartitions is how many partitions the record's subject transform spreads requests over;
// false when it has none, or one Hermes does not write.
func recordPartitions(cfg jetstream.StreamConfig) (int, bool) {
	if cfg.SubjectTransform == nil {
		return 0, false
	}
	return protocol.RequestPartitionsOf(cfg.SubjectTransform.Destination)
}

// RefreshPartitions reads again how many partitions the record spreads requests over, as
// changed by Repartition elsewhere, and returns it.
func (b *Bus) RefreshPartitions(ctx context.Context) (int, error) {
	info, err := b.Stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("bus: read stream %s: %w", protocol.StreamName, err)
	}
	n, ok := recordPartitions(info.Config)
	if !ok {
		return 0, fmt.Errorf("bus: stream %s spreads requests over no partitions Hermes knows (its subject transform is %s)", protocol.StreamName, transformText(info.Config))
	}
	b.partitions.Store(int32(n))
	return n, nil
}

func transformText(cfg jetstream.StreamConfig) string {
	if t := cfg.SubjectTransform; t != nil {
		return t.Source + " -> " + t.Destination
	}
	return "none"
}

// ensureRequestConsumer opens (or creates) the consumer of request partition p.
func (b *Bus) ensureRequestConsumer(ctx context.Context, p int) error {
	spec := b.consumer(RequestConsumer(p), protocol.FilterRequestPartition(p))
	spec.MaxAckPending = 1
	_, err := b.ensureConsumerSpec(ctx, b.Stream, spec)
	return err
}

// ensureRequestConsumers opens (or creates) the consumer of each request partition.
func (b *Bus) ensureRequestConsumers(ctx context.Context) error {
	for p := range b.Partitions() {
		if err := b.ensureRequestConsumer(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// idleChecks and idleGap: how often, and how far apart, Repartition looks for a router reading
// a partition. A running router always has a pull waiting on each partition (a pull lasts
// PullWait, 500 ms by default) but for a moment between two pulls, so three looks apart from
// each other find it.
const (
	idleChecks = 3
	idleGap    = 200 * time.Millisecond
)

// repartitionStep is called at each step of Repartition that a request sent meanwhile could
// race with: tests send one there.
var repartitionStep = func(string) {}

// Repartitioned is what Repartition did.
type Repartitioned struct {
	// Before and After are the numbers of partitions.
	Before, After int
	// Kept are partitions beyond After that still hold requests, or that a router reads: they
	// are kept, routers read them until they are empty, and Repartition deletes them once they
	// are neither.
	Kept []int
	// Raced are partitions that were sent requests while the number changed (a gateway still
	// ran), kept ones included: those requests are routed, but their sessions' order against
	// the requests sent after the change is not guaranteed.
	Raced []int
}

// Repartition changes how many partitions the record spreads requests over to n (1 to
// protocol.MaxRequestPartitions): the migration hermes provision --partitions runs.
//
// Sessions move to other partitions, so it is refused while a router reads a partition or a
// request waits in one — either would let a session's later request be routed before an
// earlier one. It then creates the partitions added (before any request can be stored in them:
// a new consumer starts at the stream's end), changes the stream's transform, and deletes the
// partitions beyond n that hold nothing. Run with the number the record has, it only deletes
// what such a change kept. A gateway still running during the change loses nothing: what it
// sent is routed, and Repartitioned says where its order was at risk. Routers notice the new
// number by themselves (the router's partition watch), but one that was running would have
// been refused here.
func (b *Bus) Repartition(ctx context.Context, n int) (Repartitioned, error) {
	before := b.Partitions()
	done := Repartitioned{Before: before, After: n}
	if n < 1 || n > protocol.MaxRequestPartitions {
		return done, fmt.Errorf("bus: %d request partitions: there must be 1 to %d", n, protocol.MaxRequestPartitions)
	}
	left, err := b.leftPartitions(ctx)
	if err != nil {
		return done, err
	}
	old := append(seq(0, before), left...)
	if n != before {
		for i := range idleChecks {
			if i > 0 && !retry.Sleep(ctx, idleGap) {
				return done, ctx.Err()
			}
			for _, p := range old {
				info, err := b.requestConsumerInfo(ctx, p)
				if err != nil || info == nil {
					if err != nil {
						return done, err
					}
					continue
				}
				if waiting := info.NumPending + uint64(info.NumAckPending); waiting > 0 {
					return done, fmt.Errorf("bus: request partition %d holds %d requests not yet routed: stop the gateways, let the routers route them, stop the routers, then change the partitions", p, waiting)
				}
				if info.NumWaiting > 0 {
					return done, fmt.Errorf("bus: a router reads request partition %d: stop the gateways and the routers before changing the partitions (they take the new number when they start again)", p)
				}
			}
		}
		for p := before; p < n; p++ {
			if err := b.ensureRequestConsumer(ctx, p); err != nil {
				return done, err
			}
		}
		repartitionStep("before the transform")
		have, err := b.Stream.Info(ctx)
		if err != nil {
			return done, fmt.Errorf("bus: read stream %s: %w", protocol.StreamName, err)
		}
		cfg := have.Config
		src, dest := protocol.RequestTransform(n)
		cfg.SubjectTransform = &jetstream.SubjectTransformConfig{Source: src, Destination: dest}
		if _, err := b.JS.UpdateStream(ctx, cfg); err != nil {
			return done, fmt.Errorf("bus: spread stream %s's requests over %d partitions: %w", protocol.StreamName, n, err)
		}
		b.partitions.Store(int32(n))
		repartitionStep("after the transform")
		for _, p := range old {
			if info, err := b.requestConsumerInfo(ctx, p); err == nil && info != nil && info.NumPending+uint64(info.NumAckPending) > 0 {
				done.Raced = append(done.Raced, p)
			}
		}
	}
	done.Kept, err = b.dropLeftPartitions(ctx)
	return done, err
}

// dropLeftPartitions deletes the consumers of partitions beyond Partitions that hold no request
// and that no router reads, and returns those it kept.
func (b *Bus) dropLeftPartitions(ctx context.Context) ([]int, error) {
	left, err := b.leftPartitions(ctx)
	if err != nil {
		return nil, err
	}
	var kept []int
	for i := range idleChecks {
		if i > 0 && len(left) > 0 && !retry.Sleep(ctx, idleGap) {
			return nil, ctx.Err()
		}
		for _, p := range left {
			info, err := b.requestConsumerInfo(ctx, p)
			if err != nil {
				return nil, err
			}
			if info != nil && (info.NumPending+uint64(info.NumAckPending) > 0 || info.NumWaiting > 0) && !slices.Contains(kept, p) {
				kept = append(kept, p)
			}
		}
	}
	for _, p := range left {
		if slices.Contains(kept, p) {
			continue
		}
		if err := b.Stream.DeleteConsumer(ctx, RequestConsumer(p)); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return kept, fmt.Errorf("bus: delete request partition %d: %w", p, err)
		}
	}
	slices.Sort(kept)
	return kept, nil
}

// leftPartitions lists the request partitions beyond Partitions whose consumers still exist.
func (b *Bus) leftPartitions(ctx context.Context) ([]int, error) {
	n := b.Partitions()
	names := b.Stream.ConsumerNames(ctx)
	var left []int
	for name := range names.Name() {
		for p := n; p < protocol.MaxRequestPartitions; p++ {
			if name == RequestConsumer(p) {
				left = append(left, p)
			}
		}
	}
	if err := names.Err(); err != nil {
		return nil, fmt.Errorf("bus: list the consumers of stream %s: %w", protocol.StreamName, err)
	}
	slices.Sort(left)
	return left, nil
}

// PartitionConsumer is the consumer of one request partition a router reads.
type PartitionConsumer struct {
	jetstream.Consumer
	// Partition is its number; Left says it lies beyond the record's number of partitions,
	// kept by a change of the number until it is empty (it may go away while read).
	Partition int
	Left      bool
}

// RequestConsumers returns the number of request partitions, the consumers of those partitions,
// and those of the partitions a change of their number left beyond them: a router reads all of
// them.
func (b *Bus) RequestConsumers(ctx context.Context) (int, []PartitionConsumer, error) {
	n := b.Partitions()
	names := b.Stream.ConsumerNames(ctx)
	exists := map[string]bool{}
	for name := range names.Name() {
		exists[name] = true
	}
	if err := names.Err(); err != nil {
		return n, nil, fmt.Errorf("bus: list the consumers of stream %s: %w", protocol.StreamName, err)
	}
	var out []PartitionConsumer
	for p := range protocol.MaxRequestPartitions {
		if p >= n && !exists[RequestConsumer(p)] {
			continue
		}
		c, err := b.Consumer(ctx, RequestConsumer(p))
		if p >= n && errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue // deleted meanwhile, empty
		}
		if err != nil {
			return n, nil, err
		}
		out = append(out, PartitionConsumer{Consumer: c, Partition: p, Left: p >= n})
	}
	return n, out, nil
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
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bus: read request partition %d: %w", p, err)
	}
	return info, nil
}

// seq is from, from+1, …, to-1.
func seq(from, to int) []int {
	var out []int
	for p := from; p < to; p++ {
		out = append(out, p)
	}
	return out
}
