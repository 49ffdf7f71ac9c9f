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
	HeaderReason     = "Hermes-Dlq-Reason"
	HeaderSubject    = "Hermes-Dlq-Subject"
	HeaderStreamSeq  = "Hermes-Dlq-Stream-Seq"
	HeaderDeliveries = "Hermes-Dlq-Deliveries"
	HeaderConsumer   = "Hermes-Dlq-Consumer"
	HeaderAt         = "Hermes-Dlq-At"
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
	if a.Stream != protocol.StreamName || !protocol.ValidToken(a.Consumer, protocol.MaxIDLen) || a.StreamSeq == 0 {
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
		pub: bus.NewPublisher(cfg.Bus.JS, protocol.Sender{Role: protocol.RoleDeadLetter, Instance: cfg.Instance})}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.cfg.Metrics == nil {
		p.cfg.Metrics = metrics.New(nil)
	}
	p.answer = answer.New(cfg.Bus, p.pub, park.New(cfg.Bus, p.pub, p.log), p.cfg.Metrics, p.log)
	return p, nil
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
	raw, err := p.cfg.Bus.Stream.GetMsg(ctx, a.StreamSeq)
	switch {
	case err == nil:
		subject, data, origHdr = raw.Subject, raw.Data, raw.Header
	case errors.Is(err, jetstream.ErrMsgNotFound):
		// Aged out of the record: keep what the advisory says.
	default:
		return fmt.Errorf("deadletter: fetch %d: %w", a.StreamSeq, err)
	}
	reason := a.reason()
	msg := &nats.Msg{Subject: protocol.SubjectDeadLetter(a.Consumer), Data: data, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, protocol.MsgIDDeadLetter(a.Consumer, a.StreamSeq))
	msg.Header.Set(HeaderReason, reason)
	msg.Header.Set(HeaderSubject, subject)
	msg.Header.Set(HeaderStreamSeq, strconv.FormatUint(a.StreamSeq, 10))
	msg.Header.Set(HeaderDeliveries, strconv.FormatUint(a.Deliveries, 10))
	msg.Header.Set(HeaderConsumer, a.Consumer)
	msg.Header.Set(HeaderAt, time.Now().UTC().Format(time.RFC3339Nano))
	if t := origHdr.Get(bus.HeaderTraceID); t != "" {
		msg.Header.Set(bus.HeaderTraceID, t)
	}
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
		return p.redriveResult(ctx, m.SessionID, subject, data, origHdr, a.StreamSeq)
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
	// A real result recorded in the meantime wins and is published instead.
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

// redriveResult gives a result the routers gave up aggregating one more round of deliveries,
// once: the result is recorded already, so aggregation is all that is left to do. The copy
// goes to the session's result subject, so that its call's own subject keeps one result.
func (p *Processor) redriveResult(ctx context.Context, session, subject string, data []byte, hdr nats.Header, seq uint64) error {
	if hdr.Get(bus.HeaderRedrive) != "" {
		p.log.Error("a result was given up twice; its request may stay without a response", "subject", subject, "stream_seq", seq)
		return nil
	}
	msg := &nats.Msg{Subject: protocol.LegacySubjectResult(session), Data: data, Header: nats.Header{}}
	redrive := protocol.AutoRedriveID(seq)
	msg.Header.Set(jetstream.MsgIDHeader, protocol.MsgIDRedrive(redrive))
	msg.Header.Set(bus.HeaderRedrive, redrive)
	_, err := p.cfg.Bus.JS.PublishMsg(ctx, msg)
	return err
}
