package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/deadletter"
	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
)

// panicking is an http executor that crashes on every try.
type panicking struct{}

func (panicking) Kind() string { return protocol.ActionHTTP }

func (panicking) Execute(context.Context, *worker.Call) (worker.Outcome, error) {
	panic("tool executor bug")
}

func (s *system) publishRaw(subject string, data []byte) {
	s.t.Helper()
	if _, err := s.js.PublishMsg(context.Background(), &nats.Msg{Subject: subject, Data: data}); err != nil {
		s.t.Fatal(err)
	}
}

func (s *system) waitDeadLetter(subject string) *jetstream.RawStreamMsg {
	s.t.Helper()
	var found *jetstream.RawStreamMsg
	waitFor(s.t, "dead letter of "+subject, func() bool {
		for _, m := range s.deadLetters() {
			if m.Header.Get(deadletter.HeaderSubject) == subject {
				found = m
				return true
			}
		}
		return false
	})
	return found
}

func TestPoisonMessagesAreDeadLettered(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, bus: bus.Config{AckWait: time.Second, MaxDeliver: 3}})
	hostile := map[string][]byte{
		protocol.SubjectToolCall(protocol.ActionHTTP, "echo", "poison_1"): []byte("not msgpack at all"),
		"hermes.request.poison_2": {0xdd, 0xff, 0xff, 0xff, 0xff, 0x01},
		protocol.SubjectToolCall(protocol.ActionHTTP, "echo", "poison_3"): {0xc6, 0x7f, 0xff, 0xff, 0xff},
		"hermes.result.poison_4":  append([]byte{0x91}, []byte(strings.Repeat("\x91", 5000))...),
		"hermes.request.poison_5": {},
		protocol.SubjectToolCall(protocol.ActionHTTP, "slow_echo", "pzn_6"): {0x81, 0xa1, 'v', 0xcb, 0x01},
	}
	for subject, data := range hostile {
		s.publishRaw(subject, data)
	}
	for subject := range hostile {
		if session, ok := strings.CutPrefix(subject, "hermes.request."); ok {
			subject = s.storedRequest(session) // as the stream stored it
		}
		dl := s.waitDeadLetter(subject)
		if r := dl.Header.Get(deadletter.HeaderReason); !strings.Contains(r, "terminated") || !strings.Contains(r, "malformed") {
			t.Errorf("%s: reason %q", subject, r)
		}
		if dl.Header.Get(deadletter.HeaderDeliveries) != "1" || dl.Header.Get(deadletter.HeaderStreamSeq) == "" {
			t.Errorf("%s: headers %v", subject, dl.Header)
		}
	}
	// The workers survived: a normal request still works.
	if r := s.route(request("after_poison", "", call("c", "echo", map[string]any{"ok": true}))); r.Status != protocol.StatusSuccess {
		t.Fatalf("after poison: %+v", r)
	}
}

func TestInvalidRequestOnTheBusGetsAFailedResponse(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	nc, _ := s.connect()
	replies := make(chan *nats.Msg, 4)
	sub, err := nc.ChanSubscribe(protocol.SubjectLiveResponse("bad_1", "sess_bad"), replies)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil { // the server knows the subscription from here on
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	m, _ := protocol.NewMessage(protocol.TypeRequest, &protocol.Request{RequestID: "bad_1", SessionID: "sess_bad",
		ToolCalls: []protocol.ToolCall{{ToolCallID: "bad.id", Name: "echo", Arguments: json.RawMessage(`{}`)}}})
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDRequest("bad_1"), "bad_1", "sess_bad"
	if _, err := bus.NewPublisher(s.js, protocol.Sender{Role: protocol.RoleClient, Instance: "test"}).Publish(context.Background(), protocol.SubjectRequest("sess_bad"), m); err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-replies:
		rm, err := protocol.Unmarshal(msg.Data)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := rm.DecodeResponse()
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status != protocol.StatusFailed || resp.RequestID != "bad_1" || resp.Error == nil ||
			!strings.Contains(resp.Error.Message, "tool_calls[0].tool_call_id") {
			t.Fatalf("response %+v does not say what was wrong", resp)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no response for an invalid request")
	}
	dl := s.waitDeadLetter(s.storedRequest("sess_bad"))
	if r := dl.Header.Get(deadletter.HeaderReason); !strings.Contains(r, "tool_calls[0].tool_call_id") {
		t.Fatalf("reason does not name the field: %q", r)
	}
	resp, err := http.Get(s.base + "/v1/requests/bad_1")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the failed response is not kept: %v %v", resp, err)
	}
	resp.Body.Close()
}

func TestCallFailingOnEveryDeliveryIsDeadLettered(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	s := start(t, options{bus: bus.Config{AckWait: time.Second, MaxDeliver: 3}, metrics: m})
	s.addWorkerWith(app.WorkerConfig{Instance: "worker-1", Tools: []string{"echo"}})
	s.addWorkerWith(app.WorkerConfig{Instance: "buggy-worker", Tools: []string{"boom"}, Executors: []worker.Executor{panicking{}}})
	resp := s.route(request("boom_1", "", call("a", "echo", map[string]any{"x": 1}), call("b", "boom", map[string]any{})))
	if resp.Status != protocol.StatusPartialSuccess {
		t.Fatalf("status %s", resp.Status)
	}
	r := result(t, resp, "b")
	if r.Status != protocol.ResultError || r.ErrorCode != protocol.CodeDeadLettered || r.Attempts != 3 || !strings.Contains(r.RecoveryHint, "dlq") {
		t.Fatalf("result %+v", r)
	}
	dl := s.waitDeadLetter(protocol.SubjectToolCall(protocol.ActionHTTP, "boom", "boom_1"))
	if dl.Header.Get(deadletter.HeaderDeliveries) != "3" || !strings.Contains(dl.Header.Get(deadletter.HeaderReason), "3 deliveries") {
		t.Fatalf("dead letter headers %v", dl.Header)
	}
	// Counters move just after what they count is published: wait for them, then check exactly.
	deadLetters := m.DeadLetters.WithLabelValues(bus.ToolConsumer(protocol.ActionHTTP, "boom"), "max_deliveries")
	responses := m.Responses.WithLabelValues(string(protocol.StatusPartialSuccess))
	waitFor(t, "the counters", func() bool { return testutil.ToFloat64(deadLetters) >= 1 && testutil.ToFloat64(responses) >= 1 })
	s.drain()
	if got := testutil.ToFloat64(deadLetters); got != 1 {
		t.Fatalf("hermes_dead_letters_total{consumer=tool_http-boom,kind=max_deliveries} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(responses); got != 1 {
		t.Fatalf("hermes_responses_total{status=partial_success} = %v, want 1", got)
	}
}

// TestResultsGivenUpTwiceAreStillAnswered: every result of a request is given up by the
// routers' consumer (terminated, as the server gives up a result whose aggregation failed on
// every delivery), and so is anything published again for them: the dead-letter processor
// answers the request itself. (Before, it re-drove a result once and, given up again, left the
// request without a response.)
func TestResultsGivenUpTwiceAreStillAnswered(t *testing.T) {
	variant(t, "internal/deadletter's TestProcessorAggregatesGivenUpResults (the processor answers a request however many of its results were given up); TestCallFailingOnEveryDeliveryIsDeadLettered end to end")
	t.Parallel()
	s := start(t, options{routers: -1, workers: 0})
	router := s.spawn("router", "short-lived-router", "--routes", "testdata/routes.yaml", "--dead-letters=false")
	waitFor(t, "the router to start", func() bool { return strings.Contains(router.out.String(), "running") })
	got := s.postAsync(request("given_up", "", call("a", "echo", map[string]any{"n": 1}), call("b", "echo", map[string]any{"n": 2})), "?timeout=1m")
	waitFor(t, "both calls dispatched", func() bool { return s.countRecorded("given_up", protocol.TypeToolCall) == 2 })
	router.kill() // nobody aggregates from now on
	s.addWorker("w")
	waitFor(t, "both results recorded", func() bool { return s.countRecorded("given_up", protocol.TypeToolResult) == 2 })
	s.addDeadLetters("dl")

	// Give up every result delivered to the routers' consumer, copies too, for a while.
	cons, err := s.js.Consumer(s.ctx, protocol.StreamName, bus.ConsumerRouterResults)
	if err != nil {
		t.Fatal(err)
	}
	given := 0
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		batch, err := cons.Fetch(8, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			continue
		}
		for msg := range batch.Messages() {
			if msg.Term() == nil {
				given++
			}
		}
	}
	if given < 2 {
		t.Fatalf("gave up %d results, want both", given)
	}
	select {
	case a := <-got:
		if a.status != http.StatusOK {
			t.Fatalf("HTTP %d: %s", a.status, a.body)
		}
		if r := decodeResponse(t, a.body); r.Status != protocol.StatusSuccess || len(r.Results) != 2 {
			t.Fatalf("response %+v", r)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the request was left without a response")
	}
	if n := s.countRecorded("given_up", protocol.TypeResponse); n != 1 {
		t.Fatalf("%d responses recorded, want 1", n)
	}
}
