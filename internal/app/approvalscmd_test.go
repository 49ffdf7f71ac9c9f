package app

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// hermes approvals sends what each subcommand says, and tells the gateway's refusals of an
// approval (exit status 1, in words) from bad usage and trouble (exit status 2).
func TestApprovalsCommandExitStatus(t *testing.T) {
	const id = "apr-0123456789abcdef01234567"
	var got []string
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got = append(got, r.Method+" "+r.URL.RequestURI()+" "+string(body))
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/v1/approvals":
			_, _ = io.WriteString(w, `{"approvals":[]}`)
		case strings.HasSuffix(r.URL.Path, "/approve"):
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"error":{"code":"ALREADY_DECIDED","message":"approvals: decided already: it is approved by ann"}}`)
		case strings.HasSuffix(r.URL.Path, "/deny"):
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, `{"error":{"code":"FORBIDDEN","message":"approvals: not yours to decide"}}`)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error":{"code":"BUS_UNAVAILABLE","message":"the approvals cannot be read now"}}`)
		}
	}))
	defer gw.Close()
	t.Setenv("HERMES_API_KEY", "hk_test")
	for _, c := range []struct {
		args    []string
		code    int
		out     string // in stdout, or stderr when code is not 0
		request string // what the gateway was sent
	}{
		{[]string{"ls", "--state", "pending", "--session", "s1"}, 0, "(no approvals)", "GET /v1/approvals?limit=100&session_id=s1&state=pending "},
		{[]string{"approve", id, "--reason", "fine"}, 1, "decided before; nothing changed (ALREADY_DECIDED approvals: decided already: it is approved by ann)",
			"POST /v1/approvals/" + id + `/approve {"reason":"fine"}`},
		{[]string{"deny", "--reason", "no", id}, 1, "not yours to decide", "POST /v1/approvals/" + id + `/deny {"reason":"no"}`},
		{[]string{"get", id}, 2, "503 BUS_UNAVAILABLE", "GET /v1/approvals/" + id + " "},
		{[]string{"deny", id}, 2, "--reason", ""},
		{[]string{"approve", "apr-1"}, 2, "not an approval id", ""},
		{[]string{"approve"}, 2, "name the approval", ""},
		{[]string{"ls", "extra"}, 2, "unexpected argument", ""},
		{[]string{"rm", id}, 2, "unknown subcommand", ""},
	} {
		got = nil
		var out, errOut bytes.Buffer
		code := Exec(RunApprovals, append(c.args, "--url", gw.URL), Env{Stdout: &out, Stderr: &errOut})
		text := out.String()
		if c.code != 0 {
			text = errOut.String()
		}
		if code != c.code || !strings.Contains(text, c.out) {
			t.Errorf("%v: exit %d, want %d with %q: %s%s", c.args, code, c.code, c.out, out.String(), errOut.String())
		}
		sent := strings.Join(got, "\n")
		if sent != c.request {
			t.Errorf("%v: sent %q, want %q", c.args, sent, c.request)
		}
	}
}
