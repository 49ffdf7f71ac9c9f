package integration

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/pkg/blueprint"
	"github.com/hermesbus/hermes/pkg/bus"
)

// applyBlueprint registers the blueprint doc through the bus, as the blueprints' API does.
func (s *system) applyBlueprint(doc string) {
	s.t.Helper()
	b, err := blueprint.Load([]byte(doc), nil)
	if err != nil {
		s.t.Fatal(err)
	}
	_, bb := s.connect()
	if _, _, err := blueprints.NewLibrary(bb.Bucket(blueprints.BlueprintsBucket)).Apply(context.Background(), b, "test"); err != nil {
		s.t.Fatal(err)
	}
}

// runs reads the runs' bucket.
func (s *system) runs() *blueprints.Runs {
	s.t.Helper()
	_, b := s.connect()
	return &blueprints.Runs{KV: b.Bucket(blueprints.RunsBucket)}
}

// chainBlueprint is three recorded steps, the second slow: a run killed in it resumes there.
const chainBlueprint = `{"name":"chain","description":"three recorded steps, the second slow","steps":[
 {"tool":"record","input_mapping":{"k":"$.user_input.k","step":0},"output_key":"first"},
 {"tool":"record","input_mapping":{"k":"$.first.k","step":1,"delay_ms":"$.user_input.delay_ms"},"output_key":"second"},
 {"tool":"record","input_mapping":{"k":"$.second.k","step":2},"output_key":"third"}]}`

// A gateway SIGKILLed in the middle of a run it drives: another gateway takes the run over
// once its lease lapses and finishes it; the finished step is not run again, the step in
// flight is joined (its call runs once), and the last runs once.
func TestBlueprintRunResumesAfterItsGatewayIsKilled(t *testing.T) {
	long(t, "a gateway SIGKILLed in the middle of a blueprint run")
	nats := startNATS(t, "interval")
	s := start(t, options{natsURL: nats.URL(), workers: 1, bus: bus.Config{AckWait: 2 * time.Second}})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser})
	s.applyBlueprint(chainBlueprint)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	gw := s.spawn("gateway", "bp-gateway-1", "--http", addr)
	inProcess := s.base
	s.base = "http://" + addr
	s.waitReady()
	code, body := s.call(http.MethodPost, "/v1/blueprints/chain/runs", keys["ann"], `{"run_id":"crash-1","user_input":{"k":"x","delay_ms":3000}}`)
	if code != http.StatusCreated {
		t.Fatalf("begin: %d %s", code, body)
	}
	runs := s.runs()
	var holder string
	waitFor(t, "the slow step to start", func() bool {
		r, _, err := runs.Get(s.ctx, "crash-1")
		if err == nil && r.Steps[1].Status == blueprints.StepRunning {
			holder = r.Holder
			return true
		}
		return false
	})
	gw.kill()
	killed := time.Now()
	s.base = inProcess

	var r *blueprints.Run
	waitForWithin(t, "the run to finish elsewhere", 60*time.Second, func() bool {
		r, _, err = runs.Get(s.ctx, "crash-1")
		return err == nil && r.Status.Final()
	})
	t.Logf("the run finished %v after its gateway was killed (lease %v)", time.Since(killed).Round(100*time.Millisecond), 15*time.Second)
	if r.Status != blueprints.Succeeded || holder != "bp-gateway-1" {
		t.Fatalf("after the kill: %s (held by %s before) %+v", r.Status, holder, r)
	}
	if !strings.Contains(string(r.Steps[2].Input), `"k":"x"`) {
		t.Fatalf("the last step's input: %s", r.Steps[2].Input)
	}
	for _, step := range []string{"s0", "s1", "s2"} {
		key := "bpr-crash-1-" + step + "/" + step
		if n := len(s.recorder.tries(key)); n != 1 {
			t.Errorf("step %s tried %d times; once", step, n)
		}
	}
	if n := len(s.recorder.idempotencyKeys()); n != 3 {
		t.Errorf("the tool was called under %d keys: %v", n, s.recorder.idempotencyKeys())
	}
}
