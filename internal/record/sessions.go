package record

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Session is one session as the record knows it.
type Session struct {
	// ID is the session id.
	ID string
	// LastRequestID is the request_id of its latest recorded request.
	LastRequestID string
	// LastSeq is the stream sequence of that request.
	LastSeq uint64
	// LastAt is when the stream stored it (UTC).
	LastAt time.Time
	// Requests is how many of its request messages the record holds.
	Requests uint64
}

// RecentSessions returns up to limit sessions of the record, the one whose latest request was
// stored last first. It reads the headers of each session's latest request (one message per
// session in the record, through a consumer delivering the last message per subject), keeping
// only the latest limit, then asks the stream how many requests each of those has. Its time grows
// with the number of sessions in the record, its memory only with limit; bound it with ctx.
//
// With owner set, only sessions whose latest request names owner (bus.HeaderOwner) count.
func RecentSessions(ctx context.Context, js jetstream.JetStream, limit int, owner string) ([]Session, error) {
	if limit <= 0 {
		return nil, nil
	}
	streams, l, err := openStreams(ctx, js)
	if err != nil {
		return nil, err
	}
	// Each stream's latest limit sessions, then the latest limit of them all (each session
	// is in one stream).
	var all []Session
	for k, stream := range streams {
		got, err := recentIn(ctx, js, stream, k, limit, owner)
		if err != nil {
			return nil, err
		}
		all = append(all, got...)
	}
	slices.SortStableFunc(all, func(a, b Session) int { return b.LastAt.Compare(a.LastAt) })
	out := all[:min(limit, len(all))]
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(countConcurrency)
	for i := range out {
		g.Go(func() error { return completeSession(gctx, streams[l.StreamOf(out[i].ID)], l, &out[i]) })
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

// recentIn returns up to limit sessions of record stream k (stream), latest first
// (RecentSessions).
func recentIn(ctx context.Context, js jetstream.JetStream, stream jetstream.Stream, k, limit int, owner string) ([]Session, error) {
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Description:       "hermes: list recent sessions",
		FilterSubject:     protocol.FilterRequestsIn(k),
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		HeadersOnly:       true,
		MemoryStorage:     true,
		Replicas:          1,
		InactiveThreshold: inactive,
	})
	if err != nil {
		return nil, fmt.Errorf("record: sessions: %w", err)
	}
	defer deleteConsumer(js, cons)
	// The latest limit sessions, in stream order: a session's requests may be on two subjects
	// (a partition's and the fast lane's), so a session seen again moves to the back.
	recent := list.New()
	byID := map[string]*list.Element{}
	if ci := cons.CachedInfo(); ci != nil && ci.NumPending > 0 {
		it, err := cons.Messages(jetstream.PullMaxMessages(1000))
		if err != nil {
			return nil, fmt.Errorf("record: sessions: %w", err)
		}
		defer it.Stop()
		var consSeq uint64
		for {
			msg, done, err := nextMsg(ctx, it, cons)
			if err != nil {
				return nil, fmt.Errorf("record: sessions: %w", err)
			}
			if done {
				break // what was left expired meanwhile
			}
			md, err := msg.Metadata()
			if err != nil {
				return nil, fmt.Errorf("record: sessions: %w", err)
			}
			if consSeq++; md.Sequence.Consumer != consSeq {
				return nil, errors.New("record: sessions: messages were lost in transit; try again")
			}
			if owner != "" && msg.Headers().Get(bus.HeaderOwner) != owner {
				continue
			}
			s := Session{ID: protocol.SessionOfSubject(msg.Subject()), LastRequestID: msg.Headers().Get(bus.HeaderRequestID),
				LastSeq: md.Sequence.Stream, LastAt: md.Timestamp.UTC()}
			if e, ok := byID[s.ID]; ok {
				recent.Remove(e)
			}
			byID[s.ID] = recent.PushBack(s)
			if recent.Len() > limit {
				delete(byID, recent.Remove(recent.Front()).(Session).ID)
			}
			if md.NumPending == 0 {
				break
			}
		}
	}
	// Latest first.
	out := make([]Session, 0, recent.Len())
	for e := recent.Back(); e != nil; e = e.Prev() {
		out = append(out, e.Value.(Session))
	}
	return out, nil
}

// countConcurrency bounds the stream info requests RecentSessions has in flight.
const countConcurrency = 8

// completeSession counts s's requests and, for a request published without the request id
// header, reads its id from the message.
func completeSession(ctx context.Context, stream jetstream.Stream, l protocol.Layout, s *Session) error {
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(l.FilterRequestsOf(s.ID)))
	if err != nil {
		return fmt.Errorf("record: sessions: count requests of %s: %w", s.ID, err)
	}
	for _, n := range info.State.Subjects {
		s.Requests += n
	}
	if s.LastRequestID == "" {
		raw, err := stream.GetMsg(ctx, s.LastSeq)
		if err != nil {
			return fmt.Errorf("record: sessions: read request %d: %w", s.LastSeq, err)
		}
		if m, err := protocol.Unmarshal(raw.Data); err == nil {
			s.LastRequestID = m.RequestID
		}
	}
	return nil
}
