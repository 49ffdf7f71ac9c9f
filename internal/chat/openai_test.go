package chat

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/scriptedllm"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// A POST to /v1/chat/completions runs the loop: the model's call of a registered tool is one
// request of the session, its decision recorded first; the answer is a chat.completion with the
// usage and what Hermes ran; the session's state keeps what the client has seen.
func TestOpenAIRunsTheLoop(t *testing.T) {
	h := newHarness(t, echoThenAnswer(), nil)
	r := h.post("/v1/chat/completions", `{"model":"scripted","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"say hi"}]}`,
		headerSession, "sess_a")
	if r.code != http.StatusOK {
		t.Fatalf("%d %s", r.code, r.body)
	}
	run := r.header.Get("X-Hermes-Run-ID")
	if !strings.HasPrefix(run, "chat-") || r.header.Get(headerSession) != "sess_a" {
		t.Fatalf("headers %v", r.header)
	}
	body := r.json(t)
	choice := body["choices"].([]any)[0].(map[string]any)
	msg := choice["message"].(map[string]any)
	usage := body["usage"].(map[string]any)
	if body["id"] != run || body["object"] != "chat.completion" || body["model"] != "scripted" || msg["content"] != "echoed hi" ||
		msg["role"] != "assistant" || choice["finish_reason"] != "stop" || usage["total_tokens"].(float64) == 0 {
		t.Fatalf("%s", r.body)
	}
	hermes := body["hermes"].(map[string]any)
	calls := hermes["calls"].([]any)
	if hermes["session_id"] != "sess_a" || hermes["run_id"] != run || hermes["turns"] != 2.0 || len(calls) != 1 {
		t.Fatalf("hermes %v", hermes)
	}
	if c := calls[0].(map[string]any); c["request_id"] != run+"-1" || c["tool_call_id"] != "call_e" || c["name"] != "echo" || c["status"] != "ok" ||
		c["execution_time_ms"] != 3.0 || c["error_code"] != nil {
		t.Errorf("call %v", c)
	}

	// One request for the turn that called a tool, as the turn's request id, in the session.
	subs := h.sub.submitted()
	if len(subs) != 1 {
		t.Fatalf("%d requests submitted", len(subs))
	}
	req := subs[0].Request
	if req.RequestID != run+"-1" || req.SessionID != "sess_a" || req.Intent != "say hi" || len(req.ToolCalls) != 1 ||
		req.ToolCalls[0].Name != "echo" || string(req.ToolCalls[0].Arguments) != `{"text":"hi"}` || subs[0].Trace.TraceID != run || subs[0].Wait <= 0 {
		t.Errorf("submitted %+v %+v", subs[0], req)
	}
	// Each turn's decision, on the session's LLM subject, the first with the person's input.
	ds := h.pub.published()
	if len(ds) != 2 || ds[0].Run != run || ds[0].Turn != 1 || ds[0].Input != "say hi" || len(ds[0].Chosen) != 1 || ds[0].Chosen[0].Name != "echo" ||
		ds[1].Answer != "echoed hi" || ds[1].Turn != 2 || ds[0].Model != "scripted" {
		t.Fatalf("decisions %+v", ds)
	}
	if got := h.pub.recorded(); got != "system:,user:,assistant:,tool:call_e" {
		t.Errorf("recorded %s", got)
	}
	for i, m := range h.pub.msgs {
		if h.pub.subjects[i] != protocol.SubjectEvent(protocol.EventLLM, "sess_a") || m.MsgID != protocol.MsgIDLLMDecision(run, i+1) ||
			m.RequestID != fmt.Sprintf("%s-%d", run, i+1) || m.SessionID != "sess_a" {
			t.Errorf("decision %d as %s: %+v", i+1, h.pub.subjects[i], m)
		}
	}
	// Asked of admission: the POST (holding a waiting request, the store checked), each
	// decision (counted, then part of an accepted run once a turn dispatched), the turn.
	var shape []string
	for _, a := range h.adm.asked() {
		switch {
		case a.Hold == admission.HoldWaiting:
			shape = append(shape, fmt.Sprintf("post(%s,%d,%s)", a.Session, a.Store, a.Need))
		case a.Mode == admission.NoSession:
			shape = append(shape, fmt.Sprintf("decision(%d)", a.Store))
		case a.WaitRate:
			shape = append(shape, "turn("+a.Session+")")
		}
	}
	want := fmt.Sprintf("post(sess_a,%d,%s) decision(%d) turn(sess_a) decision(%d)", admission.StoreCheck, auth.PermSubmit, admission.StoreCount, admission.StoreAccepted)
	if strings.Join(shape, " ") != want {
		t.Errorf("asked %s\nwant  %s", strings.Join(shape, " "), want)
	}
	// The session's state: the digests of what the client has seen, its messages and the answer.
	var st chatState
	if err := json.Unmarshal(h.kv.Value(chatKey("sess_a")), &st); err != nil || len(st.Seen) != 3 {
		t.Errorf("state %s: %v", h.kv.Value(chatKey("sess_a")), err)
	}
	// The model was offered the registered tools whose arguments are objects.
	offered := h.model.Requests()[0].Tools
	if len(offered) != 2 || offered[0].Function.Name != "echo" || offered[1].Function.Name != "weather_search" {
		t.Errorf("offered %+v", offered)
	}
}

// A POST that names no session runs in one of its own, which keeps no state; "hermes" names
// the model too.
func TestOpenAIUnnamedSessionKeepsNoState(t *testing.T) {
	h := newHarness(t, conversation(scriptedllm.Turn{Content: "hello"}), nil)
	r := h.post("/v1/chat/completions", `{"model":"hermes","messages":[{"role":"user","content":"hi"}]}`)
	if r.code != http.StatusOK || r.header.Get(headerSession) != r.header.Get("X-Hermes-Run-ID") {
		t.Fatalf("%d %v %s", r.code, r.header, r.body)
	}
	if keys := h.kv.Keys(); len(keys) != 0 {
		t.Errorf("kept %v", keys)
	}
}

func TestModelsAndTags(t *testing.T) {
	h := newHarness(t, echoThenAnswer(), nil)
	var ids []string
	for _, m := range h.do(t.Context(), http.MethodGet, "/v1/models", "").json(t)["data"].([]any) {
		m := m.(map[string]any)
		if m["object"] != "model" || m["owned_by"] != "hermes" {
			t.Errorf("%v", m)
		}
		ids = append(ids, m["id"].(string))
	}
	var names []string
	for _, m := range h.do(t.Context(), http.MethodGet, "/api/tags", "").json(t)["models"].([]any) {
		m := m.(map[string]any)
		if m["name"] != m["model"] || m["details"].(map[string]any)["family"] != "hermes" {
			t.Errorf("%v", m)
		}
		names = append(names, m["name"].(string))
	}
	if fmt.Sprint(ids) != "[scripted hermes]" || fmt.Sprint(names) != "[scripted hermes]" {
		t.Errorf("models %v, tags %v", ids, names)
	}
	// A server whose model is named "hermes" (or not named) lists it once.
	alias := newHarness(t, echoThenAnswer(), func(c *Config, _ *Env) { c.Model = "" })
	if data := alias.do(t.Context(), http.MethodGet, "/v1/models", "").json(t)["data"].([]any); len(data) != 1 || data[0].(map[string]any)["id"] != "hermes" {
		t.Errorf("%v", data)
	}
}

// Every request refused names the field at fault, OpenAI's way: 400 invalid_request_error with
// "param", its message beginning with it; nothing is admitted and the model is never asked.
func TestOpenAIRefusalsNameTheParam(t *testing.T) {
	h := newHarness(t, echoThenAnswer(), nil)
	user := `{"role":"user","content":"x"}`
	withMsgs := func(msgs string) string { return `{"model":"scripted","messages":[` + msgs + `]}` }
	with := func(extra string) string { return `{"model":"scripted","messages":[` + user + `],` + extra + `}` }
	many := func(n int, one string) string { return strings.TrimSuffix(strings.Repeat(one+",", n), ",") }
	for _, tc := range []struct {
		body    string
		headers []string
		param   string
	}{
		{body: `{"messages":[` + user + `]}`, param: "model"},
		{body: `{"model":"  ","messages":[` + user + `]}`, param: "model"},
		{body: `{"model":"scripted"}`, param: "messages"},
		{body: `{"model":"scripted","messages":"hi"}`, param: "messages"},
		{body: withMsgs(many(maxChatMessages+1, user)), param: "messages"},
		{body: withMsgs(`"hi"`), param: "messages[0]"},
		{body: withMsgs(`{"content":"x"}`), param: "messages[0].role"},
		{body: withMsgs(`{"role":"robot","content":"x"}`), param: "messages[0].role"},
		{body: withMsgs(`{"role":"user","content":"x","name":5}`), param: "messages[0].name"},
		{body: withMsgs(`{"role":"user","content":7}`), param: "messages[0].content"},
		{body: withMsgs(`{"role":"user","content":[{"type":"image_url"}]}`), param: "messages[0].content[0].type"},
		{body: withMsgs(`{"role":"system"}`), param: "messages[0].content"},
		{body: withMsgs(`{"role":"assistant"}`), param: "messages[0].content"},
		{body: withMsgs(`{"role":"assistant","tool_calls":[{"id":"a","type":"web","function":{"name":"t"}}]}`), param: "messages[0].tool_calls[0].type"},
		{body: withMsgs(`{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"no spaces"}}]}`), param: "messages[0].tool_calls[0].function.name"},
		{body: withMsgs(user + `,{"role":"tool","content":"r"}`), param: "messages[1].tool_call_id"},
		{body: withMsgs(user + `,{"role":"tool","content":"r","tool_call_id":"nope"}`), param: "messages[1].tool_call_id"},
		{body: with(`"tools":[1]`), param: "tools[0]"},
		{body: with(`"tools":[{"type":"web"}]`), param: "tools[0].type"},
		{body: with(`"tools":[{"type":"function"}]`), param: "tools[0].function"},
		{body: with(`"tools":[{"type":"function","function":{"name":"has space"}}]`), param: "tools[0].function.name"},
		{body: with(`"tools":[` + many(maxChatTools+1, `{"type":"function","function":{"name":"t"}}`) + `]`), param: "tools"},
		{body: with(`"tool_choice":"required"`), param: "tool_choice"},
		{body: with(`"tool_choice":{"type":"function","function":{"name":"echo"}}`), param: "tool_choice"},
		{body: with(`"max_turns":0`), param: "max_turns"},
		{body: with(fmt.Sprintf(`"max_turns":%d`, maxChatTurns+1)), param: "max_turns"},
		{body: with(`"temperature":"hot"`), param: "temperature"},
		{body: with(`"temperature":2.5`), param: "temperature"},
		{body: with(`"top_p":-0.1`), param: "top_p"},
		{body: with(`"max_tokens":0`), param: "max_tokens"},
		{body: with(`"max_completion_tokens":-1`), param: "max_completion_tokens"},
		{body: with(`"n":2`), param: "n"},
		{body: with(`"stop":["a","b","c","d","e"]`), param: "stop"},
		{body: with(`"stream":"yes"`), param: "stream"},
		{body: with(`"metadata":{"hermes_session_id":"bad.one"}`), param: "metadata.hermes_session_id"},
		{body: with(`"metadata":{"hermes_session_id":"sess_b"}`), headers: []string{headerSession, "sess_a"}, param: "metadata.hermes_session_id"},
		{body: with(`"metadata":{"hermes_session_id":"sandbox-x"}`), param: "metadata.hermes_session_id"},
		{body: with(`"seed":1`), headers: []string{headerSession, "bad.session"}, param: headerSession},
		{body: with(`"seed":1`), headers: []string{headerSession, protocol.SandboxSessionPrefix + "x"}, param: headerSession},
		{body: with(`"seed":1`), headers: []string{headerIdemKey, "has space"}, param: headerIdemKey},
		{body: with(`"seed":1`), headers: []string{"X-Trace-ID", "has space"}, param: "X-Trace-ID"},
		{body: with(`"seed":1`), headers: []string{admission.HeaderUser, "-alice"}, param: admission.HeaderUser},
		{body: `[1]`},
		{body: `{"model":"scripted","messages":[` + user + `]} {}`},
	} {
		r := h.post("/v1/chat/completions", tc.body, tc.headers...)
		e := r.openAIError(t)
		msg, _ := e["message"].(string)
		param, _ := e["param"].(string)
		if r.code != http.StatusBadRequest || e["type"] != "invalid_request_error" || param != tc.param || msg == "" ||
			(tc.param != "" && !strings.Contains(msg, tc.param)) || (tc.param == "" && e["param"] != nil) {
			t.Errorf("%.120s %v: %d %s", tc.body, tc.headers, r.code, r.body)
		}
	}
	if n := len(h.model.Requests()); n != 0 || len(h.adm.asked()) != 0 {
		t.Errorf("the model was asked %d times, admission %d", n, len(h.adm.asked()))
	}
}

// A model not served here is 404 model_not_found, naming where the models are listed.
func TestOpenAIUnknownModel(t *testing.T) {
	h := newHarness(t, echoThenAnswer(), nil)
	r := h.post("/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`)
	e := r.openAIError(t)
	if r.code != http.StatusNotFound || e["code"] != "model_not_found" || e["param"] != "model" || !strings.Contains(e["message"].(string), "GET /v1/models") {
		t.Errorf("%d %s", r.code, r.body)
	}
}

func TestOpenAIBodyTooLarge(t *testing.T) {
	h := newHarness(t, echoThenAnswer(), func(_ *Config, e *Env) { e.MaxBodyBytes = 64 })
	r := h.post("/v1/chat/completions", `{"model":"scripted","messages":[{"role":"user","content":"`+strings.Repeat("x", 100)+`"}]}`)
	if e := r.openAIError(t); r.code != http.StatusRequestEntityTooLarge || !strings.Contains(e["message"].(string), "64 bytes") {
		t.Errorf("%d %s", r.code, r.body)
	}
}

// What the client sets for the model is decoded into its parameters: sampling, bounds, stop
// sequences, tool_choice "none" (the model is offered no tool), streaming with usage.
func TestOpenAIRequestParams(t *testing.T) {
	req, err := decodeChatRequest([]byte(`{"model":"m","messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
		{"role":"user","content":"x"}],"temperature":0.5,"top_p":0.9,"max_tokens":10,"max_completion_tokens":20,"seed":7,"stop":"END",
		"tool_choice":"none","stream":true,"stream_options":{"include_usage":true},"max_turns":3,"n":1,"metadata":{"hermes_session_id":"s1"}}`))
	if err != nil {
		t.Fatal(err)
	}
	p := req.Params
	if p.Temperature.Value != 0.5 || p.TopP.Value != 0.9 || p.MaxTokens.Value != 10 || p.MaxCompletionTokens.Value != 20 || p.Seed.Value != 7 ||
		p.Stop.OfString.Value != "END" || !req.NoTools || !req.Stream || !req.IncludeUsage || req.MaxTurns != 3 || req.Session != "s1" ||
		req.Messages[0].Content != "ab" {
		t.Errorf("%+v", req)
	}
	if req, err = decodeChatRequest([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"stop":["a","b"],"tool_choice":"auto"}`)); err != nil ||
		len(req.Params.Stop.OfStringArray) != 2 || req.NoTools {
		t.Errorf("%v %+v", err, req)
	}

	h := newHarness(t, conversation(scriptedllm.Turn{Content: "no tools"}), nil)
	if r := h.post("/v1/chat/completions", `{"model":"scripted","tool_choice":"none","messages":[{"role":"user","content":"x"}],"temperature":0}`); r.code != http.StatusOK {
		t.Fatalf("%d %s", r.code, r.body)
	}
	if tools := h.model.Requests()[0].Tools; len(tools) != 0 {
		t.Errorf("offered %+v", tools)
	}
}

// The client's own tools are offered beside the registered ones; one named as a registered tool
// is the client's, and its call goes back to the client.
func TestOpenAIClientToolShadowsARegisteredOne(t *testing.T) {
	h := newHarness(t, conversation(scriptedllm.Turn{ToolCalls: []scriptedllm.ToolCall{call("call_c", "echo", map[string]any{"text": "mine"})}}), nil)
	r := h.post("/v1/chat/completions", `{"model":"scripted","messages":[{"role":"user","content":"x"}],
		"tools":[{"type":"function","function":{"name":"echo","description":"the client's","parameters":{"type":"object"}}}]}`)
	msg := r.json(t)["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	if r.code != http.StatusOK || msg["content"] != nil || len(msg["tool_calls"].([]any)) != 1 || len(h.sub.submitted()) != 0 {
		t.Fatalf("%d %s", r.code, r.body)
	}
	offered := h.model.Requests()[0].Tools
	if len(offered) != 2 || offered[0].Function.Description != "the client's" || offered[1].Function.Name != "weather_search" {
		t.Errorf("offered %+v", offered)
	}
}
