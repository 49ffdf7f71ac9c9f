package httpexec_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
	"github.com/hermesbus/hermes/pkg/worker/httpexec"
	"github.com/hermesbus/hermes/pkg/worker/workertest"
)

// behaving is a tool over HTTP that does what each call's body asks (a workertest.Behavior),
// and remembers which calls the worker aborted.
type behaving struct {
	mu      sync.Mutex
	aborted map[string]bool
}

type spec struct {
	ID      string          `json:"id"`
	Answer  json.RawMessage `json:"answer"`
	DelayMS int             `json:"delay_ms"`
	Fail    int             `json:"fail"`
	Size    int             `json:"size"`
	Panic   bool            `json:"panic"`
	Stub    bool            `json:"stubborn"`
}

func (b *behaving) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var s spec
	if err := json.NewDecoder(r.Body).Decode(&s); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if s.DelayMS > 0 && s.Stub {
		time.Sleep(time.Duration(s.DelayMS) * time.Millisecond) // deaf to the client going away
	} else if s.DelayMS > 0 {
		select {
		case <-time.After(time.Duration(s.DelayMS) * time.Millisecond):
		case <-r.Context().Done():
			b.mu.Lock()
			b.aborted[s.ID] = true
			b.mu.Unlock()
			return
		}
	}
	switch {
	case s.Panic:
		panic("tool bug") // net/http drops the connection
	case s.Fail == int(workertest.FailRetryable):
		http.Error(w, `{"error":"overloaded"}`, http.StatusServiceUnavailable)
	case s.Fail == int(workertest.FailPermanent):
		http.Error(w, `{"error":"no such order"}`, http.StatusBadRequest)
	case s.Size > 0:
		w.Write([]byte(`"` + strings.Repeat("x", s.Size) + `"`))
	default:
		w.Write(s.Answer)
	}
}

func TestConformance(t *testing.T) {
	tool := &behaving{aborted: map[string]bool{}}
	srv := httptest.NewServer(tool)
	defer srv.Close()
	workertest.Run(t, workertest.Harness{
		Executor: httpexec.New(nil, nil),
		Call: func(t *testing.T, id string, b workertest.Behavior) *worker.Call {
			body, _ := json.Marshal(spec{ID: id, Answer: b.Answer, DelayMS: int(b.Delay / time.Millisecond), Fail: int(b.Fail), Size: b.Size, Panic: b.Panic, Stub: b.Stubborn})
			return &worker.Call{RequestID: "req_conf", SessionID: "s", Dispatch: &protocol.Dispatch{
				Call:  protocol.ToolCall{ToolCallID: id, Name: "behave", Arguments: body},
				Route: "behave",
				Action: protocol.Action{Kind: protocol.ActionHTTP, TimeoutMS: 10_000,
					HTTP: &protocol.HTTPAction{URL: srv.URL + "/behave", Method: "POST"}},
			}}
		},
		Aborted: func(t *testing.T, id string) bool {
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				tool.mu.Lock()
				ok := tool.aborted[id]
				tool.mu.Unlock()
				if ok {
					return true
				}
				time.Sleep(10 * time.Millisecond)
			}
			return false
		},
	})
}
