package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/answer"
	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/internal/park"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/ledger"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Headers of a dead letter.
const (
	HeaderReason    = "Hermes-Dlq-Reason"
	HeaderSubject   = "Hermes-Dlq-Subject"
	HeaderStreamSeq = "Hermes-Dlq-Stream-Seq"
	// HeaderStream names the stream the message was given up in (of letters written before it
	// was set: the record's first).
	HeaderStream     = "Hermes-Dlq-Stream"
	HeaderDeliveries = "Hermes-Dlq-Deliveries"
	HeaderConsumer   = "Hermes-Dlq-Consumer"
	HeaderAt         = "Hermes-Dlq-At"
	// HeaderSize, on a letter that keeps only the first bytes of its message, is the whole
	// message's size.
	HeaderSize = "Hermes-Dlq-Size"
)

// advisory is the part of the server's max-deliveries and terminated advisories we read.
type advisory struct {
	Type       string `json:"type"`
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
	Reason     string `json:"reason"`
}

const (
	typeMaxDeliver = "io.nats.jetstream.advisory.v1.max_deliver"
	typeTerminated = "io.nats.jetstream.advisory.v1.terminated"
)

// decodeAdvisory reads an advisory, refusing anything that is not one of ours.
func decodeAdvisory(data []byte) (*advisory, error) {
	var a advisory
	if err := json.Unmarshal(data, &a); err != nil {
		return nil, fmt.Errorf("deadletter: advisory is not JSON: %w", err)
	}
	if a.Type != typeMaxDeliver && a.Type != typeTerminated {
		return nil, fmt.Errorf("deadletter: unexpected advisory type %q", a.Type)
	}
	if _, record := protocol.RecordStreamIndex(a.Stream); !record || !protocol.ValidToken(a.Consumer, protocol.MaxIDLen) || a.StreamSeq == 0 {
		return nil, fmt.Errorf("deadletter: advisory names stream %q, consumer %q, sequence %d", a.Stream, a.Consumer, a.StreamSeq)
	}
	return &a, nil
}

// kind names the advisory for metrics: max_deliveries or terminated.
func (a *advisory) kind() string {
	if a.Type == typeTerminated {
		return "terminated"
	}
	return "max_deliveries"
}

func (a *advisory) reason() string {
	if a.Type == typeTerminated {
		if a.Reason == "" {
			return "terminated by its consumer"
		}
		return "terminated: " + a.Reason
	}
	return fmt.Sprintf("gave up after %d deliveries", a.Deliveries)
}

// Config configures a Processor.
type Config struct {
	// Bus is the provisioned bus. Required.
	Bus *bus.Bus
	// Instance names this processor in the messages it sends. Required.
	Instance string
	// Limits for decoding dead requests; zero fields take protocol.DefaultLimits.
	Limits protocol.Limits
	// Metrics counts dead letters and the requests answered for them; nil counts into
	// unexported metrics.
	Metrics *metrics.Metrics
	// Logger; nil discards.
	Logger *slog.Logger
}

// Processor turns advisories into dead letters and answers the requests waiting on them. It is
// a service of its own: run it in any process, as many as you like (they share one durable
// consumer; every step is idempotent).
type Processor struct {
	cfg    Config
	pub    *bus.Publisher
	answer *answer.Responder
	log    *slog.Logger
}

// New returns a Processor.
func New(cfg Config) (*Processor, error) {
	if cfg.Bus == nil || cfg.Instance == "" {
		return nil, errors.New("deadletter: Config.Bus and Config.Instance are required")
	}
	p := &Processor{cfg: cfg, log: cfg.Logger,
		pub: cfg.Bus.NewPublisher(protocol.Sender{Role: protocol.RoleDeadLetter, Instance: cfg.Instance})}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.cfg.Metrics == nil {
		p.cfg.Metrics = metrics.New(nil)
	}
	p.answer = answer.New(cfg.Bus, p.pub, park.New(cfg.Bus, p.pub, p.log), p.cfg.Metrics, p.log)
	return p, nil
}

// Message is the dead letter of the message consumer gave up at stream sequence streamSeq of
// stream after deliveries deliveries, for reason: the original bytes data (nil when they
// are gone), published on subject, with what names it in headers, and its trace id from orig
// (nil for none). Its id makes a second letter of the same message a duplicate.
func Message(stream, consumer, subject string, streamSeq, deliveries uint64, reason string, data []byte, orig nats.Header) *nats.Msg {
	msg := &nats.Msg{Subject: protocol.SubjectDeadLetter(consumer), Data: data, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, protocol.MsgIDDeadLetter(stream, consumer, streamSeq))
	msg.Header.Set(HeaderStream, stream)
	msg.Header.Set(HeaderReason, reason)
	msg.Header.Set(HeaderSubject, subject)
	msg.Header.Set(HeaderStreamSeq, strconv.FormatUint(streamSeq, 10))
	msg.Header.Set(HeaderDeliveries, strconv.FormatUint(deliveries, 10))
	msg.Header.Set(HeaderConsumer, consumer)
	msg.Header.Set(HeaderAt, time.Now().UTC().Format(time.RFC3339Nano))
	if t := orig.Get(bus.HeaderTraceID); t != "" {
		msg.Header.Set(bus.HeaderTraceID, t)
	}
	if ct := orig.Get(bus.HeaderContentType); ct != "" {
		msg.Header.Set(bus.HeaderContentType, ct)
	}
	return msg
}

// Run processes advisories until ctx is done.
func (p *Processor) Run(ctx context.Context) error {
	cons, err := p.cfg.Bus.DeadLetterConsumer(ctx)
	if err != nil {
		return err
	}
	return (&bus.Subscriber{Consumer: cons, Handler: bus.HandlerFunc(p.handle), Concurrency: 4, Logger: p.log}).Run(ctx)
}

func (p *Processor) handle(ctx context.Context, d *bus.Delivery) error {
	a, err := decodeAdvisory(d.Data)
	if err != nil {
		p.log.Warn("ignored advisory", "subject", d.Subject, "err", err)
		return nil
	}
	var subject string
	var data []byte
	var origHdr nats.Header
	// Read from the stream leader: a replica that has not stored the message yet would make
	// it look aged out, and whoever waits for it would never be answered.
	raw, err := p.cfg.Bus.RecordAt(ctx, a.Stream, a.StreamSeq)
	switch {
	case err == nil:
		subject, data, origHdr = raw.Subject, raw.Data, raw.Header
	case errors.Is(err, bus.ErrNotFound):
		// Aged out of the record: keep what the advisory says.
	default:
		return fmt.Errorf("deadletter: fetch %d: %w", a.StreamSeq, err)
	}
	reason := a.reason()
	msg := Message(a.Stream, a.Consumer, subject, a.StreamSeq, a.Deliveries, reason, data, origHdr)
	ack, err := p.cfg.Bus.JS.PublishMsg(ctx, msg)
	if err != nil {
		return fmt.Errorf("deadletter: publish dead letter: %w", err)
	}
	if !ack.Duplicate {
		p.cfg.Metrics.DeadLetters.WithLabelValues(a.Consumer, a.kind()).Inc()
	}
	p.log.Warn("dead letter", "consumer", a.Consumer, "subject", subject, "stream_seq", a.StreamSeq,
		"deliveries", a.Deliveries, "reason", reason, "request_id", origHdr.Get(bus.HeaderRequestID),
		"session_id", origHdr.Get(bus.HeaderSessionID), "msg_id", origHdr.Get(jetstream.MsgIDHeader), "trace_id", origHdr.Get(bus.HeaderTraceID))
	if data == nil {
		return nil
	}
	if m, err := protocol.Unmarshal(data); err == nil && m.Type == protocol.TypeToolResult {
		return p.aggregate(ctx, m, reason)
	}
	return p.answerWaiting(ctx, data, reason)
}

// answerWaiting gives whoever waits on the dead message an answer.
func (p *Processor) answerWaiting(ctx context.Context, data []byte, reason string) error {
	m, err := protocol.Unmarshal(data)
	if err != nil {
		return nil // nobody can be identified as waiting for undecodable bytes
	}
	switch m.Type {
	case protocol.TypeToolCall:
		disp, err := m.DecodeDispatch()
		if err != nil {
			return nil
		}
		return p.failCall(ctx, m, disp, reason)
	case protocol.TypeRequest:
		return p.failRequest(ctx, m, reason)
	}
	return nil
}

func (p *Processor) failCall(ctx context.Context, m *protocol.Message, disp *protocol.Dispatch, reason string) error {
	attempts, code := ledger.Last(ctx, p.cfg.Bus.Claims, ledger.Key(m.RequestID, disp.Call.ToolCallID))
	hint := "Hermes gave up on this call (" + reason + "); `hermes dlq ls` shows it and `hermes dlq retry` re-drives it"
	if code != "" {
		hint = "the call kept failing with " + code + " and Hermes gave up (" + reason + "); `hermes dlq ls` shows it"
	}
	if code == "" || code == protocol.CodeCancelled {
		// CANCELLED from Hermes says a cancellation answered the call; a try that ended so
		// (a tool's own code) is not one.
		code = protocol.CodeDeadLettered
	}
	res := protocol.ErrorResult(code, protocol.OriginHermes, hint, "dead-lettered: "+reason).For(&disp.Call, disp.Route)
	res.Attempts = attempts
	out, err := protocol.NewMessage(protocol.TypeToolResult, &res)
	if err != nil {
		return bus.Permanent(err)
	}
	// The result follows its dispatch, correlation included, so it aggregates like any other.
	out.Follow(m, protocol.MsgIDToolResult(m.RequestID, res.ToolCallID))
	out.Attempt = attempts
	// The ledger says first that the call is finished, so that a worker still running it
	// leaves the answer recorded first standing; a real result recorded in the meantime
	// wins and is published instead.
	if err := ledger.Finish(ctx, p.cfg.Bus.Claims, ledger.Key(m.RequestID, disp.Call.ToolCallID)); err != nil {
		return err
	}
	_, _, err = p.cfg.Bus.RecordResult(ctx, p.pub, out, &res)
	return err
}

// failRequest answers a request no router could handle with a failed response saying why, and
// an error result for each call it could read.
func (p *Processor) failRequest(ctx context.Context, m *protocol.Message, reason string) error {
	var results []protocol.ToolResult
	hint := "Hermes could not handle this request (" + reason + "); fix it and send it again with a new request_id"
	serial := false
	if req, err := m.DecodeRequest(p.cfg.Limits); err == nil {
		serial = req.Serial
		for i := range req.ToolCalls {
			results = append(results, protocol.ErrorResult(protocol.CodeDeadLettered, protocol.OriginHermes, hint, "dead-lettered: "+reason).For(&req.ToolCalls[i], ""))
		}
	}
	_, err := p.answer.Respond(ctx, &answer.Response{RequestID: m.RequestID, SessionID: m.SessionID, Results: results,
		Error: &protocol.ResponseError{Code: protocol.CodeDeadLettered, Message: hint}, Cause: m.MsgID, Trace: m.Trace, Serial: serial})
	return err
}

// aggregate does for a result the routers gave up aggregating what they would have done: once
// every call of its request has a recorded result, the request is answered from them. Until
// then nothing is left to do here: the last result recorded completes the request (its own
// aggregation, or this). Results on the record that cannot be read are the one thing routers
// cannot get past: the request is then answered failed, DEAD_LETTERED, so that it is never
// left without a response. Anything else that goes wrong is retried.
func (p *Processor) aggregate(ctx context.Context, m *protocol.Message, reason string) error {
	callIDs, serial, trace, cause := []string(nil), false, m.Trace, protocol.MsgIDRequest(m.RequestID)
	plan, err := p.cfg.Bus.Plan(ctx, m.RequestID)
	switch {
	case err == nil:
		callIDs, serial, trace, cause = plan.CallIDs, plan.Serial, plan.Trace, plan.RequestMsg
	case (errors.Is(err, bus.ErrNotFound) || bus.IsPermanent(err)) && m.Correlation != nil && validIDs(m.Correlation.CallIDs, p.maxCalls()):
		// No plan to read (or none that decodes): the result's own correlation names the calls.
		plan, callIDs, serial = nil, m.Correlation.CallIDs, m.Correlation.Serial
	case errors.Is(err, bus.ErrNotFound) || bus.IsPermanent(err):
		p.log.Warn("a given-up result names no request Hermes knows; nothing to answer", "request_id", m.RequestID, "session_id", m.SessionID, "err", err)
		return nil
	default:
		return fmt.Errorf("deadletter: read the plan of %s: %w", m.RequestID, err)
	}
	rec := &answer.Record{RequestID: m.RequestID, SessionID: m.SessionID, CallIDs: callIDs, Cause: cause, Trace: trace, Serial: serial}
	complete, err := p.answer.FromRecord(ctx, rec)
	if !bus.IsPermanent(err) {
		if err == nil && complete {
			p.log.Info("answered a request whose result the routers gave up aggregating", "request_id", m.RequestID, "session_id", m.SessionID)
		}
		return err
	}
	hint := "Hermes could not read the results of this request (" + err.Error() + "); send it again with a new request_id"
	results := make([]protocol.ToolResult, len(callIDs))
	for i, id := range callIDs {
		results[i] = protocol.ErrorResult(protocol.CodeDeadLettered, protocol.OriginHermes, hint, "dead-lettered: "+reason).
			For(&protocol.ToolCall{ToolCallID: id, Name: nameAt(plan, i)}, "")
	}
	p.log.Error("the results of a request cannot be read; answering it failed", "request_id", m.RequestID, "session_id", m.SessionID, "err", err)
	_, err = p.answer.Respond(ctx, &answer.Response{RequestID: m.RequestID, SessionID: m.SessionID, Results: results,
		Error: &protocol.ResponseError{Code: protocol.CodeDeadLettered, Message: hint}, Cause: cause, Trace: trace, Serial: serial})
	return err
}

// maxCalls is the most calls a request may have.
func (p *Processor) maxCalls() int {
	if p.cfg.Limits.MaxToolCalls > 0 {
		return p.cfg.Limits.MaxToolCalls
	}
	return protocol.DefaultLimits.MaxToolCalls
}

// validIDs reports whether ids are at most max valid call ids.
func validIDs(ids []string, max int) bool {
	if len(ids) == 0 || len(ids) > max {
		return false
	}
	for _, id := range ids {
		if !protocol.ValidToken(id, protocol.MaxIDLen) {
			return false
		}
	}
	return true
}

// nameAt is the name of plan's call i, if it has one.
func nameAt(plan *bus.Plan, i int) string {
	if plan != nil && i < len(plan.Names) {
		return plan.Names[i]
	}
	return ""
}
