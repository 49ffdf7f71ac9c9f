package protocol

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestValidToken(t *testing.T) {
	cases := []struct {
		in   string
		want bool
	}{
		{"req_abc123", true}, {"A-b_9", true}, {"", false}, {"*", false}, {">", false},
		{"a.b", false}, {"a b", false}, {"a\x00", false}, {"ü", false},
		{strings.Repeat("a", MaxIDLen), true}, {strings.Repeat("a", MaxIDLen+1), false},
	}
	for _, c := range cases {
		if got := ValidToken(c.in, MaxIDLen); got != c.want {
			t.Errorf("ValidToken(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestDecodeRequestJSONErrorsNameTheField(t *testing.T) {
	cases := []struct {
		name, body, want string
	}{
		{"not json", `{"request_id":`, "invalid JSON"},
		{"not object", `[1]`, "must be a JSON object, got an array"},
		{"empty", ``, "body is empty"},
		{"missing request_id", `{"tool_calls":[{"tool_call_id":"c","name":"t"}]}`, "request_id is required"},
		{"request_id type", `{"request_id":5,"tool_calls":[]}`, "request_id must be a string, got a number"},
		{"reserved id", `{"request_id":"-","tool_calls":[{"tool_call_id":"c","name":"t"}]}`, `request_id "-" is reserved`},
		{"wildcard id", `{"request_id":"a.*","tool_calls":[{"tool_call_id":"c","name":"t"}]}`, "request_id must hold only letters"},
		{"long id", `{"request_id":"` + strings.Repeat("x", 200) + `","tool_calls":[{"tool_call_id":"c","name":"t"}]}`, "request_id is 200 bytes long"},
		{"bad session", `{"request_id":"r","session_id":"s>","tool_calls":[{"tool_call_id":"c","name":"t"}]}`, "session_id must hold only"},
		{"unknown field", `{"request_id":"r","tool_call":[]}`, `tool_call is not a known field`},
		{"missing calls", `{"request_id":"r"}`, "tool_calls is required"},
		{"calls not array", `{"request_id":"r","tool_calls":{}}`, "tool_calls must be an array"},
		{"no calls", `{"request_id":"r","tool_calls":[]}`, "tool_calls must hold at least one call"},
		{"call id missing", `{"request_id":"r","tool_calls":[{"tool_call_id":"a","name":"t"},{"name":"t"}]}`, "tool_calls[1].tool_call_id is required"},
		{"call not object", `{"request_id":"r","tool_calls":["x"]}`, "tool_calls[0] must be an object, got a string"},
		{"duplicate call id", `{"request_id":"r","tool_calls":[{"tool_call_id":"a","name":"t"},{"tool_call_id":"a","name":"t"}]}`, `tool_calls[1].tool_call_id "a" repeats tool_calls[0]`},
		{"name type", `{"request_id":"r","tool_calls":[{"tool_call_id":"a","name":1}]}`, "tool_calls[0].name must be a string"},
		{"bad name", `{"request_id":"r","tool_calls":[{"tool_call_id":"a","name":"x.y"}]}`, "tool_calls[0].name must hold only"},
		{"arguments string", `{"request_id":"r","tool_calls":[{"tool_call_id":"a","name":"t","arguments":"{}"}]}`, "tool_calls[0].arguments must be a JSON object, got a string"},
		{"call unknown field", `{"request_id":"r","tool_calls":[{"tool_call_id":"a","name":"t","args":{}}]}`, "tool_calls[0].args is not a known field"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeRequestJSON([]byte(c.body), Limits{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v, want it to contain %q", err, c.want)
			}
		})
	}
}

func TestDecodeRequestJSONLimits(t *testing.T) {
	body := `{"request_id":"r","tool_calls":[{"tool_call_id":"a","name":"t"},{"tool_call_id":"b","name":"t"}]}`
	_, err := DecodeRequestJSON([]byte(body), Limits{MaxToolCalls: 1})
	if err == nil || !strings.Contains(err.Error(), "tool_calls holds 2 calls; the limit is 1") {
		t.Fatalf("error = %v", err)
	}
	body = `{"request_id":"r","tool_calls":[{"tool_call_id":"a","name":"t","arguments":{"x":"0123456789"}}]}`
	_, err = DecodeRequestJSON([]byte(body), Limits{MaxArgumentsBytes: 8})
	if err == nil || !strings.Contains(err.Error(), "tool_calls[0].arguments are 18 bytes long") {
		t.Fatalf("error = %v", err)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("limit error %v is not ErrInvalid", err)
	}
}

func TestRequestRoundTripKeepsArgumentsExact(t *testing.T) {
	body := `{"request_id":"req_1","session_id":"s1","intent":"查询","tool_calls":[
		{"tool_call_id":"call_0","name":"echo","arguments":{"big": 9007199254740993, "f": 1.10, "z": "ü", "a": [1, {"b": null}]}},
		{"tool_call_id":"call_1","name":"echo"}]}`
	r, err := DecodeRequestJSON([]byte(body), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(r.ToolCalls[0].Arguments), `{"big":9007199254740993,"f":1.10,"z":"ü","a":[1,{"b":null}]}`; got != want {
		t.Fatalf("arguments = %s, want %s", got, want)
	}
	if string(r.ToolCalls[1].Arguments) != "{}" {
		t.Fatalf("missing arguments = %s, want {}", r.ToolCalls[1].Arguments)
	}
	m, err := NewMessage(TypeRequest, r)
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = MsgIDRequest(r.RequestID), r.RequestID, r.Session()
	b, err := Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := m2.DecodeRequest(Limits{})
	if err != nil {
		t.Fatal(err)
	}
	j1, _ := json.Marshal(r)
	j2, _ := json.Marshal(r2)
	if string(j1) != string(j2) {
		t.Fatalf("round trip changed the request:\n%s\n%s", j1, j2)
	}
}

func TestCheckMsgpackRejectsHostileHeaders(t *testing.T) {
	cases := map[string][]byte{
		"empty":            {},
		"bin32 huge":       {0xc6, 0xff, 0xff, 0xff, 0xff},
		"array32 huge":     {0xdd, 0xff, 0xff, 0xff, 0xff, 0x01},
		"map32 huge":       {0xdf, 0xff, 0xff, 0xff, 0xff},
		"str32 huge":       {0xdb, 0x7f, 0xff, 0xff, 0xff, 'a'},
		"ext32 huge":       {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01},
		"reserved":         {0xc1},
		"trailing":         {0x01, 0x02},
		"truncated header": {0xdc, 0x00},
		"truncated float":  {0xcb, 0x00, 0x00},
		"too deep":         []byte(strings.Repeat("\x91", MaxDepth+1) + "\x00"),
	}
	for name, data := range cases {
		if err := CheckMsgpack(data, MaxDepth); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: CheckMsgpack = %v, want ErrMalformed", name, err)
		}
		if _, err := Unmarshal(data); err == nil {
			t.Errorf("%s: Unmarshal accepted hostile bytes", name)
		}
	}
	if err := CheckMsgpack([]byte(strings.Repeat("\x91", MaxDepth-1)+"\x00"), MaxDepth); err != nil {
		t.Errorf("nesting within the bound rejected: %v", err)
	}
}

func TestUnmarshalRejectsUnsafeEnvelope(t *testing.T) {
	for name, mutate := range map[string]func(*Message){
		"wildcard session": func(m *Message) { m.SessionID = "*" },
		"dotted request":   func(m *Message) { m.RequestID = "a.b" },
		"unknown type":     func(m *Message) { m.Type = "request.v9" },
		"future schema":    func(m *Message) { m.SchemaVersion = SchemaVersion + 1 },
		"no msg id":        func(m *Message) { m.MsgID = "" },
	} {
		m, _ := NewMessage(TypeToolResult, &ToolResult{ToolCallID: "c", Status: ResultOK})
		m.MsgID, m.RequestID, m.SessionID = "x", "r", "s"
		mutate(m)
		b, err := Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Unmarshal(b); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Unmarshal = %v, want ErrInvalid", name, err)
		}
	}
}

func TestResponseStatus(t *testing.T) {
	ok, bad := ToolResult{Status: ResultOK}, ToolResult{Status: ResultError}
	for _, c := range []struct {
		in   []ToolResult
		want string
	}{
		{[]ToolResult{ok, ok}, StatusSuccess},
		{[]ToolResult{ok, bad}, StatusPartialSuccess},
		{[]ToolResult{bad}, StatusFailed},
		{nil, StatusFailed},
	} {
		if got := ResponseStatus(c.in); got != c.want {
			t.Errorf("ResponseStatus = %s, want %s", got, c.want)
		}
	}
}

func TestSubjectsHaveSessionLast(t *testing.T) {
	subjects := []string{SubjectRequest("s1"), SubjectRedrivenResult("s1"),
		SubjectResult("r1", "c1", "s1"), SubjectResponse("r1", "s1"),
		SubjectEvent(EventToolStarted, "s1"), SubjectEvent(EventCancel, "s1"), SubjectEvent(EventPolicy, "s1"), StoredSubjectRequest("s1", 16), StoredSubjectRequest("s1", 128)}
	for _, k := range Kinds {
		subjects = append(subjects, SubjectToolCall(k, "echo", "s1"))
	}
	filters := FilterSession("s1")
	for _, s := range subjects {
		if !strings.HasSuffix(s, ".s1") {
			t.Errorf("subject %s does not end with the session", s)
		}
		// A session replays with its two filters: every subject has 3 or 4 tokens.
		if n := strings.Count(s, ".") + 1; n != 3 && n != 4 {
			t.Errorf("subject %s has %d tokens; the session filters %v match 3 or 4", s, n, filters)
		}
	}
}

// Results and responses: each on a subject of its own, captured by the stream, consumed by the
// filters; a response's announcement is outside the stream.
func TestResultAndResponseSubjects(t *testing.T) {
	in := func(pats []string, subject string) bool {
		for _, p := range pats {
			if subjectMatches(p, subject) {
				return true
			}
		}
		return false
	}
	res, resp := SubjectResult("r1", "c1", "s1"), SubjectResponse("r1", "s1")
	for _, s := range []string{res, resp, SubjectRedrivenResult("s1")} {
		if !in(StreamSubjects(), s) {
			t.Errorf("the stream does not capture %s", s)
		}
	}
	if !subjectMatches(FilterResults, res) || !subjectMatches(FilterResults, SubjectRedrivenResult("s1")) || subjectMatches(FilterResults, resp) {
		t.Errorf("FilterResults %v", FilterResults)
	}
	if !subjectMatches(FilterResponseOf("r1"), resp) || subjectMatches(FilterResponseOf("r2"), resp) {
		t.Errorf("FilterResponseOf")
	}
	if SubjectResult("r1", "c1", "s1") == SubjectResult("r1c", "1", "s1") || SubjectResult("r", "1_c", "s") == SubjectResult("r_1", "c", "s") {
		t.Error("two calls share a result subject")
	}
	live := SubjectLiveResponse("r1", "s1")
	if in(StreamSubjects(), live) || !subjectMatches(FilterLiveResponses, live) {
		t.Errorf("live response %s", live)
	}
	src, dest := LiveResponseRepublish()
	if !subjectMatches(src, resp) || strings.Replace(strings.Replace(dest, "{{wildcard(1)}}", "r1", 1), "{{wildcard(2)}}", "s1", 1) != live {
		t.Errorf("republish %s -> %s", src, dest)
	}
}

func TestStreamCapturesEveryToolCallSubject(t *testing.T) {
	captured := func(subject string) bool {
		for _, pat := range StreamSubjects() {
			if subjectMatches(pat, subject) {
				return true
			}
		}
		return false
	}
	for _, k := range Kinds {
		if s := SubjectToolCall(k, "echo", "s1"); !captured(s) {
			t.Errorf("the stream does not capture %s", s)
		}
		if !subjectMatches(FilterToolCalls(k, "echo"), SubjectToolCall(k, "echo", "s1")) ||
			subjectMatches(FilterToolCalls(k, "echo"), SubjectToolCall(k, "echo2", "s1")) {
			t.Errorf("FilterToolCalls(%s, echo) matches the wrong calls", k)
		}
	}
	for _, f := range FiltersAllToolCalls() {
		if !captured(strings.Replace(strings.Replace(f, "*", "echo", 1), "*", "s1", 1)) {
			t.Errorf("filter %s matches nothing the stream captures", f)
		}
	}
	if !captured(SubjectEvent(EventCancel, "s1")) {
		t.Error("the stream does not capture cancel events")
	}
}

// subjectMatches is NATS subject matching with * and > wildcards.
func subjectMatches(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || (tok != "*" && tok != s[i]) {
			return false
		}
	}
	return len(p) == len(s)
}

func TestKeysAndWakeKeys(t *testing.T) {
	if KeyClaim("r", "c") != "r.c" || KeyPlan("r") != "r" {
		t.Error("call keys changed: what running requests keep would not be found")
	}
	for _, c := range []struct {
		key        string
		kind, tool string
		ok         bool
	}{
		{"http.echo", ActionHTTP, "echo", true},
		{"go.weather", ActionGo, "weather", true},
		{"echo", "", "", false},
		{"smtp.echo", "smtp", "echo", false},
		{"http.*", ActionHTTP, "*", false},
		{"a.b.c", "a", "b.c", false},
		{KeyMCPState("w1"), "mcpstate", "w1", false},
	} {
		kind, tool, ok := ParseKeyTool(c.key)
		if (ok && (kind != c.kind || tool != c.tool)) || ok != c.ok {
			t.Errorf("ParseKeyTool(%q) = %q %q %v", c.key, kind, tool, ok)
		}
	}
	for key, want := range map[string]bool{WakeOnResponse("r1"): true, WakeAt("r1.c1"): true, "": false, "a..b": false,
		"a.*": false, "a.>": false, strings.Repeat("a.", 130) + "a": false} {
		if ValidWakeKey(key) != want {
			t.Errorf("ValidWakeKey(%q) = %v", key, !want)
		}
	}
	if k, ok := WakeKeyOfTimer(SubjectTimerDue("response.r1")); !ok || k != "response.r1" {
		t.Errorf("WakeKeyOfTimer: %q %v", k, ok)
	}
}

func TestErrorResult(t *testing.T) {
	r := ErrorResult(CodeNoRoute, OriginHermes, strings.Repeat("é", MaxHintBytes), "no route")
	if r.Status != ResultError || r.ErrorCode != CodeNoRoute || r.ErrorOrigin != OriginHermes || string(r.Content) != `"no route"` {
		t.Fatalf("%+v", r)
	}
	if len(r.RecoveryHint) > MaxHintBytes+len("…") || !strings.HasSuffix(r.RecoveryHint, "…") {
		t.Errorf("hint of %d bytes not cut", len(r.RecoveryHint))
	}
	raw := ErrorResult(CodeToolHTTP5xx, OriginTool, "h", json.RawMessage(`{"status":503}`))
	if string(raw.Content) != `{"status":503}` {
		t.Errorf("raw content re-encoded: %s", raw.Content)
	}
	bad := ErrorResult(CodeToolHTTP5xx, OriginTool, "h", json.RawMessage(`{oops`))
	if !json.Valid(bad.Content) {
		t.Errorf("invalid raw content kept: %s", bad.Content)
	}
	call := &ToolCall{ToolCallID: "c1", Name: "echo"}
	if f := r.For(call, "rule"); f.ToolCallID != "c1" || f.Name != "echo" || f.Route != "rule" {
		t.Errorf("For: %+v", f)
	}
}

// Request ids of the approvals' runs are Hermes' own: a client cannot take one first.
func TestApprovalRequestIDsAreReserved(t *testing.T) {
	r := &Request{RequestID: ApprovalRequestPrefix + "0123456789abcdef01234567", ToolCalls: []ToolCall{{ToolCallID: "c", Name: "t", Arguments: []byte(`{}`)}}}
	if err := r.Validate(Limits{}); err == nil {
		t.Fatal("a client's request took an approval's request id")
	}
	r.Approval = r.RequestID
	if err := r.Validate(Limits{}); err != nil {
		t.Fatal(err)
	}
}

func TestRequestPartitionsOfTheirTransform(t *testing.T) {
	for _, n := range []int{1, 16, 37, MaxRequestPartitions} {
		_, dest := RequestTransform(n)
		if got, ok := RequestPartitionsOf(dest); !ok || got != n {
			t.Errorf("RequestPartitionsOf(%q) = %d, %t; want %d", dest, got, ok, n)
		}
		if p := RequestPartition("some_session", n); p < 0 || p >= n {
			t.Errorf("RequestPartition(_, %d) = %d", n, p)
		}
	}
	for _, dest := range []string{"", "hermes.request.{{partition(0,1)}}.{{wildcard(1)}}", "hermes.request.{{partition(129,1)}}.{{wildcard(1)}}",
		"hermes.request.{{partition(016,1)}}.{{wildcard(1)}}", "hermes.request.{{partition(16,2)}}.{{wildcard(1)}}", "hermes.request.{{partition(16,1)}}.{{wildcard(1)}}x",
		"other.request.{{partition(16,1)}}.{{wildcard(1)}}"} {
		if n, ok := RequestPartitionsOf(dest); ok {
			t.Errorf("RequestPartitionsOf(%q) = %d, want it refused", dest, n)
		}
	}
}
