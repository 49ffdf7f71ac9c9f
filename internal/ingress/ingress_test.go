package ingress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

var (
	_ Submitter = (*fakeSubmitter)(nil)
	_ Admitter  = (*fakeAdmitter)(nil)
)

// fakeSubmitter accepts every request (err, when set, refuses it) and keeps them; done, when
// set, hears of each.
type fakeSubmitter struct {
	mu   sync.Mutex
	err  error
	subs []submit.Submission
	done chan submit.Submission
}

func (f *fakeSubmitter) Submit(_ context.Context, sub submit.Submission) (*submit.Outcome, error) {
	f.mu.Lock()
	f.subs = append(f.subs, sub)
	f.mu.Unlock()
	if f.done != nil {
		f.done <- sub
	}
	if f.err != nil {
		return nil, f.err
	}
	return &submit.Outcome{Pending: true, TraceID: sub.Trace.TraceID}, nil
}

// fakeAdmitter admits with err nil, and keeps the asks.
type fakeAdmitter struct {
	err  error
	asks []admission.Ask
}

func (f *fakeAdmitter) Admit(_ context.Context, ask admission.Ask) (*admission.Ticket, error) {
	f.asks = append(f.asks, ask)
	if f.err != nil {
		return nil, f.err
	}
	return &admission.Ticket{Owner: ask.Actor.Owner(), Caller: ask.Actor.Record()}, nil
}

// request is a client's request of session, as published.
func request(session string) *protocol.Request {
	return &protocol.Request{RequestID: "req_1", SessionID: session, ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: "echo", Arguments: []byte(`{"a":1}`)}}}
}

// delivery is m published on subject, as the subscriber hands it over.
func delivery(t *testing.T, subject string, typ protocol.Type, payload any, session string) *bus.Delivery {
	t.Helper()
	m, err := protocol.NewMessage(typ, payload)
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = "msg_1", "req_1", session
	m.Trace = protocol.TraceContext{TraceID: "trace-1", Traceparent: "00-abc-def-01", Tracestate: "k=v, x=y"}
	m.Caller = &protocol.Caller{ID: "key:admin", Name: "admin", Role: "admin"} // what the message claims: not believed
	data, err := protocol.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return &bus.Delivery{Subject: subject, Data: data, Msg: m, NumDelivered: 1, Log: slog.New(slog.DiscardHandler)}
}

// fate is how the subscriber settles a handler's result (pkg/bus): ack, term, nak after the
// delay the handler asked for, or nak with the growing delay.
func fate(err error) string {
	switch {
	case err == nil:
		return "ack"
	case bus.IsPermanent(err):
		return "term"
	case fmt.Sprintf("%T", err) == "*bus.retryError":
		return "nak after"
	}
	return "nak"
}

// Every branch of take: what can never be submitted is terminated (logged, nothing recorded),
// what may be later is redelivered — when the store has room again, after the delay admission
// says —, and a request admitted and accepted is acked.
func TestTake(t *testing.T) {
	subject := protocol.SubjectClientRequest("crm", "sess_1")
	sandbox := request(protocol.SandboxSession("echo"))
	sandbox.Sandbox = &protocol.Sandbox{Tool: "echo", Revision: 1}
	storeFull := &admission.Refusal{Status: 503, Code: protocol.CodeStoreFull, Message: "the record is near full", RetryAfter: 30 * time.Second}
	for _, tc := range []struct {
		name      string
		d         *bus.Delivery
		admit     error
		submit    error
		fate      string
		says      string
		submitted bool
	}{
		{name: "accepted", fate: "ack", submitted: true},
		{name: "not a client's subject", d: delivery(t, "hermes.other.crm.sess_1", protocol.TypeRequest, request("sess_1"), "sess_1"), fate: "term", says: "not a client's request subject"},
		{name: "no session in the subject", d: delivery(t, protocol.SubjectClientRequest("crm", ""), protocol.TypeRequest, request("sess_1"), "sess_1"), fate: "term"},
		{name: "a user that is not an id", d: delivery(t, protocol.SubjectClientRequest("bad user", "sess_1"), protocol.TypeRequest, request("sess_1"), "sess_1"), fate: "term"},
		{name: "not a request", d: delivery(t, subject, protocol.TypeResponse, &protocol.Response{RequestID: "req_1", SessionID: "sess_1", Status: protocol.StatusSuccess}, "sess_1"),
			fate: "term", says: "not a request"},
		{name: "a request that is not valid", d: delivery(t, subject, protocol.TypeRequest, &protocol.Request{RequestID: "req_1", SessionID: "sess_1"}, "sess_1"),
			fate: "term", says: "tool_calls"},
		{name: "a sandbox request", d: delivery(t, protocol.SubjectClientRequest("crm", sandbox.SessionID), protocol.TypeRequest, sandbox, sandbox.SessionID),
			fate: "term", says: "sandbox request"},
		{name: "another session than the subject's", d: delivery(t, subject, protocol.TypeRequest, request("sess_2"), "sess_2"), fate: "term", says: `session "sess_2" on the subject of session "sess_1"`},
		{name: "admission away", admit: errors.New("no responders"), fate: "nak", says: "admit"},
		{name: "the bus away", admit: &admission.Refusal{Status: 503, Code: protocol.CodeBusUnavailable, Message: "away"}, fate: "nak"},
		{name: "the store full", admit: storeFull, fate: "nak after"},
		{name: "larger than the record could ever take", admit: &admission.Refusal{Status: 503, Code: protocol.CodeStoreFull, Message: "never", Never: true}, fate: "term"},
		{name: "someone else's session", admit: admission.NoSuchSession("sess_1"), fate: "term", says: "not its own"},
		{name: "refused otherwise", admit: &admission.Refusal{Status: 429, Code: protocol.CodeRateLimited, Message: "slow down"}, fate: "term", says: "slow down"},
		{name: "over budget", submit: fmt.Errorf("%w: by 10 bytes", submit.ErrOverBudget), fate: "term", submitted: true},
		{name: "a request_id used for another request", submit: submit.ErrConflict, fate: "term", submitted: true},
		{name: "too large", submit: submit.ErrTooLarge, fate: "term", submitted: true},
		{name: "invalid", submit: fmt.Errorf("%w: intent", protocol.ErrInvalid), fate: "term", submitted: true},
		{name: "not accepted yet", submit: submit.ErrUnavailable, fate: "nak", submitted: true},
	} {
		sub, adm := &fakeSubmitter{err: tc.submit}, &fakeAdmitter{err: tc.admit}
		g := &Ingress{Submit: sub, Admit: adm}
		d := tc.d
		if d == nil {
			d = delivery(t, subject, protocol.TypeRequest, request("sess_1"), "sess_1")
		}
		err := g.take(t.Context(), d)
		if fate(err) != tc.fate || (tc.says != "" && !strings.Contains(err.Error(), tc.says)) || (len(sub.subs) > 0) != tc.submitted {
			t.Errorf("%s: %s (%v), submitted %d", tc.name, fate(err), err, len(sub.subs))
		}
		if tc.name == "the store full" && !errors.Is(err, storeFull) {
			t.Errorf("%s: %v", tc.name, err)
		}
		if tc.name != "accepted" {
			continue
		}
		// Admitted as the NATS user the subject names, into the subject's session; submitted
		// as that user, not waited for, with the client's trace context.
		if len(adm.asks) != 1 || adm.asks[0].Actor != admission.ClientActor("crm") || adm.asks[0].Session != "sess_1" || adm.asks[0].Size != len(d.Data) {
			t.Errorf("asked %+v", adm.asks)
		}
		s := sub.subs[0]
		if !s.NoWait || s.Caller == nil || s.Caller.ID != "nats:crm" || s.Owner != "nats:crm" || s.Size != len(d.Data) || s.Request.RequestID != "req_1" ||
			s.Trace != (protocol.TraceContext{TraceID: "trace-1", Traceparent: "00-abc-def-01", Tracestate: "k=v, x=y"}) {
			t.Errorf("submitted %+v", s)
		}
	}
}

// A client's trace context is kept as a gateway keeps an HTTP caller's: a trace id it would
// refuse is replaced with a new one, a malformed traceparent or tracestate left out.
func TestClientTrace(t *testing.T) {
	long := strings.Repeat("x", 129)
	for _, tc := range []struct {
		in, want protocol.TraceContext
	}{
		{protocol.TraceContext{TraceID: "t", Traceparent: "p", Tracestate: "a=1, b=2"}, protocol.TraceContext{TraceID: "t", Traceparent: "p", Tracestate: "a=1, b=2"}},
		{protocol.TraceContext{TraceID: "t", Traceparent: "has space", Tracestate: "a=1"}, protocol.TraceContext{TraceID: "t"}},
		{protocol.TraceContext{TraceID: "t", Traceparent: "p", Tracestate: "bad\x00"}, protocol.TraceContext{TraceID: "t", Traceparent: "p"}},
		{protocol.TraceContext{TraceID: long}, protocol.TraceContext{}},
		{protocol.TraceContext{}, protocol.TraceContext{}},
	} {
		got := clientTrace(tc.in)
		if tc.want.TraceID == "" {
			if len(got.TraceID) != 32 || got.TraceID == tc.in.TraceID {
				t.Errorf("%+v: a new trace id, got %q", tc.in, got.TraceID)
			}
			got.TraceID = ""
		}
		if got != tc.want {
			t.Errorf("%+v: %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

// Run takes the requests external clients publish from their stream, through its consumer, and
// returns when its context ends.
func TestRunTakesTheClientsRequests(t *testing.T) {
	b := bustest.NewServer(t).Provision(t, bus.Config{})
	sub := &fakeSubmitter{done: make(chan submit.Submission, 1)}
	g := &Ingress{Bus: b, Submit: sub, Admit: &fakeAdmitter{}}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- g.Run(ctx) }()
	d := delivery(t, "", protocol.TypeRequest, request("sess_r"), "sess_r")
	if _, err := b.JS.Publish(t.Context(), protocol.SubjectClientRequest("crm", "sess_r"), d.Data); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-sub.done:
		if s.Request.SessionID != "sess_r" || s.Owner != "nats:crm" {
			t.Errorf("submitted %+v", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the client's request was not taken")
	}
	cancel()
	if err := <-ran; err != nil {
		t.Error(err)
	}
}

func TestContentTypeNamesWhatItTakes(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                                "",
		"application/json":                protocol.ContentTypeJSON,
		"Application/JSON; charset=utf-8": protocol.ContentTypeJSON,
		"application/msgpack":             protocol.ContentTypeMsgpack,
	} {
		if got, err := contentType(nats.Header{"Content-Type": []string{in}}); err != nil || got != want {
			t.Errorf("%q: %q %v, want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"text/plain", "application/json; x", "\x00", "application/xml"} {
		if _, err := contentType(nats.Header{"Content-Type": []string{in}}); err == nil || !strings.Contains(err.Error(), "Content-Type") {
			t.Errorf("%q: %v", in, err)
		}
	}
}

func FuzzContentType(f *testing.F) {
	f.Add("application/json; charset=utf-8")
	f.Add("application/msgpack")
	f.Fuzz(func(t *testing.T, v string) {
		got, err := contentType(nats.Header{"Content-Type": []string{v}})
		if err == nil && got != "" && got != protocol.ContentTypeJSON && got != protocol.ContentTypeMsgpack {
			t.Fatalf("%q taken as %q", v, got)
		}
	})
}

func TestEachClientHasItsShareOfDeadLetters(t *testing.T) {
	t.Parallel()
	var l letters
	now := time.Date(2026, 12, 6, 9, 0, 10, 0, time.UTC)
	for i := range lettersPerClient {
		if !l.take("crm", now) {
			t.Fatalf("letter %d refused", i)
		}
	}
	if l.take("crm", now) {
		t.Fatal("more than its share")
	}
	if !l.take("erp", now) {
		t.Fatal("another client's letter refused")
	}
	if !l.take("crm", now.Add(time.Minute)) {
		t.Fatal("the next minute's letter refused")
	}
}
