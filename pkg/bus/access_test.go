package bus_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// attempt is one thing a user tries: publishing on a subject (a message, a JetStream API call
// or a bucket write are all publishes) or subscribing to one.
type attempt struct {
	what      string
	subject   string
	subscribe bool
}

func pub(what, subject string) attempt { return attempt{what: what, subject: subject} }
func sub(what, subject string) attempt { return attempt{what: what, subject: subject, subscribe: true} }

// TestEachUserIsRefusedWhatItMustNotDo connects as each role's user of a locked server and
// tries what the role must not do: every attempt is refused by the server, which says so. (What
// each role must be able to do is what the integration tests run: every service there is its
// own user, and a refusal fails the test.)
func TestEachUserIsRefusedWhatItMustNotDo(t *testing.T) {
	t.Parallel()
	s := lockedWithApp(t)
	s.Provision(t, bus.Config{})
	forged := []attempt{
		pub("dispatch a tool call", protocol.SubjectToolCall(protocol.ActionHTTP, "echo", "s1")),
		pub("record a response", protocol.SubjectResponse("r1", "s1")),
		pub("announce a response", protocol.SubjectLiveResponse("r1", "s1")),
		pub("write a dead letter", protocol.SubjectDeadLetter("x")),
	}
	admin := []attempt{
		pub("create a stream", "$JS.API.STREAM.CREATE.EVIL"),
		pub("delete the record", "$JS.API.STREAM.DELETE."+protocol.StreamName),
		pub("change the record", "$JS.API.STREAM.UPDATE."+protocol.StreamName),
		pub("purge the record", "$JS.API.STREAM.PURGE."+protocol.StreamName),
		pub("delete a recorded message", "$JS.API.STREAM.MSG.DELETE."+protocol.StreamName),
		pub("delete a router's consumer", "$JS.API.CONSUMER.DELETE."+protocol.StreamName+"."+bus.RequestConsumer(0)),
		pub("make an API key", "$KV."+appKeys+".k1"),
		pub("delete the keys' bucket", "$JS.API.STREAM.DELETE."+bus.KVStream(appKeys)),
		pub("purge the contracts", "$JS.API.STREAM.PURGE."+bus.KVStream(bus.BucketContracts)),
	}
	// Only gateways (tools:admin callers through /api/v1/tools) and admin register contracts.
	contracts := pub("register a contract", "$KV."+bus.BucketContracts+".order_query")
	// The audit's consumer of record stream k is the auditor's alone: no other role may take
	// from it, ack it, make it (with any filter: one made first would be kept as it is) or
	// delete it.
	audit := func(k int) []attempt {
		stream := protocol.RecordStream(k)
		return []attempt{
			pub("take the audit's messages", "$JS.API.CONSUMER.MSG.NEXT."+stream+"."+bus.ConsumerAudit),
			pub("ack the audit's messages", "$JS.ACK."+stream+"."+bus.ConsumerAudit+".1.1.1.1.1"),
			pub("make the audit's consumer", "$JS.API.CONSUMER.CREATE."+stream+"."+bus.ConsumerAudit+"."+protocol.RecordRoot(k)+".>"),
			pub("make the audit's consumer on tool calls", "$JS.API.CONSUMER.CREATE."+stream+"."+bus.ConsumerAudit+"."+protocol.FilterToolCallsIn(k, protocol.ActionHTTP, "echo")),
			pub("delete the audit's consumer", "$JS.API.CONSUMER.DELETE."+stream+"."+bus.ConsumerAudit),
		}
	}
	cases := map[bus.Role][]attempt{
		bus.RoleClient: append(append([]attempt{
			pub("publish a request past the gateways", protocol.SubjectRequest("s1")),
			pub("publish a request as another client", protocol.SubjectClientRequest("other", "s1")),
			pub("call the micro service as another client", protocol.SubjectClientService("other", protocol.EndpointRequest)),
			sub("serve the micro service", protocol.FilterClientServices),
			sub("hear another client's responses", protocol.FilterClientOutOf("other")),
			pub("take the clients' requests", "$JS.API.CONSUMER.MSG.NEXT."+protocol.ClientStreamName+"."+bus.ConsumerClients),
			pub("record a result", protocol.SubjectResult("r1", "c1", "s1")),
			pub("cancel a request", protocol.SubjectEvent(protocol.EventCancel, "s1")),
			pub("record a plan", "$KV."+bus.BucketCalls+".r1"),
			pub("own a session", "$KV."+appOwners+".s1"),
			pub("read the record", "$JS.API.DIRECT.GET."+protocol.StreamName),
			pub("read the record's info", "$JS.API.STREAM.INFO."+protocol.StreamName),
			pub("read a bucket", "$JS.API.DIRECT.GET."+bus.KVStream(appKeys)),
			pub("read the record through a consumer", "$JS.API.CONSUMER.CREATE."+protocol.StreamName),
			pub("take a router's requests", "$JS.API.CONSUMER.MSG.NEXT."+protocol.StreamName+"."+bus.RequestConsumer(0)),
			sub("receive responses", protocol.FilterLiveResponses),
			sub("read the services' replies", "_INBOX.>"),
			sub("read a gateway's replies", bus.RoleInbox(bus.RoleGateway)+".>"),
			sub("read another client's replies", bus.ClientInbox("other")+".>"),
			sub("watch the tool calls", "hermes.>"),
			contracts,
		}, forged...), admin...),
		bus.RoleGateway: append(append([]attempt{
			pub("create a consumer named in the request body (and so rewrite a router's)", "$JS.API.CONSUMER.CREATE."+protocol.StreamName),
			pub("list a tool", "$KV."+bus.BucketTools+".http.echo"),
			pub("take over a router's consumer", "$JS.API.CONSUMER.CREATE."+protocol.StreamName+"."+bus.RequestConsumer(3)+"."+protocol.FilterRequestPartition(3)),
			pub("take a router's requests", "$JS.API.CONSUMER.MSG.NEXT."+protocol.StreamName+"."+bus.RequestConsumer(0)),
			pub("ack a router's message", "$JS.ACK."+protocol.StreamName+"."+bus.RequestConsumer(0)+".1.1.1.1.1"),
			pub("start a tool", protocol.SubjectEvent(protocol.EventToolStarted, "s1")),
			sub("read replies under the shared inbox", "_INBOX.>"),
			sub("read a router's replies", bus.RoleInbox(bus.RoleRouter)+".>"),
			sub("read a worker's replies", bus.RoleInbox(bus.RoleWorker)+".>"),
			sub("read a client's replies", bus.ClientInbox("client")+".>"),
		}, slices.Concat(forged[:1], audit(0), audit(1))...), admin...),
		bus.RoleRouter: append([]attempt{
			pub("own a session", "$KV."+appOwners+".s1"),
			pub("sign a browser in", "$KV."+appSignins+".x"),
			pub("cancel as a caller", protocol.SubjectEvent(protocol.EventCancel, "s1")),
			pub("record a summary", protocol.SubjectEvent(protocol.EventSummary, "s1")),
			pub("make a consumer that reads requests", "$JS.API.CONSUMER.CREATE."+protocol.StreamName+".evil."+protocol.FilterRequests),
			sub("receive responses", protocol.FilterLiveResponses),
			sub("read replies under the shared inbox", "_INBOX.>"),
			sub("read a gateway's replies (its key lookups)", bus.RoleInbox(bus.RoleGateway)+".>"),
			sub("read one of a gateway's replies", bus.RoleInbox(bus.RoleGateway)+".abc.1"),
			sub("read a worker's replies", bus.RoleInbox(bus.RoleWorker)+".>"),
			contracts,
		}, slices.Concat(audit(0), audit(1), admin)...),
		bus.RoleWorker: append(append([]attempt{
			pub("take the clients' requests", "$JS.API.CONSUMER.MSG.NEXT."+protocol.ClientStreamName+"."+bus.ConsumerClients),
			pub("publish a request", protocol.SubjectRequest("s1")),
			pub("record a plan", "$KV."+bus.BucketCalls+".r1"),
			pub("cancel a request", protocol.SubjectEvent(protocol.EventCancel, "s1")),
			pub("take a router's requests", "$JS.API.CONSUMER.MSG.NEXT."+protocol.StreamName+"."+bus.RequestConsumer(0)),
			pub("ack a router's message", "$JS.ACK."+protocol.StreamName+"."+bus.ConsumerRouterResults+".1.1.1.1.1"),
			pub("make a consumer that reads requests", "$JS.API.CONSUMER.CREATE."+protocol.StreamName+".evil."+protocol.FilterRequests),
			pub("take the summarizer's decisions", "$JS.API.CONSUMER.MSG.NEXT."+protocol.StreamName+"."+bus.ConsumerSummarizer),
			pub("ack the summarizer's decisions", "$JS.ACK."+protocol.StreamName+"."+bus.ConsumerSummarizer+".1.1.1.1.1"),
			pub("record a summary", protocol.SubjectEvent(protocol.EventSummary, "s1")),
			sub("receive responses", protocol.FilterLiveResponses),
			pub("read the record by direct gets", "$JS.API.DIRECT.GET."+protocol.StreamName),
			pub("read a session's last message by a direct get", "$JS.API.DIRECT.GET."+protocol.StreamName+".hermes.request.s1"),
			pub("read the API keys", "$JS.API.DIRECT.GET."+bus.KVStream(appKeys)),
			pub("read the API keys from the leader", "$JS.API.STREAM.MSG.GET."+bus.KVStream(appKeys)),
			pub("read a sign-in", "$JS.API.DIRECT.GET."+bus.KVStream(appSignins)+".$KV."+appSignins+".x"),
			pub("read the sessions' state", "$JS.API.STREAM.MSG.GET."+bus.KVStream(bus.BucketSessions)),
			pub("read the owners", "$JS.API.STREAM.MSG.GET."+bus.KVStream(appOwners)),
			pub("watch the plans", "$JS.API.CONSUMER.CREATE."+bus.KVStream(bus.BucketCalls)),
			pub("watch the API keys", "$JS.API.CONSUMER.CREATE."+bus.KVStream(appKeys)),
			pub("read any message of the record from the leader", "$JS.API.STREAM.MSG.GET."+protocol.StreamName),
			pub("read the plans", "$JS.API.STREAM.MSG.GET."+bus.KVStream(bus.BucketCalls)),
			pub("read a plan by a direct get", "$JS.API.DIRECT.GET."+bus.KVStream(bus.BucketCalls)+".$KV."+bus.BucketCalls+".r1"),
			sub("read replies under the shared inbox", "_INBOX.>"),
			sub("read a router's replies", bus.RoleInbox(bus.RoleRouter)+".>"),
			sub("read a gateway's replies", bus.RoleInbox(bus.RoleGateway)+".>"),
			sub("read every inbox", "*.>"),
			contracts,
		}, slices.Concat(forged, audit(0), audit(1))...), admin...),
		// The eraser purges the record (asked erasures), and does nothing else.
		bus.RoleEraser: append(append([]attempt{
			pub("publish a request", protocol.SubjectRequest("s1")),
			pub("record a result", protocol.SubjectResult("r1", "c1", "s1")),
			pub("cancel a request", protocol.SubjectEvent(protocol.EventCancel, "s1")),
			pub("record a plan", "$KV."+bus.BucketCalls+".r1"),
			pub("take a router's requests", "$JS.API.CONSUMER.MSG.NEXT."+protocol.StreamName+"."+bus.RequestConsumer(0)),
			pub("take over a router's consumer", "$JS.API.CONSUMER.CREATE."+protocol.StreamName+"."+bus.RequestConsumer(3)+"."+protocol.FilterRequestPartition(3)),
			pub("take the summarizer's decisions", "$JS.API.CONSUMER.MSG.NEXT."+protocol.StreamName+"."+bus.ConsumerSummarizer),
			pub("read the API keys", "$JS.API.DIRECT.GET."+bus.KVStream(appKeys)),
			pub("read the record by direct gets", "$JS.API.DIRECT.GET."+protocol.StreamName),
			pub("purge a bucket", "$JS.API.STREAM.PURGE."+bus.KVStream(bus.BucketCalls)),
			sub("receive responses", protocol.FilterLiveResponses),
			sub("read replies under the shared inbox", "_INBOX.>"),
			sub("read a gateway's replies", bus.RoleInbox(bus.RoleGateway)+".>"),
			contracts,
		}, slices.Concat(forged, audit(0), audit(1))...), slices.DeleteFunc(slices.Clone(admin), func(a attempt) bool { return a.what == "purge the record" })...),
		// The auditor reads the record through its own consumers (TestTheAuditorReadsTheRecord),
		// and does nothing else.
		bus.RoleAuditor: append(append([]attempt{
			pub("publish a request", protocol.SubjectRequest("s1")),
			pub("record a result", protocol.SubjectResult("r1", "c1", "s1")),
			pub("cancel a request", protocol.SubjectEvent(protocol.EventCancel, "s1")),
			pub("record a summary", protocol.SubjectEvent(protocol.EventSummary, "s1")),
			pub("start a tool", protocol.SubjectEvent(protocol.EventToolStarted, "s1")),
			pub("record a plan", "$KV."+bus.BucketCalls+".r1"),
			pub("read the API keys", "$JS.API.DIRECT.GET."+bus.KVStream(appKeys)),
			pub("read the plans from the leader", "$JS.API.STREAM.MSG.GET."+bus.KVStream(bus.BucketCalls)),
			pub("read a claim by a direct get", "$JS.API.DIRECT.GET."+bus.KVStream(bus.BucketClaims)+".$KV."+bus.BucketClaims+".r1.c1"),
			pub("watch the plans", "$JS.API.CONSUMER.CREATE."+bus.KVStream(bus.BucketCalls)),
			pub("read the record by direct gets", "$JS.API.DIRECT.GET."+protocol.StreamName),
			pub("read a session's last message by a direct get", "$JS.API.DIRECT.GET."+protocol.RecordStream(1)+".hermes_1.request.s1"),
			pub("read any message of the record from the leader", "$JS.API.STREAM.MSG.GET."+protocol.StreamName),
			pub("take a router's requests", "$JS.API.CONSUMER.MSG.NEXT."+protocol.StreamName+"."+bus.RequestConsumer(0)),
			pub("ack a router's message", "$JS.ACK."+protocol.StreamName+"."+bus.RequestConsumer(0)+".1.1.1.1.1"),
			pub("take the summarizer's decisions", "$JS.API.CONSUMER.MSG.NEXT."+protocol.StreamName+"."+bus.ConsumerSummarizer),
			pub("take over a router's consumer", "$JS.API.CONSUMER.CREATE."+protocol.StreamName+"."+bus.RequestConsumer(3)+"."+protocol.FilterRequestPartition(3)),
			pub("make a consumer of another name", "$JS.API.CONSUMER.CREATE."+protocol.StreamName+".evil."+protocol.RecordRoot(0)+".>"),
			pub("make its consumer with the filter in the request body", "$JS.API.CONSUMER.CREATE."+protocol.StreamName+"."+bus.ConsumerAudit),
			pub("make its consumer of a bucket", "$JS.API.CONSUMER.CREATE."+bus.KVStream(appKeys)+"."+bus.ConsumerAudit+".$KV."+appKeys+".>"),
			pub("delete its consumer", "$JS.API.CONSUMER.DELETE."+protocol.StreamName+"."+bus.ConsumerAudit),
			pub("delete its consumer of another stream", "$JS.API.CONSUMER.DELETE."+protocol.RecordStream(1)+"."+bus.ConsumerAudit),
			pub("delete another stream of the record", "$JS.API.STREAM.DELETE."+protocol.RecordStream(1)),
			pub("answer discovery", "_INBOX.x"),
			sub("receive responses", protocol.FilterLiveResponses),
			sub("watch the record", "hermes.>"),
			sub("read replies under the shared inbox", "_INBOX.>"),
			sub("read a gateway's replies", bus.RoleInbox(bus.RoleGateway)+".>"),
			contracts,
		}, forged...), admin...),
	}
	for _, role := range bus.Roles {
		if role == bus.RoleAdmin {
			continue
		}
		t.Run(string(role), func(t *testing.T) {
			nc := s.ConnectAs(t, role)
			for _, a := range cases[role] {
				before := len(s.Violations())
				if a.subscribe {
					if _, err := nc.SubscribeSync(a.subject); err != nil {
						t.Fatal(err)
					}
				} else if err := nc.Publish(a.subject, []byte("{}")); err != nil {
					t.Fatal(err)
				}
				_ = nc.Flush()
				if !s.RefusedSince(before, a.subject) {
					t.Errorf("%s may %s (%s): the server let it", role, a.what, a.subject)
				}
			}
		})
	}
}

// TestAClientPublishesRequestsOnly: the client user's one right works — a request published
// through JetStream under its own name is stored and acked on the client's own inbox.
func TestAClientPublishesRequestsOnly(t *testing.T) {
	t.Parallel()
	s := lockedWithApp(t)
	s.Provision(t, bus.Config{})
	nc := s.ConnectAs(t, bus.RoleClient)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := js.Publish(ctx, protocol.SubjectClientRequest("client", "s1"), []byte("{}"))
	if err != nil {
		t.Fatalf("the client could not publish a request: %v", err)
	}
	if ack.Stream != protocol.ClientStreamName {
		t.Fatalf("stored in %s", ack.Stream)
	}
	// Anything else times out unanswered (the server refuses it).
	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if _, err := js.Publish(short, protocol.SubjectResponse("r1", "s1"), []byte("{}")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a response published by the client: got %v, want no answer", err)
	}
}

// A client names the reply subject of what it publishes, and the stream acknowledges to it as
// the server: in Hermes' account that would write the acknowledgement into any bucket. Clients
// are in an account of their own, whose requests reach Hermes' through a service import, which
// answers the client itself whatever reply subject it named.
func TestAClientCannotWriteThroughItsReplySubject(t *testing.T) {
	t.Parallel()
	s := lockedWithApp(t)
	admin := s.Provision(t, bus.Config{})
	nc := s.ConnectAs(t, bus.RoleClient)
	targets := map[string]jetstream.KeyValue{appOwners: admin.Bucket(appOwners), bus.BucketCalls: admin.Calls, appKeys: admin.Bucket(appKeys)}
	for bucket := range targets {
		if err := nc.PublishRequest(protocol.SubjectClientRequest("client", "s1"), bus.KVSubject(bucket, "victim"), []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	_ = nc.Flush()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The requests themselves were stored (the stream acknowledged them somewhere)...
	waitStored := time.Now().Add(3 * time.Second)
	for {
		info, err := admin.Clients.Info(ctx)
		if err == nil && info.State.Msgs == uint64(len(targets)) {
			break
		}
		if time.Now().After(waitStored) {
			t.Fatalf("the client's requests were not stored: %+v %v", info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	// ...and nothing reached the buckets.
	for bucket, kv := range targets {
		if e, err := kv.Get(ctx, "victim"); err == nil {
			t.Errorf("an external client wrote into %s: %s", bucket, e.Value())
		}
	}
}

// A roll-up (Nats-Rollup: all) on any key would empty a bucket, and a service may write keys of
// several: no bucket a service writes takes one, but the sign-ins' (whose keys are purged).
func TestNoServiceRollsUpABucket(t *testing.T) {
	t.Parallel()
	s := lockedWithApp(t)
	admin := s.Provision(t, bus.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := admin.Claims.Put(ctx, "r1.c1", []byte("claimed")); err != nil {
		t.Fatal(err)
	}
	nc := s.ConnectAs(t, bus.RoleWorker)
	js, _ := jetstream.New(nc)
	msg := &nats.Msg{Subject: bus.KVSubject(bus.BucketClaims, "r9.c9"), Data: []byte("x"), Header: nats.Header{"Nats-Rollup": []string{"all"}}}
	if _, err := js.PublishMsg(ctx, msg); err == nil {
		t.Fatal("a worker rolled up the claims' bucket")
	}
	if _, err := admin.Claims.Get(ctx, "r1.c1"); err != nil {
		t.Fatalf("the claims' bucket lost its keys: %v", err)
	}
	for _, b := range []string{bus.BucketCalls, bus.BucketTools, bus.BucketClaims, bus.BucketSessions, bus.BucketParked, appKeys, appOwners} {
		st, err := admin.JS.Stream(ctx, bus.KVStream(b))
		if err != nil {
			t.Fatal(err)
		}
		if st.CachedInfo().Config.AllowRollup {
			t.Errorf("bucket %s takes roll-ups", b)
		}
	}
}

// A tool worker's user (in Hermes' account with the gateways and routers) can have the server
// put a stream acknowledgement on a response's subject by naming it as the reply of a result it
// publishes. A response is read as the first that counts on its subject, so what follows it
// there never hides it from its caller.
func TestNothingAfterAResponseHidesIt(t *testing.T) {
	t.Parallel()
	s := lockedWithApp(t)
	admin := s.Provision(t, bus.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp := &protocol.Response{RequestID: "r1", SessionID: "s1", Status: protocol.StatusSuccess, Results: []protocol.ToolResult{}}
	m, err := protocol.NewMessage(protocol.TypeResponse, resp)
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDResponse("r1"), "r1", "s1"
	if _, err := admin.Respond(ctx, bus.NewPublisher(admin.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: "r"}), m); err != nil {
		t.Fatal(err)
	}
	nc := s.ConnectAs(t, bus.RoleWorker)
	for i := range 3 {
		if err := nc.PublishRequest(protocol.SubjectResult("r9", "c"+strconv.Itoa(i), "s9"), protocol.SubjectResponse("r1", "s1"), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	_ = nc.Flush()
	waitAppended := time.Now().Add(3 * time.Second)
	for {
		info, err := admin.Stream.Info(ctx, jetstream.WithSubjectFilter(protocol.SubjectResponse("r1", "s1")))
		if err == nil && info.State.Subjects[protocol.SubjectResponse("r1", "s1")] == 4 {
			break
		}
		if time.Now().After(waitAppended) {
			t.Fatalf("the acknowledgements did not land on the response's subject: %+v %v", info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, err := admin.AnnouncedResponse(ctx, "r1", "s1"); err != nil || got.RequestID != "r1" {
		t.Fatalf("the response's caller reads %+v, %v", got, err)
	}
	if _, got, err := admin.Response(ctx, "r1", ""); err != nil || got.RequestID != "r1" {
		t.Fatalf("status reads %+v, %v", got, err)
	}
}

// A service that may both publish and subscribe a subject can hand itself any reply subject;
// were it let answer whatever reply it receives (NATS allow_responses), it could publish
// anywhere once. The gateway may (the live responses): it answers only on the reply subjects
// its table names.
func TestNoServiceAnswersPastItsPermissions(t *testing.T) {
	t.Parallel()
	s := lockedWithApp(t)
	s.Provision(t, bus.Config{})
	nc := s.ConnectAs(t, bus.RoleGateway)
	forbidden := "$KV." + appKeys + ".forged" // an API key
	live := protocol.SubjectLiveResponse("r1", "s1")
	got := make(chan struct{}, 1)
	sub, err := nc.Subscribe(live, func(m *nats.Msg) { _ = m.Respond([]byte("{}")); got <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	before := len(s.Violations())
	if err := nc.PublishRequest(live, forbidden, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the gateway did not receive what it published")
	}
	_ = nc.Flush()
	if !s.RefusedSince(before, forbidden) {
		t.Errorf("the gateway answered on %s", forbidden)
	}
}
