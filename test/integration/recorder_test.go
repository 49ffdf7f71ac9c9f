package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder is a tool server (127.0.0.1:8082 in testdata/routes.yaml) that records every try it
// receives. POST /record takes {"delay_ms": N, "first_delay_ms": N, "slow_tries": K}: the
// first try of an Idempotency-Key waits first_delay_ms, and each of its first K tries (every try
// when K is 0) waits delay_ms; waits end early when the caller goes away.
type recorder struct {
	addr    string
	mu      sync.Mutex
	keys    map[string][]http.Header // Idempotency-Key → headers of each try, in order
	aborted map[string]int           // Idempotency-Key → tries the caller abandoned before the answer
}

// newRecorderOn serves a recorder on ln.
func newRecorderOn(t *testing.T, ln net.Listener) *recorder {
	r := &recorder{keys: map[string][]http.Header{}, aborted: map[string]int{}}
	srv := httptest.NewUnstartedServer(r)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	r.addr = strings.TrimPrefix(srv.URL, "http://")
	return r
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	var args struct {
		DelayMS      int `json:"delay_ms"`
		FirstDelayMS int `json:"first_delay_ms"`
		SlowTries    int `json:"slow_tries"`
		PadBytes     int `json:"pad_bytes"`
	}
	_ = json.Unmarshal(body, &args)
	key := r.Header.Get("Idempotency-Key")
	rec.mu.Lock()
	rec.keys[key] = append(rec.keys[key], r.Header.Clone())
	try := len(rec.keys[key])
	rec.mu.Unlock()
	var delay time.Duration
	if args.SlowTries == 0 || try <= args.SlowTries {
		delay = time.Duration(args.DelayMS) * time.Millisecond
	}
	if try == 1 {
		delay += time.Duration(args.FirstDelayMS) * time.Millisecond
	}
	select {
	case <-time.After(delay):
	case <-r.Context().Done():
		rec.mu.Lock()
		rec.aborted[key]++
		rec.mu.Unlock()
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if args.PadBytes > 0 {
		_, _ = fmt.Fprintf(w, `{"pad":"%s"}`, strings.Repeat("x", args.PadBytes))
		return
	}
	_, _ = w.Write(body)
}

// abortedTries counts the tries of key whose caller went away before the answer.
func (rec *recorder) abortedTries(key string) int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.aborted[key]
}

// tries returns the headers of every try of key.
func (rec *recorder) tries(key string) []http.Header {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]http.Header(nil), rec.keys[key]...)
}

// idempotencyKeys lists the keys of every call the recorder saw.
func (rec *recorder) idempotencyKeys() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var out []string
	for k := range rec.keys {
		out = append(out, k)
	}
	return out
}
