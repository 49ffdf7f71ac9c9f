package gateway

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/record"
	"github.com/hermesbus/hermes/pkg/protocol"
)

func TestParseEventID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"", 0, true},
		{"0", 0, true},
		{"42", 42, true},
		{"0042", 42, true},
		{"18446744073709551614", 1<<64 - 2, true},
		{"18446744073709551615", 0, false}, // the next one would not fit
		{"18446744073709551616", 0, false},
		{"-1", 0, false},
		{"+1", 0, false},
		{" 1", 0, false},
		{"1 ", 0, false},
		{"0x10", 0, false},
		{"1_000", 0, false},
		{"1e3", 0, false},
		{"abc", 0, false},
	} {
		got, err := parseEventID("Last-Event-ID", tc.in)
		if tc.ok != (err == nil) || got != tc.want {
			t.Errorf("parseEventID(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
		var fe *protocol.FieldError
		if err != nil && (!errors.As(err, &fe) || fe.Field != "Last-Event-ID") {
			t.Errorf("parseEventID(%q): error %v does not name the field", tc.in, err)
		}
	}
}

func TestEventsAfterPrefersTheHeader(t *testing.T) {
	r := httptest.NewRequest("GET", "/v1/sessions/s/events?after=5", nil)
	if n, err := eventsAfter(r); n != 5 || err != nil {
		t.Fatalf("?after=5: %d, %v", n, err)
	}
	r.Header.Set("Last-Event-ID", "9") // an EventSource reconnecting keeps its first URL
	if n, err := eventsAfter(r); n != 9 || err != nil {
		t.Fatalf("Last-Event-ID 9 and ?after=5: %d, %v", n, err)
	}
	r = httptest.NewRequest("GET", "/v1/sessions/s/events?after=x", nil)
	var fe *protocol.FieldError
	if _, err := eventsAfter(r); !errors.As(err, &fe) || fe.Field != "after" {
		t.Fatalf("?after=x: %v", err)
	}
}

func TestSessionsLimit(t *testing.T) {
	for q, want := range map[string]int{"": defaultSessions, "?limit=1": 1, "?limit=500": 500,
		"?limit=0": -1, "?limit=501": -1, "?limit=-3": -1, "?limit=ten": -1} {
		got, err := sessionsLimit(httptest.NewRequest("GET", "/v1/sessions"+q, nil))
		if want < 0 && err == nil || want >= 0 && (err != nil || got != want) {
			t.Errorf("%q: %d, %v; want %d", q, got, err, want)
		}
	}
}

func TestAppendEvent(t *testing.T) {
	e := record.Decode(42, "hermes.response.s1", time.Date(2026, 3, 16, 9, 0, 0, 0, time.UTC), []byte("not a message"))
	got := string(appendEvent(nil, e))
	if !strings.HasPrefix(got, "id: 42\nevent: message\ndata: {\"seq\":42,") || !strings.HasSuffix(got, "}\n\n") ||
		strings.Count(got, "\n") != 4 || !strings.Contains(got, `"error":`) {
		t.Fatalf("event %q", got)
	}
}

func TestEventStreamsBoundedAndStopped(t *testing.T) {
	s := eventStreams{max: 2}
	ctx1, done1, err := s.add(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx2, _, err := s.add(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.add(context.Background()); err != errTooManyStreams {
		t.Fatalf("third stream: %v", err)
	}
	done1()
	if ctx1.Err() == nil {
		t.Fatal("done did not end the stream's context")
	}
	if _, _, err := s.add(context.Background()); err != nil {
		t.Fatalf("a slot freed: %v", err)
	}
	s.stop()
	if ctx2.Err() == nil {
		t.Fatal("stop did not end an open stream")
	}
	if _, _, err := s.add(context.Background()); err != errStopping {
		t.Fatalf("after stop: %v", err)
	}
}

func TestKeepalive(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sent := make(chan string, 8)
	fail := errors.New("client gone")
	n := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		keepalive(ctx, time.Millisecond, cancel, func(b []byte) error {
			sent <- string(b)
			if n++; n == 3 {
				return fail
			}
			return nil
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("keepalive did not stop after a failed send")
	}
	if ctx.Err() == nil {
		t.Fatal("a failed keepalive did not end the stream")
	}
	if len(sent) != 3 || <-sent != ": keepalive\n\n" {
		t.Fatalf("sent %d keepalives", len(sent))
	}
}
