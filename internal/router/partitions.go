package router

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/hermesbus/hermes/pkg/bus"
)

// DefaultPartitionWatch is how often a router reads the record's number of request partitions
// again where its configuration gives none.
const DefaultPartitionWatch = 10 * time.Second

// routeRequests reads every request partition with h until ctx is done. Every watch it reads
// the record's number of partitions again; when it changed (hermes provision --partitions) and
// every partition of the new number has its consumer, it lets each partition's request in hand
// finish and reads the new ones: a router that started while the number changed does not miss
// the partitions added. Until their consumers exist it goes on reading the ones it has.
func (r *Router) routeRequests(ctx context.Context, h bus.Handler) error {
	n, cons, err := r.cfg.Bus.RequestConsumers(ctx)
	if err != nil {
		return err
	}
	for {
		var next []bus.PartitionConsumer
		g, gctx := errgroup.WithContext(ctx)
		for _, c := range cons {
			g.Go(func() error { return r.readPartition(gctx, c, h) })
		}
		g.Go(func() error {
			var ok bool
			if n, next, ok = r.awaitPartitions(gctx, n); ok {
				return errPartitionsChanged // ends this round's readings
			}
			return nil
		})
		err := g.Wait()
		if ctx.Err() != nil {
			return nil
		}
		if !errors.Is(err, errPartitionsChanged) {
			return err
		}
		cons = next
	}
}

// awaitPartitions reads the record's number of request partitions every watch until it is no
// longer n and every partition of the new number has its consumer, and returns that number and
// the consumers to read; false when ctx ended first.
func (r *Router) awaitPartitions(ctx context.Context, n int) (int, []bus.PartitionConsumer, bool) {
	watch := r.cfg.PartitionWatch
	if watch <= 0 {
		watch = DefaultPartitionWatch
	}
	t := time.NewTicker(watch)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return n, nil, false
		case <-t.C:
		}
		if m, err := r.cfg.Bus.RefreshPartitions(ctx); err != nil {
			if ctx.Err() == nil {
				r.log.Warn("reading the record's request partitions failed; reading them again later", "err", err)
			}
			continue
		} else if m == n {
			continue
		}
		m, cons, err := r.cfg.Bus.RequestConsumers(ctx)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("the record's request partitions changed, but not all have their consumer yet (hermes provision makes them): reading the ones there are", "were", n, "now", m, "err", err)
			}
			continue
		}
		r.log.Warn("the record's request partitions changed: reading the new ones", "were", n, "now", m)
		return m, cons, true
	}
}

// readPartition reads partition c's requests with h until ctx is done. A partition that is
// deleted while read — one left beyond the number of partitions by a change of it, and emptied
// — ends its reading quietly.
func (r *Router) readPartition(ctx context.Context, c bus.PartitionConsumer, h bus.Handler) error {
	// One request of a partition at a time (the consumer allows no more): its session's order
	// holds. A slow request keeps its delivery (progress signals): it is not handed out again,
	// nor given up on and answered as dead-lettered, while it is handled.
	ackWait := r.cfg.Bus.Config().AckWait
	if info := c.CachedInfo(); info != nil && info.Config.AckWait > 0 {
		ackWait = info.Config.AckWait // as created, possibly by another process
	}
	err := (&bus.Subscriber{Consumer: c, Handler: h, Concurrency: 1, Progress: ackWait / 3, Logger: r.log}).Run(ctx)
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return err
	}
	left := c.Left
	if !left {
		m, rerr := r.cfg.Bus.RefreshPartitions(ctx)
		left = rerr == nil && c.Partition >= m // the number shrank under this router
	}
	if !left {
		return err
	}
	r.log.Info("a request partition beyond the record's number is gone: no more to read there", "partition", c.Partition)
	return nil
}

// errPartitionsChanged stops a round of routeRequests: the partitions are read again.
var errPartitionsChanged = errors.New("the request partitions changed")

// Partitions is the number of request partitions this router follows (the record's, as it last
// read it).
func (r *Router) Partitions() int { return r.cfg.Bus.Partitions() }
