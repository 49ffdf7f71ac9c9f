package metrics

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// described returns the name of every metric reg's collectors describe.
func described(t *testing.T, reg *prometheus.Registry, extra ...prometheus.Collector) map[string]bool {
	t.Helper()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	names := map[string]bool{}
	ch := make(chan *prometheus.Desc)
	go func() {
		for _, c := range append([]prometheus.Collector{reg}, extra...) {
			c.Describe(ch)
		}
		close(ch)
	}()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			names[m[1]] = true
		}
	}
	return names
}

func TestDashboardQueriesOnlyMetricsThatExist(t *testing.T) {
	data, err := os.ReadFile("../../deploy/grafana/hermes-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard is not valid JSON: %v", err)
	}
	reg := prometheus.NewRegistry()
	New(reg)
	names := described(t, reg, &Backlog{})
	metric := regexp.MustCompile(`\b(?:hermes|process|go)_[a-z0-9_]+\b`)
	var exprs []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok {
			exprs = append(exprs, q)
		}
	}
	checked := 0
	for _, e := range exprs {
		for _, name := range metric.FindAllString(e, -1) {
			base := name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(name, suffix); ok && names[b] {
					base = b
				}
			}
			if !names[base] {
				t.Errorf("the dashboard queries %s, which Hermes does not export (in %q)", name, e)
			}
			checked++
		}
	}
	if checked < 10 {
		t.Fatalf("only %d metric references found in the dashboard", checked)
	}
}

func TestAnsweredCountsEachToolOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.Answered(&protocol.Response{Status: protocol.StatusPartialSuccess, Results: []protocol.ToolResult{
		{Name: "weather"}, {Name: "weather"}, {Name: "calendar"}}})
	m.Answered(&protocol.Response{Status: protocol.StatusFailed})
	srv := httptest.NewServer(Handler(reg))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`hermes_request_total{status="partial_success",tool="weather"} 1`,
		`hermes_request_total{status="partial_success",tool="calendar"} 1`,
		`hermes_request_total{status="failed",tool=""} 1`,
		`hermes_responses_total{status="partial_success"} 1`,
		`hermes_responses_total{status="failed"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
}

func TestInstrumentCountsByPatternAndCode(t *testing.T) {
	m := New(nil)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/requests/{id}", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNotFound) })
	h := m.Instrument(mux)
	for _, path := range []string{"/v1/requests/a", "/v1/requests/b", "/nope"} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
	}
	if got := testCounter(t, m.HTTPRequests.WithLabelValues("GET /v1/requests/{id}", "404")); got != 2 {
		t.Fatalf("GET /v1/requests/{id} 404 counted %v times, want 2", got)
	}
	if got := testCounter(t, m.HTTPRequests.WithLabelValues("unmatched", "404")); got != 1 {
		t.Fatalf("unmatched 404 counted %v times, want 1", got)
	}
}

func testCounter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var m dto.Metric
	if err := (<-ch).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestErrorCodeLabelsAreHermes: error_code labels are Hermes' codes only; anything else (a
// result recorded before tools' codes moved to tool_error_code, or forged) shares one label.
func TestErrorCodeLabelsAreHermes(t *testing.T) {
	m := New(nil)
	obs := m.Worker()
	for i := range 300 {
		obs.Recorded(&protocol.ToolResult{Name: "t", Status: protocol.ResultError, ErrorCode: fmt.Sprintf("CODE_%d", i)})
	}
	obs.Recorded(&protocol.ToolResult{Name: "t", Status: protocol.ResultError, ErrorCode: protocol.CodeToolHTTP4xx, ToolErrorCode: "ORDER_NOT_FOUND"})
	if n := testutil.CollectAndCount(m.ToolResults); n != 2 {
		t.Errorf("%d series, want 2", n)
	}
	if v := testutil.ToFloat64(m.ToolResults.WithLabelValues("t", protocol.ResultError, OtherErrorCode)); v != 300 {
		t.Errorf("(other) = %v", v)
	}
	if v := testutil.ToFloat64(m.ToolResults.WithLabelValues("t", protocol.ResultError, protocol.CodeToolHTTP4xx)); v != 1 {
		t.Errorf("TOOL_HTTP_4XX = %v", v)
	}
}
