package httpexec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
)

// answer returns a handler that writes status, headers (name, value pairs) and body.
func answer(status int, body string, headers ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(headers); i += 2 {
			w.Header().Set(headers[i], headers[i+1])
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}
}

func TestHTTPStatusMapping(t *testing.T) {
	tests := []struct {
		name       string
		respond    http.HandlerFunc
		status     string
		code       string
		origin     string
		retryable  bool
		retryAfter time.Duration
		content    string // exact content
		hint       string // the recovery hint holds this
		toolCode   string // the tool's own code, as kept
	}{
		{name: "200 json kept as sent", respond: answer(200, `{"b":1,"a":9007199254740993}`, "Content-Type", "application/json"),
			status: protocol.ResultOK, content: `{"b":1,"a":9007199254740993}`},
		{name: "201 json around whitespace", respond: answer(201, " [1,2.50,\"x\"]\n"),
			status: protocol.ResultOK, content: `[1,2.50,"x"]`},
		{name: "200 json scalar", respond: answer(200, `42`),
			status: protocol.ResultOK, content: `42`},
		{name: "200 text becomes a json string", respond: answer(200, "it is sunny", "Content-Type", "text/plain"),
			status: protocol.ResultOK, content: `"it is sunny"`},
		{name: "200 text that only starts like json", respond: answer(200, `{"a":1} trailing`),
			status: protocol.ResultOK, content: `"{\"a\":1} trailing"`},
		{name: "200 empty body is null", respond: answer(200, ""),
			status: protocol.ResultOK, content: `null`},
		{name: "200 blank body is null", respond: answer(200, " \r\n\t"),
			status: protocol.ResultOK, content: `null`},
		{name: "204 is null", respond: answer(204, ""),
			status: protocol.ResultOK, content: `null`},
		{name: "429 with retry-after", respond: answer(429, `{"message":"slow down"}`, "Retry-After", "2"),
			status: protocol.ResultError, code: protocol.CodeToolRateLimited, origin: protocol.OriginTool, retryable: true,
			retryAfter: 2 * time.Second, content: `{"message":"slow down"}`, hint: "HTTP 429"},
		{name: "429 without retry-after", respond: answer(429, ""),
			status: protocol.ResultError, code: protocol.CodeToolRateLimited, origin: protocol.OriginTool, retryable: true,
			content: `null`, hint: "HTTP 429"},
		{name: "429 with its own code stays retryable", respond: answer(429, `{"error_code":"QUOTA","recovery_hint":"wait a minute"}`, "Retry-After", "7"),
			status: protocol.ResultError, code: protocol.CodeToolRateLimited, toolCode: "QUOTA", origin: protocol.OriginTool, retryable: true, retryAfter: 7 * time.Second,
			content: `{"error_code":"QUOTA","recovery_hint":"wait a minute"}`, hint: "wait a minute"},
		{name: "503", respond: answer(503, "upstream down"),
			status: protocol.ResultError, code: protocol.CodeToolHTTP5xx, origin: protocol.OriginTool, retryable: true,
			content: `"upstream down"`, hint: "HTTP 503"},
		{name: "500 with its own code and hint", respond: answer(500, `{"error_code":"DB_LOCKED","recovery_hint":"try again in a second"}`),
			status: protocol.ResultError, code: protocol.CodeToolHTTP5xx, toolCode: "DB_LOCKED", origin: protocol.OriginTool, retryable: true,
			content: `{"error_code":"DB_LOCKED","recovery_hint":"try again in a second"}`, hint: "try again in a second"},
		{name: "404", respond: answer(404, `{"message":"no such order"}`),
			status: protocol.ResultError, code: protocol.CodeToolHTTP4xx, origin: protocol.OriginTool,
			content: `{"message":"no such order"}`, hint: "HTTP 404"},
		{name: "400 with its own code and hint", respond: answer(400, `{"error_code":"ORDER_NOT_FOUND","recovery_hint":"list orders first"}`),
			status: protocol.ResultError, code: protocol.CodeToolHTTP4xx, toolCode: "ORDER_NOT_FOUND", origin: protocol.OriginTool,
			content: `{"error_code":"ORDER_NOT_FOUND","recovery_hint":"list orders first"}`, hint: "list orders first"},
		{name: "422 with only its own code keeps the default hint", respond: answer(422, `{"error_code":"BAD_DATE"}`),
			status: protocol.ResultError, code: protocol.CodeToolHTTP4xx, toolCode: "BAD_DATE", origin: protocol.OriginTool,
			content: `{"error_code":"BAD_DATE"}`, hint: "HTTP 422"},
		// What a tool says is data: it cannot pass for Hermes, nor make up codes of any shape.
		{name: "a tool claiming Hermes' NO_ROUTE", respond: answer(404, `{"error_code":"NO_ROUTE"}`),
			status: protocol.ResultError, code: protocol.CodeToolHTTP4xx, origin: protocol.OriginTool,
			content: `{"error_code":"NO_ROUTE"}`, hint: "HTTP 404"},
		{name: "a tool claiming DEAD_LETTERED on a 500", respond: answer(500, `{"error_code":"DEAD_LETTERED"}`),
			status: protocol.ResultError, code: protocol.CodeToolHTTP5xx, origin: protocol.OriginTool, retryable: true,
			content: `{"error_code":"DEAD_LETTERED"}`, hint: "HTTP 500"},
		{name: "a code of another shape", respond: answer(400, `{"error_code":"order not found\u001b[2J"}`),
			status: protocol.ResultError, code: protocol.CodeToolHTTP4xx, origin: protocol.OriginTool,
			content: `{"error_code":"order not found\u001b[2J"}`, hint: "HTTP 400"},
		{name: "409 text", respond: answer(409, "conflict"),
			status: protocol.ResultError, code: protocol.CodeToolHTTP4xx, origin: protocol.OriginTool,
			content: `"conflict"`, hint: "HTTP 409"},
		{name: "4xx json array body ignored for codes", respond: answer(403, `["error_code"]`),
			status: protocol.ResultError, code: protocol.CodeToolHTTP4xx, origin: protocol.OriginTool,
			content: `["error_code"]`, hint: "HTTP 403"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := toolServer(t, tt.respond)
			out := execute(t, newExecutor(t, nil), httpCall("GET", srv.URL+"/x", `{}`, nil))
			r := out.Result
			if r.Status != tt.status || r.ErrorCode != tt.code || r.ErrorOrigin != tt.origin || r.ToolErrorCode != tt.toolCode {
				t.Errorf("result %q/%q/%q tool code %q, want %q/%q/%q tool code %q", r.Status, r.ErrorCode, r.ErrorOrigin, r.ToolErrorCode,
					tt.status, tt.code, tt.origin, tt.toolCode)
			}
			if out.Retryable != tt.retryable {
				t.Errorf("retryable %v, want %v", out.Retryable, tt.retryable)
			}
			if out.RetryAfter != tt.retryAfter {
				t.Errorf("RetryAfter %v, want %v", out.RetryAfter, tt.retryAfter)
			}
			if string(r.Content) != tt.content {
				t.Errorf("content %s, want %s", r.Content, tt.content)
			}
			if !json.Valid(r.Content) {
				t.Errorf("content %q is not JSON", r.Content)
			}
			if !strings.Contains(r.RecoveryHint, tt.hint) {
				t.Errorf("recovery hint %q does not hold %q", r.RecoveryHint, tt.hint)
			}
			if tt.status == protocol.ResultOK && r.RecoveryHint != "" {
				t.Errorf("ok result has a recovery hint %q", r.RecoveryHint)
			}
		})
	}
}

func TestHTTPTextContentRoundTrips(t *testing.T) {
	const text = "<b>5 > 3 & 2 < 4</b>\nline two\t\"quoted\""
	srv, _ := toolServer(t, answer(200, text, "Content-Type", "text/html"))
	out := execute(t, newExecutor(t, nil), httpCall("GET", srv.URL+"/x", `{}`, nil))
	wantOK(t, out)
	var got string
	if err := json.Unmarshal(out.Result.Content, &got); err != nil || got != text {
		t.Errorf("content %s decodes to %q (%v), want the text %q", out.Result.Content, got, err, text)
	}
}

func TestHTTPExecutionTimeHeader(t *testing.T) {
	tests := []struct {
		header string
		want   int64
	}{
		{"12.4", 12},
		{"12.5", 13},
		{"0", 0},
		{"250", 250},
		{" 7 ", 7},
		{"30ms", 30},
		{"1.2e3", 1200},
	}
	for _, tt := range tests {
		t.Run(tt.header, func(t *testing.T) {
			srv, _ := toolServer(t, answer(200, `{}`, "X-Execution-Time", tt.header))
			out := execute(t, newExecutor(t, nil), httpCall("GET", srv.URL+"/x", `{}`, nil))
			wantOK(t, out)
			if out.Result.ExecutionTimeMS != tt.want {
				t.Errorf("X-Execution-Time %q gave %d ms, want %d", tt.header, out.Result.ExecutionTimeMS, tt.want)
			}
		})
	}
}

func TestExecutionTimeFallsBackToMeasured(t *testing.T) {
	for _, v := range []string{"", "soon", "-5", "NaN ms", "12 s"} {
		h := http.Header{}
		if v != "" {
			h.Set("X-Execution-Time", v)
		}
		if got := executionTime(h, 37*time.Millisecond+900*time.Microsecond); got != 37 {
			t.Errorf("executionTime(%q, 37.9ms) = %d, want the measured 37", v, got)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	tests := []struct {
		value    string
		min, max time.Duration
	}{
		{"", 0, 0},
		{"0", 0, 0},
		{"2", 2 * time.Second, 2 * time.Second},
		{"120", 2 * time.Minute, 2 * time.Minute},
		{"86400", 5 * time.Minute, 5 * time.Minute},
		{"-3", 0, 0},
		{"soon", 0, 0},
		{"1.5", 0, 0},
		{time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat), 0, 0},
		{time.Now().Add(time.Hour).UTC().Format(http.TimeFormat), 5 * time.Minute, 5 * time.Minute},
		// An HTTP date has whole seconds: 30 s from now is between 28 s and 30 s away.
		{time.Now().Add(30 * time.Second).UTC().Format(http.TimeFormat), 28 * time.Second, 30 * time.Second},
	}
	for _, tt := range tests {
		h := http.Header{}
		if tt.value != "" {
			h.Set("Retry-After", tt.value)
		}
		if got := retryAfter(h); got < tt.min || got > tt.max {
			t.Errorf("retryAfter(%q) = %v, want in [%v, %v]", tt.value, got, tt.min, tt.max)
		}
	}
}

// blockingTool starts a tool that signals started and then holds every request until the
// client gives up or the test ends. writeFirst, if set, is flushed before holding.
func blockingTool(t *testing.T, writeFirst string) (*httptest.Server, <-chan struct{}) {
	t.Helper()
	started := make(chan struct{}, 16)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if writeFirst != "" {
			w.Header().Set("Content-Length", "1000")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte(writeFirst))
			w.(http.Flusher).Flush()
		}
		started <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs before srv.Close
	return srv, started
}

func TestHTTPTimeout(t *testing.T) {
	tests := []struct {
		name       string
		writeFirst string
	}{
		{"no answer", ""},
		{"body stalls", `{"partial":`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := blockingTool(t, tt.writeFirst)
			c := httpCall("GET", srv.URL+"/slow", `{}`, nil)
			c.Dispatch.Action.TimeoutMS = 50
			out := execute(t, newExecutor(t, nil), c)
			r := out.Result
			if r.Status != protocol.ResultError || r.ErrorCode != protocol.CodeToolTimeout || r.ErrorOrigin != protocol.OriginHermes {
				t.Fatalf("result %s/%s/%s (%s), want error/%s/hermes", r.Status, r.ErrorCode, r.ErrorOrigin, r.Content, protocol.CodeToolTimeout)
			}
			if !out.Retryable {
				t.Error("a timeout is not retryable")
			}
			for _, want := range []string{"timeout_ms=50", "orders"} {
				if !strings.Contains(r.RecoveryHint, want) {
					t.Errorf("recovery hint %q does not mention %s", r.RecoveryHint, want)
				}
			}
		})
	}
}

// closedAddr returns a 127.0.0.1 address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

func TestHTTPUnreachable(t *testing.T) {
	addr := closedAddr(t)
	out := execute(t, newExecutor(t, nil), httpCall("POST", "http://"+addr+"/orders", `{"a":1}`, nil))
	r := out.Result
	if r.Status != protocol.ResultError || r.ErrorCode != protocol.CodeToolUnreachable || r.ErrorOrigin != protocol.OriginHermes {
		t.Fatalf("result %s/%s/%s (%s), want error/%s/hermes", r.Status, r.ErrorCode, r.ErrorOrigin, r.Content, protocol.CodeToolUnreachable)
	}
	if !out.Retryable {
		t.Error("an unreachable tool is not retryable")
	}
	if !strings.Contains(r.RecoveryHint, addr) || !strings.Contains(r.RecoveryHint, "orders") {
		t.Errorf("recovery hint %q does not name the host %s and the route", r.RecoveryHint, addr)
	}
}

func TestHTTPTransportResolve(t *testing.T) {
	srv, reqs := toolServer(t, answer(200, `{"ok":true}`))
	tests := []struct {
		name, url, key, host string
	}{
		{"default port", "http://tools.example/ping", "tools.example:80", "tools.example"},
		{"explicit port", "http://tools.example:8081/ping", "tools.example:8081", "tools.example:8081"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewHTTPTransport(map[string]string{tt.key: srv.Listener.Addr().String()})
			t.Cleanup(tr.CloseIdleConnections)
			h := &Executor{Client: &http.Client{Transport: tr}}
			out := execute(t, h, httpCall("GET", tt.url, `{"q":"x"}`, nil))
			wantOK(t, out)
			s := received(t, reqs)
			if s.Host != tt.host {
				t.Errorf("Host %q, want %q (resolve must not change it)", s.Host, tt.host)
			}
			if s.Path != "/ping" || s.Query.Get("q") != "x" {
				t.Errorf("request %s?%s, want /ping?q=x", s.Path, s.RawQuery)
			}
		})
	}
}

func TestHTTPTransportResolveOnlyMappedHosts(t *testing.T) {
	srv, reqs := toolServer(t, nil)
	addr := closedAddr(t)
	// Only tools.example is mapped; a call to the closed address must not reach the server.
	tr := NewHTTPTransport(map[string]string{"tools.example:80": srv.Listener.Addr().String()})
	t.Cleanup(tr.CloseIdleConnections)
	h := &Executor{Client: &http.Client{Transport: tr}}
	out := execute(t, h, httpCall("GET", "http://"+addr+"/ping", `{}`, nil))
	if out.Result.ErrorCode != protocol.CodeToolUnreachable {
		t.Errorf("error code %q, want %s", out.Result.ErrorCode, protocol.CodeToolUnreachable)
	}
	noRequest(t, reqs)
}

func TestHTTPResultTooLarge(t *testing.T) {
	big := `"` + strings.Repeat("x", worker.DefaultMaxResultBytes-2) + `"` // exactly the default limit
	tests := []struct {
		name     string
		limit    int64
		status   int
		body     string
		tooLarge bool
	}{
		{"at the limit", 16, 200, `"` + strings.Repeat("a", 14) + `"`, false},
		{"one byte over", 16, 200, `"` + strings.Repeat("a", 15) + `"`, true},
		{"far over", 16, 200, strings.Repeat("a", 100_000), true},
		{"error status over the limit", 16, 503, strings.Repeat("e", 17), true},
		{"default limit reached", 0, 200, big, false},
		{"default limit passed", 0, 200, big + " ", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := toolServer(t, answer(tt.status, tt.body))
			c := httpCall("GET", srv.URL+"/x", `{}`, nil)
			c.MaxResultBytes = tt.limit
			out := execute(t, newExecutor(t, nil), c)
			r := out.Result
			if !tt.tooLarge {
				wantOK(t, out)
				if len(r.Content) != len(tt.body) {
					t.Errorf("content of %d bytes, want the %d sent", len(r.Content), len(tt.body))
				}
				return
			}
			if r.Status != protocol.ResultError || r.ErrorCode != protocol.CodeResultTooLarge || r.ErrorOrigin != protocol.OriginHermes {
				t.Fatalf("result %s/%s/%s, want error/%s/hermes", r.Status, r.ErrorCode, r.ErrorOrigin, protocol.CodeResultTooLarge)
			}
			if out.Retryable {
				t.Error("a too large result is retryable; the tool answers the same again")
			}
			limit := tt.limit
			if limit == 0 {
				limit = worker.DefaultMaxResultBytes
			}
			if want := fmt.Sprint(limit); !strings.Contains(r.RecoveryHint, want) {
				t.Errorf("recovery hint %q does not name the limit %s", r.RecoveryHint, want)
			}
			if len(r.Content) > 200 {
				t.Errorf("content holds %d bytes; it must describe the error, not carry the answer", len(r.Content))
			}
		})
	}
}

func TestHTTPShutdownWhileToolIsSlow(t *testing.T) {
	srv, started := blockingTool(t, "")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	c := httpCall("GET", srv.URL+"/slow", `{}`, nil)
	c.Dispatch.Action.TimeoutMS = 60_000
	type result struct {
		out worker.Outcome
		err error
	}
	done := make(chan result, 1)
	h := newExecutor(t, nil)
	go func() {
		out, err := h.Execute(ctx, c)
		done <- result{out, err}
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the tool never got the request")
	}
	cancel()
	select {
	case r := <-done:
		if r.err == nil {
			t.Fatalf("Execute returned the outcome %s/%s and no error; shutdown must not be judged as a tool failure",
				r.out.Result.Status, r.out.Result.ErrorCode)
		}
		if !errors.Is(r.err, context.Canceled) {
			t.Errorf("error %v, want context.Canceled", r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Execute did not return after its ctx was cancelled")
	}
}

func TestHTTPAlreadyCancelled(t *testing.T) {
	srv, reqs := toolServer(t, nil)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := newExecutor(t, nil).Execute(ctx, httpCall("GET", srv.URL+"/x", `{}`, nil))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Execute with a cancelled ctx: error %v, want context.Canceled", err)
	}
	noRequest(t, reqs)
}

// TestHTTPRedirectKeepsSecretsHome: a tool that redirects must not make the worker send the
// route's resolved header values to another host.
func TestHTTPRedirectKeepsSecretsHome(t *testing.T) {
	other, otherReqs := toolServer(t, answer(200, `{}`))
	srv, _ := toolServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/collect", http.StatusFound)
	})
	// The HTTP executor as New builds it, reading KEY (bound to srv) from a canary.
	h, err := New([]string{"KEY@" + srv.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.Env.Lookup = mapLookup(map[string]string{"KEY": canary})
	c := httpCall("GET", srv.URL+"/orders", `{}`, nil)
	c.Dispatch.Action.HTTP.Headers = map[string]string{"X-Api-Key": "${env.KEY}"}
	execute(t, h, c)
	select {
	case s := <-otherReqs:
		if got := s.Header.Get("X-Api-Key"); got == canary {
			t.Errorf("the redirect target %s got X-Api-Key with the secret value", other.URL)
		}
	default:
	}
}

// TestHTTPSizeIsJudgedBeforeRedaction: an answer over the limit stays RESULT_TOO_LARGE even
// when redacting the secrets it echoes would shrink the cut-off part below the limit.
func TestHTTPSizeIsJudgedBeforeRedaction(t *testing.T) {
	secret := strings.Repeat("S", 40)
	srv, _ := toolServer(t, answer(200, strings.Repeat(secret, 100))) // 4000 bytes
	h, err := New([]string{"TOKEN@" + srv.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.Env.Lookup = mapLookup(map[string]string{"TOKEN": secret})
	c := httpCall("GET", srv.URL+"/x", `{}`, nil)
	c.MaxResultBytes = 1000
	c.Dispatch.Action.HTTP.Headers = map[string]string{"Authorization": "${env.TOKEN}"}
	if out := execute(t, h, c); out.Result.ErrorCode != protocol.CodeResultTooLarge {
		t.Fatalf("a 4000-byte answer with a 1000-byte limit: %s/%s, %d bytes of content", out.Result.Status, out.Result.ErrorCode, len(out.Result.Content))
	}
}
