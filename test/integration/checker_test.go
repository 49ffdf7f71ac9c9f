package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// outcome classifies one logical request after a fault.
type outcome string

const (
	outcomeOK         outcome = "ok"                          // answered on the first try
	outcomeResolved   outcome = "indeterminate-then-resolved" // an error or timeout first, then the answer
	outcomeLost       outcome = "lost"                        // never answered
	outcomeDuplicated outcome = "duplicated"                  // more than one response, or answers that differ
)

// clientRun is what one client saw for one request_id.
type clientRun struct {
	id       string
	posts    int
	failures []string // HTTP errors and statuses other than 200
	answers  [][]byte // every 200 body
}

// persistentClient posts req until it gets a 200 or deadline passes, with the same request_id
// every time; each post waits at most wait for the response.
func (s *system) persistentClient(req map[string]any, wait time.Duration, deadline time.Time) clientRun {
	run := clientRun{id: req["request_id"].(string)}
	data, _ := json.Marshal(req)
	client := &http.Client{Timeout: wait + 5*time.Second}
	for time.Now().Before(deadline) {
		run.posts++
		resp, err := client.Post(s.base+"/v1/route?timeout="+wait.String(), "application/json", bytes.NewReader(data))
		if err != nil {
			run.failures = append(run.failures, err.Error())
			time.Sleep(100 * time.Millisecond) // back off before retrying, as a client would
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			run.answers = append(run.answers, body)
			return run
		}
		run.failures = append(run.failures, fmt.Sprintf("HTTP %d", resp.StatusCode))
		if resp.StatusCode != http.StatusGatewayTimeout {
			time.Sleep(100 * time.Millisecond)
		}
	}
	return run
}

// runClients runs one persistent client per request concurrently, starting one every stagger.
func (s *system) runClients(reqs []map[string]any, wait, stagger, budget time.Duration) []clientRun {
	deadline := time.Now().Add(budget)
	runs := make([]clientRun, len(reqs))
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runs[i] = s.persistentClient(req, wait, deadline)
		}()
		time.Sleep(stagger) // pacing the load, not synchronisation
	}
	wg.Wait()
	return runs
}

// classify checks every client's view against the record: exactly one response message per
// request, and every answer a client got equal to it.
func (s *system) classify(runs []clientRun) map[outcome]int {
	s.t.Helper()
	s.drain()
	recorded := map[string][]*protocol.Response{}
	for _, m := range s.record() {
		if m.Type != protocol.TypeResponse {
			continue
		}
		r, err := m.DecodeResponse()
		if err != nil {
			s.t.Fatalf("recorded response %s: %v", m.MsgID, err)
		}
		recorded[m.RequestID] = append(recorded[m.RequestID], r)
	}
	counts := map[outcome]int{}
	for _, run := range runs {
		var o outcome
		switch rec := recorded[run.id]; {
		case len(rec) > 1:
			o = outcomeDuplicated
		case len(run.answers) == 0:
			o = outcomeLost
		case len(rec) == 0:
			// A client was answered, but the record holds no response: the answer came from
			// nowhere the record can vouch for.
			o = outcomeDuplicated
		default:
			want, _ := json.Marshal(rec[0])
			for _, a := range run.answers {
				var got protocol.Response
				if json.Unmarshal(a, &got) != nil {
					o = outcomeDuplicated
					break
				}
				g, _ := json.Marshal(&got)
				if !bytes.Equal(g, want) {
					o = outcomeDuplicated
				}
			}
			if o == "" && len(run.failures) > 0 {
				o = outcomeResolved
			} else if o == "" {
				o = outcomeOK
			}
		}
		counts[o]++
		if o == outcomeLost || o == outcomeDuplicated {
			s.t.Errorf("request %s is %s (posts %d, failures %v, recorded responses %d)", run.id, o, run.posts, run.failures, len(recorded[run.id]))
		}
	}
	return counts
}

// drain waits until every consumer of the record has handled everything: a response a client
// got from KV may still be on its way to the record (its router died between recording and
// publishing it; the redelivery publishes it).
func (s *system) drain() {
	s.t.Helper()
	_, b := s.connect()
	ctx := context.Background()
	busy := ""
	drained := func() bool {
		for info := range b.Stream.ListConsumers(ctx).Info() {
			if info.NumPending > 0 || info.NumAckPending > 0 {
				busy = fmt.Sprintf("%s: %d pending, %d awaiting ack, %d redelivered", info.Name, info.NumPending, info.NumAckPending, info.NumRedelivered)
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(20 * time.Second); !drained(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out waiting for the consumers to drain (%s)", busy)
		}
	}
}

// report logs the classification in a stable order.
func report(t *testing.T, scenario string, total int, counts map[outcome]int) {
	t.Helper()
	var parts []string
	for o, n := range counts {
		parts = append(parts, fmt.Sprintf("%s=%d", o, n))
	}
	sort.Strings(parts)
	t.Logf("%s: %d requests: %s", scenario, total, strings.Join(parts, " "))
}
