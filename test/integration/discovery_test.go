package integration

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/hermesbus/hermes/internal/discovery"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Gateways, routers and tool workers show themselves to NATS micro discovery (what nats micro
// ls, info and stats ask): each a service with its instance, and each worker's tools its
// endpoints, with the calls it ran of each as their stats' data.
func TestDiscoveryShowsEveryService(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	for i, tool := range []string{"echo", "echo", "forbidden_tool"} {
		body := `{"request_id":"disc_` + string(rune('a'+i)) + `","tool_calls":[{"tool_call_id":"c1","name":"` + tool + `","arguments":{}}]}`
		if code, out := s.call(http.MethodPost, "/v1/route", "", body); code != http.StatusOK {
			t.Fatalf("%d %s", code, out)
		}
	}
	nc, _ := s.connect()
	ask := func(subject string, into any) {
		t.Helper()
		msg, err := nc.Request(subject, nil, 5*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", subject, err)
		}
		if err := json.Unmarshal(msg.Data, into); err != nil {
			t.Fatalf("%s: %q", subject, msg.Data)
		}
	}
	for _, name := range []string{protocol.ServiceName, discovery.RouterService, discovery.WorkerService} {
		var p micro.Ping
		ask("$SRV.PING."+name, &p)
		if p.Name != name || p.Metadata["instance"] == "" {
			t.Errorf("ping %s: %+v", name, p)
		}
	}
	var router micro.Info
	ask("$SRV.INFO."+discovery.RouterService, &router)
	if router.Metadata["instance"] != "router-1" || !strings.Contains(router.Metadata["pipeline"], "route") {
		t.Errorf("the router: %+v", router)
	}
	var worker micro.Info
	ask("$SRV.INFO."+discovery.WorkerService, &worker)
	i := slices.IndexFunc(worker.Endpoints, func(e micro.EndpointInfo) bool { return e.Name == "echo" })
	if i < 0 || worker.Endpoints[i].Subject != discovery.SubjectTool("worker-1", "echo") || worker.Endpoints[i].Metadata["kind"] != protocol.ActionHTTP {
		t.Fatalf("the worker's endpoints: %+v", worker.Endpoints)
	}
	var stats micro.Stats
	defer func() {
		if t.Failed() {
			b, _ := json.Marshal(stats)
			t.Logf("stats: %s", b)
		}
	}()
	waitFor(t, "the worker's counts", func() bool {
		ask("$SRV.STATS."+discovery.WorkerService, &stats)
		for _, e := range stats.Endpoints {
			if e.Name == "echo" {
				var f struct {
					Calls, Errors int64
					Processing    int64 `json:"processing_time"`
				}
				_ = json.Unmarshal(e.Data, &f)
				return f.Calls == 2 && f.Errors == 0 && f.Processing > 0
			}
			if e.Name == "forbidden_tool" && !strings.Contains(string(e.Data), `"errors":1`) {
				return false
			}
		}
		return false
	})
	// The endpoint answers its tool's figures when asked.
	var now map[string]any
	ask(discovery.SubjectTool("worker-1", "echo"), &now)
	if now["tool"] != "echo" || now["calls"] != float64(2) {
		t.Errorf("asked: %v", now)
	}
}
