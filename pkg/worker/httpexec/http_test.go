package httpexec

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
	"github.com/hermesbus/hermes/pkg/worker/egress"
)

// seen is what a test tool saw of one request.
type seen struct {
	Method, Host, Path, EscapedPath, RawQuery string
	Query                                     url.Values
	Header                                    http.Header
	Body                                      []byte
}

// toolServer starts a tool on 127.0.0.1 that records every request and then answers with
// respond (nil answers an empty 200). The returned channel holds the recorded requests.
func toolServer(t *testing.T, respond http.HandlerFunc) (*httptest.Server, <-chan seen) {
	t.Helper()
	reqs := make(chan seen, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		reqs <- seen{Method: r.Method, Host: r.Host, Path: r.URL.Path, EscapedPath: r.URL.EscapedPath(),
			RawQuery: r.URL.RawQuery, Query: r.URL.Query(), Header: r.Header.Clone(), Body: body}
		if respond != nil {
			respond(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, reqs
}

// received returns the request the tool got; Execute has returned, so it is already recorded.
func received(t *testing.T, reqs <-chan seen) seen {
	t.Helper()
	select {
	case s := <-reqs:
		return s
	default:
		t.Fatal("the tool got no request")
		return seen{}
	}
}

// noRequest fails if the tool got a request.
func noRequest(t *testing.T, reqs <-chan seen) {
	t.Helper()
	select {
	case s := <-reqs:
		t.Errorf("the tool got a request %s %s, want none", s.Method, s.EscapedPath)
	default:
	}
}

// newExecutor returns an HTTPExecutor with its own transport, closed at the test's end.
func newExecutor(t *testing.T, env *egress.EnvResolver) *Executor {
	t.Helper()
	tr := NewHTTPTransport(nil)
	t.Cleanup(tr.CloseIdleConnections)
	return &Executor{Client: &http.Client{Transport: tr}, Env: env}
}

// httpCall is try 1 of a call routed by rule "orders" to method target.
func httpCall(method, target, args string, params map[string]string) *worker.Call {
	return &worker.Call{
		RequestID:   "req-42",
		SessionID:   "sess-1",
		Trace:       protocol.TraceContext{TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		Attempt:     1,
		MaxAttempts: 3,
		Dispatch: &protocol.Dispatch{
			Call:   protocol.ToolCall{ToolCallID: "call_1", Name: "get_order", Arguments: json.RawMessage(args)},
			Route:  "orders",
			Params: params,
			Action: protocol.Action{Kind: protocol.ActionHTTP, TimeoutMS: 10_000,
				HTTP: &protocol.HTTPAction{URL: target, Method: method}},
		},
	}
}

// execute runs c and fails on an error, which only shutdown may cause.
func execute(t *testing.T, h *Executor, c *worker.Call) worker.Outcome {
	t.Helper()
	out, err := h.Execute(t.Context(), c)
	if err != nil {
		t.Fatalf("Execute error: %v", err)
	}
	return out
}

// wantOK fails unless out is an ok result.
func wantOK(t *testing.T, out worker.Outcome) {
	t.Helper()
	if out.Result.Status != protocol.ResultOK {
		t.Fatalf("result %s %s (%s): %s, want ok", out.Result.Status, out.Result.ErrorCode, out.Result.RecoveryHint, out.Result.Content)
	}
}

// decodeExact decodes JSON keeping numbers as written.
func decodeExact(t *testing.T, b []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, b)
	}
	return v
}

func TestHTTPQueryFromArguments(t *testing.T) {
	tests := []struct {
		name   string
		method string
		args   string
		params map[string]string
		want   url.Values
	}{
		{"no arguments", "GET", ``, nil, url.Values{}},
		{"empty object", "GET", `{}`, nil, url.Values{}},
		{"null arguments", "GET", `null`, map[string]string{"region": "eu"}, url.Values{"region": {"eu"}}},
		{"strings unquoted", "GET", `{"q":"hello world","city":"Zürich"}`, nil, url.Values{"q": {"hello world"}, "city": {"Zürich"}}},
		{"escaped string", "GET", `{"q":"a\"b\\c\u00e9"}`, nil, url.Values{"q": {`a"b\cé`}}},
		{"separators stay in the value", "GET", `{"q":"a&admin=true#x"}`, nil, url.Values{"q": {"a&admin=true#x"}}},
		{"big integer exact", "GET", `{"id":9007199254740993}`, nil, url.Values{"id": {"9007199254740993"}}},
		{"numbers as written", "GET", `{"a":1.50,"b":-3,"c":1e3,"d":0}`, nil, url.Values{"a": {"1.50"}, "b": {"-3"}, "c": {"1e3"}, "d": {"0"}}},
		{"booleans", "GET", `{"t":true,"f":false}`, nil, url.Values{"t": {"true"}, "f": {"false"}}},
		{"array as repeated keys", "GET", `{"tag":["a",2,true,"b c"]}`, nil, url.Values{"tag": {"a", "2", "true", "b c"}}},
		{"empty array adds nothing", "GET", `{"tag":[],"x":"1"}`, nil, url.Values{"x": {"1"}}},
		{"object inside an array as JSON text", "GET", `{"f":[{"k":1}]}`, nil, url.Values{"f": {`{"k":1}`}}},
		{"object as JSON text", "GET", `{"filter":{"b":1,"a":[2,"x"]}}`, nil, url.Values{"filter": {`{"b":1,"a":[2,"x"]}`}}},
		{"null dropped", "GET", `{"a":null,"b":"x"}`, nil, url.Values{"b": {"x"}}},
		{"route params added", "GET", `{"q":"x"}`, map[string]string{"region": "eu-west", "n": "7"}, url.Values{"q": {"x"}, "region": {"eu-west"}, "n": {"7"}}},
		{"argument wins over a param", "GET", `{"city":"Berlin"}`, map[string]string{"city": "Paris", "region": "eu"}, url.Values{"city": {"Berlin"}, "region": {"eu"}}},
		{"params without arguments", "GET", ``, map[string]string{"region": "eu"}, url.Values{"region": {"eu"}}},
		{"delete uses the query", "DELETE", `{"id":9007199254740993,"hard":true}`, nil, url.Values{"id": {"9007199254740993"}, "hard": {"true"}}},
		{"lower-case method", "get", `{"q":"x"}`, nil, url.Values{"q": {"x"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, reqs := toolServer(t, nil)
			out := execute(t, newExecutor(t, nil), httpCall(tt.method, srv.URL+"/search", tt.args, tt.params))
			wantOK(t, out)
			s := received(t, reqs)
			if s.Method != strings.ToUpper(tt.method) {
				t.Errorf("method %s, want %s", s.Method, strings.ToUpper(tt.method))
			}
			if !reflect.DeepEqual(s.Query, tt.want) {
				t.Errorf("query %q = %v, want %v", s.RawQuery, s.Query, tt.want)
			}
			if len(s.Body) != 0 {
				t.Errorf("body %q, want none", s.Body)
			}
			if ct := s.Header.Get("Content-Type"); ct != "" {
				t.Errorf("Content-Type %q without a body, want none", ct)
			}
		})
	}
}

func TestHTTPQueryKeepsRouteQuery(t *testing.T) {
	srv, reqs := toolServer(t, nil)
	wantOK(t, execute(t, newExecutor(t, nil), httpCall("GET", srv.URL+"/search?units=metric", `{"q":"x"}`, nil)))
	want := url.Values{"units": {"metric"}, "q": {"x"}}
	if s := received(t, reqs); !reflect.DeepEqual(s.Query, want) {
		t.Errorf("query %v, want %v", s.Query, want)
	}
}

func TestHTTPBody(t *testing.T) {
	tests := []struct {
		name     string
		method   string
		url      string // path after the server's address
		args     string
		params   map[string]string
		wantPath string
		// wantRaw is the exact body; when empty, the body must decode to wantJSON.
		wantRaw  string
		wantJSON string
	}{
		{"arguments byte for byte", "POST", "/orders", `{"b":1,"a":9007199254740993}`, nil, "/orders", `{"b":1,"a":9007199254740993}`, ""},
		{"html characters kept", "POST", "/notes", `{"text":"<b>&</b>","n":1.50}`, nil, "/notes", `{"text":"<b>&</b>","n":1.50}`, ""},
		{"nested values kept", "PUT", "/orders", `{"z":{"y":[1,2.0,"x"]},"a":null}`, nil, "/orders", `{"z":{"y":[1,2.0,"x"]},"a":null}`, ""},
		{"patch", "PATCH", "/orders", `{"status":"shipped"}`, nil, "/orders", `{"status":"shipped"}`, ""},
		{"lower-case method", "post", "/orders", `{"b":1}`, nil, "/orders", `{"b":1}`, ""},
		{"no arguments is an empty object", "POST", "/ping", ``, nil, "/ping", "", `{}`},
		{"params merged", "POST", "/orders", `{"b":1,"a":9007199254740993}`, map[string]string{"region": "eu"}, "/orders", "",
			`{"b":1,"a":9007199254740993,"region":"eu"}`},
		{"argument wins over a param", "POST", "/orders", `{"region":"us","qty":2}`, map[string]string{"region": "eu", "shop": "7"}, "/orders", "",
			`{"region":"us","qty":2,"shop":"7"}`},
		{"path argument removed from the body", "POST", "/orders/{order_id}/refund", `{"order_id":"A-17","amount":9007199254740993}`, nil,
			"/orders/A-17/refund", "", `{"amount":9007199254740993}`},
		{"path param removed from the body", "PUT", "/shops/{shop}/items", `{"sku":"x"}`, map[string]string{"shop": "s1", "region": "eu"},
			"/shops/s1/items", "", `{"sku":"x","region":"eu"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, reqs := toolServer(t, nil)
			wantOK(t, execute(t, newExecutor(t, nil), httpCall(tt.method, srv.URL+tt.url, tt.args, tt.params)))
			s := received(t, reqs)
			if s.Method != strings.ToUpper(tt.method) {
				t.Errorf("method %s, want %s", s.Method, strings.ToUpper(tt.method))
			}
			if s.Path != tt.wantPath {
				t.Errorf("path %q, want %q", s.Path, tt.wantPath)
			}
			if tt.wantRaw != "" {
				if string(s.Body) != tt.wantRaw {
					t.Errorf("body %s, want byte for byte %s", s.Body, tt.wantRaw)
				}
			} else if got, want := decodeExact(t, s.Body), decodeExact(t, []byte(tt.wantJSON)); !reflect.DeepEqual(got, want) {
				t.Errorf("body %s, want %s", s.Body, tt.wantJSON)
			}
			if ct := s.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
			if s.RawQuery != "" {
				t.Errorf("query %q with a body, want none", s.RawQuery)
			}
		})
	}
}

func TestHTTPPathPlaceholder(t *testing.T) {
	tests := []struct {
		name        string
		method      string
		args        string
		params      map[string]string
		wantEscaped string
		wantPath    string
		wantQuery   url.Values
	}{
		{"plain id", "GET", `{"order_id":"A-17"}`, nil, "/orders/A-17/status", "/orders/A-17/status", url.Values{}},
		{"number", "GET", `{"order_id":9007199254740993}`, nil, "/orders/9007199254740993/status", "/orders/9007199254740993/status", url.Values{}},
		{"query and fragment characters escaped", "GET", `{"order_id":"x?admin=1#f"}`, nil, "/orders/x%3Fadmin=1%23f/status", "/orders/x?admin=1#f/status", url.Values{}},
		{"space and unicode", "GET", `{"order_id":"café au lait"}`, nil, "/orders/caf%C3%A9%20au%20lait/status", "/orders/café au lait/status", url.Values{}},
		{"other arguments go to the query", "GET", `{"order_id":"A-17","verbose":true}`, nil, "/orders/A-17/status", "/orders/A-17/status", url.Values{"verbose": {"true"}}},
		{"filled from a route param", "GET", `{"verbose":true}`, map[string]string{"order_id": "P-1"}, "/orders/P-1/status", "/orders/P-1/status", url.Values{"verbose": {"true"}}},
		{"argument wins over a route param", "GET", `{"order_id":"A-17"}`, map[string]string{"order_id": "P-1", "region": "eu"}, "/orders/A-17/status", "/orders/A-17/status", url.Values{"region": {"eu"}}},
		{"delete", "DELETE", `{"order_id":"A-17"}`, nil, "/orders/A-17/status", "/orders/A-17/status", url.Values{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, reqs := toolServer(t, nil)
			wantOK(t, execute(t, newExecutor(t, nil), httpCall(tt.method, srv.URL+"/orders/{order_id}/status", tt.args, tt.params)))
			s := received(t, reqs)
			if s.EscapedPath != tt.wantEscaped {
				t.Errorf("escaped path %q, want %q", s.EscapedPath, tt.wantEscaped)
			}
			if s.Path != tt.wantPath {
				t.Errorf("path %q, want %q", s.Path, tt.wantPath)
			}
			if !reflect.DeepEqual(s.Query, tt.wantQuery) {
				t.Errorf("query %v, want %v (the path argument must not repeat there)", s.Query, tt.wantQuery)
			}
		})
	}
}

func TestHTTPPathTwoPlaceholders(t *testing.T) {
	srv, reqs := toolServer(t, nil)
	wantOK(t, execute(t, newExecutor(t, nil), httpCall("POST", srv.URL+"/shops/{shop}/orders/{id}", `{"id":5,"shop":"s 1","qty":2}`, nil)))
	s := received(t, reqs)
	if s.EscapedPath != "/shops/s%201/orders/5" {
		t.Errorf("escaped path %q, want /shops/s%%201/orders/5", s.EscapedPath)
	}
	if string(s.Body) != `{"qty":2}` {
		t.Errorf("body %s, want {\"qty\":2}", s.Body)
	}
}

// TestHTTPPathNeverChangesHost: whatever fills a path placeholder, the request goes to the
// route's scheme, host and port, and the value stays inside its segment.
func TestHTTPPathNeverChangesHost(t *testing.T) {
	values := []string{
		"@evil.example",
		"x@evil.example:80",
		"//evil.example/x",
		"evil.example:80",
		"http://evil.example/",
		`\\evil.example`,
		"..%2F..%2Fadmin",
	}
	for _, v := range values {
		t.Run(v, func(t *testing.T) {
			srv, reqs := toolServer(t, nil)
			args, _ := json.Marshal(map[string]string{"id": v})
			out := execute(t, newExecutor(t, nil), httpCall("GET", srv.URL+"/items/{id}/x", string(args), nil))
			if strings.ContainsAny(v, `/\%`) {
				// Refused outright: servers that decode before routing would see another path.
				if out.Result.ErrorCode != protocol.CodeBadArguments || !strings.Contains(string(out.Result.Content), "path parameter") {
					t.Fatalf("%q: %s %s", v, out.Result.ErrorCode, out.Result.Content)
				}
				noRequest(t, reqs)
				return
			}
			wantOK(t, out)
			s := received(t, reqs)
			if want := strings.TrimPrefix(srv.URL, "http://"); s.Host != want {
				t.Errorf("Host %q, want %q", s.Host, want)
			}
			if s.Path != "/items/"+v+"/x" {
				t.Errorf("path %q, want %q", s.Path, "/items/"+v+"/x")
			}
			if segs := strings.Split(s.EscapedPath, "/"); len(segs) != 4 {
				t.Errorf("escaped path %q has %d segments, want the value in one segment", s.EscapedPath, len(segs)-1)
			}
		})
	}
}

// TestHTTPPathDotSegment: a path argument of "." or ".." is not escaped, so it becomes a dot
// segment that every server resolves against the path: the call lands on another resource.
func TestHTTPPathDotSegment(t *testing.T) {
	for _, v := range []string{"..", ".", "..;", ".;x=1"} {
		t.Run(v, func(t *testing.T) {
			srv, reqs := toolServer(t, nil)
			args, _ := json.Marshal(map[string]string{"user_id": v})
			out := execute(t, newExecutor(t, nil), httpCall("GET", srv.URL+"/users/{user_id}/profile", string(args), nil))
			if strings.Contains(v, ";") && out.Result.ErrorCode != protocol.CodeBadArguments {
				// Escaped, "..;" stays in its segment here, but servers that strip ";…"
				// path parameters after decoding would climb: refused outright.
				t.Fatalf("%q: %s, want BAD_ARGUMENTS", v, out.Result.ErrorCode)
			}
			if out.Result.ErrorCode == protocol.CodeBadArguments {
				noRequest(t, reqs)
				return
			}
			s := received(t, reqs)
			for _, seg := range strings.Split(s.EscapedPath, "/") {
				if seg == "." || seg == ".." {
					t.Fatalf("escaped path %q holds the dot segment %q; want BAD_ARGUMENTS or the value kept in its segment", s.EscapedPath, seg)
				}
			}
		})
	}
}

func TestHTTPBadArguments(t *testing.T) {
	tests := []struct {
		name    string
		url     string
		args    string
		mention string
	}{
		{"missing path argument", "/orders/{order_id}", `{"id":"A-17"}`, "order_id"},
		{"no arguments for a path", "/orders/{order_id}", ``, "order_id"},
		{"null path argument", "/orders/{order_id}", `{"order_id":null}`, "order_id"},
		{"empty path argument", "/orders/{order_id}", `{"order_id":""}`, "order_id"},
		{"object path argument", "/orders/{order_id}", `{"order_id":{"a":1}}`, "order_id"},
		{"array path argument", "/orders/{order_id}", `{"order_id":["a"]}`, "order_id"},
		{"unclosed placeholder", "/orders/{order_id", `{"order_id":"x"}`, "{"},
		{"arguments not an object", "/orders", `[1,2]`, "object"},
		{"arguments not JSON", "/orders", `{"a":`, "object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, reqs := toolServer(t, nil)
			out := execute(t, newExecutor(t, nil), httpCall("GET", srv.URL+tt.url, tt.args, nil))
			r := out.Result
			if r.Status != protocol.ResultError || r.ErrorCode != protocol.CodeBadArguments || r.ErrorOrigin != protocol.OriginHermes {
				t.Fatalf("result %s/%s/%s, want error/%s/%s", r.Status, r.ErrorCode, r.ErrorOrigin, protocol.CodeBadArguments, protocol.OriginHermes)
			}
			if out.Retryable {
				t.Error("bad arguments are retryable; the same arguments fail again")
			}
			if !strings.Contains(r.RecoveryHint, tt.mention) || !strings.Contains(r.RecoveryHint, "orders") {
				t.Errorf("recovery hint %q does not mention %q and the route", r.RecoveryHint, tt.mention)
			}
			if !json.Valid(r.Content) {
				t.Errorf("content %q is not JSON", r.Content)
			}
			noRequest(t, reqs)
		})
	}
}

func TestHTTPMissingAction(t *testing.T) {
	c := httpCall("GET", "http://127.0.0.1:1/", `{}`, nil)
	c.Dispatch.Action.HTTP = nil
	out := execute(t, newExecutor(t, nil), c)
	if out.Result.ErrorCode != protocol.CodeBadArguments || out.Retryable {
		t.Errorf("result %s retryable=%v, want %s, not retryable", out.Result.ErrorCode, out.Retryable, protocol.CodeBadArguments)
	}
}

func TestHTTPHeaders(t *testing.T) {
	srv, reqs := toolServer(t, nil)
	env := &egress.EnvResolver{Allowed: map[string]bool{"TOOL_TOKEN": true, "TENANT": true},
		Lookup: mapLookup(map[string]string{"TOOL_TOKEN": canary, "TENANT": "acme"})}
	h := newExecutor(t, env)
	for attempt := 1; attempt <= 2; attempt++ {
		c := httpCall("POST", srv.URL+"/orders", `{"a":1}`, nil)
		c.Attempt = attempt
		c.Dispatch.Action.HTTP.Headers = map[string]string{
			"Authorization": "Bearer ${env.TOOL_TOKEN}",
			"X-Tenant":      "${env.TENANT}-${env.TENANT}",
			"X-Static":      "plain",
		}
		wantOK(t, execute(t, h, c))
		s := received(t, reqs)
		want := map[string]string{
			"Idempotency-Key":  "req-42/call_1",
			"X-Request-Id":     "req-42",
			"X-Trace-Id":       "4bf92f3577b34da6a3ce929d0e0e4736",
			"Traceparent":      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"X-Hermes-Attempt": map[int]string{1: "1", 2: "2"}[attempt],
			"Content-Type":     "application/json",
			"Accept":           "application/json",
			"User-Agent":       "hermes-toolworker",
			"Authorization":    "Bearer " + canary,
			"X-Tenant":         "acme-acme",
			"X-Static":         "plain",
		}
		for name, v := range want {
			if got := s.Header.Values(name); len(got) != 1 || got[0] != v {
				t.Errorf("try %d: header %s = %q, want [%q]", attempt, name, got, v)
			}
		}
	}
}

func TestHTTPHeadersWithoutTrace(t *testing.T) {
	srv, reqs := toolServer(t, nil)
	c := httpCall("GET", srv.URL+"/orders", `{}`, nil)
	c.Trace = protocol.TraceContext{}
	wantOK(t, execute(t, newExecutor(t, nil), c))
	s := received(t, reqs)
	for _, name := range []string{"X-Trace-Id", "Traceparent", "Content-Type"} {
		if v, ok := s.Header[name]; ok {
			t.Errorf("header %s = %q, want it absent", name, v)
		}
	}
	if got := s.Header.Get("Idempotency-Key"); got != "req-42/call_1" {
		t.Errorf("Idempotency-Key %q, want req-42/call_1", got)
	}
}

func TestHTTPEnvRefused(t *testing.T) {
	env := &egress.EnvResolver{Allowed: map[string]bool{"UNSET_TOKEN": true},
		Lookup: mapLookup(map[string]string{"SECRET_TOKEN": canary})}
	tests := []struct {
		name, value, code, variable string
	}{
		{"not allowed", "Bearer ${env.SECRET_TOKEN}", protocol.CodeEnvNotAllowed, "SECRET_TOKEN"},
		{"unset", "Bearer ${env.UNSET_TOKEN}", protocol.CodeEnvUnset, "UNSET_TOKEN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, reqs := toolServer(t, nil)
			c := httpCall("GET", srv.URL+"/orders", `{}`, nil)
			c.Dispatch.Action.HTTP.Headers = map[string]string{"Authorization": tt.value}
			out := execute(t, newExecutor(t, env), c)
			r := out.Result
			if r.Status != protocol.ResultError || r.ErrorCode != tt.code || r.ErrorOrigin != protocol.OriginHermes || out.Retryable {
				t.Fatalf("result %s/%s/%s retryable=%v, want error/%s/hermes, not retryable", r.Status, r.ErrorCode, r.ErrorOrigin, out.Retryable, tt.code)
			}
			for _, text := range []string{r.RecoveryHint, string(r.Content)} {
				if !strings.Contains(text, tt.variable) || !strings.Contains(text, "Authorization") {
					t.Errorf("%q does not name the variable %s and the header", text, tt.variable)
				}
				if strings.Contains(text, canary) {
					t.Errorf("%q leaks the variable's value", text)
				}
			}
			noRequest(t, reqs)
		})
	}
}

func TestHTTPMalformedEnvPlaceholder(t *testing.T) {
	srv, reqs := toolServer(t, nil)
	c := httpCall("GET", srv.URL+"/orders", `{}`, nil)
	c.Dispatch.Action.HTTP.Headers = map[string]string{"Authorization": "Bearer ${env.TOKEN"}
	out := execute(t, newExecutor(t, &egress.EnvResolver{}), c)
	if out.Result.Status != protocol.ResultError || out.Retryable {
		t.Errorf("result %s retryable=%v, want a non-retryable error", out.Result.Status, out.Retryable)
	}
	noRequest(t, reqs)
}

// canary is a secret value no error text may ever contain.
const canary = "s3cr3t-CANARY-9f2c"

func mapLookup(m map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

// A call that changes a resource carries its turn to the tool: transaction id, fencing token
// and resource; a call without a grant carries none of them.
func TestHTTPCarriesTheCallsGrant(t *testing.T) {
	srv, reqs := toolServer(t, nil)
	c := httpCall("POST", srv.URL+"/orders", `{"order_id":"order_123"}`, nil)
	c.Dispatch.Grant = &protocol.Grant{Tx: protocol.TxID("req-42", "order_123"), Fence: 42, Resource: "order_123"}
	wantOK(t, execute(t, newExecutor(t, nil), c))
	s := received(t, reqs)
	for name, want := range map[string]string{protocol.HeaderTx: protocol.TxID("req-42", "order_123"), protocol.HeaderFence: "42", protocol.HeaderResource: "order_123"} {
		if got := s.Header.Values(name); len(got) != 1 || got[0] != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	c = httpCall("POST", srv.URL+"/orders", `{}`, nil)
	wantOK(t, execute(t, newExecutor(t, nil), c))
	s = received(t, reqs)
	for _, name := range []string{protocol.HeaderTx, protocol.HeaderFence, protocol.HeaderResource} {
		if v, ok := s.Header[http.CanonicalHeaderKey(name)]; ok {
			t.Errorf("without a grant, %s = %q", name, v)
		}
	}
}
