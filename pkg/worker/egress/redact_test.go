package egress

import (
	"encoding/json"
	"strings"
	"testing"
)

// jsonStrings returns every string (keys included) of the JSON document body, decoded.
func jsonStrings(t testing.TB, body []byte) []string {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(string(body)))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("not JSON: %v: %s", err, body)
	}
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case string:
			out = append(out, v)
		case []any:
			for _, e := range v {
				walk(e)
			}
		case map[string]any:
			for k, e := range v {
				out = append(out, k)
				walk(e)
			}
		case json.Number:
			out = append(out, v.String())
		}
	}
	walk(v)
	return out
}

// A tool that writes the secret with JSON escapes — \uXXXX for some or all of its characters,
// \/ for its slashes, in a key or a value, in JSON held in a JSON string — does not get it
// through: the string is decoded, and where it holds the secret it is replaced by its
// redaction. The answer stays JSON.
func TestSecretsWrittenWithJSONEscapesAreRedacted(t *testing.T) {
	const secret = "s3cr/t-token"
	tests := []struct {
		name, body string
		want       string // the redacted answer, when it is known exactly
	}{
		{"every character escaped", `{"echo":"\u0073\u0033\u0063\u0072\u002f\u0074\u002d\u0074\u006f\u006b\u0065\u006e"}`,
			`{"echo":"[redacted]"}`},
		{"upper-case hex", `{"echo":"\u0073\u0033cr\u002Ft-token"}`, `{"echo":"[redacted]"}`},
		{"partly escaped", `{"error":"bad token s3cr\u002ft-tok\u0065n, try again"}`, `{"error":"bad token [redacted], try again"}`},
		{"escaped slash and a letter", `{"echo":"s3cr\/t-tok\u0065n"}`, `{"echo":"[redacted]"}`},
		{"in a key", `{"s\u0033cr/t-token":1,"ok":true}`, `{"[redacted]":1,"ok":true}`},
		{"in an array, with other escapes", `["caf\u00e9 \"s3cr\/t-token\"\n", "plain"]`, `["café \"[redacted]\"\n", "plain"]`},
		{"JSON in a JSON string", `{"inner":"{\"t\":\"\\u0073\\u0033cr/t-token\"}"}`, ""},
		{"URL-encoded, then escaped", `{"u":"https://x/?t=s3cr%2Ft-tok\u0065n"}`, `{"u":"https://x/?t=[redacted]"}`},
		{"surrogates around it", `{"e":"\ud83d\ude00s3cr\/t-token\ud83d\ude00"}`, `{"e":"😀[redacted]😀"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Redact([]byte(tt.body), []string{secret})
			if !json.Valid(got) {
				t.Fatalf("the answer is no longer JSON: %s", got)
			}
			if tt.want != "" && string(got) != tt.want {
				t.Errorf("redacted %s, want %s", got, tt.want)
			}
			leaks := func(body []byte, depth int) bool {
				for _, s := range jsonStrings(t, body) {
					if strings.Contains(s, secret) {
						return true
					}
					if depth > 0 && json.Valid([]byte(s)) && strings.ContainsAny(s, `"`) {
						if inner := jsonStrings(t, []byte(s)); strings.Contains(strings.Join(inner, "\x00"), secret) {
							return true
						}
					}
				}
				return false
			}
			if leaks(got, 1) {
				t.Errorf("secret decoded from %s", got)
			}
			if !strings.Contains(string(got), "[redacted]") {
				t.Errorf("nothing redacted in %s", got)
			}
		})
	}
}

// A secret made of digits, echoed as a JSON number, is redacted as a string: the answer stays
// JSON.
func TestSecretsEchoedAsNumbersKeepTheAnswerJSON(t *testing.T) {
	got := Redact([]byte(`{"pin":12345678,"n":-0.5e3}`), []string{"12345678"})
	if want := `{"pin":"[redacted]","n":-0.5e3}`; string(got) != want {
		t.Errorf("redacted %s, want %s", got, want)
	}
}

// An answer without the secret, escaped or not, is returned as it came, byte for byte.
func TestRedactLeavesOtherAnswersAlone(t *testing.T) {
	for _, body := range []string{
		`{"a":"\u0041\/b","n":12,"e":"\ud83d\ude00"}`,
		`not JSON "\u0073\u0033" at all`,
		`{"unterminated":"\u0073`,
		``,
	} {
		if got := Redact([]byte(body), []string{"s3cr/t-token"}); string(got) != body {
			t.Errorf("%s became %s", body, got)
		}
	}
}

// Text that is not a JSON document but quotes a JSON string (a log line, an HTML page) has its
// escaped secrets redacted too.
func TestEscapedSecretsInTextAreRedacted(t *testing.T) {
	got := string(Redact([]byte(`upstream said: {"token": "\u0073\u0033cr/t-token"} (status 500`), []string{"s3cr/t-token"}))
	if want := `upstream said: {"token": "[redacted]"} (status 500`; got != want {
		t.Errorf("redacted %s, want %s", got, want)
	}
}

// Redaction takes time linear in the answer: a 1 MiB answer of escaped strings, nested to the
// depth decoded and beyond, is handled within the worker's time for a result.
func TestRedactIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString(`[`)
	deep := `"\u0073\u0033cr/t-token"`
	for range 8 {
		js, _ := json.Marshal(`{"x":` + deep + `}`)
		deep = string(js)
	}
	for b.Len() < 1<<20 {
		b.WriteString(deep)
		b.WriteString(`,"\u0061\u0062\u0063",`)
	}
	b.WriteString(`0]`)
	got := Redact([]byte(b.String()), []string{"s3cr/t-token", "other-secret", "third-secret-value"})
	if !json.Valid(got) {
		t.Fatal("the answer is no longer JSON")
	}
}

// FuzzRedact checks, for any answer and any secret of letters and digits, that no string of
// the redacted answer decodes to hold the secret, and that JSON stays JSON.
func FuzzRedact(f *testing.F) {
	f.Add([]byte(`{"echo":"\u0073\u0033cr3t-token-x"}`), "s3cr3t-token-x")
	f.Add([]byte(`{"s3cr3ttokenxy":[1,"a\u0062"],"n":123456789012}`), "123456789012")
	f.Add([]byte(`"\u0041BCDEFGHIJKL"`), "ABCDEFGHIJKL")
	f.Add([]byte(`{"a":"{\"b\":\"\\u0041BCDEFGHIJKL\"}"}`), "ABCDEFGHIJKL")
	f.Fuzz(func(t *testing.T, body []byte, secret string) {
		if len(secret) < 12 || len(body) > 1<<16 || strings.ContainsFunc(secret, func(r rune) bool {
			return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9')
		}) {
			t.Skip()
		}
		got := Redact(body, []string{secret})
		if json.Valid(body) && !json.Valid(got) {
			t.Fatalf("%s is JSON, its redaction %s is not", body, got)
		}
		if !json.Valid(got) {
			return
		}
		for _, s := range jsonStrings(t, got) {
			if strings.Contains(s, secret) {
				t.Fatalf("%s redacted to %s, which holds %q", body, got, s)
			}
		}
	})
}

// A secret written in a string's bytes but not in its text — one with backslashes, written by
// an encoder that does not escape them — is redacted from the bytes, and the answer stays
// JSON.
func TestSecretsInAStringsBytesAreRedacted(t *testing.T) {
	for _, tt := range []struct{ secret, body string }{
		{`C:\new\token`, `{"path":"C:\new\token","n":1}`},
		{"000000000000", `["\u000000000000000"]`},
	} {
		got := Redact([]byte(tt.body), []string{tt.secret})
		if !json.Valid(got) || strings.Contains(string(got), tt.secret) || !strings.Contains(string(got), "[redacted]") {
			t.Errorf("%s redacted to %s", tt.body, got)
		}
	}
}
