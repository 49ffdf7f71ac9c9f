package demotools

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// startServe runs serve in a goroutine; its result arrives on the channel.
func startServe(t *testing.T, ctx context.Context, ln net.Listener, s *server, grace time.Duration) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, s, s.logger, grace) }()
	return done
}

func post(url, body string) (int, string, error) {
	res, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), err
}

func TestServe(t *testing.T) {
	ln := listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, nil) }()
	status, body, err := post("http://"+ln.Addr().String()+"/v1/echo", `{"hello":"world"}`)
	if err != nil || status != http.StatusOK || body != `{"hello":"world"}` {
		t.Fatalf("echo over TCP: %d %q %v", status, body, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve returned %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after its ctx was done")
	}
}

// TestServeDrainsInFlight checks that a request in flight when shutdown begins still gets its
// answer, and that Serve returns only afterwards.
func TestServeDrainsInFlight(t *testing.T) {
	ln := listen(t)
	s := newTestServer()
	ctx, cancel := context.WithCancel(context.Background())
	done := startServe(t, ctx, ln, s, 5*time.Second)

	type result struct {
		status int
		err    error
	}
	answered := make(chan result, 1)
	go func() {
		status, _, err := post("http://"+ln.Addr().String()+"/v1/echo", `{"barrier":{"id":"drain","count":2,"timeout_ms":200}}`)
		answered <- result{status, err}
	}()
	waitFor(t, "the request at the barrier", func() bool { return s.barriers.waiting("drain") == 1 })
	cancel()
	select {
	case r := <-answered:
		if r.err != nil || r.status != http.StatusGatewayTimeout {
			t.Fatalf("in-flight request: %d %v, want its own 504 answer", r.status, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("in-flight request never answered")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("serve did not return")
	}
}

// TestServeForcesAfterGrace checks that a request still running after the grace period is
// cancelled and that serve waits for its handler before returning.
func TestServeForcesAfterGrace(t *testing.T) {
	ln := listen(t)
	s := newTestServer()
	ctx, cancel := context.WithCancel(context.Background())
	done := startServe(t, ctx, ln, s, 20*time.Millisecond)

	clientErr := make(chan error, 1)
	go func() {
		_, _, err := post("http://"+ln.Addr().String()+"/v1/echo", `{"barrier":{"id":"stuck","count":2,"timeout_ms":600000}}`)
		clientErr <- err
	}()
	waitFor(t, "the request at the barrier", func() bool { return s.barriers.waiting("stuck") == 1 })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("serve did not force the stuck request")
	}
	if n := s.barriers.waiting("stuck"); n != 0 {
		t.Errorf("serve returned while %d handler(s) still wait", n)
	}
	if err := <-clientErr; err == nil {
		t.Error("the forced request got an answer; want its connection closed")
	}
}

func TestServeReportsListenerErrors(t *testing.T) {
	ln := listen(t)
	ln.Close()
	err := Serve(context.Background(), ln, nil)
	if err == nil || errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Serve on a closed listener = %v, want the listener's error", err)
	}
}

// TestServeClosesConnectionsThatSentNothing checks that a connection a client opened and never
// used is closed as shutdown begins, as an idle one is, while a request in flight still runs:
// it does not hold the shutdown until net/http would count it idle.
func TestServeClosesConnectionsThatSentNothing(t *testing.T) {
	ln := listen(t)
	s := newTestServer()
	ctx, cancel := context.WithCancel(context.Background())
	done := startServe(t, ctx, ln, s, time.Minute)

	answered := make(chan error, 1)
	go func() {
		_, _, err := post("http://"+ln.Addr().String()+"/v1/echo", `{"barrier":{"id":"inflight","count":2,"timeout_ms":1000}}`)
		answered <- err
	}()
	waitFor(t, "the request at the barrier", func() bool { return s.barriers.waiting("inflight") == 1 })
	unused, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer unused.Close()
	// A request on a connection dialled after it is answered: the server accepted it before.
	if status, _, err := post("http://"+ln.Addr().String()+"/v1/echo", `{}`); err != nil || status != http.StatusOK {
		t.Fatalf("a request after the unused connection: %d %v", status, err)
	}
	cancel()
	closed := make(chan error, 1)
	go func() {
		_, err := unused.Read(make([]byte, 1))
		closed <- err
	}()
	select {
	case err := <-closed:
		if !errors.Is(err, io.EOF) {
			t.Errorf("the unused connection: %v, want it closed by the server", err)
		}
	case err := <-answered:
		t.Fatalf("the request in flight was answered (%v) while the unused connection stayed open", err)
	}
	if err := <-answered; err != nil {
		t.Errorf("the request in flight: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("serve returned %v", err)
	}
}
