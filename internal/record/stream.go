package record

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// Stream delivers to h, in stream order, every message on any of filters (none: every message)
// from start: first those already stored, then each new one as it is stored, until ctx is done;
// it then returns nil. One ordered consumer reads both, so no message is delivered twice and
// none is skipped between what was there and what comes. A start sequence past the end of the
// record (a record recreated since the caller saw it) starts at its end. ready, when not nil,
// is called once the consumer exists, before the first message; an error returned before ready
// means nothing was read. Stream rides out disconnects and server restarts as [Follow] does.
// Filters are placed in the record's streams as [Read] places them.
func Stream(ctx context.Context, js jetstream.JetStream, filters []string, from Start, ready func(), h Handler) error {
	if err := from.Validate(); err != nil {
		return err
	}
	parts, err := placed(ctx, js, filters, from)
	if err != nil {
		return err
	}
	if si := parts[0].stream.CachedInfo(); si != nil && from.Seq > si.State.LastSeq+1 {
		from.Seq = si.State.LastSeq + 1
	}
	return consumeAll(ctx, js, parts, func(p part) jetstream.OrderedConsumerConfig { return startConfig(p.filters, from) }, ready, h, "stream")
}
