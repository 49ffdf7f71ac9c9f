package integration

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// blueprintLoad is the nemesis' load on blueprints: runs of a blueprint of three stages (a
// step, a parallel group, a conditional step) begun while processes and the server are
// killed. Every run must end (succeeded, or failed visibly, naming the step), and each of its
// step calls run exactly once.
type blueprintLoad struct {
	s    *system
	runs []string
}

const nemesisBlueprint = `{"name":"nem_chain","steps":[
 {"tool":"echo","input_mapping":{"k":"$.user_input.k","step":0},"output_key":"a"},
 {"parallel":[
   {"tool":"record","input_mapping":{"k":"$.a.k","step":1},"output_key":"b"},
   {"tool":"echo","input_mapping":{"k":"$.a.k","step":2},"output_key":"c"}]},
 {"tool":"record","input_mapping":{"k":"$.b.k","after":"$.c.step"},"condition":"$.c.step == 2","output_key":"d"}]}`

// apply registers the blueprint.
func (b *blueprintLoad) apply() { b.s.applyBlueprint(nemesisBlueprint) }

// start begins runs until stop closes; done is closed after.
func (b *blueprintLoad) start(stop <-chan struct{}) (done chan struct{}) {
	done = make(chan struct{})
	go func() {
		defer close(done)
		client := &http.Client{Timeout: 10 * time.Second}
		for k := 0; ; k++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("nem_bp_%03d", k)
			code, body := b.s.postAnswered(client, "/v1/blueprints/nem_chain/runs", fmt.Sprintf(`{"run_id":%q,"user_input":{"k":"k%d"}}`, id, k))
			switch {
			case code == http.StatusCreated || code == http.StatusOK || code == http.StatusAccepted:
				b.runs = append(b.runs, id)
			case code == 0:
				return
			case code == http.StatusTooManyRequests && strings.Contains(string(body), protocol.CodeTooManyRuns):
				// As many runs going as a caller may have (a fault held them up): the caller
				// waits for one to end and begins the same run again, as it is told to.
				k--
				time.Sleep(time.Second)
				continue
			default:
				b.s.t.Errorf("begin run %s: %d %s", id, code, body)
			}
			time.Sleep(400 * time.Millisecond)
		}
	}()
	return done
}

// check fails the test unless every run begun ended succeeded, and each of its four calls
// ran exactly once (one successful result on the record), in no request but its steps'.
func (b *blueprintLoad) check() {
	s, t := b.s, b.s.t
	if len(b.runs) < 5 {
		t.Fatalf("the blueprint load began %d runs: too few to tell", len(b.runs))
	}
	runs := s.runs()
	for _, id := range b.runs {
		waitForWithin(t, "run "+id+" to end", 2*time.Minute, func() bool {
			r, _, err := runs.Get(s.ctx, id)
			return err == nil && r.Status.Final()
		})
		r, _, _ := runs.Get(s.ctx, id)
		if r.Status != blueprints.Succeeded {
			t.Errorf("run %s: %s %+v", id, r.Status, r.Error)
		}
	}
	ran := map[string]int{}
	for _, m := range s.record() {
		if m.Type != protocol.TypeToolResult || !strings.HasPrefix(m.SessionID, protocol.RunPrefix+"nem_bp_") {
			continue
		}
		if r, err := m.DecodeToolResult(); err == nil && r.Status == protocol.ResultOK {
			ran[m.RequestID+"/"+r.ToolCallID]++
		}
	}
	want := map[string]bool{}
	for _, id := range b.runs {
		for _, call := range []string{"s0/s0", "s1/s1_0", "s1/s1_1", "s2/s2"} {
			key := protocol.RunSession(id) + "-" + call
			want[key] = true
			if ran[key] != 1 {
				t.Errorf("%s ran %d times; exactly once", key, ran[key])
			}
		}
	}
	for key := range ran {
		if !want[key] {
			t.Errorf("%s ran, and is no step's call", key)
		}
	}
	t.Logf("blueprints under the nemesis: %d runs, all succeeded, each of their %d step calls run once", len(b.runs), len(want))
}
