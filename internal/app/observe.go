package app

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/internal/telemetry"
	"github.com/hermesbus/hermes/pkg/bus"
)

// observer is one process's metrics registry and trace export.
type observer struct {
	reg     *prometheus.Registry
	metrics *metrics.Metrics
	stop    func(context.Context) error
}

// observe sets up metrics and, when the OTEL_* environment asks for it, trace export for the
// process running service. Call close when the process ends: it flushes pending spans.
func observe(ctx context.Context, service string) (*observer, error) {
	stop, err := telemetry.Setup(ctx, service)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	return &observer{reg: reg, metrics: metrics.New(reg), stop: stop}, nil
}

// watchBacklog adds the backlog of b's consumers to the metrics.
func (o *observer) watchBacklog(b *bus.Bus, log *slog.Logger) {
	o.reg.MustRegister(&metrics.Backlog{Streams: append(slices.Clone(b.Streams), b.DLQ), Logger: log})
}

func (o *observer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = o.stop(ctx)
}
