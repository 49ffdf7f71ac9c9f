package integration

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// hermes approvals lists the calls parked for the API key's caller, approves one — which runs
// it, once — and denies another with its reason; deciding one again is refused with exit
// status 1 and says why, and a denial without a reason is not sent.
func TestApprovalsCommand(t *testing.T) {
	t.Parallel()
	s := start(t, options{callers: true, workers: 1})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser, "bob": auth.RoleUser})
	s.applyPolicy("record", `{"confirm_required":true,"expires_in":"5m"}`)
	keyFile := func(name string) string {
		p := filepath.Join(t.TempDir(), name+".key")
		if err := os.WriteFile(p, []byte(keys[name]+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ann, bob := keyFile("ann"), keyFile("bob")
	cli := func(key string, args ...string) (int, string, string) {
		t.Helper()
		return hermes(t, app.RunApprovals, append(args, "--url", s.base, "--key-file", key)...)
	}

	first := s.routeOne(keys["ann"], "cli-apr-1", "cli-apr-s", "record", `{"n":1}`).Policy.ApprovalID
	second := s.routeOne(keys["ann"], "cli-apr-2", "cli-apr-s", "record", `{"n":2}`).Policy.ApprovalID
	if first == "" || second == "" {
		t.Fatal("the calls were not parked")
	}

	code, out, errOut := cli(ann, "ls", "--state", "pending", "--session", "cli-apr-s")
	if code != 0 {
		t.Fatalf("ls: exit %d: %s", code, errOut)
	}
	for _, id := range []string{first, second} {
		line := lineWith(out, id)
		if !strings.Contains(line, "pending") || !strings.Contains(line, "record") || !strings.Contains(line, "ann (user)") || !strings.HasSuffix(line, "yes") {
			t.Errorf("ls: the line of %s reads %q:\n%s", id, line, out)
		}
	}
	if code, out, _ := cli(bob, "ls"); code != 0 || strings.Contains(out, first) {
		t.Errorf("another caller's ls: exit %d:\n%s", code, out)
	}
	if code, out, errOut := cli(ann, "get", first); code != 0 || !strings.Contains(lineWith(out, "arguments"), `{"n":1}`) || !strings.Contains(out, "yours to decide") {
		t.Errorf("get: exit %d: %s%s", code, out, errOut)
	}

	code, out, errOut = cli(ann, "approve", first)
	if code != 0 || !strings.Contains(out, first+": approved by ") || !strings.Contains(out, "runs as request "+first) {
		t.Fatalf("approve: exit %d: %s%s", code, out, errOut)
	}
	waitForWithin(t, "the approved call ran", 10*time.Second, func() bool {
		code, body := s.call(http.MethodGet, "/v1/requests/"+first, keys["ann"], "")
		return code == http.StatusOK && strings.Contains(body, `"status":"success"`)
	})
	if n := len(s.recorder.tries(first + "/c1")); n != 1 {
		t.Errorf("the approved call ran %d times; once", n)
	}

	if code, _, errOut := cli(ann, "deny", second); code != 2 || !strings.Contains(errOut, "--reason") {
		t.Errorf("deny without a reason: exit %d: %s", code, errOut)
	}
	code, out, errOut = cli(ann, "deny", second, "--reason", "not this one")
	if code != 0 || !strings.Contains(out, second+": denied by ") || !strings.Contains(out, "not this one") {
		t.Fatalf("deny: exit %d: %s%s", code, out, errOut)
	}
	if _, v := s.approval(keys["ann"], second); v.State != "denied" || v.Reason != "not this one" {
		t.Errorf("after the denial: %+v", v)
	}

	code, out, errOut = cli(ann, "approve", first)
	if code != 1 || out != "" || !strings.Contains(errOut, "decided before; nothing changed") || !strings.Contains(errOut, protocol.CodeAlreadyDecided) {
		t.Errorf("approving again: exit %d: %s%s", code, out, errOut)
	}
	if code, _, errOut := cli(bob, "deny", first, "--reason", "mine now"); code != 1 || !strings.Contains(errOut, "no such approval") {
		t.Errorf("another caller's decision: exit %d: %s", code, errOut)
	}
	if n := len(s.recorder.idempotencyKeys()); n != 1 {
		t.Errorf("the tool ran %d times; once", n)
	}
}

// lineWith is the first line of text that contains sub, trimmed.
func lineWith(text, sub string) string {
	for line := range strings.SplitSeq(text, "\n") {
		if strings.Contains(line, sub) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}
