package bench_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/bench"
)

// BenchmarkSerialSession measures how fast one session's serial requests run one after
// another: b.N requests of two echo calls are accepted at once (each waits, parked, for the
// previous one's response), and the benchmark ends when the last is answered. ns/op is the
// time from one serial request's response to the next one's, through park, wake-up, dispatch,
// results and response.
func BenchmarkSerialSession(b *testing.B) {
	sys := startSystem(b)
	client := bench.NewClient(4)
	call := func(method, url, body string) (*http.Response, error) {
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+sys.Key.Key)
		return client.Do(req)
	}
	session := fmt.Sprintf("serial%d_%d", os.Getpid(), runs.Add(1))
	post := func(id string) {
		body := fmt.Sprintf(`{"request_id":%q,"session_id":%q,"serial":true,"tool_calls":[`+
			`{"tool_call_id":"a","name":"echo","arguments":{}},{"tool_call_id":"b","name":"echo","arguments":{}}]}`, id, session)
		resp, err := call(http.MethodPost, sys.GatewayURL+"/v1/route?timeout=1ms", body)
		if err != nil {
			b.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusGatewayTimeout {
			b.Fatalf("POST %s: HTTP %d %s", id, resp.StatusCode, data)
		}
	}
	b.ResetTimer()
	last := ""
	for i := range b.N {
		last = fmt.Sprintf("%s_%d", session, i)
		post(last)
	}
	for {
		resp, err := call(http.MethodGet, sys.GatewayURL+"/v1/requests/"+last, "")
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		time.Sleep(time.Millisecond)
	}
}
