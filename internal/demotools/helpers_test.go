package demotools

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// testNow is the clock of the tests' servers: Monday 16 March 2026, 10:30 in UTC+08:00.
var testNow = time.Date(2026, 3, 16, 10, 30, 0, 0, demoZone)

func newTestServer() *server {
	return newServer(nil, func() time.Time { return testNow })
}

// reply is a recorded response.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// obj decodes the reply's body as a JSON object, keeping numbers exact.
func (r reply) obj(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("body is not a JSON object: %v\n%s", err, r.body)
	}
	return m
}

// do sends one request to h and checks what every response must have: a JSON body, the JSON
// content type and an integer X-Execution-Time. headers are name, value pairs.
func do(t *testing.T, h http.Handler, method, target, body string, headers ...string) reply {
	t.Helper()
	return doCtx(t, context.Background(), h, method, target, body, headers...)
}

func doCtx(t *testing.T, ctx context.Context, h http.Handler, method, target, body string, headers ...string) reply {
	t.Helper()
	var rd *strings.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	var req *http.Request
	if rd != nil {
		req = httptest.NewRequestWithContext(ctx, method, target, rd)
	} else {
		req = httptest.NewRequestWithContext(ctx, method, target, nil)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	res := reply{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
	checkEnvelope(t, res)
	return res
}

func checkEnvelope(t *testing.T, r reply) {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	ms, err := strconv.ParseInt(r.header.Get("X-Execution-Time"), 10, 64)
	if err != nil || ms < 0 {
		t.Errorf("X-Execution-Time = %q, want a whole number of milliseconds", r.header.Get("X-Execution-Time"))
	}
	if !json.Valid(r.body) {
		t.Errorf("body is not JSON: %s", r.body)
	}
}

// wantArgError checks that r is a 400 INVALID_ARGUMENT whose recovery hint names field.
func wantArgError(t *testing.T, r reply, field string) {
	t.Helper()
	wantError(t, r, http.StatusBadRequest, "INVALID_ARGUMENT")
	m := r.obj(t)
	if hint, _ := m["recovery_hint"].(string); !strings.Contains(hint, strconv.Quote(field)) {
		t.Errorf("recovery_hint %q does not name %q", hint, field)
	}
}

// wantError checks r's status and error shape.
func wantError(t *testing.T, r reply, status int, code string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d; body %s", r.status, status, r.body)
	}
	m := r.obj(t)
	if m["error_code"] != code {
		t.Errorf("error_code = %v, want %s", m["error_code"], code)
	}
	for _, k := range []string{"recovery_hint", "message"} {
		if s, _ := m[k].(string); s == "" {
			t.Errorf("%s is empty: %s", k, r.body)
		}
	}
}

// waitFor waits until cond holds, failing the test after a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// success returns the value of a contract-shaped answer {"success": …}.
func success(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	v, ok := m["success"].(map[string]any)
	if !ok || len(m) != 1 {
		t.Fatalf("not {\"success\": {…}}: %v", m)
	}
	return v
}

// wantFailure checks a contract-shaped failure {"failure": {error_code, recovery_hint}}.
func wantFailure(t *testing.T, r reply, status int, code string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d; body %s", r.status, status, r.body)
	}
	f, ok := r.obj(t)["failure"].(map[string]any)
	if !ok {
		t.Fatalf("not {\"failure\": {…}}: %s", r.body)
	}
	if f["error_code"] != code {
		t.Errorf("error_code = %v, want %s", f["error_code"], code)
	}
	if h, _ := f["recovery_hint"].(string); h == "" {
		t.Errorf("no recovery_hint: %s", r.body)
	}
}
