package chat

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/scriptedllm"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// An admission's refusal of the POST, in each dialect's shape: its status, Retry-After when
// waiting helps, and its code (OpenAI's error object, with the type its status makes and the
// session header as the param of a session not the caller's; Ollama's {"error"}; Hermes' own
// {"error":{code,message,field}}). An Admitter that fails otherwise is the bus away.
func TestAdmissionRefusalsInEachDialect(t *testing.T) {
	doors := []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"scripted","messages":[{"role":"user","content":"x"}]}`},
		{"/api/chat", `{"model":"scripted","stream":false,"messages":[{"role":"user","content":"x"}]}`},
		{"/v1/chat", `{"session_id":"sess_r","message":"x"}`},
	}
	for _, tc := range []struct {
		refusal                   error
		status                    int
		retryAfter, typ, code, at string
	}{
		{admission.NoSuchSession("sess_r"), http.StatusNotFound, "", "invalid_request_error", protocol.CodeNotFound, headerSession},
		{refusal(http.StatusTooManyRequests, protocol.CodeRateLimited, 3), http.StatusTooManyRequests, "3", "rate_limit_error", protocol.CodeRateLimited, ""},
		{refusal(http.StatusServiceUnavailable, protocol.CodeStoreFull, 30), http.StatusServiceUnavailable, "30", "server_error", protocol.CodeStoreFull, ""},
		{refusal(http.StatusForbidden, protocol.CodeForbidden), http.StatusForbidden, "", "permission_error", protocol.CodeForbidden, ""},
		{refusal(http.StatusUnauthorized, protocol.CodeUnauthenticated), http.StatusUnauthorized, "", "authentication_error", protocol.CodeUnauthenticated, ""},
		{errors.New("the owners' bucket did not answer"), http.StatusServiceUnavailable, "1", "server_error", protocol.CodeBusUnavailable, ""},
	} {
		h := newHarness(t, echoThenAnswer(), nil)
		h.adm.refuse = func(ask admission.Ask) error {
			if ask.Hold == admission.HoldWaiting {
				return tc.refusal
			}
			return nil
		}
		for _, door := range doors {
			r := h.post(door.path, door.body, headerSession, "sess_r")
			name := fmt.Sprintf("%s %s", door.path, tc.code)
			if r.code != tc.status || r.header.Get("Retry-After") != tc.retryAfter {
				t.Errorf("%s: %d Retry-After %q: %s", name, r.code, r.header.Get("Retry-After"), r.body)
				continue
			}
			out := r.json(t)
			switch door.path {
			case "/v1/chat/completions":
				e := r.openAIError(t)
				if e["type"] != tc.typ || e["code"] != tc.code || (tc.at != "" && e["param"] != tc.at) || e["message"] == "" {
					t.Errorf("%s: %s", name, r.body)
				}
			case "/api/chat":
				if msg, _ := out["error"].(string); len(out) != 1 || msg == "" {
					t.Errorf("%s: %s", name, r.body)
				}
			default:
				if e, _ := out["error"].(map[string]any); e["code"] != tc.code || e["message"] == "" {
					t.Errorf("%s: %s", name, r.body)
				}
			}
		}
		if n := len(h.model.Requests()); n != 0 {
			t.Errorf("%s: the model was asked %d times", tc.code, n)
		}
	}
}

// A run that cannot end with an answer says why, OpenAI's way, the conversation so far on the
// record of the session: the model failing or refusing what it was sent, an answer the loop
// cannot take, too many turns, calls refused too often, the caller over its budget, a turn or a
// decision refused, the bus away.
func TestRunFailures(t *testing.T) {
	calls := func(n int, name string) []scriptedllm.ToolCall {
		var out []scriptedllm.ToolCall
		for i := range n {
			out = append(out, call(fmt.Sprintf("c%d", i), name, map[string]any{"text": "x"}))
		}
		return out
	}
	keepCalling := conversation(scriptedllm.Turn{ToolCalls: calls(1, "echo")}, scriptedllm.Turn{ToolCalls: calls(1, "echo")})
	decisionRefused := func(_ *Config, e *Env) {
		e.Admit = &fakeAdmitter{refuse: func(ask admission.Ask) error {
			if ask.Mode == admission.NoSession {
				return refusal(http.StatusServiceUnavailable, protocol.CodeStoreFull, 30)
			}
			return nil
		}}
	}
	turnRefused := func(_ *Config, e *Env) {
		e.Admit = &fakeAdmitter{refuse: func(ask admission.Ask) error {
			if ask.WaitRate {
				return refusal(http.StatusTooManyRequests, protocol.CodeRateLimited, 2)
			}
			return nil
		}}
	}
	submitFails := func(err error) func(*Config, *Env) {
		return func(_ *Config, e *Env) {
			e.Submit = &fakeSubmitter{answer: func(context.Context, submit.Submission) (*submit.Outcome, error) { return nil, err }}
		}
	}
	for _, tc := range []struct {
		name   string
		script *scriptedllm.Script
		tweak  func(*Config, *Env)
		body   string
		status int
		code   string
	}{
		{"model down", conversation(scriptedllm.Turn{Status: 503, Message: "overloaded"}), nil, "", http.StatusBadGateway, "llm_unavailable"},
		{"model over its rate", conversation(scriptedllm.Turn{Status: 429, Message: "slow down"}), nil, "", http.StatusBadGateway, "llm_unavailable"},
		{"model answers what is not JSON", conversation(scriptedllm.Turn{Raw: `{"choices":[{"message":`}), nil, "", http.StatusBadGateway, "llm_unavailable"},
		{"model refuses the conversation", conversation(scriptedllm.Turn{Status: 400, Message: "context too long"}), nil, "", http.StatusBadRequest, "llm_refused"},
		{"too many calls in a turn", conversation(scriptedllm.Turn{ToolCalls: calls(129, "echo")}), nil, "", http.StatusBadGateway, "llm_answer_refused"},
		{"too many turns", keepCalling, nil, `"max_turns":2`, http.StatusUnprocessableEntity, "max_turns_exceeded"},
		{"calls refused too often", conversation(scriptedllm.Turn{ToolCalls: calls(1, "nope")}, scriptedllm.Turn{ToolCalls: calls(1, "nope")}),
			func(c *Config, _ *Env) { c.MaxCorrections = 1 }, "", http.StatusUnprocessableEntity, "tool_calls_refused"},
		{"over budget", keepCalling, submitFails(fmt.Errorf("%w: 10 bytes over", submit.ErrOverBudget)), "", http.StatusTooManyRequests, protocol.CodeRateLimited},
		{"bus away", keepCalling, submitFails(submit.ErrUnavailable), "", http.StatusServiceUnavailable, protocol.CodeBusUnavailable},
		{"turn refused", keepCalling, turnRefused, "", http.StatusTooManyRequests, protocol.CodeRateLimited},
		{"decision refused", keepCalling, decisionRefused, "", http.StatusServiceUnavailable, protocol.CodeStoreFull},
		{"decision not published", keepCalling, func(_ *Config, e *Env) { e.Publisher = &fakePublisher{err: errors.New("no ack")} }, "",
			http.StatusServiceUnavailable, protocol.CodeBusUnavailable},
	} {
		h := newHarness(t, tc.script, tc.tweak)
		extra := ""
		if tc.body != "" {
			extra = "," + tc.body
		}
		r := h.post("/v1/chat/completions", `{"model":"scripted","messages":[{"role":"user","content":"x"}]`+extra+`}`, headerSession, "sess_f")
		e := r.openAIError(t)
		if r.code != tc.status || e["code"] != tc.code || !strings.Contains(fmt.Sprint(e["message"]), "sess_f") {
			t.Errorf("%s: %d %s", tc.name, r.code, r.body)
		}
	}
}

// What the run reads before the model is asked — the session's state, the tools — failing is
// the bus away: 503, retry.
func TestRunCannotReadItsState(t *testing.T) {
	for name, tweak := range map[string]func(*Config, *Env){
		"state": func(_ *Config, e *Env) { kv := bustest.NewMemKV(); kv.Err = bustest.ErrUnreachable; e.Sessions = kv },
		"tools": func(_ *Config, e *Env) { e.Contracts = &fakeContracts{err: errors.New("registry away")} },
	} {
		h := newHarness(t, echoThenAnswer(), tweak)
		r := h.post("/v1/chat/completions", `{"model":"scripted","messages":[{"role":"user","content":"x"}]}`, headerSession, "sess_x")
		if e := r.openAIError(t); r.code != http.StatusServiceUnavailable || e["code"] != protocol.CodeBusUnavailable || !strings.Contains(e["message"].(string), name) {
			t.Errorf("%s: %d %s", name, r.code, r.body)
		}
		if n := len(h.model.Requests()); n != 0 {
			t.Errorf("%s: the model was asked", name)
		}
	}
}

// Calls the model makes that its tools' contracts refuse (a required argument missing,
// arguments not an object, a tool not offered) are not dispatched: they go back to the model
// as errors it can correct, and the decision warns of each.
func TestRefusedCallsGoBackToTheModel(t *testing.T) {
	h := newHarness(t, conversation(
		scriptedllm.Turn{ToolCalls: []scriptedllm.ToolCall{call("c_missing", "echo", map[string]any{}),
			{ID: "c_list", Name: "echo", ArgumentsRaw: `[1]`}, call("c_unknown", "nope", nil)}},
		scriptedllm.Turn{Content: "sorry"}), nil)
	r := h.post("/v1/chat/completions", `{"model":"scripted","messages":[{"role":"user","content":"x"}]}`)
	if r.code != http.StatusOK || len(h.sub.submitted()) != 0 {
		t.Fatalf("%d %s; %d requests", r.code, r.body, len(h.sub.submitted()))
	}
	var kinds []string
	for _, w := range h.pub.published()[0].Warnings {
		kinds = append(kinds, w.CallID+":"+string(w.Kind))
	}
	if got := strings.Join(kinds, " "); got != fmt.Sprintf("c_missing:%s c_list:%s c_unknown:%s", protocol.WarnMissingArgument, protocol.WarnNotJSON, protocol.WarnUnknownTool) {
		t.Errorf("warnings %s", got)
	}
	reqs := h.model.Requests()
	for _, m := range reqs[1].Messages[2:] {
		if m.Role != "tool" || !strings.Contains(m.Text(), protocol.CodeBadArguments) {
			t.Errorf("the model read %s %s", m.Role, m.Text())
		}
	}
}

// blockingSubmitter holds each turn's request until its context ends, then answers as Submit
// does: the wait ran out (pending), or the caller went away.
func blockingSubmitter(started chan<- struct{}, pending bool) *fakeSubmitter {
	return &fakeSubmitter{answer: func(ctx context.Context, sub submit.Submission) (*submit.Outcome, error) {
		close(started)
		<-ctx.Done()
		if pending {
			return &submit.Outcome{Pending: true}, nil
		}
		return nil, ctx.Err()
	}}
}

// A client that goes away while a turn runs cancels the turn's request on the bus, saying so,
// and the run ends (499).
func TestClientGoesAway(t *testing.T) {
	started := make(chan struct{})
	sub := blockingSubmitter(started, false)
	h := newHarness(t, echoThenAnswer(), func(_ *Config, e *Env) { e.Submit = sub })
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan reply, 1)
	go func() {
		done <- h.do(ctx, http.MethodPost, "/v1/chat/completions", `{"model":"scripted","messages":[{"role":"user","content":"x"}]}`, headerSession, "sess_g")
	}()
	<-started
	cancel()
	r := <-done
	run := r.header.Get("X-Hermes-Run-ID")
	if e := r.openAIError(t); r.code != 499 || e["code"] != protocol.CodeCancelled {
		t.Errorf("%d %s", r.code, r.body)
	}
	if cs := sub.cancelled(); len(cs) != 1 || cs[0].requestID != run+"-1" || cs[0].c.Reason != "the client went away" || cs[0].c.By != "chat run "+run {
		t.Errorf("cancelled %+v", cs)
	}
}

// A turn still running when the run's deadline passes is cancelled on the bus, and the client
// is told (504, naming the deadline). The turn waits no longer than the run has left.
func TestTurnPendingPastTheDeadline(t *testing.T) {
	started := make(chan struct{})
	sub := blockingSubmitter(started, true)
	h := newHarness(t, echoThenAnswer(), func(c *Config, e *Env) { c.RunTimeout = time.Second; e.Submit = sub })
	r := h.post("/v1/chat/completions", `{"model":"scripted","messages":[{"role":"user","content":"x"}]}`, headerSession, "sess_d")
	run := r.header.Get("X-Hermes-Run-ID")
	if e := r.openAIError(t); r.code != http.StatusGatewayTimeout || e["code"] != protocol.CodeTimeout || !strings.Contains(e["message"].(string), "1s") {
		t.Errorf("%d %s", r.code, r.body)
	}
	if cs := sub.cancelled(); len(cs) != 1 || cs[0].requestID != run+"-1" || cs[0].c.Reason != "the run's deadline passed" {
		t.Errorf("cancelled %+v", cs)
	}
	if subs := sub.submitted(); len(subs) != 1 || subs[0].Wait <= 0 || subs[0].Wait > time.Second {
		t.Errorf("the turn waited %v", subs[0].Wait)
	}
}

// A turn waits for its results at most Env.MaxWait, and never past the run's deadline; one whose
// wait runs out is cancelled.
func TestTurnWaitsAtMostMaxWait(t *testing.T) {
	sub := &fakeSubmitter{answer: func(context.Context, submit.Submission) (*submit.Outcome, error) {
		return &submit.Outcome{Pending: true}, nil
	}}
	h := newHarness(t, echoThenAnswer(), func(c *Config, e *Env) { c.RunTimeout = time.Hour; e.MaxWait = time.Second; e.Submit = sub })
	r := h.post("/v1/chat/completions", `{"model":"scripted","messages":[{"role":"user","content":"x"}]}`, headerSession, "sess_w")
	if subs := sub.submitted(); len(subs) != 1 || subs[0].Wait > time.Second {
		t.Errorf("the turn's wait is %v, past Env.MaxWait (1s)", subs[0].Wait)
	}
	if cs := sub.cancelled(); len(cs) != 1 || r.code != http.StatusGatewayTimeout || !strings.Contains(string(r.body), protocol.CodeTimeout) {
		t.Errorf("a turn whose wait ran out: %d %s; cancelled %+v", r.code, r.body, cs)
	}
}

// A turn whose wait, cut to the run's deadline, runs out a moment before the deadline itself
// (the submitter's timer and the run's context are two clocks) ended the run by its deadline:
// the client is told so, and so is the record, not that the turn's own wait ran out.
func TestTurnWaitCutToTheDeadline(t *testing.T) {
	sub := &fakeSubmitter{answer: func(context.Context, submit.Submission) (*submit.Outcome, error) {
		return &submit.Outcome{Pending: true}, nil
	}}
	h := newHarness(t, echoThenAnswer(), func(c *Config, e *Env) { c.RunTimeout = 2 * time.Second; e.MaxWait = time.Hour; e.Submit = sub })
	r := h.post("/v1/chat/completions", `{"model":"scripted","messages":[{"role":"user","content":"x"}]}`, headerSession, "sess_cut")
	if e := r.openAIError(t); r.code != http.StatusGatewayTimeout || !strings.Contains(e["message"].(string), "within 2s") {
		t.Errorf("%d %s", r.code, r.body)
	}
	if cs := sub.cancelled(); len(cs) != 1 || cs[0].c.Reason != "the run's deadline passed" {
		t.Errorf("cancelled %+v", cs)
	}
}

// A session that is not the caller's is refused naming the field the client named it in: the
// header, metadata.hermes_session_id, or /v1/chat's session_id.
func TestSessionRefusalNamesTheFieldSent(t *testing.T) {
	h := newHarness(t, echoThenAnswer(), nil)
	h.adm.refuse = func(ask admission.Ask) error { return admission.NoSuchSession(ask.Session) }
	for _, tc := range []struct {
		path, body, header, field string
	}{
		{"/v1/chat/completions", `{"model":"scripted","messages":[{"role":"user","content":"x"}]}`, "theirs", headerSession},
		{"/v1/chat/completions", `{"model":"scripted","messages":[{"role":"user","content":"x"}],"metadata":{"hermes_session_id":"theirs"}}`, "", "metadata.hermes_session_id"},
		{"/v1/chat", `{"session_id":"theirs","message":"x"}`, "", "session_id"},
	} {
		var headers []string
		if tc.header != "" {
			headers = []string{headerSession, tc.header}
		}
		r := h.post(tc.path, tc.body, headers...)
		e, _ := r.json(t)["error"].(map[string]any)
		field := e["param"]
		if tc.path == "/v1/chat" {
			field = e["field"]
		}
		if r.code != http.StatusNotFound || field != tc.field {
			t.Errorf("%s %s: %d %s, want the field %s", tc.path, tc.body, r.code, r.body, tc.field)
		}
	}
}

func TestNewRequiresWhatTheDoorsWorkWith(t *testing.T) {
	if _, err := New(Config{}, Env{}); err == nil {
		t.Error("made without a model or an Env")
	}
}
