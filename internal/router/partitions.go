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
// the record's number of partitions again; when it changed (hermes provision --partitions), it
// lets each partition's request in hand finish and reads the new ones: a router that started
// while the number changed does not miss the partitions added.
func (r *Router) routeRequests(ctx context.Context, h bus.Handler) error {
	watch := r.cfg.PartitionWatch
	if watch <= 0 {
		watch = DefaultPartitionWatch
	}
	for {
		cons, err := r.cfg.Bus.RequestConsumers(ctx)
		if err != nil {
			return err
		}
		n := r.cfg.Bus.Partitions()
		g, gctx := errgroup.WithContext(ctx)
		for _, c := range cons {
			// One request of a partition at a time (the consumer allows no more): its
			// session's order holds. A slow request keeps its delivery (progress signals): it is
			// not handed out again, nor given up on and answered as dead-lettered, while it is
			// handled.
			ackWait := r.cfg.Bus.Config().AckWait
			if info := c.CachedInfo(); info != nil && info.Config.AckWait > 0 {
				ackWait = info.Config.AckWait // as created, possibly by another process
			}
			g.Go(func() error {
				err := (&bus.Subscriber{Consumer: c, Handler: h, Concurrency: 1, Progress: ackWait / 3, Logger: r.log}).Run(gctx)
				if c.Left && errors.Is(err, jetstream.ErrConsumerNotFound) {
					// A partition left by a change of the number, emptied and deleted.
					r.log.Info("a request partition left by a change of their number is gone", "partition", c.Partition)
					return nil
				}
				return err
			})
		}
		g.Go(func() error {
			t := time.NewTicker(watch)
			defer t.Stop()
			for {
				select {
				case <-gctx.Done():
					return nil
				case <-t.C:
				}
				m, err := r.cfg.Bus.RefreshPartitions(gctx)
				if err != nil {
					if gctx.Err() == nil {
						r.log.Warn("reading the record's request partitions failed; reading them again later", "err", err)
					}
					continue
				}
				if m != n {
					r.log.Warn("the record's request partitions changed: reading the new ones", "were", n, "now", m)
					return errPartitionsChanged
				}
			}
		})
		err = g.Wait()
		if ctx.Err() != nil {
			return nil
		}
		if !errors.Is(err, errPartitionsChanged) {
			return err
		}
	}
}

// errPartitionsChanged stops a round of routeRequests: the partitions are read again.
var errPartitionsChanged = errors.New("the request partitions changed")
