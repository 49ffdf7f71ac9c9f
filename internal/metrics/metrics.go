// Package metrics defines Hermes' Prometheus metrics and serves them.
//
// Every service takes a *Metrics; New(nil) gives one that counts without being exported, so
// code never checks for nil. One process registers one Metrics (hermes up shares one between
// its services), so each series has one writer per process.
package metrics

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
)

// Metrics holds Hermes' collectors. Label values are tool names, consumer names, statuses and
// error codes: all bounded by the routes and the protocol, never ids.
type Metrics struct {
	// Requests counts answered requests: one per tool the request called (tool="" for a
	// request that failed before naming one), labelled with the response status.
	Requests *prometheus.CounterVec
	// Responses counts answered requests by status, once each.
	Responses *prometheus.CounterVec
	// Dispatch observes the time from the router's publish of a call to a worker starting it.
	Dispatch *prometheus.HistogramVec
	// Execution observes each try of a tool, by tool.
	Execution *prometheus.HistogramVec
	// ToolResults counts recorded results by tool, status and error code.
	ToolResults *prometheus.CounterVec
	// Retries counts tries that failed and were scheduled again, by tool and error code.
	Retries *prometheus.CounterVec
	// DeadLetters counts messages Hermes gave up on, by consumer and kind (max_deliveries,
	// terminated).
	DeadLetters *prometheus.CounterVec
	// InFlight is the number of tool calls running in this process, by tool.
	InFlight *prometheus.GaugeVec
	// HTTPRequests and HTTPDuration describe the gateway's HTTP traffic by route pattern.
	HTTPRequests *prometheus.CounterVec
	HTTPDuration *prometheus.HistogramVec
	// MCPServers is 1 for the state each MCP server a worker of this process holds is in
	// (connecting, connected, restarting, error), 0 for the others; MCPTools counts its tools.
	MCPServers *prometheus.GaugeVec
	MCPTools   *prometheus.GaugeVec
	// LLMCalls counts the agent loop's completions by backend, model and outcome (ok, or the
	// HTTP status the backend answered, "error" without one); LLMDuration observes them,
	// retries included; LLMTokens counts their tokens (kind prompt or completion).
	LLMCalls    *prometheus.CounterVec
	LLMDuration *prometheus.HistogramVec
	LLMTokens   *prometheus.CounterVec
	// LLMSummaries counts the summarizer's summaries by outcome (ok, failed).
	LLMSummaries *prometheus.CounterVec
	// FastLane counts the requests the routers here were asked on the fast lane, by outcome
	// (answered, replayed, conflict, declined, refused); FastRecordWaiting is how many answered
	// ones wait for their record to be written.
	FastLane          *prometheus.CounterVec
	FastRecordWaiting prometheus.Gauge
	// PartitionHold observes how long each request holds its request partition in a router
	// here (from its delivery until it is handled); PartitionsBusy is how many partitions the
	// routers here hold a request of now. A deployment routes at most partitions ÷ hold
	// requests a second: busy partitions near the record's number say it is the limit.
	PartitionHold  prometheus.Histogram
	PartitionsBusy prometheus.Gauge
}

// latencyBuckets span 0.5 ms to 60 s: bus hops take about a millisecond, tools up to minutes.
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// New returns Metrics registered with reg, with the Go runtime and process collectors; a nil
// reg gives unregistered metrics.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hermes_request_total",
			Help: "Answered requests, once per tool each called, by response status."}, []string{"status", "tool"}),
		Responses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hermes_responses_total",
			Help: "Answered requests by response status."}, []string{"status"}),
		Dispatch: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "hermes_tool_dispatch_duration_seconds",
			Help: "Time from the router publishing a tool call to a worker starting it.", Buckets: latencyBuckets}, []string{"tool"}),
		Execution: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "hermes_tool_execution_duration_seconds",
			Help: "Duration of each try of a tool.", Buckets: latencyBuckets}, []string{"tool"}),
		ToolResults: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hermes_tool_results_total",
			Help: "Recorded tool call results by status and error code."}, []string{"tool", "status", "error_code"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hermes_tool_retries_total",
			Help: "Failed tries scheduled to run again."}, []string{"tool", "error_code"}),
		DeadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hermes_dead_letters_total",
			Help: "Messages Hermes gave up on and dead-lettered."}, []string{"consumer", "kind"}),
		InFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hermes_tool_calls_in_flight",
			Help: "Tool calls running in this process."}, []string{"tool"}),
		HTTPRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hermes_http_requests_total",
			Help: "Gateway HTTP requests by route and status code."}, []string{"route", "code"}),
		HTTPDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "hermes_http_request_duration_seconds",
			Help: "Gateway HTTP request duration by route.", Buckets: latencyBuckets}, []string{"route"}),
		MCPServers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hermes_mcp_server_state",
			Help: "1 for the state an MCP server held by a tool worker here is in, 0 for the others."}, []string{"server", "state"}),
		MCPTools: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hermes_mcp_server_tools",
			Help: "Tools an MCP server held by a tool worker here lists."}, []string{"server"}),
		LLMCalls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hermes_llm_requests_total",
			Help: "The agent loop's completions by backend, model and outcome."}, []string{"backend", "model", "outcome"}),
		LLMDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "hermes_llm_request_duration_seconds",
			Help: "Duration of the agent loop's completions, retries included.", Buckets: latencyBuckets}, []string{"backend", "model"}),
		LLMTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hermes_llm_tokens_total",
			Help: "Tokens of the agent loop's completions by kind (prompt, completion)."}, []string{"backend", "model", "kind"}),
		LLMSummaries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hermes_llm_summaries_total",
			Help: "Sessions summarized by the summarizer here, by outcome (ok, failed)."}, []string{"outcome"}),
		FastLane: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hermes_fastlane_requests_total",
			Help: "Requests the routers here were asked on the fast lane, by outcome (answered, replayed, conflict, declined, refused)."}, []string{"outcome"}),
		FastRecordWaiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hermes_fastlane_record_waiting",
			Help: "Requests answered on the fast lane whose record waits to be written."}),
		PartitionHold: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hermes_router_partition_hold_seconds",
			Help: "How long each request held its request partition in a router here, from delivery until handled.", Buckets: latencyBuckets}),
		PartitionsBusy: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hermes_router_partitions_busy",
			Help: "Request partitions the routers here hold a request of now."}),
	}
	if reg != nil {
		reg.MustRegister(m.Requests, m.Responses, m.Dispatch, m.Execution, m.ToolResults, m.Retries, m.DeadLetters,
			m.InFlight, m.HTTPRequests, m.HTTPDuration, m.MCPServers, m.MCPTools, m.LLMCalls, m.LLMDuration, m.LLMTokens, m.LLMSummaries,
			m.FastLane, m.FastRecordWaiting, m.PartitionHold, m.PartitionsBusy,
			collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return m
}

// Answered counts one answered request: once by status, and once per distinct tool its
// results name. The contract sandbox's requests are not callers' and are not counted (their
// calls are, by tool, as the tools' own behaviour).
func (m *Metrics) Answered(resp *protocol.Response) {
	if protocol.IsSandboxSession(resp.SessionID) {
		return
	}
	status := string(resp.Status)
	m.Responses.WithLabelValues(status).Inc()
	if len(resp.Results) == 0 {
		m.Requests.WithLabelValues(status, "").Inc()
	}
	for i := range resp.Results {
		if !seen(resp.Results[:i], toolLabel(&resp.Results[i])) {
			m.Requests.WithLabelValues(status, toolLabel(&resp.Results[i])).Inc()
		}
	}
}

// Completed counts one completion of the agent loop's: outcome is "ok", the HTTP status the
// backend answered, or "error". Backends and models are the configured ones, so their labels
// are bounded.
func (m *Metrics) Completed(backend, model, outcome string, took time.Duration, prompt, completion int64) {
	m.LLMCalls.WithLabelValues(backend, model, outcome).Inc()
	m.LLMDuration.WithLabelValues(backend, model).Observe(took.Seconds())
	if prompt > 0 {
		m.LLMTokens.WithLabelValues(backend, model, "prompt").Add(float64(prompt))
	}
	if completion > 0 {
		m.LLMTokens.WithLabelValues(backend, model, "completion").Add(float64(completion))
	}
}

// Unrouted is the tool label of calls no route matched: their names come from callers, so
// they must not each make a series.
const Unrouted = "(unrouted)"

func toolLabel(r *protocol.ToolResult) string {
	if r.ErrorCode == protocol.CodeNoRoute {
		return Unrouted
	}
	return r.Name
}

func seen(results []protocol.ToolResult, tool string) bool {
	for i := range results {
		if toolLabel(&results[i]) == tool {
			return true
		}
	}
	return false
}

// Handler serves g in the Prometheus text format.
func Handler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Instrument wraps a handler served by an http.ServeMux and counts its requests by route
// pattern ("unmatched" when none) and status code.
func (m *Metrics) Instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(sw, r)
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		}
		m.HTTPRequests.WithLabelValues(route, statusText(sw.code)).Inc()
		m.HTTPDuration.WithLabelValues(route).Observe(time.Since(start).Seconds())
	})
}

type statusWriter struct {
	http.ResponseWriter
	code    int
	written bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.written {
		w.code, w.written = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.written = true
	return w.ResponseWriter.Write(b)
}

// Flush lets streaming handlers (server-sent events) flush through the wrapper.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap gives http.ResponseController the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func statusText(code int) string {
	if code < 100 || code > 599 {
		return "other"
	}
	return strconv.Itoa(code)
}

// Serve serves /metrics of g on ln until ctx is done.
func Serve(ctx context.Context, ln net.Listener, g prometheus.Gatherer) error {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", Handler(g))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	}
}

// Worker returns m as a tool worker's Observer: dispatch delays, in-flight calls, try
// durations, retries and recorded results.
func (m *Metrics) Worker() worker.Observer { return workerObserver{m} }

type workerObserver struct{ m *Metrics }

var _ worker.Observer = workerObserver{}

func (o workerObserver) Started(tool string, attempt int, waited time.Duration) {
	if attempt == 1 {
		o.m.Dispatch.WithLabelValues(tool).Observe(waited.Seconds())
	}
	o.m.InFlight.WithLabelValues(tool).Inc()
}

func (o workerObserver) Finished(tool string, took time.Duration) {
	o.m.InFlight.WithLabelValues(tool).Dec()
	o.m.Execution.WithLabelValues(tool).Observe(took.Seconds())
}

func (o workerObserver) Retrying(tool, errorCode string) {
	o.m.Retries.WithLabelValues(tool, o.m.codeLabel(errorCode)).Inc()
}

func (o workerObserver) Recorded(r *protocol.ToolResult) {
	o.m.ToolResults.WithLabelValues(r.Name, r.Status, o.m.codeLabel(r.ErrorCode)).Inc()
}

// OtherErrorCode is the label of an error code that is not one of Hermes' (a result recorded
// by an older Hermes, or forged): labels come from a bounded set.
const OtherErrorCode = "(other)"

// codeLabel is code as a label value: one of Hermes' codes (or none), else OtherErrorCode.
func (m *Metrics) codeLabel(code string) string {
	if code == "" || protocol.IsHermesCode(code) {
		return code
	}
	return OtherErrorCode
}
