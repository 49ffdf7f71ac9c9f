package app

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/examples"
	"github.com/hermesbus/hermes/internal/gateway"
	"github.com/hermesbus/hermes/internal/router"
	"github.com/hermesbus/hermes/internal/routes"
	"github.com/hermesbus/hermes/internal/tool"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// connect dials NATS (url, or in-process when opt is given) and provisions the bus.
func connect(ctx context.Context, url, name string, cfg bus.Config, log *slog.Logger, opts ...nats.Option) (*nats.Conn, *bus.Bus, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	nc, err := bus.Connect(cctx, url, name, log, opts...)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	var b *bus.Bus
	for {
		b, err = bus.Provision(cctx, js, cfg)
		if err == nil {
			for _, d := range b.Drift {
				log.Warn(d)
			}
			return nc, b, nil
		}
		if cctx.Err() != nil {
			nc.Close()
			return nil, nil, err
		}
		log.Warn("provisioning the bus failed; retrying", "err", err)
		select {
		case <-cctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// defaultRoutes is the routes file used when none is named.
const defaultRoutes = "examples/routes.yaml"

// loadRoutes loads path; the default path falls back to the copy built into the binary when
// the file is not there. It reports what it loaded.
func loadRoutes(path string) (*routes.Table, string, bool, error) {
	t, err := routes.Load(path)
	if err == nil {
		return t, path, true, nil
	}
	if path == defaultRoutes && errors.Is(err, fs.ErrNotExist) {
		data, rerr := examples.Files.ReadFile("routes.yaml")
		if rerr != nil {
			return nil, "", false, rerr
		}
		t, err = routes.Parse(path, data)
		return t, path + " (built-in copy)", false, err
	}
	return nil, "", false, err
}

// routerService runs a router and, when the table came from a file, reloads it on change.
type routerService struct {
	r      *router.Router
	path   string
	watch  bool
	reload time.Duration
	log    *slog.Logger
}

func (s *routerService) Run(ctx context.Context) error {
	if s.watch && s.reload > 0 {
		go func() {
			_ = routes.Watch(ctx, s.path, s.reload, func(t *routes.Table) {
				if t.Digest == s.r.Routes().Digest {
					return
				}
				s.r.SetRoutes(t)
				s.log.Info("routes reloaded", "file", s.path, "rules", len(t.Rules))
			}, s.log)
		}()
	}
	return s.r.Run(ctx)
}

func newRouter(b *bus.Bus, instance string, table *routes.Table, concurrency int, limits protocol.Limits, obs *observer, log *slog.Logger) (*router.Router, error) {
	return router.New(router.Config{Bus: b, Routes: table, Instance: instance, Concurrency: concurrency, Limits: limits,
		Metrics: obs.metrics, Logger: log.With("service", "router")})
}

func newWorker(b *bus.Bus, cfg tool.Config, obs *observer, log *slog.Logger) (*tool.Worker, error) {
	cfg.Bus, cfg.Metrics = b, obs.metrics
	cfg.Logger = log.With("service", "toolworker")
	return tool.New(cfg)
}

// newGateway builds a gateway that also serves the process's metrics at /metrics.
func newGateway(nc *nats.Conn, b *bus.Bus, cfg gateway.Config, obs *observer, log *slog.Logger) (*gateway.Gateway, error) {
	cfg.Conn, cfg.Bus, cfg.Logger = nc, b, log.With("service", "gateway")
	cfg.Metrics, cfg.Gatherer = obs.metrics, obs.reg
	return gateway.New(cfg)
}

func listen(addr, what string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: listen on %s: %w", what, addr, err)
	}
	return ln, nil
}
