// The JetStream floor of a Hermes request, for comparison only: the JetStream operations Hermes
// performs for a request of one tool call, in its order and with its waits, and nothing else —
// no routing, no envelopes (every message and KV value is 200 opaque bytes with a Nats-Msg-Id),
// no HTTP, no tool. It uses Hermes' embedded server and file store (synced on an interval, as
// `hermes up` by default), stream, buckets, consumers and subjects, one connection per service
// as StartSystem has, and fetches as bus.Subscriber does. Run it beside the
// Hermes benchmark:
//
//	go test -run '^$' -bench 'Hermes1CallC64|Floor' -benchtime 5s ./internal/bench
//
// Per request (jsops/op counts them; pulls/op counts fetch requests, each serving a batch):
//
//	gateway      KV Create hermes-calls <rid> (the plan, recorded at intake); publish request,
//	             await ack; wait for the response on one core subscription to the responses
//	             the stream announces
//	router       publish tool call, await ack; Ack (the first delivery of a request planned at
//	             intake reads nothing)
//	tool worker  KV Create hermes-claims <rid>.c0 (claim); publish tool_started, not awaited;
//	             publish the result on its call's subject, created once (expected last
//	             subject sequence 0), await ack; Ack. The ledger's Done writes nothing: the
//	             recorded result says the call is done.
//	router       publish the response on its request's subject, created once, await ack; Ack

package bench_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/ledger"
	"github.com/hermesbus/hermes/pkg/protocol"
)

const (
	// floorOpsPerRequest: 2 KV creates, 4 awaited publishes, 1 publish not awaited, 3 acks.
	floorOpsPerRequest = 10
	floorTool          = "echo"
	floorCallID        = "c0"
	floorSlots         = 64                     // each consumer's concurrency, as in the Hermes benchmark
	floorPullWait      = 500 * time.Millisecond // bus.Subscriber's default PullWait
)

// floorPayload is every message and KV value.
var floorPayload = bytes.Repeat([]byte("x"), 200)

// floor is the JetStream side of a gateway, a router and a tool worker.
type floor struct {
	gateway, router, worker *bus.Bus
	run                     string
	pulls                   atomic.Int64

	mu      sync.Mutex
	waiting map[string]chan struct{}
}

// startBuses starts the embedded server as StartSystem does (a file store in a fresh data dir,
// synced on an interval, in-process connections only), then opens one connection per name and
// provisions the bus on it, as every Hermes service does at start.
func startBuses(b *testing.B, names ...string) []*bus.Bus {
	b.Helper()
	srv, err := bus.StartServer(bus.ServerConfig{StoreDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	buses := make([]*bus.Bus, len(names))
	for i, name := range names {
		nc, err := bus.Connect(ctx, "", name, nil, srv.ConnectOption())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		if buses[i], err = bus.Provision(ctx, js, bus.Config{}); err != nil {
			b.Fatal(err)
		}
	}
	return buses
}

// startFloor starts the server, the gateway's response subscription and the consumers of the
// router and the tool worker, and sends one request through.
func startFloor(b *testing.B) *floor {
	b.Helper()
	f := &floor{run: fmt.Sprintf("f%d-%d", os.Getpid(), runs.Add(1)), waiting: map[string]chan struct{}{}}
	buses := startBuses(b, "floor-gateway", "floor-router", "floor-toolworker")
	f.gateway, f.router, f.worker = buses[0], buses[1], buses[2]
	sub, err := f.gateway.JS.Conn().Subscribe(protocol.FilterLiveResponses, func(msg *nats.Msg) {
		f.mu.Lock() // hand the response to its client, if one waits
		defer f.mu.Unlock()
		select {
		case f.waiting[lastToken(msg.Subject)] <- struct{}{}:
		default:
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	_ = sub.SetPendingLimits(1<<20, 1<<30)              // as the gateway's
	if err := f.gateway.JS.Conn().Flush(); err != nil { // as the gateway's: in place from here on
		b.Fatal(err)
	}

	ctx := b.Context() // done before the cleanups run
	must := func(c jetstream.Consumer, err error) jetstream.Consumer {
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	first := func(c []jetstream.Consumer, err error) (jetstream.Consumer, error) {
		if err != nil {
			return nil, err
		}
		return c[0], nil // a record of one stream
	}
	must(first(f.router.EnsureToolConsumer(ctx, protocol.ActionHTTP, floorTool))) // the router creates it, the worker finds it
	tools := must(first(f.worker.EnsureToolConsumer(ctx, protocol.ActionHTTP, floorTool)))
	results := must(f.router.Consumer(ctx, bus.ConsumerRouterResults))
	var wg sync.WaitGroup
	for p := range f.router.Partitions() { // as the router: one consumer per partition
		requests := must(f.router.Consumer(ctx, bus.RequestConsumer(p)))
		wg.Go(func() { f.consume(ctx, b, requests, f.dispatch) })
	}
	wg.Go(func() { f.consume(ctx, b, tools, f.runTool) })
	wg.Go(func() { f.consume(ctx, b, results, f.respond) })
	b.Cleanup(wg.Wait) // before the connections close
	if err := f.Do(ctx, 0, 0); err != nil {
		b.Fatal("warm-up request: ", err)
	}
	return f
}

// Do is one client's request: the gateway's part of the pipeline.
func (f *floor) Do(ctx context.Context, client, seq int) error {
	rid := fmt.Sprintf("%s-%d-%d", f.run, client, seq)
	replied := make(chan struct{}, 1)
	f.mu.Lock()
	f.waiting[rid] = replied
	f.mu.Unlock()
	defer func() { f.mu.Lock(); delete(f.waiting, rid); f.mu.Unlock() }()
	if err := recordAndPublish(ctx, f.gateway.JS, f.gateway.Calls, rid, protocol.SubjectRequest(rid), protocol.MsgIDRequest(rid)); err != nil {
		return err
	}
	select {
	case <-replied:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("no response to %s within 30 s", rid)
	}
}

// dispatch is the router's part for a request: dispatch the call.
func (f *floor) dispatch(ctx context.Context, msg jetstream.Msg) error {
	rid := lastToken(msg.Subject())
	if _, err := f.router.JS.PublishMsg(ctx, floorMsg(protocol.SubjectToolCall(protocol.ActionHTTP, floorTool, rid), protocol.MsgIDToolCall(rid, floorCallID))); err != nil {
		return fmt.Errorf("publish tool call: %w", err)
	}
	return nil
}

// runTool is the tool worker's part: claim the call, announce it, record and publish the result.
func (f *floor) runTool(ctx context.Context, msg jetstream.Msg) error {
	rid := lastToken(msg.Subject())
	if _, err := f.worker.Claims.Create(ctx, ledger.Key(rid, floorCallID), floorPayload); err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	started := floorMsg(protocol.SubjectEvent(protocol.EventToolStarted, rid), protocol.MsgIDToolStarted(rid, floorCallID, 1))
	if _, err := f.worker.JS.PublishMsgAsync(started); err != nil { // never stalls: ≤ 64 in flight
		return fmt.Errorf("publish tool_started: %w", err)
	}
	return publishOnce(ctx, f.worker.JS, protocol.SubjectResult(rid, floorCallID, rid), protocol.MsgIDToolResult(rid, floorCallID))
}

// respond is the router's part for the result: record the response.
func (f *floor) respond(ctx context.Context, msg jetstream.Msg) error {
	rid := lastToken(msg.Subject())
	return publishOnce(ctx, f.router.JS, protocol.SubjectResponse(rid, rid), protocol.MsgIDResponse(rid))
}

// publishOnce publishes to subject as its first message (expected last subject sequence 0)
// with Nats-Msg-Id id and waits for the ack: how results and responses are recorded.
func publishOnce(ctx context.Context, js jetstream.JetStream, subject, id string) error {
	msg := floorMsg(subject, id)
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("publish to %s: %w", subject, err)
	}
	return nil
}

// recordAndPublish creates key in kv, then publishes to subject with Nats-Msg-Id id and waits
// for the ack: the two steps of every hop of a request.
func recordAndPublish(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key, subject, id string) error {
	if _, err := kv.Create(ctx, key, floorPayload); err != nil {
		return fmt.Errorf("create %s in %s: %w", key, kv.Bucket(), err)
	}
	if _, err := js.PublishMsg(ctx, floorMsg(subject, id)); err != nil {
		return fmt.Errorf("publish to %s: %w", subject, err)
	}
	return nil
}

// consume runs handle on every message of cons, each in its own goroutine, and acks it. Like
// bus.Subscriber it fetches as many messages as it has free slots, for floorPullWait, and lets
// the server end each fetch (FetchMaxWait). It returns once ctx is done and every handler has
// returned.
func (f *floor) consume(ctx context.Context, b *testing.B, cons jetstream.Consumer, handle func(context.Context, jetstream.Msg) error) {
	var wg sync.WaitGroup
	defer wg.Wait()
	free := make(chan struct{}, floorSlots) // one token per free slot; only this loop takes them
	for range floorSlots {
		free <- struct{}{}
	}
	for {
		select {
		case <-free:
		case <-ctx.Done():
			return
		}
		k := 1
		for ; k < floorSlots && len(free) > 0; k++ {
			<-free
		}
		f.pulls.Add(1)
		batch, err := cons.Fetch(k, jetstream.FetchMaxWait(floorPullWait))
		got := 0
		if err == nil {
			for msg := range batch.Messages() {
				got++
				wg.Go(func() {
					defer func() { free <- struct{}{} }()
					if err := handle(context.WithoutCancel(ctx), msg); err != nil {
						b.Error(err)
						_ = msg.Nak()
						return
					}
					_ = msg.Ack()
				})
			}
			err = batch.Error()
		}
		for range k - got {
			free <- struct{}{}
		}
		if err != nil && ctx.Err() == nil {
			b.Error("fetch: ", err)
		}
	}
}

// floorMsg is a message of floorPayload to subject with Nats-Msg-Id id.
func floorMsg(subject, id string) *nats.Msg {
	return &nats.Msg{Subject: subject, Data: floorPayload, Header: nats.Header{jetstream.MsgIDHeader: []string{id}}}
}

// lastToken is a subject's last token: the session, which is the request id here as in the
// Hermes benchmark.
func lastToken(subject string) string { return subject[strings.LastIndexByte(subject, '.')+1:] }

func benchFloor(b *testing.B, parallelism int) {
	f := startFloor(b)
	pulls := f.pulls.Load()
	run(b, parallelism, f.Do)
	b.ReportMetric(floorOpsPerRequest, "jsops/op")
	b.ReportMetric(float64(f.pulls.Load()-pulls)/float64(b.N), "pulls/op")
}

// Parallelism as in BenchmarkHermes1Call and BenchmarkHermes1CallC64.
func BenchmarkJetStreamFloor1Call(b *testing.B)    { benchFloor(b, 1) }
func BenchmarkJetStreamFloor1CallC64(b *testing.B) { benchFloor(b, 32) }

// BenchmarkJetStreamPublishC64 is the cost of one publish awaiting its ack, from 64 clients on
// one connection, to a subject of the record stream that no consumer reads.
func BenchmarkJetStreamPublishC64(b *testing.B) {
	bb := startBuses(b, "floor-publisher")[0]
	id := fmt.Sprintf("p%d-%d", os.Getpid(), runs.Add(1))
	subject := protocol.SubjectEvent(protocol.EventToolStarted, id)
	run(b, 32, func(ctx context.Context, client, seq int) error {
		_, err := bb.JS.PublishMsg(ctx, floorMsg(subject, fmt.Sprintf("%s-%d-%d", id, client, seq)))
		return err
	})
}
