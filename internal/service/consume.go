package service

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// LookAgain is how soon Consume looks again for a consumer that is missing or failed.
var LookAgain = 5 * time.Second

// Consume runs run on the consumer get finds until ctx ends. When the consumer is missing (a
// bus provisioned by an earlier Hermes), it says once that what would be consumed is not
// (naming what, and that hermes provision makes it), and looks again; when get or run fails,
// it logs the failure and looks again, every LookAgain.
func Consume(ctx context.Context, log *slog.Logger, what string, get func(context.Context) (jetstream.Consumer, error),
	run func(context.Context, jetstream.Consumer) error) {
	warned := false
	for ctx.Err() == nil {
		c, err := get(ctx)
		if err == nil {
			warned = false
			err = run(ctx, c)
		}
		if ctx.Err() != nil {
			return
		}
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound) && !warned:
			log.Warn(what + " are not consumed: the bus was set up by an earlier Hermes; run hermes provision")
			warned = true
		case err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound):
			log.Error(what+" cannot be consumed; trying again", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(LookAgain):
		}
	}
}
