package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// TestTwoRoutersTwoWorkers200Concurrent sends 200 requests at once (1 to 3 echo calls each,
// every call with its own payload) through two routers and two tool workers. Every response
// must be correct and complete, and each of the four instances must have done part of the work.
func TestTwoRoutersTwoWorkers200Concurrent(t *testing.T) {
	long(t, "load")
	s := start(t, options{routers: 2, workers: 2})
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("load_%03d", i)
			var calls []map[string]any
			for c := range 1 + i%3 {
				calls = append(calls, call(fmt.Sprintf("call_%d", c), "echo",
					map[string]any{"req": id, "call": c, "delay_ms": 5, "big": json.Number("9007199254740993")}))
			}
			status, _, body := s.post(request(id, "", calls...), "")
			if status != http.StatusOK {
				errs <- fmt.Errorf("%s: HTTP %d: %s", id, status, body)
				return
			}
			var resp protocol.Response
			if err := json.Unmarshal(body, &resp); err != nil {
				errs <- fmt.Errorf("%s: %v", id, err)
				return
			}
			if resp.RequestID != id || resp.Status != protocol.StatusSuccess || len(resp.Results) != len(calls) {
				errs <- fmt.Errorf("%s: wrong response %s", id, body)
				return
			}
			for c, r := range resp.Results {
				want := fmt.Sprintf(`{"big":9007199254740993,"call":%d,"delay_ms":5,"req":%q}`, c, id)
				if r.ToolCallID != fmt.Sprintf("call_%d", c) || string(r.Content) != want {
					errs <- fmt.Errorf("%s: result %d is %s %s, want %s", id, c, r.ToolCallID, r.Content, want)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	dispatchers, executors, responders := map[string]int{}, map[string]int{}, map[string]int{}
	for _, m := range s.record() {
		switch m.Type {
		case protocol.TypeToolCall:
			dispatchers[m.Sender.Instance]++
		case protocol.TypeToolResult:
			executors[m.Sender.Instance]++
		case protocol.TypeResponse:
			responders[m.Sender.Instance]++
		}
	}
	t.Logf("tool calls dispatched by %v, executed by %v, responses by %v", dispatchers, executors, responders)
	for _, inst := range []string{"router-1", "router-2"} {
		if dispatchers[inst]+responders[inst] == 0 {
			t.Errorf("%s did no work", inst)
		}
	}
	for _, inst := range []string{"worker-1", "worker-2"} {
		if executors[inst] == 0 {
			t.Errorf("%s did no work", inst)
		}
	}
	total := 0
	for _, c := range responders {
		total += c
	}
	if total != n {
		t.Errorf("%d responses recorded, want exactly %d", total, n)
	}
}
