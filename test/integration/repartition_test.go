package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// TestRepartitionARunningDeployment changes the partitions of a deployment as the README's
// deployment section says: refused while a router reads them, done once the routers are
// stopped, and the routers started again read the new number. Every session's requests, before
// and after, are dispatched in the order accepted and answered once.
func TestRepartitionARunningDeployment(t *testing.T) {
	t.Parallel()
	s := start(t, options{routers: -1, workers: 1, bus: bus.Config{Partitions: 3}})
	runRouter := func(instance string) (stop func(), partitions int) {
		_, b := s.connectAs(bus.RoleRouter)
		r, err := app.NewRouter(b, app.RouterConfig{Instance: instance, Routes: s.table, Limits: s.opts.limits, Seal: s.opts.seal})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(s.ctx)
		var wg sync.WaitGroup
		wg.Go(func() {
			if err := r.Run(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("router %s: %v", instance, err)
			}
		})
		return func() { cancel(); wg.Wait() }, b.Partitions()
	}
	const sessions, each = 6, 5
	send := func(round string) {
		var wg sync.WaitGroup
		for i := range sessions {
			wg.Go(func() {
				reqs := make([]*protocol.Request, each)
				for j := range reqs {
					reqs[j] = &protocol.Request{RequestID: fmt.Sprintf("rp_%s_%d_%d", round, i, j), ToolCalls: []protocol.ToolCall{
						{ToolCallID: "a", Name: "echo", Arguments: []byte(fmt.Sprintf(`{"delay_ms":%d}`, (i+j)%4))}}}
				}
				s.publishRequests(fmt.Sprintf("sess_rp_%d", i), reqs)
			})
		}
		wg.Wait()
	}

	stop, n := runRouter("router-before")
	if n != 3 {
		t.Fatalf("the router reads %d partitions, want 3", n)
	}
	send("a")
	s.waitResponses(sessions * each)
	if _, err := s.admin.Repartition(s.ctx, 7); err == nil || !strings.Contains(err.Error(), "a router reads") {
		t.Fatalf("repartitioning under a running router: %v, want it refused", err)
	}
	stop()
	if done, err := s.admin.Repartition(s.ctx, 7); err != nil || done.Before != 3 || len(done.Kept)+len(done.Raced) > 0 {
		t.Fatalf("repartitioning with the routers stopped: %+v, %v", done, err)
	}
	stop, n = runRouter("router-after")
	defer stop()
	if n != 7 {
		t.Fatalf("the router started after the change reads %d partitions, want 7", n)
	}
	send("b")
	s.waitResponses(2 * sessions * each)

	tls := s.timelines()
	for i := range sessions {
		session := fmt.Sprintf("sess_rp_%d", i)
		tl := tls[session]
		if tl == nil || len(tl.accepted) != 2*each {
			t.Fatalf("%s: %v requests recorded, want %d", session, tl, 2*each)
		}
		var last uint64
		for k, id := range tl.accepted {
			seq, ok := tl.dispatched[id]
			if !ok || seq < last || tl.responses[id] != 1 {
				t.Fatalf("%s: %s (accepted #%d) dispatched at %d (after %d: %t), %d responses; want in order, once", session, id, k, seq, last, ok, tl.responses[id])
			}
			last = seq
		}
	}
	for _, raw := range s.stored() {
		if m, err := protocol.Unmarshal(raw.Data); err == nil && m.Type == protocol.TypeRequest && strings.HasPrefix(m.RequestID, "rp_b_") {
			if want := protocol.StoredSubjectRequest(m.SessionID, 7); raw.Subject != want {
				t.Errorf("%s stored as %s, want %s", m.RequestID, raw.Subject, want)
			}
		}
	}
}

// TestRoutersReadPartitionsAddedWhileTheyRun: a router that was running when the number of
// partitions grew (one started while hermes provision --partitions ran, or a record edited by
// hand) keeps routing until the partitions added have consumers, then reads them too, and
// routes the requests sent there.
func TestRoutersReadPartitionsAddedWhileTheyRun(t *testing.T) {
	t.Parallel()
	s := start(t, options{routers: -1, workers: 1, bus: bus.Config{Partitions: 3}})
	const watch = 100 * time.Millisecond
	r := s.addRouterWith(app.RouterConfig{Instance: "router-watching", PartitionWatch: watch})
	ctx := s.ctx
	info, err := s.admin.Stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	src, dest := protocol.RequestTransform(7)
	cfg.SubjectTransform = &jetstream.SubjectTransformConfig{Source: src, Destination: dest}
	if _, err := s.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// The router sees the new number before the partitions added have consumers, and goes on
	// reading those it has for three more watches (a router that stopped would fail the test).
	waitFor(t, "the router to read the new number", func() bool { return r.Partitions() == 7 })
	time.Sleep(3 * watch)                                                                    // the state under test, not a wait for it
	if b, err := bus.Provision(ctx, s.js, bus.Config{}); err != nil || b.Partitions() != 7 { // the partitions added get their consumers
		t.Fatalf("provisioned %v, %v", b, err)
	}
	var reqs []*protocol.Request
	for p := 3; p < 7; p++ {
		session := ""
		for i := 0; session == ""; i++ {
			if name := fmt.Sprintf("sess_added_%d", i); protocol.RequestPartition(name, 7) == p {
				session = name
			}
		}
		r := &protocol.Request{RequestID: fmt.Sprintf("added_%d", p), ToolCalls: []protocol.ToolCall{{ToolCallID: "a", Name: "echo", Arguments: []byte(`{}`)}}}
		s.publishRequests(session, []*protocol.Request{r})
		reqs = append(reqs, r)
	}
	s.waitResponses(len(reqs))
}
