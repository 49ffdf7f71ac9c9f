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

	"github.com/hermesbus/hermes/internal/ledger"
	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/pkg/bus"
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

// CodeDeadLettered is the error code of a call or request Hermes gave up on.
const CodeDeadLettered = "DEAD_LETTERED"

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
	Bus      *bus.Bus
	Instance string
	// Limits for decoding dead requests; zero fields take protocol.DefaultLimits.
	Limits protocol.Limits
	// Metrics counts dead letters and the requests answered for them; nil counts into
	// unexported metrics.
	Metrics *metrics.Metrics
	// Wake, when set, is called once a serial request is answered here, to let the next serial
	// request of its session go (router.Router.Wake).
	Wake   func(ctx context.Context, requestID string) error
	Logger *slog.Logger
}

// Processor turns advisories into dead letters and answers the requests waiting on them.
type Processor struct {
	cfg Config
	pub *bus.Publisher
	log *slog.Logger
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
	msg.Header.Set(jetstream.MsgIDHeader, "dlq:"+a.Consumer+":"+strconv.FormatUint(a.StreamSeq, 10))
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
		return p.redriveResult(ctx, subject, data, origHdr, a.StreamSeq)
	}
	return p.answer(ctx, data, reason)
}

// answer gives whoever waits on the dead message an answer.
func (p *Processor) answer(ctx context.Context, data []byte, reason string) error {
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
	if code == "" {
		code = CodeDeadLettered
	} else {
		hint = "the call kept failing with " + code + " and Hermes gave up (" + reason + "); `hermes dlq ls` shows it"
	}
	content, _ := json.Marshal("dead-lettered: " + reason)
	res := &protocol.ToolResult{ToolCallID: disp.Call.ToolCallID, Name: disp.Call.Name, Status: protocol.ResultError,
		Content: content, Attempts: attempts, ErrorCode: code, ErrorOrigin: protocol.OriginHermes, RecoveryHint: hint, Route: disp.Route,
		RequestCallIDs: disp.RequestCallIDs, RequestSerial: disp.Serial}
	out, err := protocol.NewMessage(protocol.TypeToolResult, res)
	if err != nil {
		return bus.Permanent(err)
	}
	out.Follow(m, protocol.MsgIDToolResult(m.RequestID, res.ToolCallID))
	out.Attempt = attempts
	// A real result recorded in the meantime wins and is published instead.
	_, _, err = p.cfg.Bus.RecordResult(ctx, p.pub, out, res)
	return err
}

// failRequest answers a request no router could handle with a failed response saying why, and
// an error result for each call it could read.
func (p *Processor) failRequest(ctx context.Context, m *protocol.Message, reason string) error {
	var results []protocol.ToolResult
	content, _ := json.Marshal("dead-lettered: " + reason)
	hint := "Hermes could not handle this request (" + reason + "); fix it and send it again with a new request_id"
	serial := false
	if req, err := m.DecodeRequest(p.cfg.Limits); err == nil {
		serial = req.Serial
		for _, c := range req.ToolCalls {
			results = append(results, protocol.ToolResult{ToolCallID: c.ToolCallID, Name: c.Name, Status: protocol.ResultError,
				Content: content, ErrorCode: CodeDeadLettered, ErrorOrigin: protocol.OriginHermes, RecoveryHint: hint})
		}
	}
	resp := &protocol.Response{RequestID: m.RequestID, SessionID: m.SessionID, Status: protocol.StatusFailed, Results: results,
		Error: &protocol.ResponseError{Code: CodeDeadLettered, Message: hint}}
	out, err := protocol.NewMessage(protocol.TypeResponse, resp)
	if err != nil {
		return bus.Permanent(err)
	}
	out.Follow(m, protocol.MsgIDResponse(m.RequestID))
	mine, err := p.cfg.Bus.Respond(ctx, p.pub, out)
	if err != nil {
		return err
	}
	if mine {
		p.cfg.Metrics.Answered(resp)
	}
	if serial && p.cfg.Wake != nil {
		return p.cfg.Wake(ctx, m.RequestID)
	}
	return nil
}

// redriveResult gives a result the routers gave up aggregating one more round of deliveries,
// once: the result is recorded already, so aggregation is all that is left to do.
func (p *Processor) redriveResult(ctx context.Context, subject string, data []byte, hdr nats.Header, seq uint64) error {
	if hdr.Get(bus.HeaderRedrive) != "" {
		p.log.Error("a result was given up twice; its request may stay without a response", "subject", subject, "stream_seq", seq)
		return nil
	}
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	redrive := "auto-" + strconv.FormatUint(seq, 10)
	msg.Header.Set(jetstream.MsgIDHeader, "redrive:"+redrive)
	msg.Header.Set(bus.HeaderRedrive, redrive)
	_, err := p.cfg.Bus.JS.PublishMsg(ctx, msg)
	return err
}
