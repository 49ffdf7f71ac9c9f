package bus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
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

// partitionStream is the record stream that holds request partition p.
func (b *Bus) partitionStream(p int) jetstream.Stream {
	return b.Streams[b.layout.StreamOfPartition(p)]
}

// ensureRequestConsumer opens (or creates) the consumer of request partition p, in its stream.
func (b *Bus) ensureRequestConsumer(ctx context.Context, p int) error {
	spec := b.consumer(RequestConsumer(p), b.layout.FilterRequestPartition(p))
	spec.MaxAckPending = 1
	_, err := b.ensureConsumerSpec(ctx, b.partitionStream(p), spec)
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
	if err := b.layout.CheckPartitions(n); err != nil {
		return done, fmt.Errorf("bus: %w", err)
	}
	left, err := b.leftPartitions(ctx, before)
	if err != nil {
		return done, err
	}
	old := append(seq(0, before), left...)
	if n != before {
		err := b.lookAtPartitions(ctx, old, func(p int, info *jetstream.ConsumerInfo) error {
			if waiting := holding(info); waiting > 0 {
				return fmt.Errorf("bus: request partition %d holds %d requests not yet routed: stop the gateways, let the routers route them, stop the routers, then change the partitions", p, waiting)
			}
			if info.NumWaiting > 0 {
				return fmt.Errorf("bus: a router reads request partition %d: stop the gateways and the routers before changing the partitions (they take the new number when they start again)", p)
			}
			return nil
		})
		if err != nil {
			return done, err
		}
		for p := before; p < n; p++ {
			if err := b.ensureRequestConsumer(ctx, p); err != nil {
				return done, err
			}
		}
		repartitionStep("before the transform")
		// The first stream's transform is the number every process reads: it changes last.
		for k := len(b.Streams) - 1; k >= 0; k-- {
			if err := spreadRequests(ctx, b.JS, b.Streams[k], k, n); err != nil {
				return done, err
			}
		}
		b.partitions.Store(int32(n))
		repartitionStep("after the transform")
		for _, p := range old {
			if info, err := b.requestConsumerInfo(ctx, p); err == nil && info != nil && holding(info) > 0 {
				done.Raced = append(done.Raced, p)
			}
		}
	}
	done.Kept, err = b.dropLeftPartitions(ctx)
	return done, err
}

// spreadRequests makes record stream k's (s's) transform spread its requests over n partitions.
func spreadRequests(ctx context.Context, js jetstream.JetStream, s jetstream.Stream, k, n int) error {
	have, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("bus: read stream %s: %w", protocol.RecordStream(k), err)
	}
	cfg := have.Config
	src, dest := protocol.RequestTransformIn(k, n)
	cfg.SubjectTransform = &jetstream.SubjectTransformConfig{Source: src, Destination: dest}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("bus: spread stream %s's requests over %d partitions: %w", protocol.RecordStream(k), n, err)
	}
	return nil
}

// dropLeftPartitions deletes the consumers of partitions beyond Partitions that hold no request
// and that no router reads, and returns those it kept.
func (b *Bus) dropLeftPartitions(ctx context.Context) ([]int, error) {
	left, err := b.leftPartitions(ctx, b.Partitions())
	if err != nil {
		return nil, err
	}
	var kept []int
	err = b.lookAtPartitions(ctx, left, func(p int, info *jetstream.ConsumerInfo) error {
		if (holding(info) > 0 || info.NumWaiting > 0) && !slices.Contains(kept, p) {
			kept = append(kept, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, p := range left {
		if slices.Contains(kept, p) {
			continue
		}
		if err := b.partitionStream(p).DeleteConsumer(ctx, RequestConsumer(p)); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return kept, fmt.Errorf("bus: delete request partition %d: %w", p, err)
		}
	}
	slices.Sort(kept)
	return kept, nil
}

// lookAtPartitions reads the consumer of each partition of parts idleChecks times, idleGap
// apart, and gives look each that exists; it stops at look's first error.
func (b *Bus) lookAtPartitions(ctx context.Context, parts []int, look func(p int, info *jetstream.ConsumerInfo) error) error {
	if len(parts) == 0 {
		return nil
	}
	for i := range idleChecks {
		if i > 0 && !retry.Sleep(ctx, idleGap) {
			return ctx.Err()
		}
		for _, p := range parts {
			info, err := b.requestConsumerInfo(ctx, p)
			if err != nil {
				return err
			}
			if info == nil {
				continue
			}
			if err := look(p, info); err != nil {
				return err
			}
		}
	}
	return nil
}

// holding is how many requests a partition's consumer holds: not yet delivered, or delivered
// and not yet acknowledged.
func holding(info *jetstream.ConsumerInfo) uint64 {
	return info.NumPending + uint64(info.NumAckPending)
}

// partitionOf is the partition whose consumer is named name; false for any other consumer.
func partitionOf(name string) (int, bool) {
	num, ok := strings.CutPrefix(name, requestConsumerPrefix)
	if !ok {
		return 0, false
	}
	p, err := strconv.Atoi(num)
	if err != nil || p < 0 || p >= protocol.MaxRequestPartitions || RequestConsumer(p) != name {
		return 0, false
	}
	return p, true
}

// leftPartitions lists the request partitions from n on whose consumers still exist (each in
// its stream), in order.
func (b *Bus) leftPartitions(ctx context.Context, n int) ([]int, error) {
	var left []int
	for k, s := range b.Streams {
		names := s.ConsumerNames(ctx)
		for name := range names.Name() {
			if p, ok := partitionOf(name); ok && p >= n && b.layout.StreamOfPartition(p) == k {
				left = append(left, p)
			}
		}
		if err := names.Err(); err != nil {
			return nil, fmt.Errorf("bus: list the consumers of stream %s: %w", protocol.RecordStream(k), err)
		}
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
	left, err := b.leftPartitions(ctx, n)
	if err != nil {
		return n, nil, err
	}
	var out []PartitionConsumer
	for _, p := range append(seq(0, n), left...) {
		c, err := b.consumerOf(ctx, b.partitionStream(p), RequestConsumer(p))
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
	c, err := b.partitionStream(p).Consumer(ctx, RequestConsumer(p))
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
