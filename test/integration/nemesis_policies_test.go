package integration

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// policyLoad is the nemesis' load on policies: calls of order_query park for approval and are
// approved while processes and the server are killed — each must run exactly once; calls of
// slow_echo go under a rate limit shared by every router — no more may run than it allows.
type policyLoad struct {
	s         *system
	approvals []string // approval ids, each approved
	limited   []string // request ids of the rate-limited calls
}

// rateCount is slow_echo's limit in the nemesis: fewer than the calls made.
const rateCount = 8

// apply applies the load's policies; before the routers start, so that each takes its first
// request knowing them (a router follows the policies before it takes any).
func (p *policyLoad) apply() {
	p.s.applyPolicy("order_query", `{"confirm_required":true,"expires_in":"10m"}`)
	p.s.applyPolicy("slow_echo", fmt.Sprintf(`{"rate_limit":"%d/h","scope":"tool"}`, rateCount))
}

// start sends the load until stop closes — and, however slow the faults made it, until it made
// enough for check to tell (an approval and more rate-limited calls than the limit); done is
// closed after.
func (p *policyLoad) start(stop <-chan struct{}) (done chan struct{}) {
	s := p.s
	done = make(chan struct{})
	go func() {
		defer close(done)
		client := &http.Client{Timeout: 10 * time.Second}
		post := func(path, body string) (int, []byte) { return s.postAnswered(client, path, body) }
		for k := 0; ; k++ {
			select {
			case <-s.ctx.Done():
				return
			case <-stop:
				if len(p.approvals) > 0 && len(p.limited) > rateCount {
					return
				}
			default:
			}
			id := fmt.Sprintf("nem_apr_%03d", k)
			code, body := post("/v1/route?timeout=10s", `{"request_id":"`+id+`","session_id":"nem_policies","tool_calls":[{"tool_call_id":"c1","name":"order_query","arguments":{"order_id":"ORD202603120042"}}]}`)
			if code == http.StatusOK {
				r := decodeResponse(s.t, body)
				if len(r.Results) == 1 && r.Results[0].Policy != nil && r.Results[0].Policy.ApprovalID != "" {
					apr := r.Results[0].Policy.ApprovalID
					if code, body := post("/v1/approvals/"+apr+"/approve", ""); code == http.StatusOK || code == http.StatusConflict && strings.Contains(string(body), protocol.CodeAlreadyDecided) {
						p.approvals = append(p.approvals, apr)
					} else {
						s.t.Errorf("approve %s: %d %s", apr, code, body)
					}
				}
			}
			lid := fmt.Sprintf("nem_rate_%03d", k)
			post("/v1/route?timeout=20ms", `{"request_id":"`+lid+`","session_id":"nem_policies_rate","tool_calls":[{"tool_call_id":"c1","name":"slow_echo","arguments":{}}]}`)
			p.limited = append(p.limited, lid)
			time.Sleep(300 * time.Millisecond)
		}
	}()
	return done
}

// postAnswered posts body to path until the gateway answers other than 5xx (a fault is being
// healed) or the system stops (0).
func (s *system) postAnswered(client *http.Client, path, body string) (int, []byte) {
	for {
		select {
		case <-s.ctx.Done():
			return 0, nil
		default:
		}
		resp, err := client.Post(s.base+path, "application/json", strings.NewReader(body))
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 500 {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		return resp.StatusCode, b
	}
}

// check fails the test unless every approved call ran exactly once (one result, recorded once,
// under its approval's request), and no more rate-limited calls ran than the limit allows. Call
// it after the system drained.
func (p *policyLoad) check() {
	s := p.s
	t := s.t
	if len(p.approvals) == 0 || len(p.limited) <= rateCount {
		t.Fatalf("the policy load made %d approvals and %d limited calls: too few to tell", len(p.approvals), len(p.limited))
	}
	for _, id := range p.approvals {
		waitForWithin(t, "approved call "+id+" ran", time.Minute, func() bool {
			code, _ := s.call(http.MethodGet, "/v1/requests/"+id, "", "")
			return code == http.StatusOK
		})
	}
	ran := map[string]int{}
	dispatched := map[string]bool{}
	for _, m := range s.record() {
		switch {
		case m.Type == protocol.TypeToolResult:
			if r, err := m.DecodeToolResult(); err == nil && r.Status == protocol.ResultOK && r.Name == "order_query" {
				ran[m.RequestID]++
			}
		case m.Type == protocol.TypeToolCall && strings.HasPrefix(m.RequestID, "nem_rate_"):
			dispatched[m.RequestID] = true
		}
	}
	for _, id := range p.approvals {
		if ran[id] != 1 {
			t.Errorf("approved call %s ran %d times; exactly once", id, ran[id])
		}
	}
	for id := range ran {
		if !strings.HasPrefix(id, "apr-") {
			t.Errorf("order_query ran in %s, not under an approval", id)
		}
	}
	if len(dispatched) > rateCount {
		t.Errorf("%d rate-limited calls were dispatched; the limit is %d", len(dispatched), rateCount)
	}
	t.Logf("policies under the nemesis: %d calls approved, each run once; %d of %d rate-limited calls dispatched (limit %d)",
		len(p.approvals), len(dispatched), len(p.limited), rateCount)
}
