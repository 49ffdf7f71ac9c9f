package demotools

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"
)

func TestEchoReturnsExactlyItsInput(t *testing.T) {
	s := newTestServer()
	for _, body := range []string{
		`{"id":9007199254740993,"neg":-9223372036854775808,"f":2.50,"e":1e400,"s":"é\u00e9<>&","n":null,"a":[1,{"b":[]}]}`,
		"{\n  \"pretty\": true,\n  \"delay_ms\": 0\n}",
		`{"status":200,"fail_times":0}`,
	} {
		r := do(t, s, "POST", "/v1/echo", body)
		if r.status != http.StatusOK || string(r.body) != body {
			t.Errorf("echo(%s) = %d %s", body, r.status, r.body)
		}
	}
	if r := do(t, s, "POST", "/v1/echo", ""); r.status != http.StatusOK || string(r.body) != "{}" {
		t.Errorf("echo of an empty body = %d %s, want 200 {}", r.status, r.body)
	}
}

func TestEchoGET(t *testing.T) {
	r := do(t, newTestServer(), "GET", "/v1/echo?id=9007199254740993&tag=a&tag=b&name=%E7%8E%8B%E4%BA%94", "")
	want := `{"id":"9007199254740993","name":"王五","tag":["a","b"]}`
	if r.status != http.StatusOK || string(r.body) != want {
		t.Errorf("GET echo = %d %s, want %s", r.status, r.body, want)
	}
	// An object travels in the query as its JSON text, and is echoed as that string.
	r = do(t, newTestServer(), "GET", "/v1/echo?barrier="+url.QueryEscape(`{"id":"g","count":1}`)+"&delay_ms=1", "")
	want = `{"barrier":"{\"id\":\"g\",\"count\":1}","delay_ms":"1"}`
	if r.status != http.StatusOK || string(r.body) != want {
		t.Errorf("GET echo with a barrier = %d %s, want %s", r.status, r.body, want)
	}
}

func TestEchoStatus(t *testing.T) {
	s := newTestServer()
	for _, status := range []int{202, 404, 429, 500, 503} {
		body := fmt.Sprintf(`{"status":%d,"x":"y"}`, status)
		r := do(t, s, "POST", "/v1/echo", body)
		if r.status != status || string(r.body) != body {
			t.Errorf("status %d: got %d %s", status, r.status, r.body)
		}
	}
	if r := do(t, s, "GET", "/v1/echo?status=418", ""); r.status != 418 {
		t.Errorf("GET status=418: got %d", r.status)
	}
}

func TestEchoRejectsBadControls(t *testing.T) {
	s := newTestServer()
	for body, field := range map[string]string{
		`{"delay_ms":"soon"}`:                             "delay_ms",
		`{"delay_ms":-1}`:                                 "delay_ms",
		`{"fail_times":1.5}`:                              "fail_times",
		`{"status":99}`:                                   "status",
		`{"status":"teapot"}`:                             "status",
		`{"barrier":"b"}`:                                 "barrier",
		`{"barrier":{"count":2}}`:                         "barrier.id",
		`{"barrier":{"id":"b"}}`:                          "barrier.count",
		`{"barrier":{"id":"b","count":0}}`:                "barrier.count",
		`{"barrier":{"id":"b","count":2,"timeout_ms":0}}`: "barrier.timeout_ms",
	} {
		t.Run(body, func(t *testing.T) { wantArgError(t, do(t, s, "POST", "/v1/echo", body), field) })
	}
	wantError(t, do(t, s, "POST", "/v1/echo", `[1,2]`), http.StatusBadRequest, "INVALID_ARGUMENT")
	wantError(t, do(t, s, "POST", "/v1/echo", `{"a":1} {"b":2}`), http.StatusBadRequest, "INVALID_ARGUMENT")
}

func TestEchoFailTimes(t *testing.T) {
	s := newTestServer()
	body := `{"fail_times":2,"v":1}`
	try := func(key string) reply {
		t.Helper()
		if key == "" {
			return do(t, s, "POST", "/v1/echo", body)
		}
		return do(t, s, "POST", "/v1/echo", body, "Idempotency-Key", key)
	}
	for k := 1; k <= 2; k++ {
		r := try("req_1/call_1")
		wantError(t, r, http.StatusServiceUnavailable, "UNAVAILABLE")
		m := r.obj(t)
		if want := fmt.Sprintf("failing try %d of 2", k); m["message"] != want || m["recovery_hint"] != "retry later" {
			t.Errorf("try %d: %s", k, r.body)
		}
	}
	// Another key has its own count, even while the first one is failing.
	wantError(t, try("req_1/call_2"), http.StatusServiceUnavailable, "UNAVAILABLE")
	for range 2 {
		if r := try("req_1/call_1"); r.status != http.StatusOK || string(r.body) != body {
			t.Fatalf("after 2 failures: %d %s", r.status, r.body)
		}
	}
	wantError(t, try("req_1/call_2"), http.StatusServiceUnavailable, "UNAVAILABLE")
	if r := try("req_1/call_2"); r.status != http.StatusOK {
		t.Errorf("call_2 third try: %d", r.status)
	}
	// No header counts as the empty key.
	wantError(t, try(""), http.StatusServiceUnavailable, "UNAVAILABLE")
	wantError(t, try(""), http.StatusServiceUnavailable, "UNAVAILABLE")
	if r := try(""); r.status != http.StatusOK {
		t.Errorf("no key, third try: %d", r.status)
	}
	// GET carries fail_times in the query.
	if r := do(t, s, "GET", "/v1/echo?fail_times=1", "", "Idempotency-Key", "get"); r.status != http.StatusServiceUnavailable {
		t.Errorf("GET fail_times=1 first try: %d", r.status)
	}
}

func TestFailCounterIsBounded(t *testing.T) {
	c := newFailCounter(3)
	for _, k := range []string{"a", "b", "c", "a", "d"} { // "b" is now the least recently used
		c.hit(k)
	}
	if c.len() != 3 {
		t.Fatalf("remembers %d keys, want 3", c.len())
	}
	if n := c.hit("a"); n != 3 {
		t.Errorf("a: %d, want 3", n)
	}
	if n := c.hit("b"); n != 1 {
		t.Errorf("b was forgotten, yet counts %d", n)
	}
}

// startEcho sends body to the echo tool in a goroutine; the reply arrives on the channel.
func startEcho(t *testing.T, ctx context.Context, s *server, body string) <-chan reply {
	t.Helper()
	ch := make(chan reply, 1)
	go func() { ch <- doCtx(t, ctx, s, "POST", "/v1/echo", body) }()
	return ch
}

func receive(t *testing.T, ch <-chan reply) reply {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("no reply within 5 s")
		return reply{}
	}
}

func TestEchoBarrierReleasesTogether(t *testing.T) {
	s := newTestServer()
	ctx := context.Background()
	for round := range 2 { // a released id can be reused by a new group
		var replies []<-chan reply
		for i := range 2 {
			replies = append(replies, startEcho(t, ctx, s, fmt.Sprintf(`{"n":%d,"barrier":{"id":"b1","count":3}}`, i)))
		}
		waitFor(t, "2 requests at the barrier", func() bool { return s.barriers.waiting("b1") == 2 })
		for i, ch := range replies {
			select {
			case r := <-ch:
				t.Fatalf("round %d: request %d answered before the barrier filled: %d %s", round, i, r.status, r.body)
			default:
			}
		}
		replies = append(replies, startEcho(t, ctx, s, `{"n":2,"barrier":{"id":"b1","count":3}}`))
		for i, ch := range replies {
			r := receive(t, ch)
			if want := fmt.Sprintf(`{"n":%d,"barrier":{"id":"b1","count":3}}`, i); r.status != http.StatusOK || string(r.body) != want {
				t.Errorf("round %d: request %d: %d %s", round, i, r.status, r.body)
			}
		}
		if n := s.barriers.waiting("b1"); n != 0 {
			t.Errorf("round %d: %d still waiting after release", round, n)
		}
	}
}

func TestEchoBarrierTimeout(t *testing.T) {
	s := newTestServer()
	r := do(t, s, "POST", "/v1/echo", `{"barrier":{"id":"lonely","count":2,"timeout_ms":20}}`)
	wantError(t, r, http.StatusGatewayTimeout, "BARRIER_TIMEOUT")
	if n := s.barriers.waiting("lonely"); n != 0 {
		t.Errorf("%d still waiting after the timeout", n)
	}
}

func TestEchoBarrierLeaverDoesNotCount(t *testing.T) {
	s := newTestServer()
	ctx, cancel := context.WithCancel(context.Background())
	gone := startEcho(t, ctx, s, `{"barrier":{"id":"b2","count":2}}`)
	waitFor(t, "1 request at the barrier", func() bool { return s.barriers.waiting("b2") == 1 })
	cancel()
	wantError(t, receive(t, gone), http.StatusServiceUnavailable, "CANCELLED")
	if n := s.barriers.waiting("b2"); n != 0 {
		t.Fatalf("the request that went away still counts: %d waiting", n)
	}
	first := startEcho(t, context.Background(), s, `{"barrier":{"id":"b2","count":2}}`)
	waitFor(t, "1 request at the barrier", func() bool { return s.barriers.waiting("b2") == 1 })
	select {
	case r := <-first:
		t.Fatalf("released with one request: %d %s", r.status, r.body)
	default:
	}
	second := startEcho(t, context.Background(), s, `{"barrier":{"id":"b2","count":2}}`)
	for _, ch := range []<-chan reply{first, second} {
		if r := receive(t, ch); r.status != http.StatusOK {
			t.Errorf("%d %s", r.status, r.body)
		}
	}
}

func TestEchoBarrierCountMismatch(t *testing.T) {
	s := newTestServer()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiting := startEcho(t, ctx, s, `{"barrier":{"id":"b3","count":3}}`)
	waitFor(t, "1 request at the barrier", func() bool { return s.barriers.waiting("b3") == 1 })
	wantArgError(t, do(t, s, "POST", "/v1/echo", `{"barrier":{"id":"b3","count":2}}`), "barrier.count")
	cancel()
	receive(t, waiting)
}

func TestEchoDelayHonoursCancellation(t *testing.T) {
	s := newTestServer()
	ctx, cancel := context.WithCancel(context.Background())
	ch := startEcho(t, ctx, s, `{"delay_ms":600000}`)
	cancel()
	wantError(t, receive(t, ch), http.StatusServiceUnavailable, "CANCELLED")
}

func TestEchoDelay(t *testing.T) {
	start := time.Now()
	r := do(t, newTestServer(), "POST", "/v1/echo", `{"delay_ms":30}`)
	if r.status != http.StatusOK || time.Since(start) < 30*time.Millisecond {
		t.Errorf("delay_ms 30: %d after %v", r.status, time.Since(start))
	}
	if ms, _ := strconv.Atoi(r.header.Get("X-Execution-Time")); ms < 30 {
		t.Errorf("X-Execution-Time = %d, want at least 30", ms)
	}
}
