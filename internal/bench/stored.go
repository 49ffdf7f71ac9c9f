package bench

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// StoredMessages returns how many messages every stream of js's account holds — the record,
// the dead letters, the timers and every key-value bucket. Its growth over sequential requests
// is how many messages each request stores.
func StoredMessages(ctx context.Context, js jetstream.JetStream) (uint64, error) {
	var total uint64
	streams := js.ListStreams(ctx)
	for info := range streams.Info() {
		total += info.State.Msgs
	}
	if err := streams.Err(); err != nil {
		return 0, fmt.Errorf("bench: list streams: %w", err)
	}
	return total, nil
}

// StoredPerRequest sends n requests one after another with do and returns the growth of
// StoredMessages divided by n. Nothing else may use the bus meanwhile.
func StoredPerRequest(ctx context.Context, js jetstream.JetStream, n int, do Do) (float64, error) {
	before, err := StoredMessages(ctx, js)
	if err != nil {
		return 0, err
	}
	for i := range n {
		if err := do(ctx, 0, i); err != nil {
			return 0, fmt.Errorf("bench: request %d of %d: %w", i+1, n, err)
		}
	}
	after, err := StoredMessages(ctx, js)
	if err != nil {
		return 0, err
	}
	return float64(int64(after)-int64(before)) / float64(n), nil
}
