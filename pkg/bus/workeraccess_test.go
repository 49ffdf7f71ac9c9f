package bus_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

func TestWorkerAccessForChecksItsNames(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		user  string
		tools []string
		want  string
	}{
		{"crm-worker", nil, "at least one tool"},
		{"crm-worker", []string{"a.b"}, "letters, digits"},
		{"crm-worker", []string{"*"}, "letters, digits"},
		{"crm-worker", []string{">"}, "letters, digits"},
		{"crm-worker", []string{""}, "required"},
		{"crm-worker", []string{"echo", "echo"}, "named twice"},
		{"router", []string{"echo"}, "a role's name"},
		{"toolworker", []string{"echo"}, "a role's name"},
		{"crm.worker", []string{"echo"}, "letters, digits"},
		{"", []string{"echo"}, "required"},
	} {
		if _, err := bus.WorkerAccessFor(c.user, c.tools); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q %q: %v, want an error saying %q", c.user, c.tools, err, c.want)
		}
	}
	a, err := bus.WorkerAccessFor("crm-worker", []string{"crm_lookup", "order_query"})
	if err != nil {
		t.Fatal(err)
	}
	var cancels []string
	for k := range protocol.MaxRecordStreams {
		cancels = append(cancels, protocol.FilterEventsIn(k, protocol.EventCancel))
	}
	if a.Inbox != "_INBOX_crm-worker" || !slices.Equal(a.Subscribe, slices.Concat([]string{"_INBOX_crm-worker.>"}, cancels, []string{"$SRV.>", "hermes.svc.toolworker.>",
		"hermes.fast.call.*.crm_lookup", "hermes.fast.call.*.order_query"})) {
		t.Errorf("inbox %q, subscribes %q", a.Inbox, a.Subscribe)
	}
	// Its rights over the record's consumers and the tools' keys are those of its tools' and
	// no others'.
	var want []string
	for _, tool := range []string{"crm_lookup", "order_query"} {
		for _, k := range protocol.Kinds {
			c := bus.ToolConsumer(k, tool)
			for s := range protocol.MaxRecordStreams { // each stream a record may have
				stream := protocol.RecordStream(s)
				want = append(want, "$JS.API.CONSUMER.MSG.NEXT."+stream+"."+c, "$JS.ACK."+stream+"."+c+".>",
					"$JS.API.CONSUMER.CREATE."+stream+"."+c+"."+protocol.FilterToolCallsIn(s, k, tool))
			}
			want = append(want, "$KV."+bus.BucketTools+"."+k+"."+tool)
		}
	}
	want = append(want, "$KV."+bus.BucketTools+".mcpstate.>")
	tooled := func(s string) bool {
		if strings.HasPrefix(s, "$KV."+bus.BucketTools+".") {
			return true
		}
		for k := range protocol.MaxRecordStreams {
			stream := protocol.RecordStream(k)
			for _, p := range []string{"$JS.API.CONSUMER.MSG.NEXT." + stream + ".", "$JS.API.CONSUMER.CREATE." + stream + ".", "$JS.ACK." + stream + "."} {
				if strings.HasPrefix(s, p) {
					return true
				}
			}
		}
		return false
	}
	got := slices.DeleteFunc(slices.Clone(a.Publish), func(s string) bool { return !tooled(s) })
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("rights over consumers and tools' keys:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The rest is a tool worker's.
	w, _ := bus.AccessOf(bus.RoleWorker, "toolworker")
	rest := slices.DeleteFunc(slices.Clone(w.Publish), tooled)
	if !slices.Equal(rest, slices.DeleteFunc(slices.Clone(a.Publish), tooled)) {
		t.Errorf("its other rights %q, a tool worker's %q", slices.DeleteFunc(slices.Clone(a.Publish), tooled), rest)
	}
	if !slices.Equal(a.DenyPublish, w.DenyPublish) {
		t.Errorf("denies %q, a tool worker %q", a.DenyPublish, w.DenyPublish)
	}
}

// A worker user for tool A (crm_lookup) may serve A's calls, of every kind, and nothing of tool
// B's (echo): not take from or ack B's consumers, create them, nor list B, nor read any
// service's replies. The plain toolworker user still serves every tool.
func TestAWorkerOfSomeToolsIsRefusedTheOthers(t *testing.T) {
	t.Parallel()
	const user, a, b = "crm-worker", "crm_lookup", "echo"
	s := bustest.NewLockedServer(t, bus.User{Name: user, Role: bus.RoleWorker, Tools: []string{a}})
	admin := s.Provision(t, bus.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// What it may do, it does without a refusal: make A's consumers and list A, take A's
	// calls and ack them.
	nc, err := bus.Connect(ctx, s.Plain, user, nil, s.AsUser(t, user)...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	wb, err := bus.Provision(ctx, js, bus.Config{NoProvision: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range protocol.Kinds {
		if _, err := wb.EnsureToolConsumer(ctx, kind, a); err != nil {
			t.Fatalf("the worker of %s could not make its %s consumer: %v", a, kind, err)
		}
	}
	if _, err := admin.JS.Publish(ctx, protocol.SubjectToolCall(protocol.ActionHTTP, a, "s1"), []byte("a call")); err != nil {
		t.Fatal(err)
	}
	cons, err := wb.Stream.Consumer(ctx, bus.ToolConsumer(protocol.ActionHTTP, a))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatalf("ack of %s's call: %v", a, err)
		}
		got++
	}
	if got != 1 {
		t.Fatalf("took %d of %s's calls, want 1", got, a)
	}
	if v := s.Violations(); len(v) > 0 {
		t.Fatalf("the worker of %s was refused serving it:\n%s", a, strings.Join(v, "\n"))
	}

	// The plain tool worker serves any tool: it makes B's consumer (so B's calls wait there).
	pc, err := bus.Connect(ctx, s.Plain, "toolworker", nil, s.As(t, bus.RoleWorker)...)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	pjs, _ := jetstream.New(pc)
	pb, err := bus.Provision(ctx, pjs, bus.Config{NoProvision: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pb.EnsureToolConsumer(ctx, protocol.ActionHTTP, b); err != nil {
		t.Fatalf("the toolworker user could not make %s's consumer: %v", b, err)
	}

	api, ack := "$JS.API.", "$JS.ACK."+protocol.StreamName+"."
	refusedOf := []attempt{
		pub("take B's calls", api+"CONSUMER.MSG.NEXT."+protocol.StreamName+"."+bus.ToolConsumer(protocol.ActionHTTP, b)),
		pub("take B's gRPC calls", api+"CONSUMER.MSG.NEXT."+protocol.StreamName+"."+bus.ToolConsumer(protocol.ActionGRPC, b)),
		pub("ack B's call", ack+bus.ToolConsumer(protocol.ActionHTTP, b)+".1.1.1.1.1"),
		pub("create B's consumer", api+"CONSUMER.CREATE."+protocol.StreamName+"."+bus.ToolConsumer(protocol.ActionHTTP, b)+"."+protocol.FilterToolCalls(protocol.ActionHTTP, b)),
		pub("create B's MCP consumer", api+"CONSUMER.CREATE."+protocol.StreamName+"."+bus.ToolConsumer(protocol.ActionMCP, b)+"."+protocol.FilterToolCalls(protocol.ActionMCP, b)),
		pub("create a consumer of A's calls under another name", api+"CONSUMER.CREATE."+protocol.StreamName+".evil."+protocol.FilterToolCalls(protocol.ActionHTTP, a)),
		pub("create a consumer of every tool's calls under A's name", api+"CONSUMER.CREATE."+protocol.StreamName+"."+bus.ToolConsumer(protocol.ActionHTTP, a)+"."+protocol.FilterToolCalls(protocol.ActionHTTP, "*")),
		pub("create a consumer named in the request body", api+"CONSUMER.CREATE."+protocol.StreamName),
		pub("list B", bus.KVSubject(bus.BucketTools, protocol.KeyTool(protocol.ActionHTTP, b))),
		pub("list B the old way", bus.KVSubject(bus.BucketTools, b)),
		pub("take a router's requests", api+"CONSUMER.MSG.NEXT."+protocol.StreamName+"."+bus.RequestConsumer(0)),
		pub("dispatch a call of A", protocol.SubjectToolCall(protocol.ActionHTTP, a, "s1")),
		pub("publish a request", protocol.SubjectRequest("s1")),
		pub("read the API keys", api+"DIRECT.GET."+bus.KVStream(appKeys)),
		sub("read replies under the shared inbox", "_INBOX.>"),
		sub("read the toolworker's replies", bus.RoleInbox(bus.RoleWorker)+".>"),
		sub("read a router's replies", bus.RoleInbox(bus.RoleRouter)+".>"),
		sub("read a gateway's replies", bus.RoleInbox(bus.RoleGateway)+".>"),
		sub("take B's calls by subscribing", protocol.FilterToolCalls(protocol.ActionHTTP, b)),
	}
	conn := s.ConnectAsUser(t, user)
	for _, at := range refusedOf {
		before := len(s.Violations())
		if at.subscribe {
			if _, err := conn.SubscribeSync(at.subject); err != nil {
				t.Fatal(err)
			}
		} else if err := conn.Publish(at.subject, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		_ = conn.Flush()
		if !s.RefusedSince(before, at.subject) {
			t.Errorf("the worker of %s may %s (%s): the server let it", a, at.what, at.subject)
		}
	}
	// Through the bus: B's consumer cannot be read, nor made, nor B listed. Refused, a request
	// gets no answer: each waits out a deadline of its own.
	short, cancel2 := context.WithTimeout(ctx, time.Second)
	defer cancel2()
	if _, err := wb.EnsureToolConsumer(short, protocol.ActionGRPC, b); err == nil {
		t.Error("the worker of A made a consumer of B's calls")
	}
	short, cancel3 := context.WithTimeout(ctx, time.Second)
	defer cancel3()
	if _, err := wb.Tools.Put(short, protocol.KeyTool(protocol.ActionHTTP, b), []byte("x")); err == nil {
		t.Error("the worker of A listed B")
	}
}
