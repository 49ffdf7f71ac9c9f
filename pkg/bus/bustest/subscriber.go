package bustest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// SubscriberSetup says where TestSubscriber runs. The zero value runs it on a server of its own
// (NewServer).
type SubscriberSetup struct {
	// Connect opens a connection to the JetStream server to run on, closed by t.Cleanup
	// (Server.Connect, Cluster.Connect). The suite provisions Hermes there with Config and
	// opens a few more connections of its own. Nil: a server of NewServer, started for the
	// suite.
	Connect func(t testing.TB) *nats.Conn
	// Config provisions the bus (Replicas: ClusterSize on a Cluster).
	Config bus.Config
}

// TestSubscriber checks bus.Subscriber against what its documentation promises, one guarantee
// per case, on a real JetStream server — in the way Watermill's pub/sub tests are run by each
// implementation: call it from a test. The cases:
//
//   - a handler's nil acks its message, only once it returned, and the Delivery describes it;
//   - an error naks it, redelivered no sooner than bus.DefaultRetryDelay(NumDelivered) later;
//   - RetryAfter redelivers no sooner than the delay asked;
//   - Permanent terminates it: delivered once, dead-lettered (the server's advisory in the
//     dead-letter stream), and logged;
//   - a panic in the handler or the middleware is recovered, and naks;
//   - Middleware[0] is the outermost;
//   - at most Concurrency handlers run (16 by default), and no more messages are pulled;
//   - Progress keeps a handler that outlives AckWait from having its message redelivered;
//   - at shutdown no handler starts, a running one finishes within Grace with its context
//     alive, one past Grace is cancelled and its message nak'ed, so is a message a pull under
//     way still delivers, and what was not handled is left to the next subscriber;
//   - Run returns nil at shutdown, and an error when its consumer cannot be read;
//   - under bus.Messages, bytes that are not an envelope are terminated and dead-lettered
//     without reaching the handler, and a valid one reaches it decoded, with a logger and in
//     its trace.
//
// The cases run in parallel, each on a durable pull consumer of its own on the record stream,
// configured as Provision configures Hermes' (explicit ack, deliver new, no BackOff) with the
// AckWait the case needs. It takes a few seconds, most of it waiting out the delays and
// deadlines under test.
func TestSubscriber(t *testing.T, setup SubscriberSetup) {
	t.Helper()
	connect := setup.Connect
	if connect == nil {
		connect = NewServer(t).Connect
	}
	s := &subscriberSuite{connect: connect, b: provision(t, connect(t), setup.Config),
		prefix: "bustest-" + strings.ToLower(rand.Text()[:8])}
	for _, c := range subscriberCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, s)
		})
	}
}

// subscriberSuite is what the cases of one TestSubscriber share: the bus, and the prefix
// that keeps their consumers and subjects apart from any other.
type subscriberSuite struct {
	connect func(testing.TB) *nats.Conn
	b       *bus.Bus
	prefix  string
	cases   atomic.Int64
}

// Bounds of the suite's waits: long enough for a loaded machine, far shorter than the ack
// deadline of the cases that tell a nak from an expired deadline (longAckWait).
const (
	suiteWait   = 10 * time.Second
	longAckWait = time.Minute
)

// subCase is one case's consumer on the record, and the subject it reads.
type subCase struct {
	t       *testing.T
	s       *subscriberSuite
	name    string // the consumer's durable name, also the tool token of its subject
	subject string
	cons    jetstream.Consumer
	msgs    atomic.Int64
}

// newCase makes a consumer for t with ack deadline ackWait (0: the bus's).
func (s *subscriberSuite) newCase(t *testing.T, ackWait time.Duration) *subCase {
	t.Helper()
	name := fmt.Sprintf("%s-%d", s.prefix, s.cases.Add(1))
	cfg := s.b.Config()
	if ackWait <= 0 {
		ackWait = cfg.AckWait
	}
	cons, err := s.b.Stream.CreateConsumer(t.Context(), jetstream.ConsumerConfig{
		Durable:       name,
		DeliverPolicy: jetstream.DeliverNewPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxDeliver:    cfg.MaxDeliver,
		MaxAckPending: cfg.MaxAckPending,
		Replicas:      cfg.Replicas,
		FilterSubject: protocol.FilterToolCalls(protocol.ActionHTTP, name),
	})
	if err != nil {
		t.Fatalf("consumer %s: %v", name, err)
	}
	t.Cleanup(func() { _ = s.b.Stream.DeleteConsumer(context.Background(), name) })
	return &subCase{t: t, s: s, name: name, subject: protocol.SubjectToolCall(protocol.ActionHTTP, name, "s"), cons: cons}
}

// published is a message a case published.
type published struct {
	seq   uint64
	msgID string
	data  []byte
}

// publish publishes a valid envelope (a tool call) to the case's subject.
func (c *subCase) publish() published {
	c.t.Helper()
	return c.publishMessage(func(*protocol.Message) {})
}

// publishMessage publishes a tool call as edit leaves it.
func (c *subCase) publishMessage(edit func(*protocol.Message)) published {
	c.t.Helper()
	m, err := protocol.NewMessage(protocol.TypeToolCall, &protocol.Dispatch{})
	if err != nil {
		c.t.Fatal(err)
	}
	m.MsgID = fmt.Sprintf("%s-m%d", c.name, c.msgs.Add(1))
	m.RequestID, m.SessionID = "r", "s"
	edit(m)
	p := bus.NewPublisher(c.s.b.JS, protocol.Sender{Role: "bustest", Instance: c.name})
	ack, err := p.Publish(c.t.Context(), c.subject, m)
	if err != nil {
		c.t.Fatal(err)
	}
	data, _ := protocol.Marshal(m)
	return published{seq: ack.Sequence, msgID: m.MsgID, data: data}
}

// publishRaw publishes data as it is to the case's subject.
func (c *subCase) publishRaw(data []byte) published {
	c.t.Helper()
	ack, err := c.s.b.JS.Publish(c.t.Context(), c.subject, data)
	if err != nil {
		c.t.Fatal(err)
	}
	return published{seq: ack.Sequence, data: data}
}

// running is a Subscriber's Run in progress.
type running struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned
	err    error         // what Run returned, once done
	wait   time.Duration // how long result waits
	judged atomic.Bool   // the case has read Run's result: the test's end does not judge it
}

// run runs sub on the case's consumer (unless sub names another), pulling for 100 ms at a time
// unless sub says otherwise, until stop, or the end of the test, which checks that Run
// returned nil unless the case read what it returned.
func (c *subCase) run(sub *bus.Subscriber) *running {
	c.t.Helper()
	if sub.Consumer == nil {
		sub.Consumer = c.cons
	}
	if sub.PullWait == 0 {
		sub.PullWait = 100 * time.Millisecond // shutdown waits for the pull under way
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan struct{}), wait: sub.Grace + sub.PullWait + 2*suiteWait}
	go func() {
		defer close(r.done)
		r.err = sub.Run(ctx)
	}()
	t := c.t
	t.Cleanup(func() {
		if err := r.stop(); err != nil && !r.judged.Load() {
			t.Errorf("Run returned %v at shutdown", err)
		}
	})
	return r
}

// stop cancels Run's context and returns what Run returned.
func (r *running) stop() error {
	r.cancel()
	return r.result()
}

// result waits for Run to return and returns its error.
func (r *running) result() error {
	r.judged.Store(true)
	select {
	case <-r.done:
		return r.err
	case <-time.After(r.wait):
		return fmt.Errorf("bustest: Run did not return within %v", r.wait)
	}
}

// returned reports whether Run has returned, without waiting.
func (r *running) returned() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// info returns the consumer's state.
func (c *subCase) info() *jetstream.ConsumerInfo {
	c.t.Helper()
	info, err := c.cons.Info(c.t.Context())
	if err != nil {
		c.t.Fatal(err)
	}
	return info
}

// waitSettled waits until every message up to seq is settled (acked or terminated) and none is
// delivered and unsettled: none will be delivered again.
func (c *subCase) waitSettled(seq uint64) {
	c.t.Helper()
	waitUntil(c.t, fmt.Sprintf("the consumer to settle every message up to %d", seq), func() bool {
		info, err := c.cons.Info(c.t.Context())
		return err == nil && info.AckFloor.Stream >= seq && info.NumAckPending == 0
	})
}

// advisory is what the suite reads of a terminated advisory.
type advisory struct {
	Type       string `json:"type"`
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// waitDeadLettered waits until the dead-letter stream holds an advisory of the case's consumer
// terminating each message of seqs, and returns them by stream sequence.
func (c *subCase) waitDeadLettered(seqs ...uint64) map[uint64]advisory {
	c.t.Helper()
	subject := "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED." + protocol.StreamName + "." + c.name
	oc, err := c.s.b.DLQ.OrderedConsumer(c.t.Context(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		c.t.Fatal(err)
	}
	got := map[uint64]advisory{}
	missing := func() []uint64 {
		var out []uint64
		for _, s := range seqs {
			if _, ok := got[s]; !ok {
				out = append(out, s)
			}
		}
		return out
	}
	deadline := time.Now().Add(suiteWait)
	for len(missing()) > 0 {
		if time.Now().After(deadline) {
			c.t.Fatalf("no advisory in %s of messages %v terminated by %s", protocol.DLQStreamName, missing(), c.name)
		}
		msg, err := oc.Next(jetstream.FetchMaxWait(200 * time.Millisecond))
		if err != nil {
			continue
		}
		var a advisory
		if json.Unmarshal(msg.Data(), &a) == nil && a.Stream == protocol.StreamName && a.Consumer == c.name {
			got[a.StreamSeq] = a
		}
	}
	return got
}

// waitUntil waits until cond holds, failing t after suiteWait.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(suiteWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// call is one call of a handler: the delivery it was given, when it started and returned, and
// whether its context had ended when it returned.
type call struct {
	d          bus.Delivery
	start, end time.Time
	ctxErr     error
}

// calls records the calls of a handler. It is safe for concurrent use.
type calls struct {
	mu      sync.Mutex
	started []uint64 // the stream sequence of each call's message, as they start
	list    []call   // the calls that returned, as they return
}

// of wraps h so that its calls are recorded.
func (cs *calls) of(h bus.HandlerFunc) bus.Handler {
	return bus.HandlerFunc(func(ctx context.Context, d *bus.Delivery) error {
		c := call{d: *d, start: time.Now()}
		cs.mu.Lock()
		cs.started = append(cs.started, d.StreamSeq)
		cs.mu.Unlock()
		defer func() {
			c.end, c.ctxErr = time.Now(), ctx.Err()
			cs.mu.Lock()
			cs.list = append(cs.list, c)
			cs.mu.Unlock()
		}()
		return h(ctx, d)
	})
}

// all returns the calls that returned, in the order they returned.
func (cs *calls) all() []call {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return append([]call(nil), cs.list...)
}

// ofSeq returns the calls that returned for the message at stream sequence seq.
func (cs *calls) ofSeq(seq uint64) []call {
	var out []call
	for _, c := range cs.all() {
		if c.d.StreamSeq == seq {
			out = append(out, c)
		}
	}
	return out
}

// startedFor counts the calls started for the message at stream sequence seq, returned or
// not.
func (cs *calls) startedFor(seq uint64) int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	n := 0
	for _, s := range cs.started {
		if s == seq {
			n++
		}
	}
	return n
}

// logs is a slog handler that keeps each record as a line of text. It is safe for concurrent
// use.
type logs struct {
	mu    sync.Mutex
	lines []string
}

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }
func (l *logs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logs) WithGroup(string) slog.Handler            { return l }
func (l *logs) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	l.mu.Lock()
	l.lines = append(l.lines, b.String())
	l.mu.Unlock()
	return nil
}

// mention reports whether a line logged holds s.
func (l *logs) mention(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}
