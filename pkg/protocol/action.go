package protocol

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Action kinds. A route resolves every tool call to exactly one kind of action; the router copies
// the action into the tool call message so that a tool worker needs no routes file of its own.
// Calls of each kind travel on subjects of their own (SubjectToolCall), so a worker pulls only
// calls of the kinds its executors run.
const (
	// ActionHTTP calls a tool over HTTP (HTTPAction).
	ActionHTTP = "http"
	// ActionGo runs a tool served in-process by a Go program on the public worker runtime; the
	// call names the tool, nothing more.
	ActionGo = "go"
	// ActionMCP calls a tool of an MCP server a tool worker holds a session with (MCPAction).
	ActionMCP = "mcp"
	// ActionGRPC calls a unary gRPC method (GRPCAction).
	ActionGRPC = "grpc"
)

// Kinds are every action kind, implemented or not.
var Kinds = []string{ActionHTTP, ActionGo, ActionMCP, ActionGRPC}

// ImplementedKinds are the kinds Hermes runs: a call of another kind is refused at routing with
// ACTION_UNSUPPORTED.
var ImplementedKinds = []string{ActionHTTP, ActionGo, ActionMCP, ActionGRPC}

// KnownKind reports whether kind is one of Kinds.
func KnownKind(kind string) bool {
	for _, k := range Kinds {
		if k == kind {
			return true
		}
	}
	return false
}

// Action is the resolved way to run one tool call, copied from the route that matched it.
// Exactly one of HTTP and GRPC is set, as Kind says. Header values may hold ${env.NAME}
// placeholders: they travel unresolved and only the worker that runs the call resolves them.
type Action struct {
	// Kind is one of Kinds.
	Kind string `msgpack:"kind" json:"kind"`
	// TimeoutMS bounds each try of the tool, in milliseconds.
	TimeoutMS int `msgpack:"timeout_ms" json:"timeout_ms"`
	// Retry is the route's retry policy.
	Retry RetryPolicy `msgpack:"retry" json:"retry"`
	// HTTP is set when Kind is ActionHTTP.
	HTTP *HTTPAction `msgpack:"http,omitempty" json:"http,omitempty"`
	// GRPC is set when Kind is ActionGRPC.
	GRPC *GRPCAction `msgpack:"grpc,omitempty" json:"grpc,omitempty"`
	// MCP is set when Kind is ActionMCP.
	MCP *MCPAction `msgpack:"mcp,omitempty" json:"mcp,omitempty"`
}

// MCPAction calls tool Tool of the MCP server a tool worker's configuration names Server.
// Which program or URL that is, only the worker's own configuration says: nothing in a call
// can make a worker start a program.
type MCPAction struct {
	Server string `msgpack:"server" json:"server"`
	// Tool is the tool's name as the server lists it (it may not be a valid Hermes tool name).
	Tool string `msgpack:"tool" json:"tool"`
}

// MaxMCPToolNameBytes bounds an MCP tool's name as a server lists it.
const MaxMCPToolNameBytes = 128

// HTTPAction calls a tool over HTTP.
type HTTPAction struct {
	// URL is absolute (http or https). Its path may hold {name} placeholders filled, escaped,
	// from the call's arguments; arguments never change the scheme, host or port.
	URL string `msgpack:"url" json:"url"`
	// Method is GET, POST, PUT, PATCH or DELETE. Arguments travel as the query string for GET
	// and DELETE and as a JSON body otherwise.
	Method string `msgpack:"method" json:"method"`
	// Headers are sent with every try; values may hold ${env.NAME} placeholders.
	Headers map[string]string `msgpack:"headers,omitempty" json:"headers,omitempty"`
}

// GRPCAction names a unary gRPC method and where it is served (pkg/worker/grpcexec runs it).
type GRPCAction struct {
	Service string `msgpack:"service" json:"service"`
	Method  string `msgpack:"method" json:"method"`
	// Target is the server's host:port (a host a worker's --resolve may map elsewhere). Not
	// needed to load a routes file (the seed's rule names none); a call routed by a rule
	// without one is refused naming the field.
	Target string `msgpack:"target,omitempty" json:"target,omitempty"`
	// TLS dials with TLS (the system's roots), verifying ServerName when set, the target's host
	// otherwise.
	TLS        bool   `msgpack:"tls,omitempty" json:"tls,omitempty"`
	ServerName string `msgpack:"server_name,omitempty" json:"server_name,omitempty"`
	// DescriptorSet names a FileDescriptorSet file in the worker's descriptor directory, for
	// servers without reflection (a name, never a path: a route cannot make a worker read
	// another file).
	DescriptorSet string `msgpack:"descriptor_set,omitempty" json:"descriptor_set,omitempty"`
	// Headers are sent as metadata with every try; values may hold ${env.NAME} placeholders.
	Headers map[string]string `msgpack:"headers,omitempty" json:"headers,omitempty"`
}

// CheckGRPCTarget says what is wrong with a gRPC target, "" when it is a host:port.
func CheckGRPCTarget(target string) string {
	host, port, err := net.SplitHostPort(target)
	if err != nil || host == "" || strings.ContainsFunc(host, func(r rune) bool { return r <= ' ' || r == '/' || r == '@' || r == '?' || r == '#' }) {
		return "must be host:port, e.g. profile-service:50051"
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "must end with a port from 1 to 65535"
	}
	return ""
}

// CheckDescriptorSetName says what is wrong with a descriptor set's name, "" when it is one.
func CheckDescriptorSetName(name string) string {
	if !ValidToken(strings.TrimSuffix(strings.TrimSuffix(name, ".pb"), ".binpb"), 128) {
		return "must be a file name in the workers' descriptor directory (letters, digits, '-', '_', then .pb or .binpb), not a path"
	}
	return ""
}

// RetryPolicy says how often and how far apart a failed try is repeated. The delay before try
// n+1 (n ≥ 1) is InitialIntervalMS × BackoffFactor^(n-1), capped at MaxIntervalMS, plus a random
// jitter in [0, JitterMS).
type RetryPolicy struct {
	// MaxAttempts is the number of tries in all, at least 1.
	MaxAttempts int `msgpack:"max_attempts" json:"max_attempts"`
	// BackoffFactor multiplies the delay after each failed try, at least 1.
	BackoffFactor float64 `msgpack:"backoff_factor" json:"backoff_factor"`
	// JitterMS adds up to this many random milliseconds to each delay.
	JitterMS int `msgpack:"jitter_ms" json:"jitter_ms"`
	// InitialIntervalMS is the delay after the first failed try.
	InitialIntervalMS int `msgpack:"initial_interval_ms" json:"initial_interval_ms"`
	// MaxIntervalMS caps any one delay.
	MaxIntervalMS int `msgpack:"max_interval_ms" json:"max_interval_ms"`
}

// Defaults applied by the routes loader where a route leaves a field out.
const (
	DefaultTimeoutMS         = 10_000
	DefaultMaxAttempts       = 1
	DefaultBackoffFactor     = 2.0
	DefaultInitialIntervalMS = 100
	DefaultMaxIntervalMS     = 10_000
	// MaxAttemptsLimit is the largest max_attempts a route may ask for.
	MaxAttemptsLimit = 10
)

// Bounds a tool_call message read from the bus must respect, whoever published it: the same
// bounds the routes loader applies.
const (
	MaxTimeoutMS  = 600_000
	MaxIntervalMS = 300_000
)

// Check rejects an action no routes file could have produced: numbers out of bounds, an http
// or grpc action without its block.
func (a *Action) Check() error {
	if err := a.checkBounds(); err != nil {
		return err
	}
	switch a.Kind {
	case ActionHTTP:
		if a.HTTP == nil {
			return fieldErr("action.http", "is required for an http action")
		}
	case ActionGRPC:
		if a.GRPC == nil {
			return fieldErr("action.grpc", "is required for a grpc action")
		}
		if t := a.GRPC.Target; t != "" {
			if why := CheckGRPCTarget(t); why != "" {
				return fieldErr("action.grpc.target", why)
			}
		}
		if n := a.GRPC.DescriptorSet; n != "" {
			if why := CheckDescriptorSetName(n); why != "" {
				return fieldErr("action.grpc.descriptor_set", why)
			}
		}
	case ActionMCP:
		if a.MCP == nil {
			return fieldErr("action.mcp", "is required for an mcp action")
		}
		if err := CheckID("action.mcp.server", a.MCP.Server); err != nil {
			return err
		}
		if t := a.MCP.Tool; t == "" || len(t) > MaxMCPToolNameBytes || !utf8.ValidString(t) || strings.ContainsFunc(t, unicode.IsControl) {
			return fieldErr("action.mcp.tool", fmt.Sprintf("must be 1 to %d bytes of printable text", MaxMCPToolNameBytes))
		}
	default:
		// Another kind is carried to the worker, whose executors decide.
	}
	return nil
}

// checkBounds rejects numbers no route could have produced.
func (a *Action) checkBounds() error {
	r := &a.Retry
	switch {
	case a.TimeoutMS < 1 || a.TimeoutMS > MaxTimeoutMS:
		return fieldErr("action.timeout_ms", fmt.Sprintf("must be between 1 and %d", MaxTimeoutMS))
	case r.MaxAttempts < 1 || r.MaxAttempts > MaxAttemptsLimit:
		return fieldErr("action.retry.max_attempts", fmt.Sprintf("must be between 1 and %d", MaxAttemptsLimit))
	case !(r.BackoffFactor >= 1 && r.BackoffFactor <= 1000):
		return fieldErr("action.retry.backoff_factor", "must be between 1 and 1000")
	case r.JitterMS < 0 || r.JitterMS > MaxIntervalMS:
		return fieldErr("action.retry.jitter_ms", fmt.Sprintf("must be between 0 and %d", MaxIntervalMS))
	case r.InitialIntervalMS < 1 || r.InitialIntervalMS > MaxIntervalMS:
		return fieldErr("action.retry.initial_interval_ms", fmt.Sprintf("must be between 1 and %d", MaxIntervalMS))
	case r.MaxIntervalMS < r.InitialIntervalMS || r.MaxIntervalMS > MaxIntervalMS:
		return fieldErr("action.retry.max_interval_ms", fmt.Sprintf("must be between initial_interval_ms and %d", MaxIntervalMS))
	}
	return nil
}
