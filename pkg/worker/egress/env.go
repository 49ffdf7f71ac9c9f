package egress

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
)

// EnvResolver resolves ${env.NAME} placeholders for names on an allow-list. A nil resolver
// allows nothing.
type EnvResolver struct {
	// Allowed holds the names that may be resolved.
	Allowed map[string]bool
	// Hosts binds names to the one origin (scheme://host:port, see Origin) their value may be
	// sent to. A tool_call message names its own URL, so without a binding anyone able to
	// publish on the bus could have an allowed value sent to a place of their choosing: New
	// refuses an unbound name.
	Hosts map[string]string
	// Lookup reads a variable; nil means os.LookupEnv.
	Lookup func(string) (string, bool)
}

// EnvError explains a placeholder that was refused, naming the variable but never a value.
type EnvError struct {
	// Code is protocol.CodeEnvNotAllowed or protocol.CodeEnvUnset.
	Code         string
	name, header string
	host         string // the host the name is bound to, when the call went elsewhere
}

func (e *EnvError) Error() string {
	if e.host != "" {
		return fmt.Sprintf("header %s uses ${env.%s}, which this worker sends only to %s", e.header, e.name, e.host)
	}
	if e.Code == "ENV_UNSET" {
		return fmt.Sprintf("header %s uses ${env.%s}, which is not set on this worker", e.header, e.name)
	}
	return fmt.Sprintf("header %s uses ${env.%s}, which this worker does not allow (add it to --allow-env)", e.header, e.name)
}

// Secrets returns the values the ${env.NAME} placeholders of headers resolve to, for
// redacting them from what a tool answers. Placeholders that would not resolve are skipped.
func (r *EnvResolver) Secrets(headers map[string]string) []string {
	var out []string
	for _, v := range headers {
		for rest := v; ; {
			i := strings.Index(rest, "${env.")
			if i < 0 {
				break
			}
			end := strings.IndexByte(rest[i:], '}')
			if end < 0 {
				break
			}
			name := rest[i+len("${env.") : i+end]
			rest = rest[i+end+1:]
			if r == nil || !r.Allowed[name] {
				continue
			}
			lookup := r.Lookup
			if lookup == nil {
				lookup = os.LookupEnv
			}
			if val, ok := lookup(name); ok && val != "" {
				out = append(out, val)
			}
		}
	}
	return out
}

// Redact replaces each secret of at least minSecretLen bytes in body with [redacted],
// in every form a tool might echo it in — as sent, JSON-escaped, URL-encoded (query and path),
// and base64 (standard and URL alphabets, padded or not) — so a tool that echoes its
// credentials (in an error, say) does not put them on the bus.
//
// A JSON string written with escapes (\u0073, \/, in part or in full; a key as well as a
// value) is decoded, and where its text holds a secret, in any of those forms, the whole string
// is replaced by its redaction, encoded again; so is a JSON string held in such a string, to
// maxDecodeDepth levels. A secret of digits written as a JSON number becomes the string
// "[redacted]". An answer that was JSON stays JSON, unless a secret is written across its
// tokens. The work is linear in len(body): each level reads the bytes of the one above once.
func Redact(body []byte, secrets []string) []byte {
	var forms [][]byte
	for _, s := range secrets {
		if len(s) < minSecretLen {
			continue
		}
		for _, form := range secretForms(s) {
			forms = append(forms, []byte(form))
		}
	}
	if len(forms) == 0 {
		return body
	}
	return redactForms(body, forms, maxDecodeDepth)
}

// maxDecodeDepth is how many levels of JSON strings held in JSON strings Redact decodes.
const maxDecodeDepth = 4

// redacted is what a secret is replaced with.
var redacted = []byte("[redacted]")

// redactForms replaces every form in body, after redacting the JSON strings and numbers that
// hold one (decoding escaped strings depth levels deep).
func redactForms(body []byte, forms [][]byte, depth int) []byte {
	return replaceForms(redactTokens(body, forms, depth), forms)
}

// replaceForms replaces every form in body, byte for byte.
func replaceForms(body []byte, forms [][]byte) []byte {
	for _, form := range forms {
		if bytes.Contains(body, form) {
			body = bytes.ReplaceAll(body, form, redacted)
		}
	}
	return body
}

// redactTokens replaces each JSON string of body written with escapes whose text or bytes
// hold a secret (one without escapes is its text, which replaceForms reads), and, when body is
// a JSON document, each number that holds one.
// Outside a JSON document, every double-quoted run is tried as a JSON string: a log line or a
// page can quote one. body is returned as it came when nothing is replaced.
func redactTokens(body []byte, forms [][]byte, depth int) []byte {
	if depth <= 0 {
		return body
	}
	document := -1 // unknown until a number is met: json.Valid is a second pass
	var out []byte
	last := 0 // body[:last] is in out
	for i := 0; i < len(body); {
		switch c := body[i]; {
		case c == '"':
			end, escaped := stringEnd(body, i)
			if end < 0 {
				i = len(body) // unterminated: what is left is not a string
				break
			}
			if escaped {
				if token, ok := redactString(body[i:end], forms, depth-1); ok {
					out = append(append(out, body[last:i]...), token...)
					last = end
				}
			}
			i = end
		case c == '-' || '0' <= c && c <= '9':
			if document < 0 {
				document = 0
				if json.Valid(body) {
					document = 1
				}
			}
			if document == 0 {
				i++
				break
			}
			j := i + 1
			for j < len(body) && strings.IndexByte("0123456789.eE+-", body[j]) >= 0 {
				j++
			}
			if holdsForm(body[i:j], forms) {
				out = append(append(append(out, body[last:i]...), '"'), redacted...)
				out = append(out, '"')
				last = j
			}
			i = j
		default:
			i++
		}
	}
	if out == nil {
		return body
	}
	return append(out, body[last:]...)
}

// stringEnd returns the index just past the closing quote of the JSON string opening at
// body[i], and whether it holds an escape; -1 when it is not closed.
func stringEnd(body []byte, i int) (end int, escaped bool) {
	for j := i + 1; j < len(body); j++ {
		switch body[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped
		}
	}
	return -1, escaped
}

// redactString decodes the JSON string token and, when its text holds a form, returns the
// redacted text encoded as a JSON string. A form written in the token's bytes but not in its
// text (a secret with a backslash, written by an encoder that does not escape it; digits after
// a \u) is redacted from the bytes, which become the text: the secret is shown neither way.
// ok is false when token is no JSON string or holds no form.
func redactString(token []byte, forms [][]byte, depth int) (_ []byte, ok bool) {
	var text string
	if json.Unmarshal(token, &text) != nil {
		return nil, false
	}
	red := redactForms([]byte(text), forms, depth)
	if string(red) == text {
		raw := token[1 : len(token)-1]
		if !holdsForm(raw, forms) {
			return nil, false
		}
		red = replaceForms(bytes.Clone(raw), forms)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // as it came: a tool's < > & are not escaped again
	if enc.Encode(string(red)) != nil {
		return nil, false
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), true
}

// holdsForm reports whether b contains any of forms.
func holdsForm(b []byte, forms [][]byte) bool {
	for _, form := range forms {
		if bytes.Contains(b, form) {
			return true
		}
	}
	return false
}

// secretForms lists the ways s may be written in an answer, longest first (so a longer form is
// replaced before a shorter one inside it).
func secretForms(s string) []string {
	js, _ := json.Marshal(s)
	jsonEscaped := string(js[1 : len(js)-1])
	var plain bytes.Buffer // as encoders that leave & < > alone write it (protojson, most others)
	enc := json.NewEncoder(&plain)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	jsonPlain := strings.TrimSuffix(strings.TrimSpace(plain.String()), `"`)[1:]
	lowerHex := func(e string) string { // %2F as %2f, as some encoders write it
		return percentHex.ReplaceAllStringFunc(e, strings.ToLower)
	}
	forms := []string{s, jsonEscaped, jsonPlain, strings.ReplaceAll(jsonEscaped, "/", `\/`), url.QueryEscape(s), url.PathEscape(s),
		lowerHex(url.QueryEscape(s)), lowerHex(url.PathEscape(s)),
		base64.StdEncoding.EncodeToString([]byte(s)), base64.URLEncoding.EncodeToString([]byte(s)),
		base64.RawStdEncoding.EncodeToString([]byte(s)), base64.RawURLEncoding.EncodeToString([]byte(s))}
	slices.SortFunc(forms, func(a, b string) int { return len(b) - len(a) })
	return slices.Compact(forms)
}

// minSecretLen is the shortest value redacted from tool answers: shorter ones would blank
// out ordinary text.
const minSecretLen = 4

// Resolve replaces every ${env.NAME} in value, the value of header, for a call to any origin;
// names bound to an origin are refused.
func (r *EnvResolver) Resolve(header, value string) (string, error) {
	return r.ResolveFor("", header, value)
}

// Origin is u's scheme://host:port, lower-case, the port made explicit (80 for http, 443 for
// https): what a name is bound to.
func Origin(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[strings.ToLower(u.Scheme)]
	}
	return strings.ToLower(u.Scheme) + "://" + strings.ToLower(net.JoinHostPort(u.Hostname(), port))
}

// ParseAllowEnv reads --allow-env entries, NAME@scheme://host:port each (the port may be left
// out for http's 80 and https' 443): the names ${env.NAME} may read, each bound to the one origin
// its value may be sent to. A name without an origin is an error: it would go wherever a
// tool_call message points.
func ParseAllowEnv(entries []string) (*EnvResolver, error) {
	env := &EnvResolver{Allowed: map[string]bool{}, Hosts: map[string]string{}}
	for _, e := range entries {
		name, where, bound := strings.Cut(e, "@")
		if !envName.MatchString(name) {
			return nil, fmt.Errorf("--allow-env %q: %q is not a variable name", e, name)
		}
		if !bound {
			return nil, fmt.Errorf("--allow-env %s: bind it to the one origin its value may be sent to, as %s@https://host:port "+
				"(unbound, it would go wherever a tool_call message points)", name, name)
		}
		u, err := url.Parse(where)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil ||
			(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			return nil, fmt.Errorf("--allow-env %s@%s: the origin must be scheme://host[:port] with scheme http or https, e.g. %s@https://policy-service:8443", name, where, name)
		}
		if old, dup := env.Hosts[name]; dup && old != Origin(u) {
			return nil, fmt.Errorf("--allow-env %s: bound twice (%s and %s); a value goes to one origin", name, old, Origin(u))
		}
		env.Allowed[name], env.Hosts[name] = true, Origin(u)
	}
	return env, nil
}

// percentHex matches a percent-escape.
var percentHex = regexp.MustCompile(`%[0-9A-F]{2}`)

// envName is what a ${env.NAME} may name.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// ResolveFor replaces every ${env.NAME} in value, the value of header of a call to origin
// (Origin of its URL).
func (r *EnvResolver) ResolveFor(origin, header, value string) (string, error) {
	if !strings.Contains(value, "${") {
		return value, nil
	}
	var b strings.Builder
	rest := value
	for {
		i := strings.Index(rest, "${")
		if i < 0 {
			b.WriteString(rest)
			return b.String(), nil
		}
		b.WriteString(rest[:i])
		end := strings.IndexByte(rest[i:], '}')
		if end < 0 || !strings.HasPrefix(rest[i:], "${env.") {
			return "", fmt.Errorf("header %s holds a malformed placeholder", header)
		}
		name := rest[i+len("${env.") : i+end]
		if r == nil || !r.Allowed[name] {
			return "", &EnvError{Code: "ENV_NOT_ALLOWED", name: name, header: header}
		}
		if bound, ok := r.Hosts[name]; ok && !strings.EqualFold(bound, origin) {
			return "", &EnvError{Code: "ENV_NOT_ALLOWED", name: name, header: header, host: bound}
		}
		lookup := r.Lookup
		if lookup == nil {
			lookup = os.LookupEnv
		}
		v, ok := lookup(name)
		if !ok {
			return "", &EnvError{Code: "ENV_UNSET", name: name, header: header}
		}
		b.WriteString(v)
		rest = rest[i+end+1:]
	}
}
