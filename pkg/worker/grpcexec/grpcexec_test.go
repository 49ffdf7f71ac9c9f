package grpcexec_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
	"github.com/hermesbus/hermes/pkg/worker/grpcexec"
	"github.com/hermesbus/hermes/pkg/worker/workertest"
)

func newExecutor(t *testing.T, cfg grpcexec.Config) *grpcexec.Executor {
	t.Helper()
	e, err := grpcexec.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// grpcCall is a call of hermes.test.Behave's method at target with args, the action as edit
// leaves it.
func grpcCall(target, method, args string, edit func(*protocol.GRPCAction)) *worker.Call {
	a := &protocol.GRPCAction{Service: behaveService, Method: method, Target: target}
	if edit != nil {
		edit(a)
	}
	return &worker.Call{RequestID: "req_grpc", SessionID: "s", Attempt: 1, MaxAttempts: 3, Timeout: 10 * time.Second,
		MaxResultBytes: 1 << 20, Dispatch: &protocol.Dispatch{
			Call:   protocol.ToolCall{ToolCallID: "call_1", Name: "behave", Arguments: json.RawMessage(args)},
			Route:  "behave",
			Action: protocol.Action{Kind: protocol.ActionGRPC, TimeoutMS: 10_000, GRPC: a},
		}}
}

func execute(t *testing.T, e worker.Executor, c *worker.Call) worker.Outcome {
	t.Helper()
	out, err := worker.Chain(e, worker.Standard()...).Execute(t.Context(), c)
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	return out
}

func wantOK(t *testing.T, out worker.Outcome) {
	t.Helper()
	if r := out.Result; r.Status != protocol.ResultOK {
		t.Fatalf("%s %s: %s %s", r.Status, r.ErrorCode, r.RecoveryHint, r.Content)
	}
}

func wantFailure(t *testing.T, out worker.Outcome, code string, retryable bool, says ...string) {
	t.Helper()
	r := out.Result
	if r.Status != protocol.ResultError || r.ErrorCode != code || out.Retryable != retryable {
		t.Fatalf("%s %s retryable=%v (%s %s), want %s retryable=%v", r.Status, r.ErrorCode, out.Retryable, r.RecoveryHint, r.Content, code, retryable)
	}
	for _, s := range says {
		if !strings.Contains(r.RecoveryHint+" "+string(r.Content), s) {
			t.Errorf("%s: hint %q and content %s do not say %q", code, r.RecoveryHint, r.Content, s)
		}
	}
}

// Every executor's conformance: answers matched to calls, the deadline, cancellation reaching
// the server, retryable against permanent failures, oversized answers, a crashing tool.
func TestConformance(t *testing.T) {
	t.Parallel()
	srv := serveBehave(t, serverOptions{reflection: true})
	workertest.Run(t, workertest.Harness{
		Executor: newExecutor(t, grpcexec.Config{}),
		Call: func(t *testing.T, id string, b workertest.Behavior) *worker.Call {
			c := grpcCall(srv.addr, "Run", string(workertest.Script(id, b)), nil)
			c.Dispatch.Call.ToolCallID = id
			return c
		},
		Aborted: func(t *testing.T, id string) bool { return srv.wasAborted(id) },
		// Run answers a google.protobuf.Value, whose numbers are doubles.
		Carried: func(answer json.RawMessage) json.RawMessage {
			v := &structpb.Value{}
			if err := protojson.Unmarshal(answer, v); err != nil {
				t.Fatal(err)
			}
			b, _ := protojson.Marshal(v)
			return b
		},
	})
}

// The method is found by reflection, or in the route's descriptor set when the server has
// none; without either the error says what to do.
func TestFindingTheMethod(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeDescriptorSet(t, dir, "behave.pb")
	e := newExecutor(t, grpcexec.Config{Descriptors: dir})
	on := serveBehave(t, serverOptions{reflection: true})
	off := serveBehave(t, serverOptions{})
	args := `{"id":"x","answer":{"order":"ORD1"}}`

	t.Run("reflection", func(t *testing.T) {
		out := execute(t, e, grpcCall(on.addr, "Run", args, nil))
		wantOK(t, out)
		if string(out.Result.Content) != `{"order":"ORD1"}` {
			t.Errorf("content %s", out.Result.Content)
		}
	})
	t.Run("descriptor set", func(t *testing.T) {
		wantOK(t, execute(t, e, grpcCall(off.addr, "Run", args, func(a *protocol.GRPCAction) { a.DescriptorSet = "behave.pb" })))
	})
	t.Run("neither", func(t *testing.T) {
		wantFailure(t, execute(t, e, grpcCall(off.addr, "Run", args, nil)), protocol.CodeGRPCMethodUnknown, false,
			"no server reflection", "descriptor_set")
		if off.tries("x") != 1 { // only the descriptor set's call above reached it
			t.Errorf("the server saw %d calls", off.tries("x"))
		}
	})
	t.Run("a descriptor set the worker does not have", func(t *testing.T) {
		wantFailure(t, execute(t, e, grpcCall(off.addr, "Run", args, func(a *protocol.GRPCAction) { a.DescriptorSet = "other.pb" })),
			protocol.CodeGRPCMethodUnknown, false, "other.pb", "--grpc-descriptors")
		noDir := newExecutor(t, grpcexec.Config{})
		wantFailure(t, execute(t, noDir, grpcCall(off.addr, "Run", args, func(a *protocol.GRPCAction) { a.DescriptorSet = "behave.pb" })),
			protocol.CodeGRPCMethodUnknown, false, "no --grpc-descriptors directory")
	})
	t.Run("a file that is no descriptor set", func(t *testing.T) {
		if err := writeFile(dir, "junk.pb", "not a descriptor set"); err != nil {
			t.Fatal(err)
		}
		wantFailure(t, execute(t, e, grpcCall(off.addr, "Run", args, func(a *protocol.GRPCAction) { a.DescriptorSet = "junk.pb" })),
			protocol.CodeGRPCMethodUnknown, false, "junk.pb")
	})
	t.Run("an unknown method", func(t *testing.T) {
		wantFailure(t, execute(t, e, grpcCall(on.addr, "Runn", args, nil)), protocol.CodeGRPCMethodUnknown, false,
			"has no method Runn", "Run, Numbers, Watch")
	})
	t.Run("an unknown service", func(t *testing.T) {
		wantFailure(t, execute(t, e, grpcCall(on.addr, "Run", args, func(a *protocol.GRPCAction) { a.Service = "hermes.test.Nope" })),
			protocol.CodeGRPCMethodUnknown, false, "hermes.test.Nope")
	})
	t.Run("a streaming method", func(t *testing.T) {
		wantFailure(t, execute(t, e, grpcCall(on.addr, "Watch", args, nil)), protocol.CodeGRPCMethodUnknown, false, "unary methods only")
	})
}

// Each status a server answers: its code in tool_error_code, its message in the result, and
// retried only when the status says another try may succeed.
func TestStatuses(t *testing.T) {
	t.Parallel()
	srv := serveBehave(t, serverOptions{reflection: true})
	e := newExecutor(t, grpcexec.Config{})
	for _, c := range []struct {
		status, code string
		retryable    bool
	}{
		{"UNAVAILABLE", protocol.CodeToolGRPCStatus, true},
		{"DEADLINE_EXCEEDED", protocol.CodeToolGRPCStatus, true},
		{"RESOURCE_EXHAUSTED", protocol.CodeToolRateLimited, true},
		{"INVALID_ARGUMENT", protocol.CodeToolGRPCStatus, false},
		{"NOT_FOUND", protocol.CodeToolGRPCStatus, false},
		{"PERMISSION_DENIED", protocol.CodeToolGRPCStatus, false},
		{"INTERNAL", protocol.CodeToolGRPCStatus, false},
		{"UNIMPLEMENTED", protocol.CodeToolGRPCStatus, false},
	} {
		t.Run(c.status, func(t *testing.T) {
			msg := "the server says " + strings.ToLower(c.status)
			out := execute(t, e, grpcCall(srv.addr, "Run", `{"id":"s","status":"`+c.status+`","message":"`+msg+`"}`, nil))
			wantFailure(t, out, c.code, c.retryable, msg, `"grpc_code":"`+c.status+`"`)
			want := c.status
			if protocol.IsHermesCode(want) { // a tool cannot pass for Hermes: grpc_code says it
				want = ""
			}
			if r := out.Result; r.ErrorOrigin != protocol.OriginTool || r.ToolErrorCode != want {
				t.Errorf("origin %s, tool_error_code %q, want tool, %q", r.ErrorOrigin, r.ToolErrorCode, want)
			}
		})
	}
	t.Run("retried by the worker", func(t *testing.T) {
		c := grpcCall(srv.addr, "Run", `{"id":"retried","status":"UNAVAILABLE","message":"later"}`, nil)
		c.Dispatch.Action.Retry = protocol.RetryPolicy{MaxAttempts: 3, BackoffFactor: 1, InitialIntervalMS: 1, MaxIntervalMS: 1}
		out := execute(t, e, c)
		wantFailure(t, out, protocol.CodeToolGRPCStatus, true)
	})
}

// 64-bit integers travel exactly both ways; arguments follow the JSON mapping, an unknown
// field named.
func TestExactIntegers(t *testing.T) {
	t.Parallel()
	srv := serveBehave(t, serverOptions{reflection: true})
	e := newExecutor(t, grpcexec.Config{})
	for _, args := range []string{
		`{"big":9223372036854775807,"ubig":18446744073709551615,"order_note":"n"}`,
		`{"big":"9223372036854775807","ubig":"18446744073709551615","orderNote":"n"}`,
	} {
		out := execute(t, e, grpcCall(srv.addr, "Numbers", args, nil))
		wantOK(t, out)
		if want := `{"big":"9223372036854775807","ubig":"18446744073709551615","order_note":"n"}`; !sameJSON(out.Result.Content, want) {
			t.Errorf("%s → %s, want %s", args, out.Result.Content, want)
		}
	}
	out := execute(t, e, grpcCall(srv.addr, "Numbers", `{}`, nil))
	if want := `{"big":"0","ubig":"0","order_note":""}`; !sameJSON(out.Result.Content, want) {
		t.Errorf("unset fields: %s, want %s", out.Result.Content, want)
	}
	wantFailure(t, execute(t, e, grpcCall(srv.addr, "Numbers", `{"big":1,"colour":"red"}`, nil)), protocol.CodeBadArguments, false,
		"colour", "hermes.test.Numbers")
	wantFailure(t, execute(t, e, grpcCall(srv.addr, "Numbers", `{"big":1.5}`, nil)), protocol.CodeBadArguments, false, "big")
	// A route's captures fill fields of their names, and are left out where there are none.
	c := grpcCall(srv.addr, "Numbers", `{"big":7}`, nil)
	c.Dispatch.Params = map[string]string{"order_note": "from the route", "region": "east"}
	out = execute(t, e, c)
	wantOK(t, out)
	if !strings.Contains(string(out.Result.Content), `"order_note":"from the route"`) {
		t.Errorf("captures: %s", out.Result.Content)
	}
}

// timeout_ms is the call's deadline, and the server sees it.
func TestDeadline(t *testing.T) {
	t.Parallel()
	srv := serveBehave(t, serverOptions{reflection: true})
	e := newExecutor(t, grpcexec.Config{})
	c := grpcCall(srv.addr, "Run", `{"id":"slow","delay_ms":5000,"answer":{}}`, nil)
	c.Timeout = 300 * time.Millisecond
	start := time.Now()
	out := execute(t, e, c)
	wantFailure(t, out, protocol.CodeToolTimeout, true, "timeout_ms=300")
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("took %v", took)
	}
	if !srv.wasAborted("slow") {
		t.Error("the server's call did not end at the deadline")
	}
}

// A server killed mid-call: the try fails as unreachable (retried), and once the server is
// back the next try succeeds.
func TestServerKilledMidCall(t *testing.T) {
	t.Parallel()
	srv := serveBehave(t, serverOptions{reflection: true})
	e := newExecutor(t, grpcexec.Config{})
	wantOK(t, execute(t, e, grpcCall(srv.addr, "Run", `{"id":"warm","answer":1}`, nil)))
	go func() { // stopped once the call runs at the server
		for deadline := time.Now().Add(10 * time.Second); srv.tries("killed") == 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		srv.srv.Stop()
	}()
	out := execute(t, e, grpcCall(srv.addr, "Run", `{"id":"killed","delay_ms":5000,"answer":{}}`, nil))
	wantFailure(t, out, protocol.CodeToolUnreachable, true, srv.addr)
	// Down: still unreachable, quickly.
	wantFailure(t, execute(t, e, grpcCall(srv.addr, "Run", `{"id":"down","answer":1}`, nil)), protocol.CodeToolUnreachable, true)
	back := serveBehave(t, serverOptions{reflection: true, addr: srv.addr})
	deadline := time.Now().Add(10 * time.Second)
	for {
		out = execute(t, e, grpcCall(back.addr, "Run", `{"id":"back","answer":1}`, nil))
		if out.Result.Status == protocol.ResultOK || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	wantOK(t, out)
}

// A route without a target loads (the seed's does), and its calls say what is missing.
func TestNoTarget(t *testing.T) {
	t.Parallel()
	e := newExecutor(t, grpcexec.Config{})
	wantFailure(t, execute(t, e, grpcCall("", "Run", `{}`, nil)), protocol.CodeRouteIncomplete, false, "action.grpc.target")
}

// Where a worker dials: --resolve, the destination rules, an unreachable server.
func TestDestinations(t *testing.T) {
	t.Parallel()
	srv := serveBehave(t, serverOptions{reflection: true})
	e := newExecutor(t, grpcexec.Config{Resolve: map[string]string{"profile-service:50051": srv.addr}})
	wantOK(t, execute(t, e, grpcCall("profile-service:50051", "Run", `{"id":"r","answer":1}`, nil)))
	wantFailure(t, execute(t, e, grpcCall("169.254.169.254:80", "Run", `{}`, nil)), protocol.CodeDestinationRefused, false, "link-local")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	wantFailure(t, execute(t, e, grpcCall(closed, "Run", `{}`, nil)), protocol.CodeToolUnreachable, true, closed)
}

// Headers travel as metadata, ${env.NAME} only to the origin it is bound to, and a value the
// server echoes is redacted from its answer.
func TestMetadataAndEnv(t *testing.T) {
	srv := serveBehave(t, serverOptions{reflection: true})
	const secret = "s3cr3t-GRPC-token-77"
	t.Setenv("HERMES_GRPC_TEST_TOKEN", secret)
	e := newExecutor(t, grpcexec.Config{AllowEnv: []string{"HERMES_GRPC_TEST_TOKEN@http://" + srv.addr}})
	auth := func(a *protocol.GRPCAction) {
		a.Headers = map[string]string{"Authorization": "Bearer ${env.HERMES_GRPC_TEST_TOKEN}", "x-tenant": "acme"}
	}
	out := execute(t, e, grpcCall(srv.addr, "Run", `{"id":"m","echo":"authorization"}`, auth))
	wantOK(t, out)
	if got := srv.metadata("authorization"); len(got) != 1 || got[0] != "Bearer "+secret {
		t.Errorf("the server saw authorization %q", got)
	}
	if strings.Contains(string(out.Result.Content), secret) || !strings.Contains(string(out.Result.Content), "[redacted]") {
		t.Errorf("the echoed secret reached the answer: %s", out.Result.Content)
	}
	for name, want := range map[string]string{"x-tenant": "acme", "idempotency-key": "req_grpc/call_1", "x-request-id": "req_grpc", "x-hermes-attempt": "1"} {
		if got := srv.metadata(name); len(got) != 1 || got[0] != want {
			t.Errorf("metadata %s = %q, want %q", name, got, want)
		}
	}
	// The same value to another origin (with TLS, say) is refused before anything is sent.
	other := execute(t, e, grpcCall(srv.addr, "Run", `{"id":"m2","answer":1}`, func(a *protocol.GRPCAction) { auth(a); a.TLS = true }))
	wantFailure(t, other, protocol.CodeEnvNotAllowed, false, "HERMES_GRPC_TEST_TOKEN")
	if srv.tries("m2") != 0 {
		t.Error("a call with a refused header reached the server")
	}
	if strings.Contains(other.Result.RecoveryHint+string(other.Result.Content), secret) {
		t.Error("the secret reached the error")
	}
	wantFailure(t, execute(t, e, grpcCall(srv.addr, "Run", `{}`, func(a *protocol.GRPCAction) {
		a.Headers = map[string]string{"grpc-timeout": "1S"}
	})), protocol.CodeRouteIncomplete, false, "grpc-timeout")
}

// TLS: the server's certificate is verified against the name the route gives.
func TestTLS(t *testing.T) {
	t.Parallel()
	cert, pool := selfSigned(t, "profile.internal")
	srv := serveBehave(t, serverOptions{reflection: true, tls: credentials.NewServerTLSFromCert(&cert)})
	e := newExecutor(t, grpcexec.Config{RootCAs: pool})
	wantOK(t, execute(t, e, grpcCall(srv.addr, "Run", `{"id":"t","answer":1}`, func(a *protocol.GRPCAction) {
		a.TLS, a.ServerName = true, "profile.internal"
	})))
	// The wrong name, or plaintext to a TLS server: no call gets through.
	wantFailure(t, execute(t, e, grpcCall(srv.addr, "Run", `{"id":"t2","answer":1}`, func(a *protocol.GRPCAction) {
		a.TLS, a.ServerName = true, "elsewhere.internal"
	})), protocol.CodeToolUnreachable, true, "certificate")
	wantFailure(t, execute(t, e, grpcCall(srv.addr, "Run", `{"id":"t3","answer":1}`, nil)), protocol.CodeToolUnreachable, true)
	if srv.tries("t2")+srv.tries("t3") != 0 {
		t.Error("a call without a verified TLS connection reached the server")
	}
}

func selfSigned(t *testing.T, name string) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

func sameJSON(got json.RawMessage, want string) bool {
	var a, b any
	return json.Unmarshal(got, &a) == nil && json.Unmarshal([]byte(want), &b) == nil && jsonString(a) == jsonString(b)
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// A call that changes a resource carries its turn as metadata; a resource key that is not
// printable ASCII travels as binary metadata.
func TestMetadataCarriesTheCallsGrant(t *testing.T) {
	srv := serveBehave(t, serverOptions{reflection: true})
	e := newExecutor(t, grpcexec.Config{})
	c := grpcCall(srv.addr, "Run", `{"id":"g1","answer":1}`, nil)
	c.Dispatch.Grant = &protocol.Grant{Tx: protocol.TxID("req_grpc", "订单-9"), Fence: 7, Resource: "订单-9"}
	wantOK(t, execute(t, e, c))
	for name, want := range map[string]string{"x-hermes-tx": protocol.TxID("req_grpc", "订单-9"), "x-hermes-fence": "7", "x-hermes-resource-bin": "订单-9"} {
		if got := srv.metadata(name); len(got) != 1 || got[0] != want {
			t.Errorf("metadata %s = %q, want %q", name, got, want)
		}
	}
}
