package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
)

// TestRestreamADeployment gives a deployment's record more streams, and then one again, as the
// README says: refused while a service runs, done once they are stopped; the services started
// again use the new number. Every session's requests, before and after, are dispatched in the
// order accepted and answered once, each session whole in the stream that keeps it.
func TestRestreamADeployment(t *testing.T) {
	t.Parallel()
	s := start(t, options{routers: -1, workers: 0, bus: bus.Config{Partitions: 6}})
	// The router and the worker run on connections of their own, so that they can be stopped.
	run := func() (stop func()) {
		_, rb := s.connectAs(bus.RoleRouter)
		r, err := app.NewRouter(rb, app.RouterConfig{Instance: "router-restream", Routes: s.table, Limits: s.opts.limits, Seal: s.opts.seal})
		if err != nil {
			t.Fatal(err)
		}
		_, wb := s.connectAs(bus.RoleWorker)
		w, err := app.NewWorker(wb, app.WorkerConfig{Instance: "worker-restream", Resolve: s.resolve, Pools: worker.Pools{}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(s.ctx)
		var wg sync.WaitGroup
		wg.Go(func() {
			if err := r.Run(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("router: %v", err)
			}
		})
		wg.Go(func() {
			if err := w.Run(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("worker: %v", err)
			}
		})
		return func() { cancel(); wg.Wait() }
	}
	const sessions, each = 8, 3
	sent := 0
	send := func(round string) {
		for i := range sessions {
			reqs := make([]*protocol.Request, each)
			for j := range reqs {
				reqs[j] = &protocol.Request{RequestID: fmt.Sprintf("rs_%s_%d_%d", round, i, j), ToolCalls: []protocol.ToolCall{
					{ToolCallID: "a", Name: "echo", Arguments: []byte(`{}`)}}}
			}
			s.publishRequests(fmt.Sprintf("sess_rs_%d", i), reqs)
		}
		sent += sessions * each
		s.waitResponses(sent)
	}
	reopen := func() {
		b, err := bus.Provision(s.ctx, s.js, bus.Config{})
		if err != nil {
			t.Fatal(err)
		}
		s.admin = b
	}

	stop := run()
	send("a")
	if _, err := s.admin.Restream(s.ctx, 3); err == nil || !strings.Contains(err.Error(), "a service reads") {
		t.Fatalf("restreaming under running services: %v, want it refused", err)
	}
	stop()
	if _, err := s.admin.Restream(s.ctx, 3); err == nil || !strings.Contains(err.Error(), "gateway-clients") {
		t.Fatalf("restreaming under a running gateway: %v, want it refused", err)
	}
	s.gwStop()
	done, err := s.admin.Restream(s.ctx, 3)
	if err != nil || done.Before != 1 || done.After != 3 || done.Sessions == 0 || done.Messages == 0 {
		t.Fatalf("restreaming with the services stopped: %+v, %v", done, err)
	}
	reopen()
	if s.admin.Layout().Streams() != 3 {
		t.Fatalf("the record reopened has %d streams, want 3", s.admin.Layout().Streams())
	}
	s.startGateway("gateway-2")
	stop = run()
	send("b")
	check := func(rounds ...string) {
		t.Helper()
		l := s.admin.Layout()
		for k := range l.Streams() {
			for _, raw := range s.storedIn(protocol.RecordStream(k)) {
				session := raw.Subject[strings.LastIndexByte(raw.Subject, '.')+1:]
				if l.StreamOf(session) != k {
					t.Errorf("stream %s holds %s, of a session of stream %d", protocol.RecordStream(k), raw.Subject, l.StreamOf(session))
				}
			}
		}
		tls := s.timelines()
		for i := range sessions {
			session := fmt.Sprintf("sess_rs_%d", i)
			tl := tls[session]
			if tl == nil || len(tl.accepted) != len(rounds)*each {
				t.Fatalf("%s: %v requests recorded, want %d", session, tl, len(rounds)*each)
			}
			var last uint64
			for n, id := range tl.accepted {
				if want := fmt.Sprintf("rs_%s_%d_%d", rounds[n/each], i, n%each); id != want {
					t.Errorf("%s: request #%d is %s, want %s", session, n, id, want)
				}
				seq, ok := tl.dispatched[id]
				if !ok || seq < last || tl.responses[id] != 1 {
					t.Fatalf("%s: %s dispatched at %d (after %d: %t), %d responses; want in order, once", session, id, seq, last, ok, tl.responses[id])
				}
				last = seq
			}
		}
	}
	check("a", "b")
	// And back to one stream.
	stop()
	s.gwStop()
	if done, err := s.admin.Restream(s.ctx, 1); err != nil || done.Before != 3 || done.After != 1 {
		t.Fatalf("back to one stream: %+v, %v", done, err)
	}
	reopen()
	for k := 1; k < 3; k++ {
		if _, err := s.js.Stream(s.ctx, protocol.RecordStream(k)); err == nil {
			t.Errorf("stream %s is still there", protocol.RecordStream(k))
		}
	}
	stop = run()
	defer stop()
	send("c")
	check("a", "b", "c")
}
