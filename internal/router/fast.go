package router

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// What the fast lane (package fastlane) takes of a router: its pipeline from the contract stage
// on, the messages its outlet would publish, and its sender. A request on the fast lane is never
// serial, and its plan is recorded after it is answered, so the serial and plan stages are not
// its; every other stage decides about its calls as about any request's.

// FastPipeline is the router's pipeline past its serial and plan stages, emitting to out.
func (r *Router) FastPipeline(out Outlet) *Pipeline {
	return &Pipeline{Stages: r.pipeline.Stages[2:], Out: out}
}

// CallMessage is the message that dispatches c, a routed call of job, sealed as the router
// seals, and the subject the durable path would publish it on.
func (r *Router) CallMessage(ctx context.Context, job *Job, c *Call) (bus.Outgoing, error) {
	return r.pipeline.Out.(*busOutlet).call(ctx, job.Msg, correlation(job), c)
}

// DecidedMessage is the message of the result a stage decided for c, a call of job.
func (r *Router) DecidedMessage(ctx context.Context, job *Job, c *Call) (*protocol.Message, error) {
	return decided(ctx, job.Msg, correlation(job), c.Result)
}

// MayBeFast reports whether every call of req only reads, as its tool's contract says
// (effects: none) or, without one, its route (read_only): what the fast lane asks before it runs
// anything. A call no contract or route knows passes (it is answered NO_ROUTE wherever it goes);
// a contract that cannot be read does not.
func (r *Router) MayBeFast(req *protocol.Request) bool {
	table := r.Routes()
	for i := range req.ToolCalls {
		name := req.ToolCalls[i].Name
		if r.cfg.Contracts != nil {
			k, err := r.cfg.Contracts(name)
			if err != nil {
				return false
			}
			if k != nil {
				if k.EffectsOrDefault() != contract.EffectsNone {
					return false
				}
				continue
			}
		}
		if rule, _, ok := table.Match(name, req.Intent); ok && !rule.ReadOnly {
			return false
		}
	}
	return true
}

// Sender is who the router's messages say sent them.
func (r *Router) Sender() protocol.Sender { return r.pub.Sender() }

// FastGrace is how long after it is stored a result the fast lane recorded (bus.HeaderFast) is
// left to the fast lane's writer, which records the request's response right after it: within
// it, a router's results consumer that finds the response missing delivers it again in a
// moment; past it, the router that answered is taken to have stopped before recording the
// response, and the result is aggregated as any other — the durable path answers the request.
// (The lane records its requests where no router's consumer takes them.)
const FastGrace = 5 * time.Second

// fastRetry is how soon such a message is delivered again.
const fastRetry = 50 * time.Millisecond

var errFastRecording = errors.New("router: the fast lane is recording the request's response")

// fastRecorded leaves the results the fast lane records to its writer: such a result, its
// request answered, needs nothing more (acked at once). When this
// process's fast lane is writing it, the delivery waits for the write, and reads nothing.
func (r *Router) fastRecorded(next bus.Handler) bus.Handler {
	return bus.HandlerFunc(func(ctx context.Context, d *bus.Delivery) error {
		if d.Header.Get(bus.HeaderFast) == "" || d.Msg == nil {
			return next.Handle(ctx, d)
		}
		if w := r.writes.find(d.Msg.RequestID); w != nil {
			t := time.NewTimer(FastGrace)
			defer t.Stop()
			select {
			case <-w.done:
				if w.ok {
					return nil // its response is on the record
				}
			case <-t.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		answered, err := r.cfg.Bus.Answered(ctx, d.Msg.RequestID, d.Msg.SessionID)
		switch {
		case err != nil:
			return err
		case answered:
			return nil
		case time.Since(d.Published) < FastGrace:
			return bus.RetryAfter(errFastRecording, fastRetry)
		}
		d.Log.Warn("the fast lane recorded this but not the request's response; the durable path finishes it")
		return next.Handle(ctx, d)
	})
}

// FastWriting tells the router that its fast lane is writing the record of requestID; the
// returned func says when the write ended, and whether the request's response is on the record.
// The router's consumers then wait for it rather than read the record.
func (r *Router) FastWriting(requestID string) func(ok bool) {
	w := r.writes.add(requestID)
	return func(ok bool) {
		w.once.Do(func() {
			w.ok = ok
			close(w.done)
		})
	}
}

// FastWritten waits, up to FastGrace, while this process's fast lane writes requestID's record,
// and reports whether it wrote it (false when it writes none of it).
func (r *Router) FastWritten(ctx context.Context, requestID string) bool {
	w := r.writes.find(requestID)
	if w == nil {
		return false
	}
	t := time.NewTimer(FastGrace)
	defer t.Stop()
	select {
	case <-w.done:
		return w.ok
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// fastWrite is one request whose record this process's fast lane writes.
type fastWrite struct {
	done chan struct{}
	ok   bool // set before done is closed
	once sync.Once
}

// fastWrites are the requests this process's fast lane writes now or wrote lately: two
// generations, the older dropped every fastWritesKept, so each is found for at least that long.
type fastWrites struct {
	mu       sync.Mutex
	cur, old map[string]*fastWrite
	turned   time.Time
}

const fastWritesKept = 30 * time.Second

func (f *fastWrites) add(requestID string) *fastWrite {
	w := &fastWrite{done: make(chan struct{})}
	f.mu.Lock()
	defer f.mu.Unlock()
	if now := time.Now(); f.cur == nil || now.Sub(f.turned) > fastWritesKept {
		f.old, f.cur, f.turned = f.cur, map[string]*fastWrite{}, now
	}
	f.cur[requestID] = w
	return w
}

func (f *fastWrites) find(requestID string) *fastWrite {
	f.mu.Lock()
	defer f.mu.Unlock()
	if w, ok := f.cur[requestID]; ok {
		return w
	}
	return f.old[requestID]
}
