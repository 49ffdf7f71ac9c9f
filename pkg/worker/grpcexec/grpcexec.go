// Package grpcexec runs grpc actions on the worker runtime: a route's
// `grpc: {service, method, target, timeout_ms}` becomes a unary call of that method, its
// request made from the call's JSON arguments and its response given back as JSON.
//
// The method is found by server reflection (grpc.reflection.v1, else v1alpha) or, for a server
// without it, in a FileDescriptorSet file the route names (descriptor_set) from the worker's
// descriptor directory; what is found is remembered for a minute, and forgotten at once when
// the server answers UNIMPLEMENTED. Arguments and answers follow the protobuf JSON mapping
// (protojson): fields by their proto or JSON names, 64-bit integers exact (as JSON strings in
// answers, as the mapping says; numbers or strings in arguments), unset fields given with their
// zero values, field names as in the .proto file.
//
// A try's deadline is the call's timeout (timeout_ms), sent to the server as the gRPC deadline.
// A status other than OK is the tool's failure, TOOL_GRPC_STATUS with the status code in
// tool_error_code (or the reason of a google.rpc.ErrorInfo detail) and its message in the hint
// and content; RESOURCE_EXHAUSTED is TOOL_RATE_LIMITED (unless it refuses a request too large
// for the server). UNAVAILABLE, DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED are retried, every
// other status not. A server that cannot be reached (or that goes away mid-call) is
// TOOL_UNREACHABLE, retried; a deadline that passes is TOOL_TIMEOUT, retried; an answer past
// MaxResultBytes, on the wire or once written as JSON (counted before it is written), is
// RESULT_TOO_LARGE.
//
// Connections are dialed through egress.Dialer (--resolve, and the destination rules an HTTP
// call follows), one per target, kept and reused. Header values may hold ${env.NAME}, resolved
// under the same allow-list and origin binding as HTTP's: a gRPC target's origin is
// http://host:port, or with TLS https:// and the name its certificate is verified against
// (ServerName when given). What a server says (answers, status messages, lookup errors) has
// those values redacted, and is bounded.
package grpcexec

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/tracing"
	"github.com/hermesbus/hermes/pkg/worker"
	"github.com/hermesbus/hermes/pkg/worker/egress"
)

// Config configures an Executor.
type Config struct {
	// AllowEnv names the environment variables header values may read, each bound to the one
	// origin it may be sent to (egress.ParseAllowEnv: NAME@https://host:port).
	AllowEnv []string
	// Resolve maps a target as routes write it to the host:port to dial (--resolve).
	Resolve map[string]string
	// Descriptors is the directory descriptor_set names a file in; "" for none.
	Descriptors string
	// RootCAs verifies TLS servers; nil for the system's roots.
	RootCAs *x509.CertPool
	Logger  *slog.Logger
}

// Executor runs grpc actions. It is safe for concurrent use; Close closes its connections.
type Executor struct {
	env     *egress.EnvResolver
	conns   *conns
	methods *methods
}

var _ worker.Executor = (*Executor)(nil)

// New returns an executor configured by cfg.
func New(cfg Config) (*Executor, error) {
	env, err := egress.ParseAllowEnv(cfg.AllowEnv)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Executor{
		env:     env,
		conns:   &conns{dial: egress.Dialer(cfg.Resolve), roots: cfg.RootCAs, open: map[connKey]*conn{}},
		methods: &methods{dir: cfg.Descriptors, sources: map[sourceKey]*source{}, log: log},
	}, nil
}

// Kind is protocol.ActionGRPC.
func (e *Executor) Kind() string { return protocol.ActionGRPC }

// Close closes every connection; calls still running fail.
func (e *Executor) Close() error {
	e.conns.close()
	return nil
}

// reservedMetadata are metadata names gRPC or Hermes set; a route cannot.
var reservedMetadata = []string{"content-type", "te", "user-agent", "idempotency-key", "x-request-id", "x-hermes-attempt", "x-hermes-tx", "x-hermes-fence", "x-hermes-resource", "x-hermes-resource-bin", "traceparent", "tracestate"}

// Execute runs one try of a grpc action.
func (e *Executor) Execute(ctx context.Context, c *worker.Call) (out worker.Outcome, err error) {
	if ctx.Err() != nil {
		return worker.Outcome{}, context.Cause(ctx)
	}
	a := c.Dispatch.Action.GRPC
	route := c.Dispatch.Route
	if a == nil {
		return worker.Failed(protocol.CodeRouteIncomplete, protocol.OriginHermes,
			fmt.Sprintf("route %s has a grpc action without its grpc block", route), "grpc action missing", false), nil
	}
	full := a.Service + "/" + a.Method
	ctx, span := tracing.Tracer().Start(ctx, "gRPC "+full, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("hermes.route", route), attribute.Int("hermes.attempt", c.Attempt),
			attribute.String("rpc.system", "grpc"), attribute.String("rpc.service", a.Service), attribute.String("rpc.method", a.Method),
			attribute.String("server.address", a.Target)))
	defer func() {
		if out.Result.ErrorCode != "" {
			span.SetStatus(otelcodes.Error, out.Result.ErrorCode)
			span.SetAttributes(attribute.String("hermes.error_code", out.Result.ErrorCode))
		}
		tracing.End(span, err)
	}()
	if a.Target == "" {
		return worker.Failed(protocol.CodeRouteIncomplete, protocol.OriginHermes,
			fmt.Sprintf("route %s calls %s but says not where: give its action.grpc.target (host:port)", route, full),
			"action.grpc.target is required to call a gRPC method", false), nil
	}
	if why := protocol.CheckGRPCTarget(a.Target); why != "" {
		return worker.Failed(protocol.CodeRouteIncomplete, protocol.OriginHermes,
			fmt.Sprintf("route %s: action.grpc.target %s", route, why), "action.grpc.target "+why, false), nil
	}
	md, err := e.metadata(ctx, c, a)
	if err != nil {
		var ee *egress.EnvError
		if errors.As(err, &ee) {
			return worker.Failed(ee.Code, protocol.OriginHermes, ee.Error(), ee.Error(), false), nil
		}
		return worker.Failed(protocol.CodeRouteIncomplete, protocol.OriginHermes, fmt.Sprintf("route %s: %v", route, err), err.Error(), false), nil
	}
	tctx, cancel := context.WithTimeout(ctx, c.TryTimeout())
	defer cancel()
	start := time.Now()

	key := connKey{target: a.Target, tls: a.TLS, serverName: a.ServerName}
	if a.TLS && key.serverName == "" {
		key.serverName, _, _ = net.SplitHostPort(a.Target) // checked above
	}
	cn, err := e.conns.get(key)
	if err != nil {
		return worker.Failed(protocol.CodeRouteIncomplete, protocol.OriginHermes, fmt.Sprintf("route %s: %v", route, err), err.Error(), false), nil
	}
	defer e.conns.put(cn)
	// The route's metadata goes with the reflection lookup too (a server may want its
	// credentials for that as well).
	tctx = metadata.NewOutgoingContext(tctx, md)
	sk := sourceKey{descriptorSet: a.DescriptorSet} // a descriptor set: the same whatever the server
	if a.DescriptorSet == "" {
		sk = sourceKey{conn: key, service: a.Service, creds: credsDigest(md)}
	}
	secrets := e.env.Secrets(a.Headers)
	m, err := e.methods.find(tctx, e.conns, cn, sk, a.Service, a.Method, secrets)
	if err != nil {
		return e.failure(ctx, tctx, c, cn, nil, err, nil, start, secrets)
	}
	in := dynamicpb.NewMessage(m.desc.Input())
	if err := e.request(c, m, in); err != nil {
		return worker.Failed(protocol.CodeBadArguments, protocol.OriginHermes,
			fmt.Sprintf("fix the call's arguments: they must fit %s: %v", m.desc.Input().FullName(), err), err.Error(), false), nil
	}
	resp := dynamicpb.NewMessage(m.desc.Output())
	limit := c.ResultLimit()
	cctx, mark := withAnswerMark(tctx)
	err = cn.cc.Invoke(cctx, "/"+a.Service+"/"+a.Method, in, resp, grpc.MaxCallRecvMsgSize(int(min(limit, 1<<30))))
	elapsed := time.Since(start)
	if err != nil {
		if status.Code(err) == codes.Unimplemented && mark.v.Load() {
			e.methods.forget(sk)
		}
		return e.failure(ctx, tctx, c, cn, in, err, mark, start, secrets)
	}
	span.SetAttributes(attribute.Int("rpc.grpc.status_code", int(codes.OK)))
	// The JSON mapping writes every unset field of every message: a small answer of a wide
	// schema can grow a thousandfold. Its size is bounded before anything is written.
	if jsonSize(resp.ProtoReflect(), m.types, limit) > limit {
		return worker.TooLarge(limit), nil
	}
	body, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true, Resolver: m.types}.Marshal(resp)
	if err != nil {
		return worker.Failed(protocol.CodeToolBadResponse, protocol.OriginTool,
			fmt.Sprintf("the answer of %s could not be given as JSON; check the server", full), err.Error(), false), nil
	}
	if int64(len(body)) > limit {
		return worker.TooLarge(limit), nil
	}
	body = egress.Redact(body, secrets)
	out = worker.OK(body, elapsed)
	out.Answered = worker.AnsweredValue
	return out, nil
}

// request fills in from the call's arguments. The route's captures are added only where the
// request message has a field of their name (proto or JSON) that the arguments do not set
// (under either name, or another member of its oneof), as that field's kind.
func (e *Executor) request(c *worker.Call, m *method, in *dynamicpb.Message) error {
	args := c.Dispatch.Call.Arguments
	if len(c.Dispatch.Params) > 0 {
		obj := map[string]json.RawMessage{}
		if len(args) > 0 {
			if err := json.Unmarshal(args, &obj); err != nil {
				return fmt.Errorf("arguments must be a JSON object: %v", err)
			}
		}
		if obj == nil {
			obj = map[string]json.RawMessage{}
		}
		fields := m.desc.Input().Fields()
		set := func(fd protoreflect.FieldDescriptor) bool {
			_, byName := obj[string(fd.Name())]
			_, byJSON := obj[fd.JSONName()]
			return byName || byJSON
		}
		for k, v := range c.Dispatch.Params {
			fd := fields.ByName(protoreflect.Name(k))
			if fd == nil {
				fd = fields.ByJSONName(k)
			}
			if fd == nil || set(fd) || fd.IsList() || fd.IsMap() || (fd.Message() != nil && !textual[fd.Message().FullName()]) {
				continue
			}
			if o := fd.ContainingOneof(); o != nil {
				taken := false
				for i := range o.Fields().Len() {
					taken = taken || set(o.Fields().Get(i))
				}
				if taken {
					continue
				}
			}
			obj[string(fd.Name())] = captureValue(fd, v)
		}
		args, _ = json.Marshal(obj)
	}
	if len(args) == 0 {
		args = []byte("{}")
	}
	return protojson.UnmarshalOptions{Resolver: m.types}.Unmarshal(args, in)
}

// textual are the message types the mapping writes as one scalar (wrappers, times, masks): a
// capture may fill a field of theirs.
var textual = map[protoreflect.FullName]bool{
	"google.protobuf.DoubleValue": true, "google.protobuf.FloatValue": true, "google.protobuf.Int64Value": true,
	"google.protobuf.UInt64Value": true, "google.protobuf.Int32Value": true, "google.protobuf.UInt32Value": true,
	"google.protobuf.BoolValue": true, "google.protobuf.StringValue": true, "google.protobuf.BytesValue": true,
	"google.protobuf.Timestamp": true, "google.protobuf.Duration": true, "google.protobuf.FieldMask": true,
}

// captureValue is a capture (text) as a JSON value of fd's kind: true and false for a bool, a
// number for an enum given by number, the text itself for a number (the mapping takes numbers
// as strings too), a string otherwise.
func captureValue(fd protoreflect.FieldDescriptor, v string) json.RawMessage {
	kind := fd.Kind()
	if m := fd.Message(); m != nil { // a wrapper: its value's kind
		kind = m.Fields().ByNumber(1).Kind()
	}
	switch kind {
	case protoreflect.BoolKind:
		if v == "true" || v == "false" {
			return json.RawMessage(v)
		}
	case protoreflect.EnumKind:
		if _, err := strconv.ParseInt(v, 10, 32); err == nil {
			return json.RawMessage(v)
		}
	}
	b, _ := json.Marshal(v)
	return b
}

// metadata is what goes with each try: the route's headers, ${env.NAME} resolved for the
// origin the connection is verified as, and Hermes' own (idempotency key, request id, attempt,
// trace context: this try's span as the server's parent).
func (e *Executor) metadata(ctx context.Context, c *worker.Call, a *protocol.GRPCAction) (metadata.MD, error) {
	md := metadata.MD{}
	// A name's value goes only to the origin it is bound to. Over TLS that is the name the
	// server's certificate is checked against (server_name when given), not merely where the
	// connection goes: a route cannot send it to another name's holder.
	origin := egress.Origin(&url.URL{Scheme: "http", Host: a.Target})
	if a.TLS {
		host := a.Target
		if a.ServerName != "" {
			_, port, _ := net.SplitHostPort(a.Target)
			host = net.JoinHostPort(a.ServerName, port)
		}
		origin = egress.Origin(&url.URL{Scheme: "https", Host: host})
	}
	for name, v := range a.Headers {
		lower := strings.ToLower(name)
		if strings.HasPrefix(lower, "grpc-") || slices.Contains(reservedMetadata, lower) {
			return nil, fmt.Errorf("header %s is set by gRPC or Hermes and cannot be configured", name)
		}
		if !validMetadataKey(lower) {
			return nil, fmt.Errorf("header %s is not a gRPC metadata name (letters, digits, '-', '_', '.')", name)
		}
		rv, err := e.env.ResolveFor(origin, name, v)
		if err != nil {
			return nil, err
		}
		if !strings.HasSuffix(lower, "-bin") && strings.ContainsFunc(rv, func(r rune) bool { return r < 0x20 || r > 0x7e }) {
			// Never the value: it may be a secret (one read from a file often ends in a newline).
			return nil, fmt.Errorf("header %s's value holds characters gRPC metadata cannot carry (printable ASCII only; a trailing newline?)", name)
		}
		md.Set(lower, rv)
	}
	md.Set("idempotency-key", c.IdempotencyKey())
	md.Set("x-request-id", c.RequestID)
	md.Set("x-hermes-attempt", strconv.Itoa(c.Attempt))
	if g := c.Dispatch.Grant; g != nil {
		// The call's turn on the resource it changes: the server refuses a fencing token
		// lower than one it has seen for the resource.
		md.Set("x-hermes-tx", g.Tx)
		md.Set("x-hermes-fence", strconv.FormatUint(g.Fence, 10))
		if strings.ContainsFunc(g.Resource, func(r rune) bool { return r < 0x20 || r > 0x7e }) {
			md.Set("x-hermes-resource-bin", g.Resource) // not printable ASCII: sent as bytes
		} else {
			md.Set("x-hermes-resource", g.Resource)
		}
	}
	tc := c.Trace
	tracing.Inject(ctx, &tc)
	if tc.Traceparent != "" {
		md.Set("traceparent", tc.Traceparent)
		if tc.Tracestate != "" {
			md.Set("tracestate", tc.Tracestate)
		}
	}
	return md, nil
}

// credsDigest tells apart the route's own metadata (not what changes with every try).
func credsDigest(md metadata.MD) string {
	h := sha256.New()
	keys := make([]string, 0, len(md))
	for k := range md {
		switch k {
		case "idempotency-key", "x-request-id", "x-hermes-attempt", "traceparent", "tracestate":
		default:
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(h, "%q=%q\n", k, md[k])
	}
	return hex.EncodeToString(h.Sum(nil)[:12])
}

func validMetadataKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// failure judges a call (or a method lookup) that failed with err: the try's context ended,
// the server answered a status (mark set), or the connection failed. What the server said is
// redacted of the route's ${env} values and cut before it goes anywhere.
// secrets are the values of the route's ${env} headers.
func (e *Executor) failure(ctx, tctx context.Context, c *worker.Call, cn *conn, in proto.Message, err error, mark *sawStatus, start time.Time, secrets []string) (worker.Outcome, error) {
	a := c.Dispatch.Action.GRPC
	route := c.Dispatch.Route
	if ctx.Err() != nil {
		return worker.Outcome{}, context.Cause(ctx) // shutting down or cancelled: not the tool's fault
	}
	var (
		um *unknownMethod
		rs *reflectionStatus
	)
	switch {
	case errors.As(err, &um):
		msg := scrub(secrets, um.msg)
		return worker.Failed(protocol.CodeGRPCMethodUnknown, protocol.OriginHermes, fmt.Sprintf("route %s: %s", route, msg), msg, false), nil
	case errors.As(err, &rs):
		// The server answered the method's lookup with a status: retried as the call's would
		// be; any other (PERMISSION_DENIED, UNAUTHENTICATED…) is for the route's author to fix.
		msg := scrub(secrets, rs.Error())
		switch rs.st.Code() {
		case codes.Unavailable, codes.DeadlineExceeded:
			return worker.Failed(protocol.CodeToolGRPCStatus, protocol.OriginTool, msg, msg, true), nil
		case codes.ResourceExhausted:
			return worker.Failed(protocol.CodeToolRateLimited, protocol.OriginTool, msg, msg, true), nil
		}
		return worker.Failed(protocol.CodeGRPCMethodUnknown, protocol.OriginHermes,
			fmt.Sprintf("route %s: the method could not be looked up: %s", route, msg), msg, false), nil
	}
	st := status.Convert(err)
	switch {
	case tctx.Err() != nil || atDeadline(tctx, st.Code()): // the deadline Hermes set passed, whatever the server said at it
		return worker.TimedOut(c), nil
	case answerTooLarge(st, c, in):
		return worker.TooLarge(c.ResultLimit()), nil
	case mark != nil && mark.v.Load():
		out := statusFailure(st, secrets)
		out.Result.ExecutionTimeMS = time.Since(start).Milliseconds()
		return out, nil
	}
	// Hermes' side: a connection that failed, or an answer it would not take.
	if m := st.Message(); strings.Contains(m, "header list size") ||
		(strings.Contains(m, "RST_STREAM with error code: INTERNAL_ERROR") && mark != nil && !mark.header.Load()) {
		// The server could not begin its answer (more metadata than the worker takes: a grpc
		// server resets the call so): the same answer would fail the same way. A reset after
		// it began (a proxy whose server went away mid-call) is the connection's, below.
		return worker.Failed(protocol.CodeToolBadResponse, protocol.OriginTool,
			fmt.Sprintf("the gRPC server at %s reset the call: an answer it could not send (more than %d bytes of metadata, say); check the server", a.Target, maxHeaderListBytes),
			"answer metadata too large", false), nil
	}
	if p := cn.refused.Load(); p != nil && st.Code() == codes.Unavailable {
		return worker.Failed(protocol.CodeDestinationRefused, protocol.OriginHermes,
			fmt.Sprintf("route %s points at an address tool workers do not call; point it at the tool's own host", route),
			cut((*p).Error()), false), nil
	}
	return worker.Failed(protocol.CodeToolUnreachable, protocol.OriginHermes,
		fmt.Sprintf("could not reach the gRPC server at %s; check that it runs and that route %s points at it", a.Target, route),
		"tool unreachable: "+scrub(secrets, st.Message()), true), nil
}

// tooLargeText is how gRPC says a message passed a receive limit: "grpc: received message
// larger than max (N vs. M)", "grpc: message after decompression larger than max (N vs. M)",
// "grpc: received message after decompression larger than max M".
var tooLargeText = regexp.MustCompile(`^grpc: (?:received )?message (?:after decompression )?larger than max (?:\((\d+) vs\. (\d+)\)|(\d+))$`)

// answerTooLarge reports whether st is this client refusing the answer for passing the call's
// limit — not a server refusing the request in for passing its own, which reads the same (told
// apart by the limit named, and by the size: the request's own is the server's refusal).
func answerTooLarge(st *status.Status, c *worker.Call, in proto.Message) bool {
	if st.Code() != codes.ResourceExhausted {
		return false
	}
	m := tooLargeText.FindStringSubmatch(st.Message())
	if m == nil {
		return false
	}
	size, limit := m[1], m[2]+m[3]
	if size != "" && in != nil && size == strconv.Itoa(proto.Size(in)) {
		return false
	}
	return limit == strconv.FormatInt(min(c.ResultLimit(), 1<<30), 10)
}

// scrub is text a server sent, with the values of the route's ${env} headers redacted and cut
// to a readable length.
func scrub(secrets []string, text string) string {
	return cut(string(egress.Redact([]byte(text), secrets)))
}

// atDeadline reports whether a call that ended with code ended at its deadline: the server
// knows the deadline too (gRPC sends it), and may end the call a moment before the client's
// own timer does.
func atDeadline(ctx context.Context, code codes.Code) bool {
	dl, ok := ctx.Deadline()
	if !ok || time.Until(dl) > deadlineMargin {
		return false
	}
	return code == codes.DeadlineExceeded || code == codes.Canceled || code == codes.Unavailable
}

// deadlineMargin is how close to its deadline a call's end counts as the deadline's.
const deadlineMargin = 50 * time.Millisecond

// statusFailure is the server's own non-OK status, secrets redacted from what it says.
func statusFailure(st *status.Status, secrets []string) worker.Outcome {
	name := codeName(st.Code())
	msg := protocol.Shorten(string(egress.Redact([]byte(st.Message()), secrets)), maxStatusMessageBytes)
	content := map[string]any{"grpc_code": name, "message": msg}
	own := name
	var details []json.RawMessage
	room := maxStatusDetailsBytes
	for _, d := range st.Proto().GetDetails() {
		if proto.Size(d) > room {
			continue // not decoded: what does not fit is left out
		}
		if b, err := protojson.Marshal(d); err == nil && len(b) <= room {
			details = append(details, egress.Redact(b, secrets))
			room -= len(b)
		}
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && protocol.ToolCode(info.GetReason()) != "" {
			own = info.GetReason()
		}
	}
	if len(details) > 0 {
		content["details"] = details
	}
	code, retryable := protocol.CodeToolGRPCStatus, false
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded:
		retryable = true
	case codes.ResourceExhausted:
		// Overloaded: another try may pass. A request larger than the server takes never will.
		if !tooLargeText.MatchString(st.Message()) {
			code, retryable = protocol.CodeToolRateLimited, true
		}
	}
	hint := "gRPC " + name
	if msg != "" {
		hint += ": " + msg
	}
	r := protocol.ToolFailure(code, own, hint, content)
	return worker.Outcome{Result: r, Retryable: retryable, Answered: worker.AnsweredValue}
}

// Bounds on what of a status goes into a result: its message, and its details (those that do
// not fit are left out).
const (
	maxStatusMessageBytes = 4 << 10
	maxStatusDetailsBytes = 16 << 10
)

// codeName is a status code as the gRPC spec writes it (NOT_FOUND).
func codeName(c codes.Code) string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return "CODE_" + strconv.Itoa(int(c))
}

var codeNames = map[codes.Code]string{
	codes.OK: "OK", codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN", codes.InvalidArgument: "INVALID_ARGUMENT",
	codes.DeadlineExceeded: "DEADLINE_EXCEEDED", codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
	codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED", codes.OutOfRange: "OUT_OF_RANGE",
	codes.Unimplemented: "UNIMPLEMENTED", codes.Internal: "INTERNAL", codes.Unavailable: "UNAVAILABLE",
	codes.DataLoss: "DATA_LOSS", codes.Unauthenticated: "UNAUTHENTICATED",
}

// cut bounds an error text.
func cut(s string) string { return protocol.Shorten(s, 300) }
