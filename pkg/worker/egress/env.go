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
func Redact(body []byte, secrets []string) []byte {
	for _, s := range secrets {
		if len(s) < minSecretLen {
			continue
		}
		for _, form := range secretForms(s) {
			if bytes.Contains(body, []byte(form)) {
				body = bytes.ReplaceAll(body, []byte(form), []byte("[redacted]"))
			}
		}
	}
	return body
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
