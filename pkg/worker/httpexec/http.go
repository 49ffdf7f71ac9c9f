// Package httpexec is the Executor of http actions (protocol.ActionHTTP), the one Hermes' own
// tool worker runs: it calls the route's URL with a call's arguments (path parameters, then the
// query or a JSON body), with ${env.NAME} placeholders in headers resolved only for the origin
// each name is bound to, dialing only where package egress allows (never link-local, loopback
// only when the URL writes it). It reads at most a call's MaxResultBytes of an answer, maps the
// answer's status to a result or a retryable failure (429 and 5xx may succeed later, honouring
// Retry-After), and passes the workertest conformance suite.
package httpexec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/tracing"
	"github.com/hermesbus/hermes/pkg/worker"
	"github.com/hermesbus/hermes/pkg/worker/egress"
)

// Executor runs http actions: it calls the route's URL with the call's arguments (path
// parameters, then the query for GET and DELETE or a JSON body otherwise), resolving
// ${env.NAME} placeholders in headers through Env. It reads at most the call's MaxResultBytes
// of an answer. It is safe for concurrent use and reuses connections.
type Executor struct {
	Client *http.Client
	Env    *egress.EnvResolver
}

var _ worker.Executor = (*Executor)(nil)

// New returns an executor that dials through NewHTTPClient(resolve) and resolves the
// environment variables allowEnv names, each bound to the one origin its value may be sent to
// (ParseAllowEnv: NAME@scheme://host:port; an unbound name is an error).
func New(allowEnv []string, resolve map[string]string) (*Executor, error) {
	env, err := egress.ParseAllowEnv(allowEnv)
	if err != nil {
		return nil, err
	}
	return &Executor{Client: NewHTTPClient(resolve), Env: env}, nil
}

// Kind is protocol.ActionHTTP.
func (h *Executor) Kind() string { return protocol.ActionHTTP }

// NewHTTPTransport returns a transport tuned for many concurrent calls to few tool hosts.
// resolve maps host:port as written in routes to another host:port to dial (like curl
// --resolve); it never changes the Host header or the URL. Other addresses are dialed only where
// egress.Dialer allows: never link-local (cloud metadata), and loopback only when the URL
// writes it (localhost, 127.0.0.1, [::1]).
func NewHTTPTransport(resolve map[string]string) *http.Transport {
	t := &http.Transport{
		Proxy:               nil,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   false,
		DialContext:         egress.Dialer(resolve),
	}
	return t
}

// NewHTTPClient returns the client a worker calls tools with: connections reused through
// NewHTTPTransport, and redirects followed only within the route's scheme, host and port, so
// header values resolved from ${env.NAME} never travel to a host the route does not name.
func NewHTTPClient(resolve map[string]string) *http.Client {
	return &http.Client{
		Transport: NewHTTPTransport(resolve),
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			first := via[0].URL
			if req.URL.Scheme != first.Scheme || req.URL.Host != first.Host || len(via) >= 5 {
				return http.ErrUseLastResponse
			}
			return nil
		},
	}
}

// Execute runs one try of an http action.
func (h *Executor) Execute(ctx context.Context, c *worker.Call) (out worker.Outcome, err error) {
	a := c.Dispatch.Action
	route := c.Dispatch.Route
	name := "HTTP"
	if a.HTTP != nil {
		name += " " + strings.ToUpper(a.HTTP.Method)
	}
	ctx, span := tracing.Tracer().Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("hermes.route", route), attribute.Int("hermes.attempt", c.Attempt)))
	defer func() {
		if out.Result.ErrorCode != "" {
			span.SetStatus(codes.Error, out.Result.ErrorCode)
			span.SetAttributes(attribute.String("hermes.error_code", out.Result.ErrorCode))
		}
		tracing.End(span, err)
	}()
	req, err := h.build(ctx, c)
	if err != nil {
		var ee *egress.EnvError
		if errors.As(err, &ee) {
			return worker.Failed(ee.Code, protocol.OriginHermes, ee.Error(), ee.Error(), false), nil
		}
		return worker.Failed(protocol.CodeBadArguments, protocol.OriginHermes,
			fmt.Sprintf("fix the call's arguments for route %s: %v", route, err), err.Error(), false), nil
	}
	tctx, cancel := context.WithTimeout(ctx, c.TryTimeout())
	defer cancel()
	req = req.WithContext(tctx)
	span.SetAttributes(attribute.String("http.request.method", req.Method), attribute.String("server.address", req.URL.Host),
		attribute.String("url.path", req.URL.Path))
	start := time.Now()
	resp, err := h.Client.Do(req)
	if err != nil {
		return h.transportFailure(ctx, err, c)
	}
	defer resp.Body.Close()
	span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
	limit := c.ResultLimit()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return h.transportFailure(ctx, err, c)
	}
	elapsed := time.Since(start)
	// The size is judged on what the tool sent, before secrets are redacted: redaction can
	// shorten a cut-off answer below the limit, or lengthen one that fits above it.
	if int64(len(body)) > limit {
		return worker.TooLarge(limit), nil
	}
	if a.HTTP != nil && len(a.HTTP.Headers) > 0 {
		body = egress.Redact(body, h.Env.Secrets(a.HTTP.Headers))
	}
	out = worker.Outcome{Result: protocol.ToolResult{Content: contentOf(body), ExecutionTimeMS: executionTime(resp.Header, elapsed)}}
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		out.Result.Status = protocol.ResultOK
		out.Answered = worker.AnsweredBody
		return out, nil
	case resp.StatusCode == http.StatusTooManyRequests:
		out = toolFailure(out, body, protocol.CodeToolRateLimited, resp.StatusCode, true,
			"the tool is rate limiting Hermes; lower the call rate or raise the tool's limit")
		out.RetryAfter = retryAfter(resp.Header)
	case resp.StatusCode >= 500:
		out = toolFailure(out, body, protocol.CodeToolHTTP5xx, resp.StatusCode, true,
			"the tool failed on its side; check its health and logs, the call may succeed later")
		out.RetryAfter = retryAfter(resp.Header)
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		out = toolFailure(out, body, protocol.CodeToolRedirected, resp.StatusCode, false,
			"the tool redirected to "+redirectTarget(resp)+"; Hermes follows redirects only to the route's own host: point the route at the final URL")
	default:
		out = toolFailure(out, body, protocol.CodeToolHTTP4xx, resp.StatusCode, false,
			"the tool refused the call; check the arguments against what the tool expects")
	}
	// Whatever came with an error status or a redirect is the tool's, for its contract to
	// judge (or withhold).
	out.Answered = worker.AnsweredBody
	return out, nil
}

// toolFailure turns an HTTP error status into an error outcome: code is Hermes' word for the
// status; the tool's own error_code (in tool_error_code, when valid and not one of Hermes') and
// recovery_hint are kept when its body carries them.
func toolFailure(out worker.Outcome, body []byte, code string, status int, retryable bool, hint string) worker.Outcome {
	hint = fmt.Sprintf("HTTP %d: %s", status, hint)
	var own struct {
		ErrorCode    string `json:"error_code"`
		RecoveryHint string `json:"recovery_hint"`
	}
	if json.Unmarshal(body, &own) == nil && own.RecoveryHint != "" {
		hint = own.RecoveryHint
	}
	r := protocol.ToolFailure(code, own.ErrorCode, hint, out.Result.Content)
	r.ExecutionTimeMS = out.Result.ExecutionTimeMS
	return worker.Outcome{Result: r, Retryable: retryable}
}

func (h *Executor) transportFailure(ctx context.Context, err error, c *worker.Call) (worker.Outcome, error) {
	if ctx.Err() != nil {
		return worker.Outcome{}, context.Cause(ctx) // shutting down or cancelled: not the tool's fault
	}
	if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		return worker.TimedOut(c), nil
	}
	// The URL (and its query, which may hold what it should not) stays out of the text: what
	// failed is said without it.
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if errors.Is(err, egress.ErrDestinationRefused) {
		return worker.Failed(protocol.CodeDestinationRefused, protocol.OriginHermes,
			fmt.Sprintf("route %s points at an address tool workers do not call; point it at the tool's own host", c.Dispatch.Route),
			scrub(err.Error()), false), nil
	}
	host := ""
	if c.Dispatch.Action.HTTP != nil {
		if u, perr := url.Parse(c.Dispatch.Action.HTTP.URL); perr == nil {
			host = u.Host
		}
	}
	return worker.Failed(protocol.CodeToolUnreachable, protocol.OriginHermes,
		fmt.Sprintf("could not reach the tool at %s; check that it runs and that route %s points at it", host, c.Dispatch.Route),
		"tool unreachable: "+scrub(err.Error()), true), nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// scrub cuts an error text to a readable length; transport errors hold no header values.
func scrub(s string) string {
	if len(s) > 300 {
		return s[:300]
	}
	return s
}

// build makes the HTTP request of one try: path parameters filled from arguments and route
// captures, the rest as query (GET, DELETE) or JSON body.
func (h *Executor) build(ctx context.Context, c *worker.Call) (*http.Request, error) {
	a := c.Dispatch.Action.HTTP
	if a == nil {
		return nil, errors.New("http action missing")
	}
	args, err := c.Arguments()
	if err != nil {
		return nil, err
	}
	target, used, err := fillPath(a.URL, args)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("url: %v", err)
	}
	method := strings.ToUpper(a.Method)
	var body io.Reader
	if method == http.MethodGet || method == http.MethodDelete {
		q := u.Query()
		for _, k := range sortedKeys(args) {
			if !used[k] {
				addQuery(q, k, args[k])
			}
		}
		u.RawQuery = q.Encode()
	} else {
		body = bytes.NewReader(bodyOf(c.Dispatch, args, used))
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, err
	}
	for name, v := range a.Headers {
		rv, err := h.Env.ResolveFor(egress.Origin(u), name, v)
		if err != nil {
			return nil, err
		}
		req.Header.Set(name, rv)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "hermes-toolworker")
	req.Header.Set("Idempotency-Key", c.IdempotencyKey())
	req.Header.Set("X-Request-ID", c.RequestID)
	req.Header.Set("X-Hermes-Attempt", strconv.Itoa(c.Attempt))
	if g := c.Dispatch.Grant; g != nil {
		// The call's turn on the resource it changes: the tool refuses a fencing token lower
		// than one it has seen for the resource.
		req.Header.Set(protocol.HeaderTx, g.Tx)
		req.Header.Set(protocol.HeaderFence, strconv.FormatUint(g.Fence, 10))
		req.Header.Set(protocol.HeaderResource, g.Resource)
	}
	tc := c.Trace // the tool's parent is this try's client span, when there is one
	tracing.Inject(ctx, &tc)
	if tc.TraceID != "" {
		req.Header.Set("X-Trace-ID", tc.TraceID)
	}
	if tc.Traceparent != "" {
		req.Header.Set("traceparent", tc.Traceparent)
		if tc.Tracestate != "" {
			req.Header.Set("tracestate", tc.Tracestate)
		}
	}
	return req, nil
}

// bodyOf is the JSON body: the arguments byte for byte when nothing was added or taken,
// else the merged object.
func bodyOf(d *protocol.Dispatch, args map[string]json.RawMessage, used map[string]bool) []byte {
	if len(d.Params) == 0 && len(used) == 0 && len(d.Call.Arguments) > 0 {
		return d.Call.Arguments
	}
	rest := make(map[string]json.RawMessage, len(args))
	for k, v := range args {
		if !used[k] {
			rest[k] = v
		}
	}
	b, _ := json.Marshal(rest)
	return b
}

// fillPath replaces {name} placeholders in the URL's path with escaped argument values.
// The scheme, host and port come from the route alone.
func fillPath(raw string, args map[string]json.RawMessage) (string, map[string]bool, error) {
	if !strings.Contains(raw, "{") {
		return raw, nil, nil
	}
	used := map[string]bool{}
	var b strings.Builder
	rest := raw
	for {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			b.WriteString(rest)
			return b.String(), used, nil
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return "", nil, fmt.Errorf("url %q has an unclosed {", raw)
		}
		name := rest[i+1 : i+j]
		v, ok := args[name]
		if !ok {
			return "", nil, fmt.Errorf("path parameter {%s} needs the argument %q", name, name)
		}
		s, ok := scalarText(v)
		if !ok || s == "" {
			return "", nil, fmt.Errorf("argument %q fills a path parameter and must be a non-empty string or number", name)
		}
		if seg, _, _ := strings.Cut(s, ";"); seg == "." || seg == ".." { // ";" starts path parameters some servers strip
			return "", nil, fmt.Errorf("argument %q fills a path parameter and cannot be %q (it would climb the path)", name, s)
		}
		// Escaped, they would stay in their segment here, but many servers and proxies decode
		// them before routing: a value must not be able to reach another resource.
		if strings.ContainsAny(s, `/\%`) {
			return "", nil, fmt.Errorf("argument %q fills a path parameter and cannot hold '/', '\\' or '%%' (they could change the path)", name)
		}
		b.WriteString(rest[:i])
		b.WriteString(url.PathEscape(s))
		used[name] = true
		rest = rest[i+j+1:]
	}
}

// scalarText renders a JSON scalar as query or path text: strings unquoted, numbers and
// booleans as written.
func scalarText(v json.RawMessage) (string, bool) {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return "", false
	}
	switch v[0] {
	case '"':
		var s string
		if json.Unmarshal(v, &s) != nil {
			return "", false
		}
		return s, true
	case '{', '[', 'n':
		return "", false
	}
	return string(v), true
}

func addQuery(q url.Values, k string, v json.RawMessage) {
	if s, ok := scalarText(v); ok {
		q.Add(k, s)
		return
	}
	v = bytes.TrimSpace(v)
	if len(v) > 0 && v[0] == '[' {
		var items []json.RawMessage
		if json.Unmarshal(v, &items) == nil {
			for _, it := range items {
				if s, ok := scalarText(it); ok {
					q.Add(k, s)
				} else {
					q.Add(k, string(bytes.TrimSpace(it)))
				}
			}
			return
		}
	}
	if string(v) == "null" {
		return
	}
	q.Add(k, string(v))
}

func sortedKeys(m map[string]json.RawMessage) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// contentOf keeps a JSON answer as it is and wraps any other text as a JSON string.
func contentOf(body []byte) json.RawMessage {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return json.RawMessage("null")
	}
	if json.Valid(trimmed) {
		return json.RawMessage(trimmed)
	}
	return jsonString(string(body))
}

func executionTime(h http.Header, measured time.Duration) int64 {
	if v := h.Get("X-Execution-Time"); v != "" {
		if f, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), "ms"), 64); err == nil && f >= 0 {
			return int64(f + 0.5)
		}
	}
	return measured.Milliseconds()
}

func retryAfter(h http.Header) time.Duration {
	v := h.Get("Retry-After")
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return min(time.Duration(s)*time.Second, 5*time.Minute)
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(time.Until(t), 0), 5*time.Minute)
	}
	return 0
}

// redirectTarget names where a redirect pointed, without its query (which may hold tokens).
func redirectTarget(resp *http.Response) string {
	loc, err := resp.Location()
	if err != nil {
		return "an unnamed location"
	}
	return loc.Scheme + "://" + loc.Host + loc.Path
}

func jsonString(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}
