package app

import (
	"context"
	"errors"
	"log/slog"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/internal/erasure"
	"github.com/hermesbus/hermes/internal/service"
	"github.com/hermesbus/hermes/pkg/bus"
)

// NewEraser builds the eraser on b (connected as the bus role eraser): it erases from the
// record what owners ask to have erased through a gateway (DELETE /v1/memory).
func NewEraser(b *bus.Bus, log *slog.Logger) (*erasure.Eraser, error) {
	kv := b.Bucket(erasure.Bucket)
	if kv == nil {
		return nil, errors.New("eraser: the bus keeps no erasures' bucket (" + erasure.Bucket + ")")
	}
	return &erasure.Eraser{Asks: &erasure.Asks{KV: kv}, JS: b.JS, Log: orDiscard(log).With("service", "eraser")}, nil
}

// RunEraser runs the eraser alone: hermes eraser. Any number may run; each erases what is
// asked (erasing again what is erased finds nothing).
func RunEraser(ctx context.Context, args []string, env Env) error {
	fs := newFlagSet("eraser", "hermes eraser [flags]", env.Stderr)
	var c common
	c.register(fs, "eraser")
	log, err := parse(fs, args, env, &c.logLevel)
	if err != nil {
		return err
	}
	return c.runService(ctx, "hermes-eraser", "eraser running", log, func(_ *nats.Conn, b *bus.Bus, _ *observer) (*service.List, []any, error) {
		e, err := NewEraser(b, log)
		if err != nil {
			return nil, nil, err
		}
		return one(service.Func("eraser", e.Run)), nil, nil
	})
}
