package httpexec_test

import (
	"io"
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

func (b *behaving) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	id, s, err := workertest.ReadScript(data)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if s.Wait(r.Context()) != nil { // the client went away
		b.mu.Lock()
		b.aborted[id] = true
		b.mu.Unlock()
		return
	}
	switch {
	case s.Panic:
		panic("tool bug") // net/http drops the connection
	case s.Fail == workertest.FailRetryable:
		http.Error(w, `{"error":"overloaded"}`, http.StatusServiceUnavailable)
	case s.Fail == workertest.FailPermanent:
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
		Executor: mustNew(t),
		Call: func(t *testing.T, id string, b workertest.Behavior) *worker.Call {
			body := workertest.Script(id, b)
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

func mustNew(t *testing.T) *httpexec.Executor {
	t.Helper()
	e, err := httpexec.New(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return e
}
