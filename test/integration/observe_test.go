package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/hermesbus/hermes/examples"
	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/routes"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// TestOneTraceFromGatewayThroughToolAndBack records spans in memory and checks that one
// request makes one trace: the caller's span → gateway → router → tool worker → tool HTTP
// call → router aggregation, each the child of the one before (aggregation of the worker's),
// and that the tool receives the trace context of the HTTP call's span.
func TestOneTraceFromGatewayThroughToolAndBack(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev); _ = tp.Shutdown(context.Background()) })

	s := start(t, options{workers: 1})
	const traceID, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	status, hdr, body := s.post(request("trace_1", "", call("a", "record", map[string]any{})), "",
		"traceparent", "00-"+traceID+"-"+callerSpan+"-01")
	if status != http.StatusOK {
		t.Fatalf("HTTP %d: %s", status, body)
	}
	if got := hdr.Get("X-Trace-ID"); got != traceID {
		t.Fatalf("X-Trace-ID = %q; without the caller's own, the W3C trace id is the correlation id", got)
	}
	names := []string{"POST /v1/route", "hermes.route", "hermes.tool record", "HTTP POST", "hermes.aggregate"}
	byName := map[string]sdktrace.ReadOnlySpan{}
	waitFor(t, "every span of the request", func() bool {
		for _, sp := range exp.GetSpans().Snapshots() {
			if sp.SpanContext().TraceID().String() == traceID {
				byName[sp.Name()] = sp
			}
		}
		return len(byName) >= len(names)
	})
	parentOf := map[string]string{
		"POST /v1/route":     callerSpan,
		"hermes.route":       byName["POST /v1/route"].SpanContext().SpanID().String(),
		"hermes.tool record": byName["hermes.route"].SpanContext().SpanID().String(),
		"HTTP POST":          byName["hermes.tool record"].SpanContext().SpanID().String(),
		"hermes.aggregate":   byName["hermes.tool record"].SpanContext().SpanID().String(),
	}
	for _, name := range names {
		sp, ok := byName[name]
		if !ok {
			t.Fatalf("no span %q in the trace; have %v", name, keys(byName))
		}
		if got := sp.Parent().SpanID().String(); got != parentOf[name] {
			t.Errorf("span %q: parent %s, want %s", name, got, parentOf[name])
		}
	}
	if a := attr(byName["POST /v1/route"], "hermes.request_id"); a != "trace_1" {
		t.Errorf("gateway span request id attribute %q", a)
	}
	tries := s.recorder.tries("trace_1/a")
	if len(tries) != 1 {
		t.Fatalf("tool tried %d times", len(tries))
	}
	want := "00-" + traceID + "-" + byName["HTTP POST"].SpanContext().SpanID().String() + "-01"
	if got := tries[0].Get("traceparent"); got != want {
		t.Fatalf("the tool got traceparent %q, want %q (the HTTP call's span)", got, want)
	}
	if got := tries[0].Get("X-Trace-ID"); got != traceID {
		t.Fatalf("the tool got X-Trace-ID %q", got)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func attr(sp sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range sp.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// lockedBuffer is an io.Writer safe for the services' concurrent log lines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestLogLinesNameTheirMessageAndNoSecret runs calls that log (a retried call, a call with a
// secret header, a refused variable, an unrouted call) with every service logging JSON at
// debug level, then checks that each line about a request names its request, session,
// message and trace, and that no secret value appears in the logs, the record or the answer.
func TestLogLinesNameTheirMessageAndNoSecret(t *testing.T) {
	const secret, forbidden = "canary-5d1e8a-secret", "canary-0b7c44-forbidden"
	t.Setenv("HERMES_IT_SECRET", secret)
	t.Setenv("HERMES_IT_FORBIDDEN", forbidden)
	tools := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A careless tool: it fails and echoes the request headers back in its error.
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintf(w, `{"error":"denied","seen":%q}`, r.Header.Get("Authorization"))
	}))
	defer tools.Close()
	var logs lockedBuffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s := start(t, options{workers: 1, logger: log, allowEnv: []string{"HERMES_IT_SECRET@http://127.0.0.1:8082"},
		resolve: map[string]string{"127.0.0.1:8082": strings.TrimPrefix(tools.URL, "http://")}})
	status, _, body := s.post(request("logs_1", "",
		call("retried", "echo", map[string]any{"fail_times": 1}),
		call("secret", "secret_tool", map[string]any{}),
		call("refused", "forbidden_tool", map[string]any{}),
		call("unrouted", "no_such_tool", map[string]any{})), "", "X-Trace-ID", "trace-logs-1")
	if status != http.StatusOK {
		t.Fatalf("HTTP %d: %s", status, body)
	}
	resp := decodeResponse(t, body)
	if r := result(t, resp, "retried"); r.Status != protocol.ResultOK || r.Attempts != 2 {
		t.Fatalf("retried call: %+v", r)
	}
	out := logs.String()
	for _, v := range []string{secret, forbidden} {
		if strings.Contains(out, v) {
			t.Errorf("a secret value appears in the logs")
		}
		if bytes.Contains(s.rawRecord(), []byte(v)) {
			t.Errorf("a secret value appears on the stream")
		}
	}
	about, events := 0, map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line is not JSON: %s", sc.Text())
		}
		if line["request_id"] == nil {
			continue
		}
		about++
		events[fmt.Sprint(line["msg"])] = true
		for _, k := range []string{"session_id", "msg_id", "trace_id"} {
			if v, _ := line[k].(string); v == "" {
				t.Errorf("log line about request %v has no %s: %s", line["request_id"], k, sc.Text())
			}
		}
		if line["trace_id"] != "trace-logs-1" {
			t.Errorf("log line carries trace_id %v, want the caller's trace-logs-1: %s", line["trace_id"], sc.Text())
		}
	}
	for _, want := range []string{"try failed; retrying", "no route", "request published"} {
		if !events[want] {
			t.Errorf("no %q line among %d lines about the request; got %v", want, about, keys(events))
		}
	}
}

// startUp runs Hermes as hermes up does (the examples' routes, the demo tools, a kept admin
// key), until the test ends.
// exampleRoutes is examples/routes.yaml, as hermes up loads it.
func exampleRoutes(t *testing.T) *routes.Table {
	t.Helper()
	data, _ := examples.Files.ReadFile("routes.yaml")
	table, err := routes.Parse("examples/routes.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	return table
}

func startUp(t *testing.T, instance string) (sys *app.System, keyFile string) {
	t.Helper()
	table := exampleRoutes(t)
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	keyFile = filepath.Join(dir, "admin.key")
	var err error
	sys, err = app.StartSystem(ctx, app.SystemConfig{DataDir: dir, HTTPAddr: "127.0.0.1:0", DemoAddr: "127.0.0.1:0", DemoGRPCAddr: "127.0.0.1:0",
		NATSListen: "127.0.0.1:0", Routes: table, ToolWorkers: 1, Worker: app.WorkerConfig{Concurrency: 8}, Instance: instance, KeyFile: keyFile})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = sys.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return sys, keyFile
}

// TestUpServesMetricsOnItsHTTPPort runs Hermes as hermes up does and scrapes /metrics after a
// request with a retried call and one that is not routed.
func TestUpServesMetricsOnItsHTTPPort(t *testing.T) {
	t.Parallel()
	sys, keyFile := startUp(t, "metrics-it")
	// The system made an admin key and kept it, for its owner only; without it nothing but the
	// probes answers.
	if !sys.Key.Made || sys.Key.Path != keyFile || !strings.HasPrefix(sys.Key.Key, "hk_") {
		t.Fatalf("admin key: made %v, kept in %q", sys.Key.Made, sys.Key.Path)
	}
	if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v", fi, err)
	}
	if kept, _ := os.ReadFile(keyFile); strings.TrimSpace(string(kept)) != sys.Key.Key {
		t.Fatal("the key file does not hold the key")
	}
	call := func(method, path, key, body string) *http.Response {
		req, err := http.NewRequest(method, sys.GatewayURL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	body := `{"request_id":"m1","tool_calls":[{"tool_call_id":"a","name":"echo","arguments":{"fail_times":1}},` +
		`{"tool_call_id":"b","name":"nope","arguments":{}}]}`
	waitFor(t, "the gateway to be ready", func() bool {
		r, err := http.Get(sys.GatewayURL + "/readyz")
		if err == nil {
			r.Body.Close()
		}
		return err == nil && r.StatusCode == http.StatusOK
	})
	for _, p := range []string{"/v1/route", "/metrics", "/v1/sessions"} {
		method := http.MethodGet
		if p == "/v1/route" {
			method = http.MethodPost
		}
		r := call(method, p, "", body)
		r.Body.Close()
		if r.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s %s without a key: HTTP %d", method, p, r.StatusCode)
		}
	}
	var resp *http.Response
	waitFor(t, "the gateway to answer", func() bool {
		resp = call(http.MethodPost, "/v1/route", sys.Key.Key, body)
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return false
		}
		return true
	})
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(answer), `"partial_success"`) {
		t.Fatalf("answer: %s", answer)
	}
	scrape := func() string {
		r := call(http.MethodGet, "/metrics", sys.Key.Key, "")
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return string(b)
	}
	wants := []string{
		`hermes_request_total{status="partial_success",tool="echo"} 1`,
		`hermes_request_total{status="partial_success",tool="(unrouted)"} 1`,
		`hermes_responses_total{status="partial_success"} 1`,
		`hermes_tool_retries_total{error_code="TOOL_HTTP_5XX",tool="echo"} 1`,
		`hermes_tool_results_total{error_code="",status="ok",tool="echo"} 1`,
		`hermes_tool_dispatch_duration_seconds_count{tool="echo"} 1`,
		`hermes_tool_execution_duration_seconds_count{tool="echo"} 2`,
		`hermes_tool_calls_in_flight{tool="echo"} 0`,
		`hermes_consumer_pending_messages{consumer="tool_http-echo",stream="HERMES"}`,
		`hermes_consumer_ack_pending_messages{consumer="router-requests-0",stream="HERMES"}`,
		`hermes_consumer_info_up 1`,
		`hermes_router_partitions_busy 0`,
		`hermes_router_partition_hold_seconds_count`,
		`hermes_http_requests_total{code="200",route="POST /v1/route"}`,
		`process_resident_memory_bytes`,
	}
	// Counters move just after the message they count is published, so the client may see its
	// answer a moment before the scrape shows it.
	var text string
	for range 200 {
		if text = scrape(); containsAll(text, wants) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, want := range wants {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("scrape:\n%s", grepLines(text, "hermes_"))
	}
}

func containsAll(text string, subs []string) bool {
	for _, s := range subs {
		if !strings.Contains(text, s) {
			return false
		}
	}
	return true
}

func grepLines(text, prefix string) string {
	var b strings.Builder
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) && !strings.Contains(l, "_bucket") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}
