package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Tools appear while discovery asks for the stats (which micro answers holding its lock, and
// asks each endpoint's data under it): neither waits on the other, and every tool is shown with
// what its calls were.
func TestToolsAppearWhileStatsAreAsked(t *testing.T) {
	t.Parallel()
	srv := bustest.NewServer(t)
	nc, err := nats.Connect(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tools := &Tools{Conn: nc, Instance: "w1"}
	obs := tools.Observer(nil)
	done := make(chan error, 1)
	go func() { done <- tools.Run(ctx) }()
	asker, err := nats.Connect(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer asker.Close()
	for deadline := time.Now().Add(10 * time.Second); ; { // the service is up once it answers
		if _, err := asker.Request("$SRV.PING."+WorkerService, nil, time.Second); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the service never answered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop := make(chan struct{})
	asked := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				asked <- n
				return
			default:
			}
			if _, err := asker.Request("$SRV.STATS."+WorkerService, nil, time.Second); err == nil {
				n++
			}
		}
	}()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for i := range 200 {
			tool := fmt.Sprintf("tool_%d", i)
			tools.Serving(protocol.ActionHTTP, tool)
			obs.Started(tool, 1, 0)
			obs.Finished(tool, time.Millisecond)
			obs.Recorded(&protocol.ToolResult{Name: tool, Status: protocol.ResultOK})
		}
	}()
	select {
	case <-finished:
	case <-time.After(20 * time.Second):
		t.Fatal("adding tools while the stats were asked did not finish: a deadlock")
	}
	close(stop)
	if n := <-asked; n == 0 {
		t.Log("no stats were answered meanwhile")
	}
	msg, err := asker.Request("$SRV.STATS."+WorkerService, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var st micro.Stats
	if err := json.Unmarshal(msg.Data, &st); err != nil || len(st.Endpoints) != 200 {
		t.Fatalf("%d endpoints: %v", len(st.Endpoints), err)
	}
	for _, e := range st.Endpoints {
		var f Figures
		if err := json.Unmarshal(e.Data, &f); err != nil || f.Tool != e.Name || f.Calls != 1 || f.ProcessingTime != time.Millisecond {
			t.Fatalf("%s: %s %v", e.Name, e.Data, err)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
