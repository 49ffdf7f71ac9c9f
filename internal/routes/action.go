package routes

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/hermesbus/hermes/pkg/protocol"
	"gopkg.in/yaml.v3"
)

// Limits of an action's timing fields, in milliseconds.
const (
	// MaxTimeoutMS is the largest timeout_ms a route may ask for.
	MaxTimeoutMS = 600_000
	// MaxIntervalLimitMS is the largest retry delay (initial_interval_ms, max_interval_ms and
	// jitter_ms) a route may ask for.
	MaxIntervalLimitMS = 300_000
)

var (
	httpFields  = []string{"url", "method", "timeout_ms", "headers", "retry"}
	grpcFields  = []string{"service", "method", "target", "tls", "server_name", "descriptor_set", "timeout_ms", "headers", "retry"}
	goFields    = []string{"timeout_ms", "retry"}
	mcpFields   = []string{"server", "tool", "timeout_ms", "retry"}
	retryFields = []string{"max_attempts", "backoff_factor", "jitter_ms", "initial_interval_ms", "max_interval_ms"}

	// httpMethods are the methods an http action may use.
	httpMethods = []string{"GET", "POST", "PUT", "PATCH", "DELETE"}

	// reservedHeaders are set by Hermes on every call; a route may not set them.
	reservedHeaders = []string{
		"Idempotency-Key", "X-Request-ID", "X-Trace-ID", "Content-Type", "Content-Length", "Host", "traceparent",
		protocol.HeaderTx, protocol.HeaderFence, protocol.HeaderResource,
	}
)

// action decodes a rule's action block: exactly one of http, go and grpc.
func (d *decoder) action(e entry, path string) (protocol.Action, error) {
	f, err := d.mapping(e.value, path, e.key.Line, actionFields)
	if err != nil {
		return protocol.Action{}, err
	}
	var kinds []string
	for _, k := range actionFields {
		if f.has(k) {
			kinds = append(kinds, k)
		}
	}
	switch {
	case len(kinds) > 1:
		return protocol.Action{}, d.errorf(f.line, path, "has %s; want exactly one", strings.Join(kinds, " and "))
	case len(kinds) == 0:
		return protocol.Action{}, d.errorf(f.line, path, "needs one of %s", strings.Join(actionFields, ", "))
	}
	switch kinds[0] {
	case protocol.ActionHTTP:
		return d.httpAction(f.byKey["http"], path+".http")
	case protocol.ActionGo:
		return d.goAction(f.byKey["go"], path+".go")
	case protocol.ActionMCP:
		return d.mcpAction(f.byKey["mcp"], path+".mcp")
	default:
		return d.grpcAction(f.byKey["grpc"], path+".grpc")
	}
}

// goAction decodes a go block: the tool is a Go function served by a program on the worker
// runtime (package worker); the action holds only timing.
func (d *decoder) goAction(e entry, path string) (protocol.Action, error) {
	a := protocol.Action{Kind: protocol.ActionGo}
	f, err := d.mapping(e.value, path, e.key.Line, goFields)
	if err != nil {
		return a, err
	}
	return a, d.common(&a, f, path)
}

// mcpAction decodes an mcp block: a tool of an MCP server the tool workers' own configuration
// names (server), by its name there (tool).
func (d *decoder) mcpAction(e entry, path string) (protocol.Action, error) {
	a := protocol.Action{Kind: protocol.ActionMCP, MCP: &protocol.MCPAction{}}
	f, err := d.mapping(e.value, path, e.key.Line, mcpFields)
	if err != nil {
		return a, err
	}
	var line int
	if a.MCP.Server, line, err = d.str(f, "server", true); err != nil {
		return a, err
	}
	if err := protocol.CheckID("server", a.MCP.Server); err != nil {
		return a, d.errorf(line, path+".server", "%s", strings.TrimPrefix(err.Error(), "server: "))
	}
	if a.MCP.Tool, line, err = d.str(f, "tool", true); err != nil {
		return a, err
	}
	if err := d.common(&a, f, path); err != nil {
		return a, err
	}
	if err := a.Check(); err != nil {
		return a, d.errorf(line, path+".tool", "%s", err.Error())
	}
	return a, nil
}

// httpAction decodes an http block.
func (d *decoder) httpAction(e entry, path string) (protocol.Action, error) {
	a := protocol.Action{Kind: protocol.ActionHTTP}
	f, err := d.mapping(e.value, path, e.key.Line, httpFields)
	if err != nil {
		return a, err
	}
	rawURL, line, err := d.str(f, "url", true)
	if err != nil {
		return a, err
	}
	if reason := checkURL(rawURL); reason != "" {
		return a, d.errorf(line, path+".url", "%s", reason)
	}
	method, line, err := d.str(f, "method", false)
	if err != nil {
		return a, err
	}
	if method == "" {
		method = "POST"
	}
	if upper := strings.ToUpper(method); slices.Contains(httpMethods, upper) {
		method = upper
	} else {
		return a, d.errorf(line, path+".method", "must be one of %s, got %q", strings.Join(httpMethods, ", "), truncate(method, 32))
	}
	a.HTTP = &protocol.HTTPAction{URL: rawURL, Method: method}
	if a.HTTP.Headers, err = d.headers(f, path+".headers"); err != nil {
		return a, err
	}
	return a, d.common(&a, f, path)
}

// grpcAction decodes a grpc block (pkg/worker/grpcexec runs it). A rule without a target loads,
// as the seed's does; its calls are refused naming the field.
func (d *decoder) grpcAction(e entry, path string) (protocol.Action, error) {
	a := protocol.Action{Kind: protocol.ActionGRPC, GRPC: &protocol.GRPCAction{}}
	f, err := d.mapping(e.value, path, e.key.Line, grpcFields)
	if err != nil {
		return a, err
	}
	for _, field := range []struct {
		key string
		dst *string
	}{{"service", &a.GRPC.Service}, {"method", &a.GRPC.Method}} {
		v, line, err := d.str(f, field.key, true)
		if err != nil {
			return a, err
		}
		if strings.ContainsFunc(v, func(r rune) bool { return r == ' ' || isControl(r) }) {
			return a, d.errorf(line, path+"."+field.key, "must not contain spaces or control characters")
		}
		*field.dst = v
	}
	if a.GRPC.Headers, err = d.headers(f, path+".headers"); err != nil {
		return a, err
	}
	for _, field := range []struct {
		key   string
		dst   *string
		check func(string) string
	}{{"target", &a.GRPC.Target, protocol.CheckGRPCTarget}, {"server_name", &a.GRPC.ServerName, nil},
		{"descriptor_set", &a.GRPC.DescriptorSet, protocol.CheckDescriptorSetName}} {
		v, line, err := d.str(f, field.key, false)
		if err != nil {
			return a, err
		}
		if v != "" && field.check != nil {
			if why := field.check(v); why != "" {
				return a, d.errorf(line, path+"."+field.key, "%s", why)
			}
		}
		*field.dst = v
	}
	if e, ok := f.present("tls"); ok {
		v := resolve(e.value)
		if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" || v.Decode(&a.GRPC.TLS) != nil {
			return a, d.errorf(e.key.Line, path+".tls", "must be true or false, got %s", kindOf(v))
		}
	}
	return a, d.common(&a, f, path)
}

// common decodes the fields every action kind has: timeout_ms and retry.
func (d *decoder) common(a *protocol.Action, f fields, path string) error {
	var err error
	if a.TimeoutMS, err = d.integer(f, "timeout_ms", protocol.DefaultTimeoutMS, 1, MaxTimeoutMS); err != nil {
		return err
	}
	a.Retry, err = d.retry(f, path+".retry")
	return err
}

// retry decodes a retry block, applying the protocol defaults.
func (d *decoder) retry(parent fields, path string) (protocol.RetryPolicy, error) {
	p := protocol.RetryPolicy{
		MaxAttempts:       protocol.DefaultMaxAttempts,
		BackoffFactor:     protocol.DefaultBackoffFactor,
		InitialIntervalMS: protocol.DefaultInitialIntervalMS,
		MaxIntervalMS:     protocol.DefaultMaxIntervalMS,
	}
	e, ok := parent.present("retry")
	if !ok {
		return p, nil
	}
	f, err := d.mapping(e.value, path, e.key.Line, retryFields)
	if err != nil {
		return p, err
	}
	if p.MaxAttempts, err = d.integer(f, "max_attempts", p.MaxAttempts, 1, protocol.MaxAttemptsLimit); err != nil {
		return p, err
	}
	if p.BackoffFactor, err = d.number(f, "backoff_factor", p.BackoffFactor, 1, 1000); err != nil {
		return p, err
	}
	if p.JitterMS, err = d.integer(f, "jitter_ms", 0, 0, MaxIntervalLimitMS); err != nil {
		return p, err
	}
	if p.InitialIntervalMS, err = d.integer(f, "initial_interval_ms", p.InitialIntervalMS, 1, MaxIntervalLimitMS); err != nil {
		return p, err
	}
	if _, ok := f.present("max_interval_ms"); !ok {
		p.MaxIntervalMS = max(p.MaxIntervalMS, p.InitialIntervalMS)
		return p, nil
	}
	if p.MaxIntervalMS, err = d.integer(f, "max_interval_ms", 0, 1, MaxIntervalLimitMS); err != nil {
		return p, err
	}
	if p.MaxIntervalMS < p.InitialIntervalMS {
		e := f.byKey["max_interval_ms"]
		return p, d.errorf(e.key.Line, path+".max_interval_ms", "must be at least initial_interval_ms (%d), got %d",
			p.InitialIntervalMS, p.MaxIntervalMS)
	}
	return p, nil
}

// headers decodes a headers block: valid, non-reserved names, each given once (ignoring case),
// to string values whose only ${…} placeholders are ${env.NAME}. It returns nil for no headers.
func (d *decoder) headers(parent fields, path string) (map[string]string, error) {
	e, ok := parent.present("headers")
	if !ok {
		return nil, nil
	}
	f, err := d.mapping(e.value, path, e.key.Line, nil)
	if err != nil || len(f.entries) == 0 {
		return nil, err
	}
	out := make(map[string]string, len(f.entries))
	firstLine := make(map[string]int, len(f.entries)) // lower-case name → line
	for _, h := range f.entries {
		name, line, field := h.key.Value, h.key.Line, join(path, h.key.Value)
		if !validHeaderName(name) {
			return nil, d.errorf(line, field, "is not a valid HTTP header name")
		}
		if i := slices.IndexFunc(reservedHeaders, func(r string) bool { return strings.EqualFold(r, name) }); i >= 0 {
			return nil, d.errorf(line, field, "%s is set by Hermes and cannot be configured", reservedHeaders[i])
		}
		lower := strings.ToLower(name)
		if prev, dup := firstLine[lower]; dup {
			return nil, d.errorf(line, field, "duplicate header (first at line %d; header names ignore case)", prev)
		}
		firstLine[lower] = line
		v := resolve(h.value)
		if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
			return nil, d.errorf(line, field, "must be a string, got %s", kindOf(v))
		}
		if reason := checkHeaderValue(v.Value); reason != "" {
			return nil, d.errorf(line, field, "%s", reason)
		}
		if reason := checkCredential(name, v.Value); reason != "" {
			return nil, d.errorf(line, field, "%s", reason)
		}
		out[name] = v.Value
	}
	return out, nil
}

// checkHeaderValue returns why v cannot be a header value, or "". It never quotes v, which may
// be a secret.
func checkHeaderValue(v string) string {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return fmt.Sprintf("must not contain control characters (byte offset %d)", i)
		}
	}
	for i := 0; ; {
		j := strings.Index(v[i:], "${")
		if j < 0 {
			return ""
		}
		start := i + j
		end := strings.IndexByte(v[start:], '}')
		if end < 0 {
			return fmt.Sprintf("has an unclosed ${ at byte offset %d", start)
		}
		name, ok := strings.CutPrefix(v[start+2:start+end], "env.")
		if !ok || !isIdent(name) {
			return fmt.Sprintf("has a malformed placeholder at byte offset %d; want ${env.NAME} with NAME matching [A-Za-z_][A-Za-z0-9_]*", start)
		}
		i = start + end + 1
	}
}

// checkURL returns why raw cannot be an http action's URL, or "". It never quotes raw, whose
// query may hold a secret.
func checkURL(raw string) string {
	if strings.Contains(raw, "${") {
		return "must not contain ${…} placeholders (only header values may use ${env.NAME})"
	}
	if strings.ContainsFunc(raw, func(r rune) bool { return r == ' ' || isControl(r) }) {
		return "must not contain spaces or control characters"
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return "is not a valid URL: " + err.Error()
	}
	switch {
	case (u.Scheme != "http" && u.Scheme != "https") || u.Opaque != "":
		return "must be an absolute http:// or https:// URL"
	case u.User != nil:
		return "must not hold credentials; send them in a header with ${env.NAME}"
	case u.Hostname() == "":
		return "must name a host"
	case strings.Contains(raw, "#"):
		return "must not have a fragment (#…)"
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return "port must be between 1 and 65535"
		}
	}
	// Split the raw text, not the decoded URL: placeholders are filled in the raw text.
	_, rest, _ := strings.Cut(raw, "://")
	authority, pathAndQuery := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, pathAndQuery = rest[:i], rest[i:]
	}
	path, query, _ := strings.Cut(pathAndQuery, "?")
	if strings.ContainsAny(authority, "{}") || strings.ContainsAny(query, "{}") {
		return "may hold {name} placeholders only in its path"
	}
	// The raw query, split as servers may (on & and ;), not only as Go's parser does.
	for _, pair := range strings.FieldsFunc(u.RawQuery, func(r rune) bool { return r == '&' || r == ';' }) {
		k, v, _ := strings.Cut(pair, "=")
		if name, err := url.QueryUnescape(k); err == nil && credentialName(name) && v != "" {
			return fmt.Sprintf("holds a credential in its query (%s=…): routes are shared and recorded; send it in a header whose value is ${env.NAME}", name)
		}
	}
	return checkPathPlaceholders(path)
}

// credentialParts mark a header or query parameter name holding them as carrying a credential;
// credentialNames do so only as the whole name.
var (
	credentialParts = []string{"auth", "token", "secret", "password", "passwd", "api_key", "apikey", "api-key", "cookie"}
	credentialNames = []string{"key", "sig", "signature", "code"}
)

// credentialName reports whether name (a header or query parameter) carries a credential.
func credentialName(name string) bool {
	n := strings.ToLower(name)
	return slices.Contains(credentialNames, n) || slices.ContainsFunc(credentialParts, func(w string) bool { return strings.Contains(n, w) })
}

// secretPrefixes start well-known kinds of secret, whatever header they are in.
var secretPrefixes = []string{"sk-", "sk_live_", "sk_test_", "ghp_", "gho_", "github_pat_", "xoxb-", "xoxp-", "AKIA", "ASIA", "hk_", "glpat-", "AIza", "eyJ"}

// authSchemes may precede the credential in a header value.
var authSchemes = []string{"bearer", "basic", "token", "apikey", "digest"}

// checkCredential returns why a route may not hold header name: value, or "": a credential
// must be a ${env.NAME} placeholder, resolved on the worker, never a literal in a file that is
// shared, kept in version control and recorded with every call. It never quotes value.
func checkCredential(name, value string) string {
	literal := placeholder.ReplaceAllString(value, "")
	for _, w := range strings.Fields(literal) {
		for _, p := range secretPrefixes {
			if strings.HasPrefix(w, p) && len(w) > len(p)+8 {
				return fmt.Sprintf("holds what looks like a literal secret (%s…); put it in the worker's environment and write ${env.NAME} here", p)
			}
		}
	}
	if !credentialName(name) {
		return ""
	}
	rest := strings.TrimSpace(literal)
	for _, s := range authSchemes {
		if len(rest) >= len(s) && strings.EqualFold(rest[:len(s)], s) && (len(rest) == len(s) || rest[len(s)] == ' ') {
			rest = strings.TrimSpace(rest[len(s):])
			break
		}
	}
	if rest != "" {
		return fmt.Sprintf("%s carries a credential, and its value holds literal text besides ${env.NAME} placeholders: "+
			"put the secret in the worker's environment and write e.g. \"Bearer ${env.NAME}\"", name)
	}
	return ""
}

// placeholder matches a ${env.NAME} placeholder.
var placeholder = regexp.MustCompile(`\$\{env\.[A-Za-z_][A-Za-z0-9_]*\}`)

// checkPathPlaceholders checks that every { in path opens a {name} placeholder.
func checkPathPlaceholders(path string) string {
	for i := 0; i < len(path); i++ {
		switch path[i] {
		case '}':
			return "has a } that closes no {name} placeholder"
		case '{':
			end := strings.IndexByte(path[i:], '}')
			if end < 0 {
				return "has an unclosed { placeholder"
			}
			if name := path[i+1 : i+end]; !isIdent(name) {
				return fmt.Sprintf("placeholder {%s} is not {name} with name matching [A-Za-z_][A-Za-z0-9_]*", truncate(name, 40))
			}
			i += end
		}
	}
	return ""
}

// isIdent reports whether s matches [A-Za-z_][A-Za-z0-9_]*.
func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '_' && !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// validHeaderName reports whether s is an HTTP field name: one or more token characters
// (RFC 9110 §5.6.2).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
