package fastlane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/internal/answer"
	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/internal/park"
	"github.com/hermesbus/hermes/internal/router"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// DefaultCallWait is how long a router waits for a worker's answer on the fast lane, unless
// configured otherwise: a call that takes longer goes down the durable path.
const DefaultCallWait = time.Second

// DefaultInFlight bounds the requests a router answers on the fast lane at once, unless
// configured otherwise; more are declined (the durable path takes them).
const DefaultInFlight = 1024

// Config configures a Lane.
type Config struct {
	// Conn is the router's NATS connection. Required.
	Conn *nats.Conn
	// Bus is the provisioned bus. Required.
	Bus *bus.Bus
	// Router is the router whose pipeline decides about each request. Required.
	Router *router.Router
	// Limits bound requests read from the lane; zero fields take protocol.DefaultLimits.
	Limits protocol.Limits
	// CallWait bounds the wait for a worker's answer (DefaultCallWait).
	CallWait time.Duration
	// InFlight bounds requests answered at once (DefaultInFlight).
	InFlight int
	// Buffer is how many answered requests may wait for their record (DefaultBuffer).
	Buffer int
	// Metrics counts what the lane answers; nil counts into unexported metrics.
	Metrics *metrics.Metrics
	// Logger; nil discards.
	Logger *slog.Logger
}

// Lane is a router's side of the fast lane: it answers the requests gateways ask it over
// request/reply (protocol.SubjectFastRequest) whose calls all only read, running them through
// the router's pipeline (contracts, policies, routes: everything but the serial and plan stages)
// and sending each call, sealed, to a live worker of its tool (protocol.SubjectFastCall); the
// answer goes back at once, and the record of it — request, calls, results, response — to its
// Writer. Its plan is recorded first, as the gateway records a durable request's (created once
// per request_id, before any worker is asked): a request_id in use is never run again here. Anything else it
// declines before a worker runs anything: a call that changes something, a stage that would make
// the request wait (a rate limit's wait), a request_id in use, a full record buffer. A call no
// worker answers in time, or answers with a failure another try may fix, makes it decline too:
// the gateway then takes the durable path, where the call is dispatched again under the same ids
// (a worker that answered it on the fast lane records that answer instead of running it again).
type Lane struct {
	cfg    Config
	writer *Writer
	sender protocol.Sender
	log    *slog.Logger
	slots  chan struct{}
	pub    *bus.Publisher

	mu      sync.Mutex
	closing bool                      // no request is taken once set
	running sync.WaitGroup            // requests in hand
	inbox   string                    // FastReplies.<this lane's token>
	waiting map[string]chan *nats.Msg // call token → where its answer goes

	answered, declined atomic.Int64
}

// New returns a Lane for cfg.
func New(cfg Config) (*Lane, error) {
	if cfg.Conn == nil || cfg.Bus == nil || cfg.Router == nil {
		return nil, errors.New("fastlane: Config.Conn, Config.Bus and Config.Router are required")
	}
	if cfg.CallWait <= 0 {
		cfg.CallWait = DefaultCallWait
	}
	if cfg.InFlight <= 0 {
		cfg.InFlight = DefaultInFlight
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New(nil)
	}
	var tok [12]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return nil, err
	}
	l := &Lane{cfg: cfg, sender: cfg.Router.Sender(), log: cfg.Logger, slots: make(chan struct{}, cfg.InFlight),
		inbox: protocol.FastReplies + "." + hex.EncodeToString(tok[:]), waiting: map[string]chan *nats.Msg{}}
	l.pub = cfg.Bus.NewPublisher(l.sender)
	l.writer = NewWriter(cfg.Bus, l.pub, cfg.Buffer, cfg.Logger)
	l.writer.waiting = cfg.Metrics.FastRecordWaiting
	return l, nil
}

// Writer is the lane's record writer.
func (l *Lane) Writer() *Writer { return l.writer }

// Counts are the requests answered and declined so far.
func (l *Lane) Counts() (answered, declined int64) { return l.answered.Load(), l.declined.Load() }

// Run answers the lane until ctx ends, then waits for the requests in hand and writes their
// record.
func (l *Lane) Run(ctx context.Context) error {
	replies, err := l.cfg.Conn.Subscribe(l.inbox+".*", l.answerArrived)
	if err != nil {
		return fmt.Errorf("fastlane: subscribe to the workers' answers: %w", err)
	}
	defer func() { _ = replies.Unsubscribe() }()
	_ = replies.SetPendingLimits(64<<10, 256<<20)
	sub, err := l.cfg.Conn.QueueSubscribe(protocol.FilterFastRequests, protocol.FastQueue, func(msg *nats.Msg) {
		if !l.take() {
			l.reply(msg, nil, protocol.FastDeclined)
			return
		}
		go func() {
			defer l.running.Done()
			defer func() { <-l.slots }()
			data, outcome := l.answer(ctx, msg)
			l.reply(msg, data, outcome)
		}()
	})
	if err != nil {
		return fmt.Errorf("fastlane: subscribe: %w", err)
	}
	_ = sub.SetPendingLimits(64<<10, 256<<20)
	// In place once the server has them: a gateway asking from now on finds this router.
	if err := l.cfg.Conn.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("fastlane: subscribe: %w", err)
	}
	written := make(chan error, 1)
	wctx, stopWriter := context.WithCancel(context.WithoutCancel(ctx))
	go func() { written <- l.writer.Run(wctx) }()
	<-ctx.Done()
	l.mu.Lock()
	l.closing = true // no request is taken from here on: running counts them all
	l.mu.Unlock()
	_ = sub.Unsubscribe()
	l.running.Wait()
	stopWriter()
	return <-written
}

// take takes a request in hand: false when the lane is closing or has InFlight in hand.
func (l *Lane) take() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closing {
		return false
	}
	select {
	case l.slots <- struct{}{}:
	default:
		return false
	}
	l.running.Add(1)
	return true
}

func (l *Lane) reply(msg *nats.Msg, data []byte, outcome string) {
	l.cfg.Metrics.FastLane.WithLabelValues(outcome).Inc()
	if outcome == protocol.FastAnswered || outcome == protocol.FastReplayed {
		l.answered.Add(1)
	} else {
		l.declined.Add(1)
	}
	if msg.Reply == "" {
		return
	}
	_ = msg.RespondMsg(&nats.Msg{Data: data, Header: nats.Header{bus.HeaderFast: []string{outcome}}})
}

// answerArrived hands a worker's answer to the call waiting for it.
func (l *Lane) answerArrived(msg *nats.Msg) {
	token := strings.TrimPrefix(msg.Subject, l.inbox+".")
	l.mu.Lock()
	ch := l.waiting[token]
	delete(l.waiting, token) // one answer per call: a second one finds nobody
	l.mu.Unlock()
	if ch != nil {
		ch <- msg
	}
}

// errDeclined ends a request's run on the fast lane: the durable path takes it.
var errDeclined = errors.New("fastlane: declined")

// replayWait bounds how long a request asked again waits for this router to write the record of
// its first run.
const replayWait = time.Second

// answer answers one request, or says why not.
func (l *Lane) answer(ctx context.Context, msg *nats.Msg) ([]byte, string) {
	if !l.writer.Reserve() {
		return nil, protocol.FastDeclined
	}
	filled := false
	defer func() {
		if !filled {
			l.writer.Release()
		}
	}()
	m, err := protocol.Unmarshal(msg.Data)
	if err != nil || m.Type != protocol.TypeRequest || protocol.SubjectFastRequest(m.SessionID) != msg.Subject {
		return []byte("not a request of this subject's session"), protocol.FastRefused
	}
	req, err := m.DecodeRequest(l.cfg.Limits)
	if err != nil {
		return []byte(err.Error()), protocol.FastRefused
	}
	if req.Serial || req.Sandbox != nil {
		return nil, protocol.FastDeclined
	}
	log := l.log.With("request_id", m.RequestID, "session_id", m.SessionID, "msg_id", m.MsgID, "trace_id", m.Trace.TraceID)
	if !l.cfg.Router.MayBeFast(req) {
		return nil, protocol.FastDeclined // a call that changes something: nothing runs here
	}
	// The request is accepted as the gateway accepts a durable one, before any stage runs: its
	// plan, created once per request_id. A request_id in use goes no further here.
	plan := bus.PlanOf(m, req, time.Now())
	plan.AtIntake, plan.Fast = true, true
	created, first, err := l.cfg.Bus.CreatePlan(ctx, m.RequestID, plan)
	switch {
	case err != nil:
		log.Warn("the fast lane could not record the request's plan; the durable path takes the request", "err", err)
		return nil, protocol.FastDeclined
	case !created && first.Fingerprint != "" && first.Fingerprint != plan.Fingerprint:
		return nil, protocol.FastConflict
	case !created:
		return l.again(ctx, m, first)
	}
	// Taken: from here this router answers the request, or puts it on the durable path itself.
	e := &emitter{lane: l}
	job := router.NewJob(m, req, msg.Data, "", log)
	if err := l.cfg.Router.FastPipeline(e).Run(ctx, job); err != nil {
		return l.handOver(ctx, m, msg, log, err)
	}
	out, resp, err := (&answer.Response{RequestID: m.RequestID, SessionID: m.SessionID, Results: e.results,
		Cause: m.MsgID, Trace: m.Trace}).Message(ctx)
	if err != nil {
		return l.handOver(ctx, m, msg, log, err)
	}
	out.Sender = l.sender
	data, err := protocol.Marshal(out)
	if err != nil || len(data) > l.cfg.Bus.MaxMessageBytes()-4<<10 {
		return l.handOver(ctx, m, msg, log, errors.New("the response does not fit in one message")) // the durable path shrinks it
	}
	fast := nats.Header{bus.HeaderFast: []string{l.sender.Instance}}
	reqHeader := nats.Header{bus.HeaderFast: []string{l.sender.Instance}}
	if owner := msg.Header.Get(bus.HeaderOwner); owner != "" {
		reqHeader.Set(bus.HeaderOwner, owner)
	}
	rec := &record{requestID: m.RequestID}
	rec.messages = append(rec.messages, bus.Encoded{Subject: protocol.SubjectFastRecordedRequest(m.SessionID), Msg: m, Data: msg.Data,
		Header: reqHeader, MsgID: protocol.MsgIDFastRequest(m.RequestID)})
	rec.messages = append(rec.messages, e.calls...)
	for _, st := range e.starts {
		rec.messages = append(rec.messages, st...)
	}
	for i := range e.recorded {
		e.recorded[i].Header = fast
	}
	rec.messages = append(rec.messages, e.recorded...)
	rec.messages = append(rec.messages, bus.Encoded{Subject: protocol.SubjectResponse(m.RequestID, m.SessionID), Msg: out, Data: data, Once: true})
	if !l.writer.Fits(rec) {
		// The buffer's bytes are spoken for: the durable path records it (a worker that
		// answered a call here records that answer).
		return l.handOver(ctx, m, msg, log, errors.New("the record buffer is full"))
	}
	rec.written = l.cfg.Router.FastWriting(m.RequestID)
	l.writer.Fill(rec)
	filled = true
	l.cfg.Metrics.Answered(resp)
	return data, protocol.FastAnswered
}

// again answers a request whose request_id was accepted before, for the same request: with the
// first run's response once it has one; while a router answers it on the fast lane, the
// gateway waits for it (FastDurable); anything else is the durable path's, which joins the
// first run.
func (l *Lane) again(ctx context.Context, m *protocol.Message, first *bus.Plan) ([]byte, string) {
	rec, _, err := l.cfg.Bus.Response(ctx, m.RequestID, m.SessionID)
	if errors.Is(err, bus.ErrNotFound) && first.Fast {
		wctx, cancel := context.WithTimeout(ctx, replayWait)
		written := l.cfg.Router.FastWritten(wctx, m.RequestID)
		cancel()
		if written {
			rec, _, err = l.cfg.Bus.Response(ctx, m.RequestID, m.SessionID)
		}
	}
	switch {
	case err == nil:
		return rec.Data, protocol.FastReplayed
	case errors.Is(err, bus.ErrNotFound) && first.Fast && time.Since(first.AcceptedAt) < Ownership:
		return nil, protocol.FastDurable
	}
	return nil, protocol.FastDeclined
}

// handOver puts a request this router took (its plan recorded) but cannot finish on the fast
// lane on the durable path, as the gateway would have: published once, its plan recorded.
// Calls already run here are not run again where their worker can tell.
func (l *Lane) handOver(ctx context.Context, m *protocol.Message, msg *nats.Msg, log *slog.Logger, why error) ([]byte, string) {
	if !errors.Is(why, errDeclined) {
		log.Info("the fast lane hands the request to the durable path", "why", why)
	}
	hdr := nats.Header{bus.HeaderPlanned: []string{"1"}}
	if owner := msg.Header.Get(bus.HeaderOwner); owner != "" {
		hdr.Set(bus.HeaderOwner, owner)
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handOverWithin)
	defer cancel()
	if _, err := l.pub.PublishAs(pctx, protocol.SubjectRequest(m.SessionID), m, msg.Data, m.MsgID, hdr); err != nil {
		// The gateway publishes it then: its plan says nothing ran on the durable path yet.
		log.Warn("the fast lane could not put the request on the durable path; the gateway does", "err", err)
		return nil, protocol.FastDeclined
	}
	return nil, protocol.FastDurable
}

// handOverWithin bounds publishing a request handed to the durable path.
const handOverWithin = 5 * time.Second

// emitter is the fast lane's outlet: it asks the workers and keeps what is to be recorded.
type emitter struct {
	lane     *Lane
	starts   [][]bus.Encoded       // each call's tries' starts, as recorded
	results  []protocol.ToolResult // one per call, in order
	calls    []bus.Encoded         // the calls sent, as recorded
	recorded []bus.Encoded         // the results, as recorded
}

var _ router.Outlet = (*emitter)(nil)

// Park declines: a request that must wait takes the durable path.
func (e *emitter) Park(context.Context, *router.Job, park.Wait) (func(context.Context) error, error) {
	return nil, errDeclined
}

// Emit sends every routed call to a worker at once and gathers their results; it declines
// unless every call is decided by a stage or only reads.
func (e *emitter) Emit(ctx context.Context, job *router.Job) error {
	l := e.lane
	r := l.cfg.Router
	e.results = make([]protocol.ToolResult, len(job.Calls))
	e.recorded = make([]bus.Encoded, len(job.Calls))
	e.starts = make([][]bus.Encoded, len(job.Calls))
	type ask struct {
		i    int
		c    *router.Call
		data []byte
	}
	var asks []ask
	for i, c := range job.Calls {
		switch {
		case c.Result != nil:
			out, err := r.DecidedMessage(ctx, job, c)
			if err != nil {
				return err
			}
			data, err := l.cfg.Bus.SealedDecision(l.pub, out)
			if err != nil {
				return err
			}
			e.results[i] = *c.Result
			e.recorded[i] = bus.Encoded{Subject: protocol.SubjectResult(job.Msg.RequestID, c.Call.ToolCallID, job.Msg.SessionID), Msg: out, Data: data, Once: true}
		case c.Dispatch != nil && c.Dispatch.ReadOnly && c.Hold == nil && !c.Done:
			out, err := r.CallMessage(ctx, job, c)
			if err != nil {
				return err
			}
			out.Msg.Sender = l.sender
			data, err := protocol.Marshal(out.Msg)
			if err != nil {
				return err
			}
			e.calls = append(e.calls, bus.Encoded{Subject: protocol.SubjectEvent(protocol.EventFastCall, job.Msg.SessionID), Msg: out.Msg, Data: data,
				MsgID: protocol.MsgIDFastCall(job.Msg.RequestID, c.Call.ToolCallID)})
			asks = append(asks, ask{i: i, c: c, data: data})
		default:
			return errDeclined
		}
	}
	wait := l.cfg.CallWait
	if d := job.Msg.Deadline; !d.IsZero() {
		wait = min(wait, time.Until(d))
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	errs := make([]error, len(asks))
	var wg sync.WaitGroup
	for n, a := range asks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[n] = e.ask(ctx, job, a.i, a.c, a.data)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// call sends data, a call of tool of kind, to a worker of the tool, and waits for its answer
// within ctx.
func (l *Lane) call(ctx context.Context, kind, tool string, data []byte) (*nats.Msg, error) {
	var tok [12]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return nil, err
	}
	token := hex.EncodeToString(tok[:]) // not to be guessed by another tool's worker
	ch := make(chan *nats.Msg, 1)
	l.mu.Lock()
	l.waiting[token] = ch
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.waiting, token)
		l.mu.Unlock()
	}()
	within := l.cfg.CallWait
	if dl, ok := ctx.Deadline(); ok {
		within = time.Until(dl)
	}
	err := l.cfg.Conn.PublishMsg(&nats.Msg{Subject: protocol.SubjectFastCall(kind, tool), Reply: l.inbox + "." + token, Data: data,
		Header: nats.Header{bus.HeaderFastWithin: []string{within.String()}}})
	if err != nil {
		return nil, err
	}
	select {
	case reply := <-ch:
		if reply.Header.Get("Status") == "503" && len(reply.Data) == 0 {
			return nil, nats.ErrNoResponders
		}
		return reply, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ask sends one call to a worker of its tool and takes its answer: the call's sealed result,
// checked as aggregation checks results.
func (e *emitter) ask(ctx context.Context, job *router.Job, i int, c *router.Call, data []byte) error {
	l := e.lane
	sent := time.Now().UTC()
	reply, err := l.call(ctx, c.Dispatch.Action.Kind, c.Call.Name, data)
	if err != nil {
		// No worker of the tool (no responders), none in time, or the connection failed.
		return fmt.Errorf("%w: %s: %v", errDeclined, c.Call.Name, err)
	}
	if outcome := reply.Header.Get(bus.HeaderFast); outcome != protocol.FastAnswered {
		if outcome == protocol.FastRefused {
			job.Log.Warn("a worker refused a fast-lane call", "tool", c.Call.Name, "why", protocol.Shorten(string(reply.Data), 200))
		}
		return fmt.Errorf("%w: %s: the worker said %s", errDeclined, c.Call.Name, outcome)
	}
	m, err := protocol.Unmarshal(reply.Data)
	if err != nil {
		return fmt.Errorf("%w: %s: the worker's answer: %v", errDeclined, c.Call.Name, err)
	}
	res, err := m.DecodeToolResult()
	if err != nil || m.RequestID != job.Msg.RequestID || m.SessionID != job.Msg.SessionID || res.ToolCallID != c.Call.ToolCallID {
		return fmt.Errorf("%w: %s: the worker answered another call", errDeclined, c.Call.Name)
	}
	if keys := l.cfg.Bus.ResultKeys(); keys != nil {
		if err := keys.VerifyResult(m, res, c.Call.Name); err != nil {
			job.Log.Warn("refused a fast-lane result", "tool", c.Call.Name, "err", err)
			return fmt.Errorf("%w: %s: %v", errDeclined, c.Call.Name, err)
		}
	}
	e.results[i] = *res
	e.recorded[i] = bus.Encoded{Subject: protocol.SubjectResult(m.RequestID, res.ToolCallID, m.SessionID), Msg: m, Data: reply.Data, Once: true}
	// The start of each try the answer took, as the worker would record it on the durable
	// path (its instance named): written after the call, before the result.
	for attempt := 1; attempt <= max(res.Attempts, 1); attempt++ {
		st, err := protocol.NewMessage(protocol.TypeToolStarted, &protocol.ToolStarted{ToolCallID: c.Call.ToolCallID, Name: c.Call.Name,
			Attempt: attempt, StartedAt: sent, Retrying: protocol.RetriedBefore(res.Retried, attempt)})
		if err != nil {
			return fmt.Errorf("%w: %v", errDeclined, err)
		}
		st.Follow(job.Msg, protocol.MsgIDToolStarted(job.Msg.RequestID, c.Call.ToolCallID, attempt))
		st.Attempt, st.Correlation, st.Sender = attempt, nil, m.Sender
		b, err := protocol.Marshal(st)
		if err != nil {
			return fmt.Errorf("%w: %v", errDeclined, err)
		}
		e.starts[i] = append(e.starts[i], bus.Encoded{Subject: protocol.SubjectEvent(protocol.EventToolStarted, job.Msg.SessionID), Msg: st, Data: b})
	}
	return nil
}
