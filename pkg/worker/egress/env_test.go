package egress

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/url"
	"strings"
	"testing"
)

// canary is a secret value no error text may ever contain.
const canary = "s3cr3t-CANARY-9f2c"

func mapLookup(m map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

func TestEnvResolverResolve(t *testing.T) {
	r := &EnvResolver{
		Allowed: map[string]bool{"API_TOKEN": true, "TENANT": true, "REGION": true, "UNSET_VAR": true, "NESTED": true},
		Lookup: mapLookup(map[string]string{
			"API_TOKEN": canary,
			"TENANT":    "acme",
			"REGION":    "eu-1",
			"SECRET":    canary, // set, but not allowed
			"NESTED":    "${env.SECRET}",
		}),
	}
	tests := []struct {
		name  string
		value string
		want  string
	}{
		{"plain value untouched", "application/json", "application/json"},
		{"empty value", "", ""},
		{"dollar without brace untouched", "cost $5 {not a placeholder}", "cost $5 {not a placeholder}"},
		{"bearer token", "Bearer ${env.API_TOKEN}", "Bearer " + canary},
		{"whole value", "${env.TENANT}", "acme"},
		{"several placeholders", "${env.TENANT}/${env.REGION}:${env.TENANT}", "acme/eu-1:acme"},
		{"adjacent placeholders", "${env.TENANT}${env.REGION}", "acmeeu-1"},
		{"text around placeholders", "t=${env.TENANT}; r=${env.REGION}.", "t=acme; r=eu-1."},
		{"resolved value is not expanded again", "x ${env.NESTED}", "x ${env.SECRET}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := r.Resolve("Authorization", tt.value)
			if err != nil {
				t.Fatalf("Resolve(%q) error: %v", tt.value, err)
			}
			if got != tt.want {
				t.Errorf("Resolve(%q) = %q, want %q", tt.value, got, tt.want)
			}
		})
	}
}

func TestEnvResolverRefuses(t *testing.T) {
	r := &EnvResolver{
		Allowed: map[string]bool{"API_TOKEN": true, "MISSING": true},
		Lookup:  mapLookup(map[string]string{"API_TOKEN": canary, "SECRET": canary, "OTHER": canary}),
	}
	tests := []struct {
		name     string
		value    string
		code     string // EnvError code; "" for a malformed placeholder
		mentions []string
	}{
		{"not allowed", "Bearer ${env.SECRET}", "ENV_NOT_ALLOWED", []string{"SECRET", "X-Api-Key", "allow"}},
		{"not allowed after an allowed one", "${env.API_TOKEN}:${env.OTHER}", "ENV_NOT_ALLOWED", []string{"OTHER", "X-Api-Key"}},
		{"unset", "Bearer ${env.MISSING}", "ENV_UNSET", []string{"MISSING", "X-Api-Key", "not set"}},
		{"empty name", "${env.}", "ENV_NOT_ALLOWED", []string{"X-Api-Key"}},
		{"unclosed", "Bearer ${env.API_TOKEN", "", []string{"X-Api-Key", "malformed"}},
		{"unclosed after a good one", "${env.API_TOKEN} ${env.API_TOKEN", "", []string{"X-Api-Key", "malformed"}},
		{"not env", "Bearer ${foo}", "", []string{"X-Api-Key", "malformed"}},
		{"other namespace", "${vault.API_TOKEN}", "", []string{"X-Api-Key", "malformed"}},
		{"bare opener", "${", "", []string{"X-Api-Key", "malformed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := r.Resolve("X-Api-Key", tt.value)
			if err == nil {
				t.Fatalf("Resolve(%q) = %q, want an error", tt.value, got)
			}
			if got != "" {
				t.Errorf("Resolve(%q) returned %q with its error, want \"\"", tt.value, got)
			}
			var ee *EnvError
			switch {
			case tt.code == "" && errors.As(err, &ee):
				t.Errorf("error %q is an EnvError %s, want a plain malformed-placeholder error", err, ee.Code)
			case tt.code != "" && !errors.As(err, &ee):
				t.Errorf("error %q is %T, want *EnvError", err, err)
			case tt.code != "" && ee.Code != tt.code:
				t.Errorf("error code %s, want %s", ee.Code, tt.code)
			}
			msg := err.Error()
			for _, m := range tt.mentions {
				if !strings.Contains(msg, m) {
					t.Errorf("error %q does not mention %q", msg, m)
				}
			}
			if strings.Contains(msg, canary) {
				t.Errorf("error %q leaks the secret value", msg)
			}
		})
	}
}

func TestEnvResolverDefaultLookup(t *testing.T) {
	t.Setenv("HERMES_TOOL_TEST_TOKEN", canary)
	t.Setenv("HERMES_TOOL_TEST_SECRET", canary) // set, but not allowed
	r := &EnvResolver{Allowed: map[string]bool{"HERMES_TOOL_TEST_TOKEN": true, "HERMES_TOOL_TEST_UNSET": true}}
	got, err := r.Resolve("Authorization", "Bearer ${env.HERMES_TOOL_TEST_TOKEN}")
	if err != nil || got != "Bearer "+canary {
		t.Errorf("Resolve with os.LookupEnv = %q, %v; want the environment's value", got, err)
	}
	var ee *EnvError
	if _, err := r.Resolve("Authorization", "${env.HERMES_TOOL_TEST_UNSET}"); !errors.As(err, &ee) || ee.Code != "ENV_UNSET" {
		t.Errorf("Resolve of an unset variable: error %v, want ENV_UNSET", err)
	}
	_, err = r.Resolve("Authorization", "Bearer ${env.HERMES_TOOL_TEST_SECRET}")
	if !errors.As(err, &ee) || ee.Code != "ENV_NOT_ALLOWED" {
		t.Fatalf("Resolve of a variable not allowed: error %v, want ENV_NOT_ALLOWED", err)
	}
	if strings.Contains(err.Error(), canary) {
		t.Errorf("error %q leaks the environment's value", err)
	}
}

func TestEnvResolverNoAllowList(t *testing.T) {
	r := &EnvResolver{Lookup: mapLookup(map[string]string{"TOKEN": canary})}
	if got, err := r.Resolve("Authorization", "plain"); err != nil || got != "plain" {
		t.Errorf("Resolve(plain) = %q, %v; want it untouched", got, err)
	}
	var ee *EnvError
	if _, err := r.Resolve("Authorization", "${env.TOKEN}"); !errors.As(err, &ee) || ee.Code != "ENV_NOT_ALLOWED" {
		t.Errorf("Resolve with a nil allow-list: error %v, want ENV_NOT_ALLOWED", err)
	}
}

// A name is bound to one origin — scheme, host and port — and its value goes nowhere else:
// not to another host, port or scheme (an https secret never travels over http).
func TestEnvBoundToOrigin(t *testing.T) {
	r, err := ParseAllowEnv([]string{"KEY@http://Policy-Service:8000", "TLS@https://vault.example"})
	if err != nil {
		t.Fatal(err)
	}
	r.Lookup = mapLookup(map[string]string{"KEY": canary, "TLS": canary})
	origin := func(raw string) string {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		return Origin(u)
	}
	for name, target := range map[string]string{"KEY": "http://policy-service:8000/x", "TLS": "https://VAULT.example:443/y"} {
		if got, err := r.ResolveFor(origin(target), "X-Key", "${env."+name+"}"); err != nil || got != canary {
			t.Fatalf("%s to %s: %q %v", name, target, got, err)
		}
	}
	for _, target := range []string{"http://attacker.example:8000/", "http://policy-service:8001/", "https://policy-service:8000/", "http://169.254.169.254/"} {
		_, err := r.ResolveFor(origin(target), "X-Key", "${env.KEY}")
		if err == nil || !strings.Contains(err.Error(), "http://policy-service:8000") || strings.Contains(err.Error(), canary) {
			t.Errorf("to %s: error %v", target, err)
		}
	}
	if _, err := r.ResolveFor(origin("http://vault.example/"), "X-Key", "${env.TLS}"); err == nil {
		t.Error("an https-bound secret went over http")
	}
}

// An --allow-env name without an origin, or with one that is not scheme://host[:port], is
// refused at start.
func TestAllowEnvMustBeBound(t *testing.T) {
	for _, bad := range []string{"POLICY_TOKEN", "POLICY_TOKEN@policy-service:8000", "P@ftp://x", "P@https://", "P@https://x/path",
		"P@https://user:pw@x", "P@https://x?q=1", "bad name@https://x", "P@https://a,P@https://b"} {
		entries := strings.Split(bad, ",")
		if _, err := ParseAllowEnv(entries); err == nil {
			t.Errorf("%q accepted", bad)
		} else if strings.HasPrefix(bad, "POLICY_TOKEN") && !strings.Contains(err.Error(), "POLICY_TOKEN@https://") {
			t.Errorf("%q: %v does not show how to bind it", bad, err)
		}
	}
}

func TestSecretsAreRedactedFromAnswers(t *testing.T) {
	env := &EnvResolver{Allowed: map[string]bool{"TOKEN": true, "SHORT": true}, Lookup: func(n string) (string, bool) {
		return map[string]string{"TOKEN": "s3cr3t-token", "SHORT": "ab", "OTHER": "not-allowed-value"}[n], true
	}}
	secrets := env.Secrets(map[string]string{"Authorization": "Bearer ${env.TOKEN}", "X-Short": "${env.SHORT}", "X-Other": "${env.OTHER}"})
	body := []byte(`{"error":"bad token s3cr3t-token","ab":"not-allowed-value"}`)
	got := string(Redact(body, secrets))
	if want := `{"error":"bad token [redacted]","ab":"not-allowed-value"}`; got != want {
		t.Fatalf("redacted %s, want %s", got, want)
	}
}

// A secret a tool echoes is redacted in every form it may come back in: JSON-escaped,
// URL-encoded, base64.
func TestSecretsAreRedactedInEveryForm(t *testing.T) {
	secret := `s3cr/t+"tok=en"`
	forms := secretForms(secret)
	js, _ := json.Marshal(secret)
	for _, f := range []string{secret, string(js[1 : len(js)-1]), url.QueryEscape(secret), base64.StdEncoding.EncodeToString([]byte(secret)),
		base64.RawURLEncoding.EncodeToString([]byte(secret)), `s3cr\/t+\"tok=en\"`, "s3cr%2ft%2b%22tok%3den%22"} {
		body := []byte(`{"echo":"` + f + `","n":1}`)
		if got := string(Redact(body, []string{secret})); strings.Contains(got, f) || !strings.Contains(got, "[redacted]") {
			t.Errorf("form %q: %s (forms %q)", f, got, forms)
		}
	}
}

// A secret holding both an HTML character and a quote, echoed by an encoder that leaves & < >
// as they are (protojson, and most outside Go's encoding/json), is redacted too.
func TestSecretsWithHTMLCharactersAreRedacted(t *testing.T) {
	for _, secret := range []string{`p&ss"secret-123`, `p<ss\secret-123`} {
		var b strings.Builder
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(map[string]string{"echo": secret})
		if got := string(Redact([]byte(b.String()), []string{secret})); !strings.Contains(got, "[redacted]") || strings.Contains(got, "secret-123") {
			t.Errorf("%q: %s", secret, got)
		}
	}
}
