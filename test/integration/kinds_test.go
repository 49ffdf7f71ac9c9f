package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
)

// TestWorkersPullOnlyTheirKinds: a call routed to an in-process Go tool (action kind go) is
// never taken by a worker that runs only HTTP tools: it waits as backlog of its own consumer,
// visible there, until a program serving the Go tool on the public worker runtime starts; then
// it runs there. A gRPC call (a kind Hermes does not run) is refused at routing.
func TestWorkersPullOnlyTheirKinds(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1}) // Hermes' own worker: HTTP only
	req := request("kind_1", "", call("h", "echo", map[string]any{"n": 1}), call("g", "shout", map[string]any{"text": "hello"}))
	if status, _, body := s.post(req, "?timeout=1s"); status != http.StatusGatewayTimeout {
		t.Fatalf("before any Go worker: HTTP %d: %s", status, body)
	}
	ctx := t.Context()
	_, b := s.connect()
	cons, err := b.Stream.Consumer(ctx, bus.ToolConsumer(protocol.ActionGo, "shout"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil || info.NumPending != 1 || info.NumAckPending != 0 || info.Delivered.Consumer != 0 {
		t.Fatalf("the Go call's consumer: %+v %v; want it waiting, never delivered", info, err)
	}
	// The backlog is in the metrics too (hermes up's and the router's /metrics scrape it).
	backlog := `hermes_consumer_pending_messages{consumer="tool_go-shout",stream="HERMES"} 1`
	if text := gatherText(t, &metrics.Backlog{Streams: []jetstream.Stream{b.Stream}}); !strings.Contains(text, backlog) {
		t.Errorf("metrics lack %s:\n%s", backlog, grepLines(text, "tool_go"))
	}
	if n := s.countRecorded("kind_1", protocol.TypeToolStarted); n != 1 {
		t.Errorf("%d calls started; only the http one may", n)
	}

	// A program of its own serves the Go tool, on nothing but pkg/.
	funcs, err := worker.NewFuncs(map[string]worker.Func{
		"shout": func(_ context.Context, args json.RawMessage) (any, error) {
			var in struct{ Text string }
			if err := json.Unmarshal(args, &in); err != nil {
				return nil, &worker.ToolError{Code: protocol.CodeBadArguments, Err: err}
			}
			return map[string]string{"text": strings.ToUpper(in.Text) + "!"}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(worker.Config{Bus: b, Instance: "go-program", Executors: []worker.Executor{funcs}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(w.Kinds(), ","); got != protocol.ActionGo {
		t.Fatalf("kinds %s", got)
	}
	s.goRun(w.Run)
	var resp *protocol.Response
	waitFor(t, "the Go call to run", func() bool {
		r, err := http.Get(s.base + "/v1/requests/kind_1")
		if err != nil {
			return false
		}
		defer r.Body.Close()
		body, _ := io.ReadAll(r.Body)
		if r.StatusCode != http.StatusOK {
			return false
		}
		resp = decodeResponse(t, body)
		return true
	})
	if g := result(t, resp, "g"); g.Status != protocol.ResultOK || string(g.Content) != `{"text":"HELLO!"}` || g.Route != "shout_in_process" {
		t.Fatalf("Go call: %+v", g)
	}
	for _, m := range s.record() {
		if m.Type == protocol.TypeToolStarted && m.RequestID == "kind_1" {
			st, _ := m.DecodeToolStarted()
			if want := map[string]string{"h": "worker-1", "g": "go-program"}[st.ToolCallID]; m.Sender.Instance != want {
				t.Errorf("call %s started on %s, want %s", st.ToolCallID, m.Sender.Instance, want)
			}
		}
	}
	waitFor(t, "the Go call's backlog to be gone", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
}

// gatherText is what c exports, in the Prometheus text format.
func gatherText(t *testing.T, c prometheus.Collector) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range families {
		if _, err := expfmt.MetricFamilyToText(&b, f); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}
