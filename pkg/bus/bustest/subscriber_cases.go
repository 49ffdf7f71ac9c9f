package bustest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// subscriberCases are TestSubscriber's cases, each named for the guarantee it checks.
var subscriberCases = []struct {
	name string
	run  func(*testing.T, *subscriberSuite)
}{
	{"nil acks, once, with the delivery described", nilAcks},
	{"an error naks with a delay growing with NumDelivered", errorNaks},
	{"RetryAfter redelivers no sooner than asked", retryAfter},
	{"Permanent terminates and dead-letters", permanentTerminates},
	{"panics in handler and middleware are recovered and nak", panicsRecovered},
	{"Middleware[0] is the outermost", middlewareOrder},
	{"Concurrency bounds handlers and what is pulled", concurrencyBounds},
	{"Progress keeps a handler past AckWait", progressKeepsAlive},
	{"shutdown lets a handler finish within Grace", shutdownWaitsWithinGrace},
	{"shutdown cancels a handler past Grace and naks its message", shutdownCancelsPastGrace},
	{"shutdown naks what a pull under way still delivers", shutdownNaksLateDeliveries},
	{"Run fails when the consumer cannot be read", runFailsWhenUnreadable},
	{"Messages terminates bytes that are not an envelope", messagesTerminatesHostileBytes},
}

// nilAcks: a handler that returns nil has its message acked — only once it returned — and it
// is never delivered again; the Delivery names the message (subject, data, headers,
// NumDelivered from 1, stream sequence, when it was stored).
func nilAcks(t *testing.T, s *subscriberSuite) {
	c := s.newCase(t, 0)
	var cs calls
	started, release := make(chan struct{}, 1), make(chan struct{})
	c.run(&bus.Subscriber{Handler: cs.of(func(ctx context.Context, _ *bus.Delivery) error {
		started <- struct{}{}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})})
	before := time.Now()
	p := c.publish()
	after := time.Now()
	select {
	case <-started:
	case <-time.After(suiteWait):
		t.Fatal("no handler started")
	}
	if info := c.info(); info.AckFloor.Stream >= p.seq || info.NumAckPending != 1 {
		t.Errorf("while its handler runs the message is settled (ack floor %d, %d pending)", info.AckFloor.Stream, info.NumAckPending)
	}
	close(release)
	c.waitSettled(p.seq)
	got := cs.ofSeq(p.seq)
	if len(got) != 1 {
		t.Fatalf("handled %d times, want once", len(got))
	}
	d := got[0].d
	switch {
	case d.Subject != c.subject:
		t.Errorf("Subject %q, want %q", d.Subject, c.subject)
	case !bytes.Equal(d.Data, p.data):
		t.Errorf("Data is not the bytes published")
	case d.Header.Get(jetstream.MsgIDHeader) != p.msgID:
		t.Errorf("Header %v lacks the message's Nats-Msg-Id %s", d.Header, p.msgID)
	case d.NumDelivered != 1:
		t.Errorf("NumDelivered %d on the first delivery, want 1", d.NumDelivered)
	case d.StreamSeq != p.seq:
		t.Errorf("StreamSeq %d, want %d", d.StreamSeq, p.seq)
	case d.Published.Before(before.Add(-time.Second)) || d.Published.After(after.Add(time.Second)):
		t.Errorf("Published %v, not when the message was stored (%v to %v)", d.Published, before, after)
	case d.Msg != nil || d.Log != nil:
		t.Errorf("Msg and Log set without the middleware that sets them")
	}
	if info := c.info(); info.NumRedelivered != 0 {
		t.Errorf("%d messages redelivered", info.NumRedelivered)
	}
}

// errorNaks: a handler error that asks for no delay naks the message, which is redelivered no
// sooner than bus.DefaultRetryDelay(NumDelivered) after the handler returned; the failure is
// logged.
func errorNaks(t *testing.T, s *subscriberSuite) {
	const fails = 3
	c := s.newCase(t, 0)
	var cs calls
	var log logs
	c.run(&bus.Subscriber{Logger: slog.New(&log), Handler: cs.of(func(_ context.Context, d *bus.Delivery) error {
		if d.NumDelivered <= fails {
			return fmt.Errorf("not yet (delivery %d)", d.NumDelivered)
		}
		return nil
	})})
	p := c.publish()
	c.waitSettled(p.seq)
	got := cs.ofSeq(p.seq)
	if len(got) != fails+1 {
		t.Fatalf("handled %d times, want %d", len(got), fails+1)
	}
	for i, call := range got {
		if call.d.NumDelivered != uint64(i+1) {
			t.Errorf("delivery %d has NumDelivered %d", i+1, call.d.NumDelivered)
		}
		if i == 0 {
			continue
		}
		n := got[i-1].d.NumDelivered
		if gap, want := call.start.Sub(got[i-1].end), bus.DefaultRetryDelay(n); gap < want {
			t.Errorf("redelivered %v after failed delivery %d, sooner than DefaultRetryDelay(%d) = %v", gap, n, n, want)
		}
	}
	if !log.mention("not yet (delivery 1)") {
		t.Error("the failure was not logged")
	}
}

// retryAfter: an error wrapped with RetryAfter naks the message with that delay: it is
// redelivered no sooner (a delay longer than DefaultRetryDelay(1), so that one is not taken for
// the other).
func retryAfter(t *testing.T, s *subscriberSuite) {
	delay := 3 * bus.DefaultRetryDelay(1)
	c := s.newCase(t, 0)
	var cs calls
	c.run(&bus.Subscriber{Handler: cs.of(func(_ context.Context, d *bus.Delivery) error {
		if d.NumDelivered == 1 {
			return bus.RetryAfter(errors.New("busy"), delay)
		}
		return nil
	})})
	p := c.publish()
	c.waitSettled(p.seq)
	got := cs.ofSeq(p.seq)
	if len(got) != 2 {
		t.Fatalf("handled %d times, want 2", len(got))
	}
	if gap := got[1].start.Sub(got[0].end); gap < delay {
		t.Errorf("redelivered %v after RetryAfter(%v)", gap, delay)
	}
}

// permanentTerminates: an error wrapped with Permanent terminates the message: it is never
// delivered again, the dead-letter stream holds the server's advisory naming it, and the
// failure is logged.
func permanentTerminates(t *testing.T, s *subscriberSuite) {
	c := s.newCase(t, 0)
	var cs calls
	var log logs
	c.run(&bus.Subscriber{Logger: slog.New(&log), Handler: cs.of(func(context.Context, *bus.Delivery) error {
		return bus.Permanent(errors.New("refused for good"))
	})})
	p := c.publish()
	adv := c.waitDeadLettered(p.seq)[p.seq]
	c.waitSettled(p.seq)
	if n := len(cs.ofSeq(p.seq)); n != 1 {
		t.Errorf("handled %d times, want once", n)
	}
	if adv.Deliveries != 1 {
		t.Errorf("the advisory counts %d deliveries, want 1", adv.Deliveries)
	}
	if !log.mention("refused for good") {
		t.Error("the failure was not logged")
	}
}

// panicsRecovered: a panic in the handler, or in the Subscriber's middleware, is recovered:
// the message is nak'ed and redelivered, and the subscriber runs on.
func panicsRecovered(t *testing.T, s *subscriberSuite) {
	c := s.newCase(t, 0)
	var cs calls
	panicky := func(next bus.Handler) bus.Handler {
		return bus.HandlerFunc(func(ctx context.Context, d *bus.Delivery) error {
			if d.NumDelivered == 1 {
				panic("middleware bug")
			}
			return next.Handle(ctx, d)
		})
	}
	r := c.run(&bus.Subscriber{Middleware: []bus.Middleware{panicky}, Handler: cs.of(func(_ context.Context, d *bus.Delivery) error {
		if d.NumDelivered == 2 {
			panic("handler bug")
		}
		return nil
	})})
	p := c.publish()
	c.waitSettled(p.seq)
	got := cs.ofSeq(p.seq)
	if len(got) != 2 || got[0].d.NumDelivered != 2 || got[1].d.NumDelivered != 3 {
		t.Fatalf("the handler saw deliveries %v, want 2 (it panicked) and 3", numsDelivered(got))
	}
	if r.returned() {
		t.Fatalf("Run returned after a panic: %v", r.result())
	}
}

func numsDelivered(cs []call) []uint64 {
	var out []uint64
	for _, c := range cs {
		out = append(out, c.d.NumDelivered)
	}
	return out
}

// middlewareOrder: Middleware wraps Handler, Middleware[0] the outermost.
func middlewareOrder(t *testing.T, s *subscriberSuite) {
	c := s.newCase(t, 0)
	var mu sync.Mutex
	var trail []string
	note := func(s string) { mu.Lock(); trail = append(trail, s); mu.Unlock() }
	mw := func(name string) bus.Middleware {
		return func(next bus.Handler) bus.Handler {
			return bus.HandlerFunc(func(ctx context.Context, d *bus.Delivery) error {
				note(name + ">")
				defer note("<" + name)
				return next.Handle(ctx, d)
			})
		}
	}
	c.run(&bus.Subscriber{Middleware: []bus.Middleware{mw("0"), mw("1")}, Handler: bus.HandlerFunc(func(context.Context, *bus.Delivery) error {
		note("handler")
		return nil
	})})
	c.waitSettled(c.publish().seq)
	mu.Lock()
	defer mu.Unlock()
	if got, want := strings.Join(trail, " "), "0> 1> handler <1 <0"; got != want {
		t.Errorf("calls %q, want %q", got, want)
	}
}

// concurrencyBounds: at most Concurrency handlers run at once (16 when it is not set), and the
// subscriber holds no more messages than that, also when a slot frees while others are taken:
// none waits in a client buffer.
func concurrencyBounds(t *testing.T, s *subscriberSuite) {
	for _, tc := range []struct {
		concurrency, want int
	}{{3, 3}, {0, 16}} {
		t.Run(fmt.Sprintf("Concurrency %d", tc.concurrency), func(t *testing.T) {
			t.Parallel()
			c := s.newCase(t, 0)
			var running, peak, handled atomic.Int32
			release := make(chan struct{}) // a send lets one handler return, closing lets all
			var once sync.Once
			releaseAll := func() { once.Do(func() { close(release) }) }
			t.Cleanup(releaseAll)
			c.run(&bus.Subscriber{Concurrency: tc.concurrency, Handler: bus.HandlerFunc(func(ctx context.Context, _ *bus.Delivery) error {
				n := running.Add(1)
				defer running.Add(-1)
				raise(&peak, n)
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
				handled.Add(1)
				return nil
			})})
			var last published
			for range tc.want + 2 {
				last = c.publish()
			}
			full := func(what string) {
				t.Helper()
				waitUntil(t, fmt.Sprintf("%d handlers running %s", tc.want, what), func() bool { return running.Load() >= int32(tc.want) })
				if info := c.info(); info.NumAckPending != tc.want {
					t.Errorf("%s: %d handlers run and %d messages are delivered: a pull asked for more than the free slots", what, tc.want, info.NumAckPending)
				}
			}
			full("at first")
			release <- struct{}{}
			waitUntil(t, "the first handler to return", func() bool { return handled.Load() == 1 })
			full("once a slot freed")
			releaseAll()
			c.waitSettled(last.seq)
			if n := handled.Load(); n != int32(tc.want+2) {
				t.Errorf("%d handled, want %d", n, tc.want+2)
			}
			if p := peak.Load(); p != int32(tc.want) {
				t.Errorf("%d handlers ran at once, want at most and at peak %d", p, tc.want)
			}
		})
	}
}

// raise makes peak at least n.
func raise(peak *atomic.Int32, n int32) {
	for p := peak.Load(); n > p; p = peak.Load() {
		if peak.CompareAndSwap(p, n) {
			return
		}
	}
}

// progressKeepsAlive: with Progress set, a handler that runs past the consumer's AckWait keeps
// its message from being redelivered meanwhile. (Without Progress the same handler's message
// is redelivered: the case is checked to be able to fail.)
func progressKeepsAlive(t *testing.T, s *subscriberSuite) {
	const ackWait = time.Second
	t.Run("with Progress", func(t *testing.T) {
		t.Parallel()
		c := s.newCase(t, ackWait)
		var cs calls
		c.run(&bus.Subscriber{Concurrency: 2, Progress: ackWait / 4, Handler: cs.of(func(ctx context.Context, _ *bus.Delivery) error {
			select {
			case <-time.After(2 * ackWait): // the work: twice the ack deadline
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})})
		p := c.publish()
		c.waitSettled(p.seq)
		if n := cs.startedFor(p.seq); n != 1 {
			t.Errorf("delivered %d times while its handler ran, want once", n)
		}
	})
	t.Run("without Progress (the control)", func(t *testing.T) {
		t.Parallel()
		c := s.newCase(t, ackWait)
		again := make(chan struct{})
		var once sync.Once
		c.run(&bus.Subscriber{Concurrency: 2, Handler: bus.HandlerFunc(func(ctx context.Context, d *bus.Delivery) error {
			if d.NumDelivered > 1 {
				once.Do(func() { close(again) })
				return nil
			}
			select { // the same work, cut short once the message is delivered again
			case <-again:
			case <-time.After(2 * ackWait):
			case <-ctx.Done():
			}
			return nil
		})})
		c.publish()
		select {
		case <-again:
		case <-time.After(suiteWait):
			t.Fatalf("without Progress, a handler running past AckWait (%v) kept its message: the case proves nothing", ackWait)
		}
	})
}

// shutdownWaitsWithinGrace: once ctx is done no handler starts, a running one with work left
// finishes it within Grace with its context alive, Run returns only after it (nil), its result
// settles its message, and the messages not handled are left for another subscriber.
func shutdownWaitsWithinGrace(t *testing.T, s *subscriberSuite) {
	const work = 300 * time.Millisecond // left to do once shutdown begins; Grace is far longer
	c := s.newCase(t, longAckWait)
	var cs calls
	started, shutdown := make(chan struct{}, 8), make(chan struct{})
	r := c.run(&bus.Subscriber{Concurrency: 1, Grace: 2 * suiteWait, Handler: cs.of(func(ctx context.Context, _ *bus.Delivery) error {
		started <- struct{}{}
		<-shutdown
		select {
		case <-time.After(work):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})})
	first := c.publish()
	var rest []published
	for range 2 {
		rest = append(rest, c.publish())
	}
	select {
	case <-started:
	case <-time.After(suiteWait):
		close(shutdown)
		t.Fatal("no handler started")
	}
	r.cancel()
	close(shutdown)
	if err := r.result(); err != nil {
		t.Fatalf("Run returned %v", err)
	}
	got := cs.all() // Run returned: every handler it ran has returned
	if len(got) != 1 || got[0].d.StreamSeq != first.seq {
		t.Fatalf("%d handlers returned by the time Run did, want 1 (no handler starts once ctx is done)", len(got))
	}
	if got[0].ctxErr != nil {
		t.Fatalf("the handler's context ended (%v) within Grace", got[0].ctxErr)
	}
	c.waitSettled(first.seq)
	var next calls
	c.run(&bus.Subscriber{Handler: next.of(func(context.Context, *bus.Delivery) error { return nil })})
	c.waitSettled(rest[len(rest)-1].seq)
	for _, p := range rest {
		if n := len(next.ofSeq(p.seq)); n != 1 {
			t.Errorf("message %d, left unhandled at shutdown, was handled %d times by the next subscriber", p.seq, n)
		}
	}
	if n := len(next.ofSeq(first.seq)); n != 0 {
		t.Errorf("the message settled at shutdown was delivered again")
	}
}

// shutdownCancelsPastGrace: a handler still running after Grace has its context cancelled, Run
// returns nil, and its message is nak'ed: redelivered at once, not after its ack deadline.
func shutdownCancelsPastGrace(t *testing.T, s *subscriberSuite) {
	c := s.newCase(t, longAckWait)
	var cs calls
	started := make(chan struct{}, 1)
	r := c.run(&bus.Subscriber{Concurrency: 1, Grace: 100 * time.Millisecond, Handler: cs.of(func(ctx context.Context, _ *bus.Delivery) error {
		started <- struct{}{}
		<-ctx.Done() // a handler that stops only when cancelled
		return ctx.Err()
	})})
	p := c.publish()
	select {
	case <-started:
	case <-time.After(suiteWait):
		t.Fatal("no handler started")
	}
	if err := r.stop(); err != nil {
		t.Fatalf("Run returned %v", err)
	}
	if got := cs.all(); len(got) != 1 || got[0].ctxErr == nil {
		t.Fatalf("the handler past Grace was not cancelled (%d calls)", len(got))
	}
	var next calls
	c.run(&bus.Subscriber{Handler: next.of(func(context.Context, *bus.Delivery) error { return nil })})
	c.waitSettled(p.seq) // within suiteWait, far short of the ack deadline
	if got := next.ofSeq(p.seq); len(got) != 1 || got[0].d.NumDelivered != 2 {
		t.Errorf("redelivered as deliveries %v, want once, as the second", numsDelivered(got))
	}
}

// shutdownNaksLateDeliveries: a message that a pull under way when ctx is done still delivers
// is not handled, and is nak'ed: redelivered at once, not after its ack deadline.
func shutdownNaksLateDeliveries(t *testing.T, s *subscriberSuite) {
	c := s.newCase(t, longAckWait)
	var cs calls
	r := c.run(&bus.Subscriber{Concurrency: 1, PullWait: suiteWait, Handler: cs.of(func(context.Context, *bus.Delivery) error { return nil })})
	waitUntil(t, "the subscriber's pull to wait at the server", func() bool { return c.info().NumWaiting > 0 })
	r.cancel()
	p := c.publish()
	if err := r.result(); err != nil {
		t.Fatalf("Run returned %v", err)
	}
	if n := len(cs.all()); n != 0 {
		t.Fatalf("%d handlers ran after ctx was done", n)
	}
	var next calls
	c.run(&bus.Subscriber{Handler: next.of(func(context.Context, *bus.Delivery) error { return nil })})
	c.waitSettled(p.seq) // within suiteWait, far short of the ack deadline
	if got := next.ofSeq(p.seq); len(got) != 1 || got[0].d.NumDelivered != 2 {
		t.Errorf("redelivered as deliveries %v, want once, as the second (the first nak'ed at shutdown)", numsDelivered(got))
	}
}

// runFailsWhenUnreadable: Run returns an error when its consumer cannot be read: its
// connection closed, or the consumer deleted.
func runFailsWhenUnreadable(t *testing.T, s *subscriberSuite) {
	nothing := bus.HandlerFunc(func(context.Context, *bus.Delivery) error { return nil })
	t.Run("connection closed", func(t *testing.T) {
		t.Parallel()
		c := s.newCase(t, 0)
		nc := s.connect(t)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		cons, err := js.Consumer(t.Context(), protocol.StreamName, c.name)
		if err != nil {
			t.Fatal(err)
		}
		r := c.run(&bus.Subscriber{Consumer: cons, Handler: nothing})
		nc.Close()
		if err := r.result(); err == nil {
			t.Fatal("Run returned nil after its connection closed")
		}
	})
	t.Run("consumer deleted", func(t *testing.T) {
		t.Parallel()
		c := s.newCase(t, 0)
		r := c.run(&bus.Subscriber{Handler: nothing})
		if err := s.b.Stream.DeleteConsumer(t.Context(), c.name); err != nil {
			t.Fatal(err)
		}
		if err := r.result(); err == nil {
			t.Fatal("Run returned nil after its consumer was deleted")
		}
	})
}

// messagesTerminatesHostileBytes: under bus.Messages, bytes that are not a valid envelope never
// reach the handler: the message is terminated (delivered once) and dead-lettered. A valid
// envelope reaches it with Msg and Log set, in a span of the message's trace.
func messagesTerminatesHostileBytes(t *testing.T, s *subscriberSuite) {
	c := s.newCase(t, 0)
	var cs calls
	var traceID trace.TraceID
	var mu sync.Mutex
	h := bus.Messages(cs.of(func(ctx context.Context, d *bus.Delivery) error {
		mu.Lock()
		traceID = trace.SpanContextFromContext(ctx).TraceID()
		mu.Unlock()
		return nil
	}), nil, "bustest")
	c.run(&bus.Subscriber{Handler: h})
	unsafe, err := protocol.NewMessage(protocol.TypeToolCall, &protocol.Dispatch{})
	if err != nil {
		t.Fatal(err)
	}
	unsafe.MsgID, unsafe.RequestID, unsafe.SessionID = "m", "r", "*" // a session id that is a wildcard
	unsafeBytes, err := protocol.Marshal(unsafe)
	if err != nil {
		t.Fatal(err)
	}
	hostile := map[string][]byte{
		"empty":                  {},
		"not msgpack":            []byte("{not msgpack"),
		"a bin32 of 4 GiB":       {0xc6, 0xff, 0xff, 0xff, 0xff},
		"an array32 of 4G items": {0xdd, 0xff, 0xff, 0xff, 0xff},
		"a map32 of 4G entries":  {0xdf, 0xff, 0xff, 0xff, 0xff},
		"100k nested arrays":     bytes.Repeat([]byte{0x91}, 100_000),
		"a number":               {0x01},
		"an unsafe session id":   unsafeBytes,
	}
	seqs := map[uint64]string{}
	var all []uint64
	for what, data := range hostile {
		p := c.publishRaw(data)
		seqs[p.seq] = what
		all = append(all, p.seq)
	}
	const parent = "4bf92f3577b34da6a3ce929d0e0e4736"
	valid := c.publishMessage(func(m *protocol.Message) { m.Trace.Traceparent = "00-" + parent + "-00f067aa0ba902b7-01" })
	for seq, a := range c.waitDeadLettered(all...) {
		if a.Deliveries != 1 {
			t.Errorf("%s: terminated after %d deliveries, want 1", seqs[seq], a.Deliveries)
		}
	}
	c.waitSettled(valid.seq)
	got := cs.all()
	if len(got) != 1 || got[0].d.StreamSeq != valid.seq {
		var names []string
		for _, call := range got {
			names = append(names, seqs[call.d.StreamSeq])
		}
		t.Fatalf("the handler saw %d messages (hostile: %v), want only the valid one", len(got), names)
	}
	if d := got[0].d; d.Msg == nil || d.Msg.MsgID != valid.msgID || d.Log == nil {
		t.Errorf("the handler saw Msg %+v and Log %v, want the envelope decoded and a logger", d.Msg, d.Log)
	}
	mu.Lock()
	defer mu.Unlock()
	if traceID.String() != parent {
		t.Errorf("the handler's span is in trace %s, not the message's %s", traceID, parent)
	}
}
