package policy

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestTheSeedsPoliciesLoadUnchanged(t *testing.T) {
	data, err := os.ReadFile("../../../shared/seed-examples/tool-policies.yaml")
	if err != nil {
		t.Skip("the seed examples are not beside this checkout:", err)
	}
	f, err := ParseFile(data)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(f.Tools, ",") != "meeting_book,notify_send" {
		t.Fatalf("tools %v", f.Tools)
	}
	book, notify := f.Policies["meeting_book"], f.Policies["notify_send"]
	if !book.ConfirmRequired || strings.Join(book.AllowedRoles, ",") != "admin" || book.RateLimit != nil {
		t.Fatalf("meeting_book: %+v", book)
	}
	if notify.RateLimit == nil || *notify.RateLimit != (Rate{Count: 10, Per: time.Minute}) || notify.MaxRecipients != 20 {
		t.Fatalf("notify_send: %+v", notify)
	}
	if notify.ScopeOrDefault() != ScopeCaller || notify.OnLimitOrDefault() != OnLimitRefuse {
		t.Fatalf("defaults: %s %s", notify.ScopeOrDefault(), notify.OnLimitOrDefault())
	}
	if !book.Allows("admin") || book.Allows("user") || book.Allows("") || !notify.Allows("user") {
		t.Fatal("Allows")
	}
}

func TestRates(t *testing.T) {
	for in, want := range map[string]Rate{
		"10": {10, time.Minute}, "10/s": {10, time.Second}, "100/h": {100, time.Hour}, "3/min": {3, time.Minute},
		"5/minute": {5, time.Minute}, " 7 / sec ": {7, time.Second}, "2/hour": {2, time.Hour},
	} {
		r, err := ParseRate(in)
		if err != nil || *r != want {
			t.Errorf("%q: %v %v", in, r, err)
		}
		back, err := ParseRate(r.String())
		if err != nil || *back != want {
			t.Errorf("%q written as %q reads back as %v %v", in, r.String(), back, err)
		}
	}
	for _, in := range []string{"", "ten", "10/d", "0", "-1/s", "10001/h", "10/", "1e3"} {
		if r, err := ParseRate(in); err == nil {
			t.Errorf("%q read as %v", in, r)
		}
	}
}

func TestPolicyJSONRoundTrip(t *testing.T) {
	p := &Policy{AllowedRoles: []string{"admin"}, RateLimit: &Rate{10, time.Second}, OnLimit: OnLimitWait, MaxWait: Duration(5 * time.Second),
		ConfirmRequired: true, Approvers: []string{"operator"}, ExpiresIn: Duration(time.Hour), MaxRecipients: 3}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"rate_limit":"10/s"`) || !strings.Contains(string(b), `"expires_in":"1h0m0s"`) {
		t.Fatalf("%s", b)
	}
	var back Policy
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	b2, _ := json.Marshal(&back)
	if string(b) != string(b2) {
		t.Fatalf("%s\n%s", b, b2)
	}
	var bare Policy
	if err := json.Unmarshal([]byte(`{"rate_limit":10}`), &bare); err != nil || *bare.RateLimit != (Rate{10, time.Minute}) {
		t.Fatalf("%v %v", bare.RateLimit, err)
	}
}

func TestBadPoliciesNameTheFieldAndTheReason(t *testing.T) {
	for in, want := range map[string]string{
		"policies:\n  notify_send:\n    rate_limit: 10/d\n":              "line 3: policies.notify_send.rate_limit: \"d\" is no window",
		"policies:\n  notify_send:\n    rate_limt: 10\n":                 "line 3: policies.notify_send.rate_limt: unknown field",
		"policies:\n  notify_send:\n    max_recipients: -2\n":            "policies.notify_send.max_recipients: must be a whole number",
		"policies:\n  notify_send:\n    scope: tool\n":                   "policies.notify_send.scope: applies to a rate_limit",
		"policies:\n  notify_send:\n    confirm_required: yes\n":         "policies.notify_send.confirm_required: must be true or false",
		"policies:\n  notify_send:\n    approvers: [admin]\n":            "policies.notify_send.approvers: say who approves",
		"policies:\n  notify_send:\n    allowed_roles: []\n":             "policies.notify_send.allowed_roles: is empty",
		"policies:\n  notify_send:\n    allowed_roles: [admin, admin]\n": "policies.notify_send.allowed_roles[1]: \"admin\" is named twice",
		"policies:\n  notify.send:\n    rate_limit: 1\n":                 "policies.notify.send: is no tool name",
		"policies:\n  a: {rate_limit: 1}\n  a: {rate_limit: 2}\n":        "line 3: policies.a: duplicate key",
		"policy:\n  a: {}\n": "line 1: policy: unknown field",
		"policies: [a]\n":    "policies: must map tool names",
		"policies:\n  a: &x {rate_limit: 1}\n  b: *x\n":                              "anchors and aliases are not read",
		"policies:\n  a:\n    rate_limit: 1\n    on_limit: wait\n    max_wait: 2h\n": "policies.a.max_wait: must be from 1s to 1h0m0s",
		"policies:\n  a:\n    confirm_required: true\n    expires_in: soon\n":        "policies.a.expires_in: \"soon\" is no duration",
		"":  "the document is empty",
		"{": "not YAML or JSON",
	} {
		_, err := ParseFile([]byte(in))
		var e *Error
		if err == nil || !errors.As(err, &e) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", in, err, want)
		}
	}
	p := &Policy{AllowedRoles: []string{"admin", "auditor"}}
	if err := p.CheckRoles("policies.x", []string{"admin", "operator", "user"}); err == nil || !strings.Contains(err.Error(), `policies.x.allowed_roles[1]: "auditor" is no role; the roles are admin, operator, user`) {
		t.Fatal(err)
	}
}

func TestJSONFilesReadToo(t *testing.T) {
	f, err := ParseFile([]byte(`{"policies": {"notify_send": {"rate_limit": "100/h", "scope": "tool", "on_limit": "wait", "max_wait": "10s"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	p := f.Policies["notify_send"]
	if p.RateLimit.String() != "100/h" || p.ScopeOrDefault() != ScopeTool || p.MaxWaitOrDefault() != 10*time.Second {
		t.Fatalf("%+v", p)
	}
}

func FuzzParseFile(f *testing.F) {
	f.Add([]byte("policies:\n  meeting_book:\n    confirm_required: true\n    allowed_roles: [admin]\n  notify_send:\n    rate_limit: 10\n    max_recipients: 20\n"))
	f.Add([]byte(`{"policies":{"a":{"rate_limit":"1/s","on_limit":"wait"}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := ParseFile(data)
		if err != nil {
			return
		}
		for _, tool := range file.Tools {
			p := file.Policies[tool]
			if err := p.Check(""); err != nil {
				t.Fatalf("read a policy Check refuses: %v", err)
			}
			b, err := json.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			var back Policy
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatalf("%s does not read back: %v", b, err)
			}
		}
	})
}
