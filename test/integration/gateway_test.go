package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/hermesbus/hermes/pkg/protocol"
)

func TestGatewayRejectsBadInput(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	cases := []struct {
		name, body, query string
		status            int
		field             string
	}{
		{"malformed", `{"request_id":`, "", 400, ""},
		{"missing field", `{"request_id":"r1"}`, "", 400, "tool_calls"},
		{"mistyped", `{"request_id":"r1","tool_calls":[{"tool_call_id":"c","name":7}]}`, "", 400, "tool_calls[0].name"},
		{"missing call id", `{"request_id":"r1","tool_calls":[{"tool_call_id":"a","name":"echo"},{"name":"echo"}]}`, "", 400, "tool_calls[1].tool_call_id"},
		{"wildcard session", `{"request_id":"r1","session_id":"*","tool_calls":[{"tool_call_id":"c","name":"echo"}]}`, "", 400, "session_id"},
		{"dotted request id", `{"request_id":"a.b","tool_calls":[{"tool_call_id":"c","name":"echo"}]}`, "", 400, "request_id"},
		{"control char id", "{\"request_id\":\"a\\u0000\",\"tool_calls\":[{\"tool_call_id\":\"c\",\"name\":\"echo\"}]}", "", 400, "request_id"},
		{"duplicate call ids", `{"request_id":"r1","tool_calls":[{"tool_call_id":"c","name":"echo"},{"tool_call_id":"c","name":"echo"}]}`, "", 400, "tool_calls[1].tool_call_id"},
		{"bad timeout", `{"request_id":"r1","tool_calls":[{"tool_call_id":"c","name":"echo"}]}`, "?timeout=soon", 400, "timeout"},
		{"too large", `{"request_id":"r1","intent":"` + strings.Repeat("x", 70<<10) + `"}`, "", 413, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, _, body := s.post(c.body, c.query)
			if status != c.status {
				t.Fatalf("HTTP %d, want %d: %s", status, c.status, body)
			}
			var e struct {
				Error struct{ Code, Message, Field string }
			}
			if err := json.Unmarshal(body, &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
				t.Fatalf("error body is not a JSON error: %s", body)
			}
			if e.Error.Field != c.field {
				t.Fatalf("field %q, want %q (%s)", e.Error.Field, c.field, e.Error.Message)
			}
		})
	}
	if n := len(s.record()); n != 0 {
		t.Fatalf("rejected requests left %d messages on the bus", n)
	}
}

func TestDuplicateRequestIDRunsOnce(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	req := request("dup_1", "", call("c", "echo", map[string]any{"delay_ms": 50, "v": "first"}))
	// Concurrent posts of the same request, then one more after it finished.
	var wg sync.WaitGroup
	bodies := make([][]byte, 4)
	for i := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, _, body := s.post(req, "")
			if status != http.StatusOK {
				t.Errorf("post %d: HTTP %d: %s", i, status, body)
			}
			bodies[i] = body
		}()
	}
	wg.Wait()
	status, hdr, again := s.post(req, "")
	if status != http.StatusOK || hdr.Get("X-Hermes-Replayed") != "true" {
		t.Fatalf("repeat: HTTP %d replayed=%q: %s", status, hdr.Get("X-Hermes-Replayed"), again)
	}
	for i, b := range append(bodies, again) {
		if !bytes.Equal(bytes.TrimSpace(b), bytes.TrimSpace(bodies[0])) {
			t.Errorf("answer %d differs:\n%s\n%s", i, b, bodies[0])
		}
	}
	// The response reaches the gateway as the stream stores it: wait for the record.
	waitFor(t, "the response on the record", func() bool { return s.countRecorded("dup_1", protocol.TypeResponse) >= 1 })
	counts := map[protocol.Type]int{}
	for _, m := range s.record() {
		if m.RequestID == "dup_1" {
			counts[m.Type]++
		}
	}
	for typ, want := range map[protocol.Type]int{protocol.TypeRequest: 1, protocol.TypeToolCall: 1, protocol.TypeToolStarted: 1, protocol.TypeToolResult: 1, protocol.TypeResponse: 1} {
		if counts[typ] != want {
			t.Errorf("%s recorded %d times, want %d", typ, counts[typ], want)
		}
	}
	// The same id with other content is a conflict, not a replay.
	other := request("dup_1", "", call("c", "echo", map[string]any{"v": "second"}))
	if status, _, body := s.post(other, ""); status != http.StatusConflict {
		t.Fatalf("conflicting reuse: HTTP %d: %s", status, body)
	}
}

func TestTimeoutThenFetchAndLateWorker(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 0})
	req := request("late_1", "", call("c", "echo", map[string]any{"v": 1}))
	status, hdr, body := s.post(req, "?timeout=200ms", "X-Trace-ID", "trace-late-1")
	if status != http.StatusGatewayTimeout {
		t.Fatalf("HTTP %d, want 504: %s", status, body)
	}
	if hdr.Get("X-Trace-ID") != "trace-late-1" {
		t.Fatalf("X-Trace-ID not echoed: %q", hdr.Get("X-Trace-ID"))
	}
	var e struct {
		RequestID string `json:"request_id"`
		StatusURL string `json:"status_url"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.RequestID != "late_1" || e.StatusURL == "" {
		t.Fatalf("504 body %s", body)
	}
	get := func() (int, []byte) {
		resp, err := http.Get(s.base + e.StatusURL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if st, b := get(); st != http.StatusAccepted {
		t.Fatalf("pending request: HTTP %d: %s", st, b)
	}
	// The call was published before any worker ran; a worker started now executes it.
	s.addWorker("late-worker")
	var final []byte
	waitFor(t, "the response", func() bool {
		st, b := get()
		final = b
		return st == http.StatusOK
	})
	if r := decodeResponse(t, final); r.Status != protocol.StatusSuccess {
		t.Fatalf("late response %s", final)
	}
	for _, m := range s.record() {
		if m.Trace.TraceID != "trace-late-1" {
			t.Errorf("%s %s lost the trace id: %q", m.Type, m.MsgID, m.Trace.TraceID)
		}
	}
	if st, _ := get(); st != http.StatusOK {
		t.Fatal("response not kept")
	}
	resp, _ := http.Get(s.base + "/v1/requests/nope")
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown request: HTTP %d", resp.StatusCode)
	}
	resp, _ = http.Get(s.base + "/v1/requests/a*b")
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad request id: HTTP %d", resp.StatusCode)
	}
}

func TestEnvSecretsStayOffTheBus(t *testing.T) {
	const secret, forbidden = "canary-9f2c1e-secret", "canary-77ab0d-forbidden"
	t.Setenv("HERMES_IT_SECRET", secret)
	t.Setenv("HERMES_IT_FORBIDDEN", forbidden)
	var mu sync.Mutex
	seen := map[string]http.Header{}
	tools := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path] = r.Header.Clone()
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"ok":true}`)
	}))
	defer tools.Close()
	s := start(t, options{workers: 1, allowEnv: []string{"HERMES_IT_SECRET@http://127.0.0.1:8082"},
		resolve: map[string]string{"127.0.0.1:8082": strings.TrimPrefix(tools.URL, "http://")}})
	status, _, body := s.post(request("secret_1", "", call("a", "secret_tool", map[string]any{}), call("b", "forbidden_tool", map[string]any{})), "", "X-Trace-ID", "trace-secret")
	if status != http.StatusOK {
		t.Fatalf("HTTP %d: %s", status, body)
	}
	resp := decodeResponse(t, body)
	if r := result(t, resp, "a"); r.Status != protocol.ResultOK {
		t.Fatalf("allowed secret call failed: %+v", r)
	}
	r := result(t, resp, "b")
	if r.Status != protocol.ResultError || r.ErrorCode != protocol.CodeEnvNotAllowed || !strings.Contains(r.RecoveryHint, "HERMES_IT_FORBIDDEN") {
		t.Fatalf("non-allowed variable was not refused: %+v", r)
	}
	mu.Lock()
	got := seen["/secret"]
	_, called := seen["/forbidden"]
	mu.Unlock()
	if got.Get("Authorization") != "Bearer "+secret {
		t.Fatalf("the tool did not receive the resolved header: %q", got.Get("Authorization"))
	}
	if got.Get("Idempotency-Key") != "secret_1/a" || got.Get("X-Request-ID") != "secret_1" || got.Get("X-Trace-ID") != "trace-secret" {
		t.Fatalf("tool headers: %v", got)
	}
	if called {
		t.Fatal("the call with a non-allowed variable reached the tool")
	}
	raw := s.rawRecord()
	for _, v := range []string{secret, forbidden} {
		if bytes.Contains(raw, []byte(v)) {
			t.Fatalf("a secret value appears on the stream")
		}
	}
	if !bytes.Contains(raw, []byte("${env.HERMES_IT_SECRET}")) {
		t.Fatal("the placeholder should travel unresolved on the bus")
	}
}
