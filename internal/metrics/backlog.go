package metrics

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Backlog reports the backlog of every durable consumer of some streams at each scrape:
// messages not yet delivered (pending) and delivered but not yet acknowledged (ack pending).
// It reads consumer info from the server, bounded by Timeout; a scrape that cannot reach the
// server reports hermes_consumer_info_up 0 instead of stale numbers.
type Backlog struct {
	Streams []jetstream.Stream
	// Timeout bounds one scrape's reads. Default 2 s.
	Timeout time.Duration
	Logger  *slog.Logger
}

var (
	pendingDesc = prometheus.NewDesc("hermes_consumer_pending_messages",
		"Messages of a durable consumer not delivered yet.", []string{"stream", "consumer"}, nil)
	ackPendingDesc = prometheus.NewDesc("hermes_consumer_ack_pending_messages",
		"Messages delivered to a durable consumer and not acknowledged yet.", []string{"stream", "consumer"}, nil)
	redeliveredDesc = prometheus.NewDesc("hermes_consumer_redelivered_messages",
		"Messages of a durable consumer delivered more than once and not acknowledged yet.", []string{"stream", "consumer"}, nil)
	infoUpDesc = prometheus.NewDesc("hermes_consumer_info_up",
		"1 when the last scrape read every consumer's state from the server, else 0.", nil, nil)
)

// Describe implements prometheus.Collector.
func (b *Backlog) Describe(ch chan<- *prometheus.Desc) {
	ch <- pendingDesc
	ch <- ackPendingDesc
	ch <- redeliveredDesc
	ch <- infoUpDesc
}

// Collect implements prometheus.Collector.
func (b *Backlog) Collect(ch chan<- prometheus.Metric) {
	timeout := b.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	up := 1.0
	for _, s := range b.Streams {
		stream := s.CachedInfo().Config.Name
		infos := s.ListConsumers(ctx)
		for info := range infos.Info() {
			if info.Config.Durable == "" {
				continue
			}
			ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(info.NumPending), stream, info.Name)
			ch <- prometheus.MustNewConstMetric(ackPendingDesc, prometheus.GaugeValue, float64(info.NumAckPending), stream, info.Name)
			ch <- prometheus.MustNewConstMetric(redeliveredDesc, prometheus.GaugeValue, float64(info.NumRedelivered), stream, info.Name)
		}
		if err := infos.Err(); err != nil {
			up = 0
			if b.Logger != nil {
				b.Logger.Warn("metrics: list consumers", "stream", stream, "err", err)
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(infoUpDesc, prometheus.GaugeValue, up)
}
