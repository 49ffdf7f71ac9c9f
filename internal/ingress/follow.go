package ingress

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/record"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Bounds of a follow: how long one lasts unless it says (for), and at most.
const (
	defaultFollow = time.Minute
	maxFollow     = 10 * time.Minute
)

// HeaderSeq, on what a follow sends, is the message's sequence in the record (ask again with
// after set to it to go on from there); HeaderEnd marks the follow's last message, and says why
// it ended.
const (
	HeaderSeq = "Hermes-Seq"
	HeaderEnd = "Hermes-Follow-End"
)

// followAsk is a call of the endpoint follow.
type followAsk struct {
	SessionID string `json:"session_id"`
	// For is how long to follow (a Go duration; default 1m, at most 10m).
	For string `json:"for,omitempty"`
	// After, when set, follows from the message after this record sequence; else from the
	// session's first.
	After uint64 `json:"after,omitempty"`
}

// follow sends the client the messages of one of its sessions, as JSON, on its own subject
// (protocol.SubjectClientSession): the session's history, then each new message as it is
// recorded, for as long as it asked, or until the gateway stops; a last empty message carries
// HeaderEnd. It answers at once with the subject and the end: the client subscribes first.
// Only a session the client owns is followed (another's is 404, as one that never was).
func (s *Service) follow(ctx context.Context, r micro.Request) {
	user, ok := s.client(r)
	if !ok {
		return
	}
	var ask followAsk
	if !s.decodeAsk(r, &ask, `{"session_id": "…", "for": "5m", "after": 0}`) {
		return
	}
	filters, err := record.SessionFilters("session_id", ask.SessionID)
	if err != nil {
		s.refuse(r, http.StatusBadRequest, protocol.CodeInvalidRequest, "session_id", err.Error())
		return
	}
	length := defaultFollow
	if ask.For != "" {
		d, err := time.ParseDuration(ask.For)
		if err != nil || d < time.Second || d > maxFollow {
			s.refuse(r, http.StatusBadRequest, protocol.CodeInvalidRequest, "for", fmt.Sprintf("for: %q is not a time from 1s to %s (a Go duration: 5m)", protocol.Shorten(ask.For, 32), maxFollow))
			return
		}
		length = d
	}
	if ask.After == ^uint64(0) {
		s.refuse(r, http.StatusBadRequest, protocol.CodeInvalidRequest, "after", "after: no record sequence follows it")
		return
	}
	if r.Reply() == "" {
		return
	}
	release, ok := s.place(r)
	if !ok {
		return
	}
	t, ok := s.admitClient(ctx, r, user, admission.Ask{Session: ask.SessionID, Mode: admission.Follow, Hold: admission.HoldStream, Store: admission.StoreNone})
	if !ok {
		release()
		return
	}
	subject := protocol.SubjectClientSession(user, ask.SessionID)
	until := time.Now().Add(length)
	answer, _ := json.Marshal(map[string]any{"session_id": ask.SessionID, "subject": subject, "until": until.UTC()})
	if err := r.Respond(answer, micro.WithHeaders(micro.Headers{bus.HeaderContentType: {protocol.ContentTypeJSON}})); err != nil {
		t.Close()
		s.releaseClient(user)
		release()
		return
	}
	go func() {
		defer func() { t.Close(); s.releaseClient(user); release() }()
		fctx, cancel := context.WithDeadline(s.stopping, until)
		defer cancel()
		from := record.Start{}
		if ask.After > 0 {
			from.Seq = ask.After + 1
		}
		err := record.Stream(fctx, s.Record, filters, from, nil, func(e *record.Entry) error {
			hdr := nats.Header{bus.HeaderContentType: {protocol.ContentTypeJSON}, HeaderSeq: {strconv.FormatUint(e.Seq, 10)}}
			data, err := record.JSON(record.ForCallers(e))
			if err == nil {
				err = s.Conn.PublishMsg(&nats.Msg{Subject: subject, Data: data, Header: hdr})
			}
			if err != nil {
				// Too large to send (or to encode): the entry without its payload, saying why,
				// so the client knows of it and goes on past it.
				stub, _ := record.JSON(&record.Entry{Seq: e.Seq, Subject: e.Subject, Time: e.Time, Msg: e.Msg, Err: fmt.Errorf("not sent: %w", err)})
				return s.Conn.PublishMsg(&nats.Msg{Subject: subject, Data: stub, Header: hdr})
			}
			return nil
		})
		why := "time"
		switch {
		case err != nil && fctx.Err() == nil:
			why = "the record could not be read; follow again with after"
			s.Logger.Warn("follow", "client", user, "session_id", ask.SessionID, "err", err)
		case s.stopping.Err() != nil:
			why = "the gateway stopped; follow again with after"
		}
		_ = s.Conn.PublishMsg(&nats.Msg{Subject: subject, Header: nats.Header{HeaderEnd: {why}}})
	}()
}
