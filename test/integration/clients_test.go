package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/asyncapi"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/deadletter"
	"github.com/hermesbus/hermes/internal/ingress"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// An external NATS client publishes requests under its own NATS user, and that user is who the
// record says made them, whatever caller the message claims; it owns the sessions it opens, may
// not publish into another caller's, and may publish nothing but requests.
func TestExternalClientsPublishRequestsAsThemselves(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"alice": auth.RoleUser, "ops": auth.RoleOperator})
	if code, body := s.call("POST", "/v1/route", keys["alice"], `{"request_id":"alice_1","session_id":"alices","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{}}]}`); code != 200 {
		t.Fatalf("alice: HTTP %d %s", code, body)
	}
	js := clientJS(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	publish := func(subjectSession, requestID, session string) {
		t.Helper()
		req := &protocol.Request{RequestID: requestID, SessionID: session, ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: "echo", Arguments: []byte(`{"from":"crm"}`)}}}
		// The caller the message claims is not believed.
		publishClientRequest(ctx, t, js, subjectSession, req, &protocol.Caller{ID: "key:someone-else", Name: "admin", Role: "admin"})
	}
	publish("ext_s1", "ext_1", "ext_s1")
	_, admin := s.connect()
	var resp *protocol.Response
	waitFor(t, "the client's request answered", func() bool {
		_, r, err := admin.Response(ctx, "ext_1", "ext_s1")
		resp = r
		return err == nil
	})
	if resp.Status != protocol.StatusSuccess || !strings.Contains(string(resp.Results[0].Content), "crm") {
		t.Fatalf("response %+v", resp)
	}
	stored, err := admin.Stream.GetLastMsgForSubject(ctx, s.storedRequest("ext_s1"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := protocol.Unmarshal(stored.Data)
	if err != nil {
		t.Fatal(err)
	}
	if m.Caller == nil || m.Caller.ID != "nats:client" || m.Caller.Name != "client" {
		t.Fatalf("the request was recorded as made by %+v, want the NATS user client", m.Caller)
	}
	// The session is the client's: an operator reads it, alice does not.
	if code, body := s.call("GET", "/v1/requests/ext_1", keys["ops"], ""); code != 200 {
		t.Fatalf("operator reads the client's request: HTTP %d %s", code, body)
	} else {
		var r protocol.Response
		if err := json.Unmarshal([]byte(body), &r); err != nil || r.RequestID != "ext_1" {
			t.Fatalf("%s", body)
		}
	}
	if code, _ := s.call("GET", "/v1/requests/ext_1", keys["alice"], ""); code != 404 {
		t.Fatalf("alice reads the client's request: HTTP %d", code)
	}

	// Into alice's session, or under another session than its subject names: never accepted.
	publish("alices", "ext_2", "alices")
	publish("ext_s3", "ext_3", "ext_other")
	publish("ext_s4", "ext_4", "ext_s4") // after both: once it is answered, they were handled
	waitFor(t, "the last request answered", func() bool { _, _, err := admin.Response(ctx, "ext_4", "ext_s4"); return err == nil })
	for id, session := range map[string]string{"ext_2": "alices", "ext_3": "ext_other"} {
		if _, err := admin.Plan(ctx, id); err == nil {
			t.Errorf("%s was accepted", id)
		}
		// Nor answered: an answer to a request refused here would land in another caller's
		// session, and pre-empt the id there.
		if _, r, err := admin.Response(ctx, id, session); err == nil {
			t.Errorf("%s was answered in session %s: %+v", id, session, r)
		}
	}
	// Every request taken, accepted or refused, has left the clients' stream (a work queue).
	waitFor(t, "the clients' stream drained", func() bool {
		info, err := admin.Clients.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
	// Anything but its own requests is refused by the server.
	s.violating = true
	for _, subject := range []string{protocol.SubjectRequest("ext_s5"), protocol.SubjectClientRequest("other", "ext_s5"), protocol.SubjectResponse("ext_1", "ext_s1")} {
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		if _, err := js.Publish(short, subject, []byte("{}")); err == nil {
			t.Errorf("the client published on %s", subject)
		}
		cancel()
	}
}

// A client's request that could never fit the record's margin is refused at once rather than
// wait, one at a time, in front of every other client's; the next is taken right after.
func TestAClientRequestTooLargeForTheRecordDoesNotHoldTheOthers(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, bus: bus.Config{MaxBytes: 512 << 10}})
	js := clientJS(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	publish := func(requestID string, blob int) {
		t.Helper()
		var calls []protocol.ToolCall
		for i := range 2 {
			calls = append(calls, protocol.ToolCall{ToolCallID: "c" + string(rune('0'+i)), Name: "echo", Arguments: []byte(`{"blob":"` + strings.Repeat("z", blob) + `"}`)})
		}
		publishClientRequest(ctx, t, js, requestID, &protocol.Request{RequestID: requestID, SessionID: requestID, ToolCalls: calls}, nil)
	}
	// The gateway knows the record's limit before it takes any client's request (Listen).
	publish("ext_huge", 75<<10) // writes about 4 × 150 KiB: more than 90 % of 512 KiB
	publish("ext_small", 10)
	_, admin := s.connect()
	waitForWithin(t, "the small request answered", 10*time.Second, func() bool {
		_, _, err := admin.Response(ctx, "ext_small", "ext_small")
		return err == nil
	})
	if _, err := admin.Plan(ctx, "ext_huge"); err == nil {
		t.Fatal("the request too large for the record was accepted")
	}
}

// publishClientRequest publishes req as the external client user "client" does, on the subject
// of subjectSession, its envelope claiming caller (nil: none).
// clientJS connects to the test's server as the NATS user of role client.
func clientJS(t *testing.T, s *system) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(s.srv.ConnectAs(t, bus.RoleClient))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func publishClientRequest(ctx context.Context, t *testing.T, js jetstream.JetStream, subjectSession string, req *protocol.Request, caller *protocol.Caller) {
	t.Helper()
	m, err := protocol.NewMessage(protocol.TypeRequest, req)
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID, m.Caller = protocol.MsgIDRequest(req.RequestID), req.RequestID, req.Session(), caller
	data, err := protocol.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, protocol.SubjectClientRequest("client", subjectSession), data); err != nil {
		t.Fatalf("the client could not publish a request: %v", err)
	}
}

// A client in any language publishes its request as JSON (Content-Type: application/json, the
// HTTP API's field names); what can never be submitted — malformed, unknown fields, an id no
// subject may hold, an unknown content type, another's session — is kept as a dead letter
// naming the problem, which no one may re-drive past the client, and the next request is taken.
func TestExternalClientsPublishJSON(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"alice": auth.RoleUser})
	if code, body := s.call("POST", "/v1/route", keys["alice"], `{"request_id":"jalice_1","session_id":"jalices","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{}}]}`); code != 200 {
		t.Fatalf("alice: HTTP %d %s", code, body)
	}
	js := clientJS(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	send := func(session, contentType, body string) {
		t.Helper()
		msg := &nats.Msg{Subject: protocol.SubjectClientRequest("client", session), Data: []byte(body), Header: nats.Header{}}
		if contentType != "" {
			msg.Header.Set("Content-Type", contentType)
		}
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	bad := map[string]string{ // session → the problem its dead letter names
		"jbad_1":  "malformed",
		"jbad_2":  "colour",
		"jbad_3":  "request_id",
		"jbad_4":  "Content-Type",
		"jalices": "not its own",
		"jbad_6":  "malformed",
	}
	send("jbad_1", "application/json", `{"request_id":"jb1","session_id":"jbad_1","tool_calls":[`)
	send("jbad_2", "application/json", `{"request_id":"jb2","session_id":"jbad_2","colour":"red","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{}}]}`)
	send("jbad_3", "application/json; charset=utf-8", `{"request_id":"jb.3","session_id":"jbad_3","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{}}]}`)
	send("jbad_4", "text/plain", `{"request_id":"jb4","session_id":"jbad_4","tool_calls":[]}`)
	send("jalices", "application/json", `{"request_id":"jb5","session_id":"jalices","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{}}]}`)
	send("jbad_6", "application/json", `{"request_id":"jb6","tool_calls":"`+strings.Repeat("x", 100<<10)) // its letter keeps 16 KiB
	send("jgood", "application/json", `{"request_id":"jgood_1","session_id":"jgood","intent":"a JSON client","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{"from":"python"}}]}`)
	_, admin := s.connect()
	var resp *protocol.Response
	waitFor(t, "the JSON request answered", func() bool {
		_, r, err := admin.Response(ctx, "jgood_1", "jgood")
		resp = r
		return err == nil
	})
	if resp.Status != protocol.StatusSuccess || !strings.Contains(string(resp.Results[0].Content), "python") {
		t.Fatalf("response %+v", resp)
	}
	stored, err := admin.Stream.GetLastMsgForSubject(ctx, s.storedRequest("jgood"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := protocol.Unmarshal(stored.Data)
	if err != nil || m.Caller == nil || m.Caller.ID != "nats:client" {
		t.Fatalf("recorded as %+v %v", m, err)
	}
	if req, err := m.DecodeRequest(protocol.DefaultLimits); err != nil || req.Intent != "a JSON client" {
		t.Fatalf("recorded %+v %v", req, err)
	}
	// Fire and forget, then fetched on the bus: its own request's response, nobody else's.
	nc := s.srv.ConnectAs(t, bus.RoleClient)
	fetch := func(body string) (string, string) {
		t.Helper()
		reply, err := nc.Request(protocol.SubjectClientService("client", protocol.EndpointResponse), []byte(body), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return reply.Header.Get(micro.ErrorCodeHeader), string(reply.Data)
	}
	if code, body := fetch(`{"request_id":"jgood_1"}`); code != "" || !strings.Contains(body, `"status":"success"`) || !strings.Contains(body, "python") {
		t.Errorf("its response: %s %s", code, body)
	}
	for ask, want := range map[string]string{
		`{"request_id":"jalice_1"}`: "404", // alice's
		`{"request_id":"nobody"}`:   "404",
		`{"request_id":"a.b"}`:      "400",
		`{"request":"jgood_1"}`:     "400",
		`not json`:                  "400",
	} {
		if code, body := fetch(ask); code != want {
			t.Errorf("%s: %s %s, want %s", ask, code, body, want)
		}
	}
	var letters []deadletter.Letter
	waitFor(t, "every bad request dead-lettered", func() bool {
		letters, err = deadletter.List(ctx, admin, 100)
		return err == nil && len(letters) == len(bad)
	})
	for _, l := range letters {
		_, session, _ := protocol.ClientOfSubject(l.Subject)
		want, ok := bad[session]
		if !ok || l.Consumer != bus.ConsumerClients || !strings.Contains(l.Reason, want) || !strings.Contains(l.Reason, "client") {
			t.Errorf("letter of %s (%s): %q, want it to name %q", l.Subject, l.Consumer, l.Reason, want)
		}
		if session == "jbad_6" && (!l.Truncated || l.Size < 100<<10) {
			t.Errorf("the large request's letter: %+v", l)
		}
		if _, err := deadletter.Retry(ctx, admin, l.Seq); !errors.Is(err, deadletter.ErrNotRedrivable) {
			t.Errorf("letter %d re-driven past the client: %v", l.Seq, err)
		}
	}
	if code, out, _ := hermes(t, app.RunDLQ, "ls", "--nats", s.srv.URL); code != 0 || !strings.Contains(out, "jb2") {
		t.Errorf("hermes dlq ls: %d\n%s", code, out)
	}
	for _, id := range []string{"jb2", "jb5"} {
		if _, err := admin.Plan(ctx, id); err == nil {
			t.Errorf("%s was accepted", id)
		}
	}
}

// A client calls the micro service hermes (request/reply, JSON) on its own subject and gets the
// response once the request is done, recorded as any other and answered again from the record
// for the same request_id; bad input is an error reply naming the problem; no client calls as
// another; and the gateways say what they serve to discovery.
func TestClientsCallTheMicroService(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, callers: true, users: []bus.User{{Name: "crm", Role: bus.RoleClient}}})
	keys := callerKeys(t, s, map[string]auth.Role{"alice": auth.RoleUser})
	if code, body := s.call("POST", "/v1/route", keys["alice"], `{"request_id":"malice_1","session_id":"malices","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{}}]}`); code != 200 {
		t.Fatalf("alice: HTTP %d %s", code, body)
	}
	nc := s.srv.ConnectAs(t, bus.RoleClient)
	call := func(subject, body string, hdr ...string) (*nats.Msg, map[string]any) {
		t.Helper()
		msg := &nats.Msg{Subject: subject, Data: []byte(body), Header: nats.Header{}}
		for i := 0; i+1 < len(hdr); i += 2 {
			msg.Header.Set(hdr[i], hdr[i+1])
		}
		reply, err := nc.RequestMsg(msg, 20*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", subject, err)
		}
		var out map[string]any
		if err := json.Unmarshal(reply.Data, &out); err != nil {
			t.Fatalf("%s: not JSON: %q", subject, reply.Data)
		}
		return reply, out
	}
	own := protocol.SubjectClientService("client", protocol.EndpointRequest)
	good := `{"request_id":"micro_1","session_id":"micro_s","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{"from":"nats req"}}]}`
	reply, out := call(own, good)
	if reply.Header.Get(micro.ErrorCodeHeader) != "" || out["status"] != "success" || !strings.Contains(fmt.Sprint(out["results"]), "nats req") {
		t.Fatalf("the response: %v %s", reply.Header, reply.Data)
	}
	anc, admin := s.connect()
	if _, r, err := admin.Response(context.Background(), "micro_1", "micro_s"); err != nil || r.Status != protocol.StatusSuccess {
		t.Fatalf("not recorded: %v %v", r, err)
	}
	if _, again := call(own, good); again["request_id"] != "micro_1" || again["status"] != "success" {
		t.Fatalf("asked again: %v", again)
	}
	for _, tc := range []struct{ body, code, status, names string }{
		{`{"request_id":"micro_2",`, protocol.CodeInvalidRequest, "400", "JSON"},
		{`{"request_id":"micro_3","colour":"red","tool_calls":[]}`, protocol.CodeInvalidRequest, "400", "colour"},
		{`{"request_id":"micro.4","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{}}]}`, protocol.CodeInvalidRequest, "400", "request_id"},
		{`{"request_id":"micro_5","session_id":"malices","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{}}]}`, protocol.CodeNotFound, "404", "session"},
	} {
		reply, out := call(own, tc.body)
		e, _ := out["error"].(map[string]any)
		if reply.Header.Get(micro.ErrorCodeHeader) != tc.status || e["code"] != tc.code || !strings.Contains(strings.ToLower(fmt.Sprint(e["message"])), strings.ToLower(tc.names)) {
			t.Errorf("%s: %v %s", tc.body, reply.Header, reply.Data)
		}
	}
	if reply, _ := call(own, good, ingress.HeaderWait, "forever"); reply.Header.Get(micro.ErrorCodeHeader) != "400" {
		t.Errorf("Hermes-Wait: forever: %v %s", reply.Header, reply.Data)
	}
	// Discovery: the gateway's service, its endpoint and its counts.
	info, err := anc.Request("$SRV.INFO."+protocol.ServiceName, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var svc micro.Info
	if err := json.Unmarshal(info.Data, &svc); err != nil || svc.Name != protocol.ServiceName || len(svc.Endpoints) != 3 || svc.Endpoints[0].Subject != protocol.SubjectClientService("*", protocol.EndpointRequest) ||
		svc.Endpoints[1].Subject != protocol.SubjectClientService("*", protocol.EndpointResponse) {
		t.Fatalf("info: %s %v", info.Data, err)
	}
	stats, err := anc.Request("$SRV.STATS."+protocol.ServiceName, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var st micro.Stats
	if err := json.Unmarshal(stats.Data, &st); err != nil || st.Endpoints[0].NumRequests != 7 || st.Endpoints[0].NumErrors != 5 ||
		!strings.Contains(string(st.Endpoints[0].Data), `"answered":2`) {
		t.Fatalf("stats: %s %v", stats.Data, err)
	}
	// The gateway serves the document of these subjects, to anyone.
	if code, doc := s.call("GET", "/v1/asyncapi.json", "", ""); code != http.StatusOK || doc != string(asyncapi.JSON()) || !strings.Contains(doc, protocol.SubjectClientService("{user}", protocol.EndpointRequest)) {
		t.Errorf("GET /v1/asyncapi.json: %d %.200s", code, doc)
	}
	// No client calls as another: the server refuses the subject.
	s.violating = true
	if _, err := nc.Request(protocol.SubjectClientService("crm", protocol.EndpointRequest), []byte(good), 500*time.Millisecond); err == nil {
		t.Error("a client called as crm")
	}
}

// A client hears the responses of its own requests on its own subject, and no other client can
// subscribe there; responses of other callers' requests are sent to no client.
func TestClientsHearOnlyTheirOwnResponses(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, callers: true, users: []bus.User{{Name: "crm", Role: bus.RoleClient}}})
	keys := callerKeys(t, s, map[string]auth.Role{"alice": auth.RoleUser})
	anc, _ := s.connect()
	all, err := anc.SubscribeSync(protocol.FilterClientOut) // the admin sees everything sent
	if err != nil {
		t.Fatal(err)
	}
	nc := s.srv.ConnectAs(t, bus.RoleClient)
	mine, err := nc.SubscribeSync(protocol.FilterClientOutOf("client"))
	if err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	if code, body := s.call("POST", "/v1/route", keys["alice"], `{"request_id":"hear_alice","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{}}]}`); code != 200 {
		t.Fatalf("alice: %d %s", code, body)
	}
	js := clientJS(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	msg := &nats.Msg{Subject: protocol.SubjectClientRequest("client", "hear_s"), Header: nats.Header{"Content-Type": {"application/json"}},
		Data: []byte(`{"request_id":"hear_1","session_id":"hear_s","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{"to":"client"}}]}`)}
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	got, err := mine.NextMsg(15 * time.Second)
	if err != nil {
		t.Fatal("the client heard nothing:", err)
	}
	if got.Subject != protocol.SubjectClientResponse("client", "hear_s", "hear_1") || !strings.Contains(string(got.Data), `"to":"client"`) {
		t.Fatalf("heard %s: %s", got.Subject, got.Data)
	}
	sent, err := all.NextMsg(5 * time.Second)
	if err != nil || sent.Subject != got.Subject {
		t.Fatalf("sent: %v %v", sent, err)
	}
	if extra, err := all.NextMsg(500 * time.Millisecond); err == nil && extra.Subject != got.Subject {
		t.Fatalf("also sent %s: %s", extra.Subject, extra.Data)
	}
	// An announcement is only a hint: what is sent is the recorded response, and one forged
	// on the announcements' subject (no response recorded) sends nothing.
	forged, err := protocol.NewMessage(protocol.TypeResponse, &protocol.Response{RequestID: "hear_forged", SessionID: "hear_s", Status: protocol.StatusSuccess})
	if err != nil {
		t.Fatal(err)
	}
	forged.RequestID, forged.SessionID, forged.MsgID = "hear_forged", "hear_s", "forged"
	data, err := protocol.Marshal(forged)
	if err != nil {
		t.Fatal(err)
	}
	if err := anc.Publish(protocol.SubjectLiveResponse("hear_forged", "hear_s"), data); err != nil {
		t.Fatal(err)
	}
	if m, err := mine.NextMsg(time.Second); err == nil {
		t.Fatalf("a forged announcement reached the client: %s %s", m.Subject, m.Data)
	}
	// It follows its own sessions only: alice's is as unknown as one that never was.
	for ask, want := range map[string]string{
		`{"session_id":"hear_alice"}`:            "404",
		`{"session_id":"nobody_s"}`:              "404",
		`{"session_id":"hear_s","for":"1h"}`:     "400",
		`{"session_id":"hear.s"}`:                "400",
		`{"session_id":"hear_s","colour":"red"}`: "400",
		`{"session_id":"hear_s","for":"50ms"}`:   "400",
		`{"session_id":"hear_s","for":"1s"}`:     "",
	} {
		reply, err := nc.Request(protocol.SubjectClientService("client", protocol.EndpointFollow), []byte(ask), 5*time.Second)
		if err != nil || reply.Header.Get(micro.ErrorCodeHeader) != want {
			t.Errorf("follow %s: %v %v %s, want %q", ask, err, reply.Header, reply.Data, want)
		}
	}
	// Another client may not listen there.
	s.violating = true
	other := s.srv.ConnectAsUser(t, "crm")
	before := len(s.srv.Violations())
	if _, err := other.SubscribeSync(protocol.FilterClientOutOf("client")); err != nil {
		t.Fatal(err)
	}
	_ = other.Flush()
	if !s.srv.RefusedSince(before, protocol.FilterClientOutOf("client")) {
		t.Error("crm subscribed to client's responses")
	}
}
