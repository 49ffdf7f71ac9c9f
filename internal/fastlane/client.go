package fastlane

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// DefaultAskWait bounds a gateway's wait for a router's answer on the fast lane, unless
// configured otherwise: past it the request takes the durable path.
const DefaultAskWait = 3 * time.Second

// Client asks routers to answer requests on the fast lane: what a gateway's submitter does
// first with every request that may take it. It is safe for concurrent use.
type Client struct {
	conn *nats.Conn
	wait time.Duration
	off  atomic.Bool
}

// NewClient returns a Client asking over conn, waiting at most wait (DefaultAskWait when ≤ 0).
func NewClient(conn *nats.Conn, wait time.Duration) *Client {
	if wait <= 0 {
		wait = DefaultAskWait
	}
	return &Client{conn: conn, wait: wait}
}

// SetEnabled turns asking on or off (on by default): off, every request takes the durable
// path.
func (c *Client) SetEnabled(on bool) { c.off.Store(!on) }

// Enabled reports whether the client asks.
func (c *Client) Enabled() bool { return c != nil && !c.off.Load() }

// Ownership is how long after a router took a request on the fast lane (recorded its plan,
// bus.Plan.Fast) it is taken to be still answering it, or putting it on the durable path: a
// gateway that heard nothing from it waits for the response rather than publish the request.
const Ownership = 10 * time.Second

// Answer is what came of asking.
type Answer struct {
	// Outcome is a protocol.Fast… value: FastAnswered or FastReplayed with Response set,
	// FastConflict, FastDurable (wait for the response of the durable path), FastDeclined (no
	// router took it: the durable path's), or "" when no router answered at all (one may have
	// taken it).
	Outcome  string
	Response *protocol.Response
}

// Ask asks a router to answer m, a validated request message encoded as data, with header hdr
// (the owner), and waits for the answer within the client's wait (or ctx's).
func (c *Client) Ask(ctx context.Context, m *protocol.Message, data []byte, hdr nats.Header) Answer {
	ctx, cancel := context.WithTimeout(ctx, c.wait)
	defer cancel()
	reply, err := c.conn.RequestMsgWithContext(ctx, &nats.Msg{Subject: protocol.SubjectFastRequest(m.SessionID), Data: data, Header: hdr})
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return Answer{Outcome: protocol.FastDeclined} // no router listens: none took it
	case err != nil:
		return Answer{}
	}
	a := Answer{Outcome: reply.Header.Get(bus.HeaderFast)}
	switch a.Outcome {
	case protocol.FastAnswered, protocol.FastReplayed:
		resp, err := decodeResponse(reply.Data, m.RequestID)
		if err != nil {
			return Answer{} // a router took it; its answer is unreadable: wait for the record
		}
		a.Response = resp
	case protocol.FastConflict, protocol.FastDurable, protocol.FastDeclined:
	default:
		return Answer{Outcome: protocol.FastDeclined} // refused before anything was taken
	}
	return a
}

// decodeResponse reads a router's answer: the response to requestID.
func decodeResponse(data []byte, requestID string) (*protocol.Response, error) {
	m, err := protocol.Unmarshal(data)
	if err != nil {
		return nil, err
	}
	if m.Type != protocol.TypeResponse || m.RequestID != requestID {
		return nil, errors.New("fastlane: the answer is not this request's response")
	}
	resp, err := m.DecodeResponse()
	if err != nil {
		return nil, err
	}
	if resp.RequestID != requestID {
		return nil, errors.New("fastlane: the answer is not this request's response")
	}
	return resp, nil
}
