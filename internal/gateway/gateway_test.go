package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// fakeSubmitter answers as told and remembers what it was asked.
type fakeSubmitter struct {
	outcome   *submit.Outcome
	resp      *protocol.Response
	pending   bool
	replayed  bool
	err       error
	connected bool

	submitted []submit.Submission
	cancelled []submit.Cancellation
	asked     []string
}

func (f *fakeSubmitter) Submit(_ context.Context, sub submit.Submission) (*submit.Outcome, error) {
	f.submitted = append(f.submitted, sub)
	return f.outcome, f.err
}

func (f *fakeSubmitter) Status(_ context.Context, id string) (*protocol.Response, bool, error) {
	f.asked = append(f.asked, id)
	return f.resp, f.pending, f.err
}

func (f *fakeSubmitter) Cancel(_ context.Context, id string, c submit.Cancellation) (*protocol.Response, bool, error) {
	f.asked = append(f.asked, id)
	f.cancelled = append(f.cancelled, c)
	return f.resp, f.replayed, f.err
}

// Session answers from the requests submitted so far.
func (f *fakeSubmitter) Session(_ context.Context, id string) (string, error) {
	for _, sub := range f.submitted {
		if sub.Request.RequestID == id {
			return sub.Request.Session(), nil
		}
	}
	return "", submit.ErrNotFound
}

func (f *fakeSubmitter) Connected() bool               { return f.connected }
func (f *fakeSubmitter) Run(ctx context.Context) error { <-ctx.Done(); return nil }

func okResponse(id string) *protocol.Response {
	return &protocol.Response{RequestID: id, SessionID: id, Status: protocol.StatusSuccess,
		Results: []protocol.ToolResult{{ToolCallID: "c", Status: protocol.ResultOK, Content: json.RawMessage(`{}`)}}}
}

// serve sends one request to a gateway around f and returns the recorded answer.
func serve(t *testing.T, f *fakeSubmitter, method, target, body string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	g := newGateway(Config{PublicHosts: testHosts, Instance: "test", MaxBodyBytes: 1 << 10}, f)
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	g.Handler().ServeHTTP(rec, req)
	return rec
}

// apiErr decodes a JSON error answer.
func apiErr(t *testing.T, rec *httptest.ResponseRecorder) apiError {
	t.Helper()
	var e apiError
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
		t.Fatalf("not a JSON error: %v: %s", err, rec.Body)
	}
	return e
}

const goodRequest = `{"request_id":"r1","tool_calls":[{"tool_call_id":"c","name":"echo","arguments":{"a":1}}]}`

func TestRouteRendersWhatSubmitSays(t *testing.T) {
	for _, c := range []struct {
		name       string
		f          *fakeSubmitter
		status     int
		code       string
		header     map[string]string
		wantSubmit bool
	}{
		{name: "answered", f: &fakeSubmitter{outcome: &submit.Outcome{Response: okResponse("r1"), TraceID: "t1"}}, status: 200,
			header: map[string]string{"X-Trace-ID": "t1", "X-Request-ID": "r1"}, wantSubmit: true},
		{name: "replayed", f: &fakeSubmitter{outcome: &submit.Outcome{Response: okResponse("r1"), Replayed: true, TraceID: "t1"}}, status: 200,
			header: map[string]string{"X-Hermes-Replayed": "true", "X-Trace-ID": "t1"}, wantSubmit: true},
		{name: "pending", f: &fakeSubmitter{outcome: &submit.Outcome{Pending: true, TraceID: "t1"}, connected: true}, status: 504, code: protocol.CodeTimeout, wantSubmit: true},
		{name: "conflict", f: &fakeSubmitter{err: fmt.Errorf("%w: request_id r1 was already used", submit.ErrConflict)}, status: 409, code: protocol.CodeRequestIDConflict, wantSubmit: true},
		{name: "too large for the bus", f: &fakeSubmitter{err: fmt.Errorf("%w: the request is 9 bytes", submit.ErrTooLarge)}, status: 413, code: protocol.CodeBodyTooLarge, wantSubmit: true},
		{name: "not connected", f: &fakeSubmitter{err: submit.ErrNotConnected}, status: 503, code: protocol.CodeBusUnavailable,
			header: map[string]string{"Retry-After": "1"}, wantSubmit: true},
		{name: "bus unreachable", f: &fakeSubmitter{err: fmt.Errorf("%w: publish", submit.ErrUnavailable)}, status: 503, code: protocol.CodeBusUnavailable, wantSubmit: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := serve(t, c.f, http.MethodPost, "/v1/route?timeout=7s", goodRequest)
			if rec.Code != c.status {
				t.Fatalf("HTTP %d: %s", rec.Code, rec.Body)
			}
			if c.code != "" && apiErr(t, rec).Error.Code != c.code {
				t.Errorf("code %s, want %s: %s", apiErr(t, rec).Error.Code, c.code, rec.Body)
			}
			for k, v := range c.header {
				if got := rec.Header().Get(k); got != v {
					t.Errorf("%s: %q, want %q", k, got, v)
				}
			}
			if (len(c.f.submitted) == 1) != c.wantSubmit {
				t.Fatalf("submitted %d times", len(c.f.submitted))
			}
			sub := c.f.submitted[0]
			if sub.Wait != 7*time.Second || sub.Request.RequestID != "r1" || sub.Size != len(goodRequest) || sub.Trace.TraceID == "" {
				t.Errorf("submission %+v", sub)
			}
		})
	}
}

func TestRouteRefusesBadInputBeforeSubmitting(t *testing.T) {
	for _, c := range []struct {
		name, target, body string
		header             []string
		status             int
		code, field        string
	}{
		{"not JSON", "/v1/route", `{"request_id":`, nil, 400, protocol.CodeInvalidRequest, ""},
		{"a field wrong", "/v1/route", `{"request_id":"a.b","tool_calls":[]}`, nil, 400, protocol.CodeInvalidRequest, "request_id"},
		{"body too large", "/v1/route", `{"request_id":"r","intent":"` + strings.Repeat("x", 2000) + `"}`, nil, 413, protocol.CodeBodyTooLarge, ""},
		{"bad timeout", "/v1/route?timeout=soon", goodRequest, nil, 400, protocol.CodeInvalidRequest, "timeout"},
		{"timeout too long", "/v1/route?timeout=1h", goodRequest, nil, 400, protocol.CodeInvalidRequest, "timeout"},
		{"bad trace id", "/v1/route", goodRequest, []string{"X-Trace-ID", "has space"}, 400, protocol.CodeInvalidRequest, "X-Trace-ID"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeSubmitter{}
			rec := serve(t, f, http.MethodPost, c.target, c.body, c.header...)
			e := apiErr(t, rec)
			if rec.Code != c.status || e.Error.Code != c.code || e.Error.Field != c.field {
				t.Errorf("HTTP %d %+v, want %d %s field %q", rec.Code, e.Error, c.status, c.code, c.field)
			}
			if len(f.submitted) != 0 {
				t.Error("bad input was submitted")
			}
		})
	}
	// The caller's correlation id is kept; without one the gateway makes one.
	f := &fakeSubmitter{outcome: &submit.Outcome{Response: okResponse("r1"), TraceID: "mine"}}
	serve(t, f, http.MethodPost, "/v1/route", goodRequest, "X-Trace-ID", "mine")
	if f.submitted[0].Trace.TraceID != "mine" || f.submitted[0].Wait != 30*time.Second {
		t.Errorf("submission %+v", f.submitted[0])
	}
}

func TestStatusAndCancelRenderWhatSubmitSays(t *testing.T) {
	cancelled := &protocol.Response{RequestID: "r1", SessionID: "r1", Status: protocol.StatusFailed,
		Error: &protocol.ResponseError{Code: protocol.CodeCancelled, Message: "cancelled by http x"}}
	for _, c := range []struct {
		name, method, target string
		f                    *fakeSubmitter
		status               int
		code                 string
		replayed             string
	}{
		{"status: answered", "GET", "/v1/requests/r1", &fakeSubmitter{resp: okResponse("r1")}, 200, "", ""},
		{"status: pending", "GET", "/v1/requests/r1", &fakeSubmitter{pending: true}, 202, "", ""},
		{"status: unknown", "GET", "/v1/requests/r1", &fakeSubmitter{err: submit.ErrNotFound}, 404, protocol.CodeNotFound, ""},
		{"status: not connected", "GET", "/v1/requests/r1", &fakeSubmitter{err: submit.ErrNotConnected}, 503, protocol.CodeBusUnavailable, ""},
		{"status: unreachable", "GET", "/v1/requests/r1", &fakeSubmitter{err: submit.ErrUnavailable}, 503, protocol.CodeBusUnavailable, ""},
		{"status: bad id", "GET", "/v1/requests/r.1", &fakeSubmitter{}, 400, protocol.CodeInvalidRequest, ""},
		{"cancel", "DELETE", "/v1/requests/r1?reason=stop", &fakeSubmitter{resp: cancelled}, 200, "", ""},
		{"cancel again", "DELETE", "/v1/requests/r1", &fakeSubmitter{resp: cancelled, replayed: true}, 200, "", "true"},
		{"cancel a finished request", "DELETE", "/v1/requests/r1", &fakeSubmitter{resp: okResponse("r1"), err: submit.ErrFinished}, 409, protocol.CodeAlreadyFinished, ""},
		{"cancel an unknown request", "DELETE", "/v1/requests/r1", &fakeSubmitter{err: submit.ErrNotFound}, 404, protocol.CodeNotFound, ""},
		{"cancel while disconnected", "DELETE", "/v1/requests/r1", &fakeSubmitter{err: submit.ErrNotConnected}, 503, protocol.CodeBusUnavailable, ""},
		{"cancel cut short", "DELETE", "/v1/requests/r1", &fakeSubmitter{err: submit.ErrUnavailable}, 503, protocol.CodeBusUnavailable, ""},
		{"cancel with a bad id", "DELETE", "/v1/requests/r*", &fakeSubmitter{}, 400, protocol.CodeInvalidRequest, ""},
		{"cancel with a reason too long", "DELETE", "/v1/requests/r1?reason=" + strings.Repeat("x", protocol.MaxCancelTextBytes+1), &fakeSubmitter{}, 400, protocol.CodeInvalidRequest, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := serve(t, c.f, c.method, c.target, "")
			if rec.Code != c.status {
				t.Fatalf("HTTP %d: %s", rec.Code, rec.Body)
			}
			if c.code != "" && apiErr(t, rec).Error.Code != c.code {
				t.Errorf("code %s, want %s", apiErr(t, rec).Error.Code, c.code)
			}
			if got := rec.Header().Get("X-Hermes-Replayed"); got != c.replayed {
				t.Errorf("X-Hermes-Replayed %q", got)
			}
			if c.status == 400 && len(c.f.asked) != 0 {
				t.Error("a bad request reached submit")
			}
		})
	}
	// The record names the caller by its address, and keeps the reason.
	f := &fakeSubmitter{resp: cancelled}
	serve(t, f, "DELETE", "/v1/requests/r1?reason=changed+my+mind", "")
	if len(f.cancelled) != 1 || f.cancelled[0].By != "http 192.0.2.1:1234" || f.cancelled[0].Reason != "changed my mind" {
		t.Errorf("cancellation %+v", f.cancelled)
	}
}

// testHosts are the host names the gateways of these tests serve: httptest's.
var testHosts = []string{"example.com"}
