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
func Stream(ctx context.Context, js jetstream.JetStream, filters []string, from Start, ready func(), h Handler) error {
	if err := from.Validate(); err != nil {
		return err
	}
	stream, err := openStream(ctx, js)
	if err != nil {
		return err
	}
	if si := stream.CachedInfo(); si != nil && from.Seq > si.State.LastSeq+1 {
		from.Seq = si.State.LastSeq + 1
	}
	return consume(ctx, js, stream, startConfig(filters, from), ready, h, "stream")
}
