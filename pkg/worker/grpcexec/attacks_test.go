package grpcexec_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	_ "google.golang.org/grpc/encoding/gzip" // a server that compresses its answers
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
	"github.com/hermesbus/hermes/pkg/worker/grpcexec"
)

// What a hostile or broken server, or a careless route, may try — each bounded or refused.

const token = "s3cr3t-GRPC-token-77"

// withToken allows HERMES_GRPC_TEST_TOKEN (set to value) to the plain-text origin of addr.
func withToken(t *testing.T, addr, value string, cfg grpcexec.Config) *grpcexec.Executor {
	t.Setenv("HERMES_GRPC_TEST_TOKEN", value)
	cfg.AllowEnv = append(cfg.AllowEnv, "HERMES_GRPC_TEST_TOKEN@http://"+addr)
	return newExecutor(t, cfg)
}

func bearer(a *protocol.GRPCAction) {
	a.Headers = map[string]string{"Authorization": "Bearer ${env.HERMES_GRPC_TEST_TOKEN}"}
}

func noSecret(t *testing.T, out worker.Outcome) {
	t.Helper()
	if r := out.Result; strings.Contains(r.RecoveryHint+string(r.Content), token) {
		t.Errorf("the secret reached the result: %s %s", r.RecoveryHint, r.Content)
	}
}

// A server that refuses reflection repeating the caller's credentials, as a status or as a
// plain error: the credentials never reach the result; a refusal is for the route's author.
func TestReflectionRefusalsAreRedacted(t *testing.T) {
	for name, refuse := range map[string]func(md metadata.MD) error{
		"status": func(md metadata.MD) error {
			return status.Errorf(codes.PermissionDenied, "token %q may not list services", md.Get("authorization"))
		},
		"plain error": func(md metadata.MD) error { return fmt.Errorf("bad credentials %v", md.Get("authorization")) },
	} {
		t.Run(name, func(t *testing.T) {
			srv := serveBehave(t, serverOptions{reflection: true, extra: []grpc.ServerOption{grpc.StreamInterceptor(
				func(_ any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, _ grpc.StreamHandler) error {
					md, _ := metadata.FromIncomingContext(ss.Context())
					return refuse(md)
				})}})
			out := execute(t, withToken(t, srv.addr, token, grpcexec.Config{}), grpcCall(srv.addr, "Run", `{"id":"m","answer":1}`, bearer))
			wantFailure(t, out, protocol.CodeGRPCMethodUnknown, false, "[redacted]")
			noSecret(t, out)
		})
	}
	t.Run("a status message", func(t *testing.T) {
		srv := serveBehave(t, serverOptions{reflection: true})
		out := execute(t, withToken(t, srv.addr, token, grpcexec.Config{}), grpcCall(srv.addr, "Run",
			`{"id":"s","status":"UNAVAILABLE","message":"try later, `+token+`"}`, bearer))
		wantFailure(t, out, protocol.CodeToolGRPCStatus, true, "[redacted]")
		noSecret(t, out)
	})
}

// A server that accepts connections and never speaks: the call ends at its deadline, and a
// cancelled request at its cancellation — not when the method's lookup gives up.
func TestAWedgedServerEndsAtTheDeadline(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	e := newExecutor(t, grpcexec.Config{})
	c := grpcCall(ln.Addr().String(), "Run", `{}`, nil)
	c.Timeout = 300 * time.Millisecond
	start := time.Now()
	wantFailure(t, execute(t, e, c), protocol.CodeToolTimeout, true)
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("a 300 ms call took %v", took)
	}
	ctx, cancel := context.WithCancelCause(t.Context())
	time.AfterFunc(200*time.Millisecond, func() { cancel(worker.ErrCancelled) })
	start = time.Now()
	_, err = worker.Chain(e, worker.Standard()...).Execute(ctx, grpcCall(ln.Addr().String(), "Run", `{}`, nil))
	if !errors.Is(err, worker.ErrCancelled) || time.Since(start) > 3*time.Second {
		t.Errorf("cancelled at 200 ms: %v after %v", err, time.Since(start))
	}
}

// Many first calls at once share one lookup (run with -race).
func TestConcurrentFirstCalls(t *testing.T) {
	t.Parallel()
	srv := serveBehave(t, serverOptions{reflection: true})
	for range 3 {
		e := newExecutor(t, grpcexec.Config{})
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				out, err := e.Execute(t.Context(), grpcCall(srv.addr, "Run", `{"id":"r","answer":1}`, nil))
				if err != nil || out.Result.Status != protocol.ResultOK {
					t.Errorf("%v %s %s", err, out.Result.ErrorCode, out.Result.RecoveryHint)
				}
			})
		}
		wg.Wait()
	}
}

// A route's capture beside an argument that sets its field under the JSON name: the
// argument wins, as it does over any capture.
func TestACaptureDoesNotCollideWithAnArgument(t *testing.T) {
	t.Parallel()
	srv := serveBehave(t, serverOptions{reflection: true})
	e := newExecutor(t, grpcexec.Config{})
	c := grpcCall(srv.addr, "Numbers", `{"orderNote":"from the caller"}`, nil)
	c.Dispatch.Params = map[string]string{"order_note": "from the route", "big": "42"}
	out := execute(t, e, c)
	wantOK(t, out)
	if !sameJSON(out.Result.Content, `{"big":"42","ubig":"0","order_note":"from the caller"}`) {
		t.Errorf("content %s", out.Result.Content)
	}
}

// A request larger than the server takes is the server's refusal, not retried — not an
// answer too large for Hermes.
func TestARequestTooLargeForTheServer(t *testing.T) {
	t.Parallel()
	srv := serveBehave(t, serverOptions{reflection: true, extra: []grpc.ServerOption{grpc.MaxRecvMsgSize(1024)}})
	e := newExecutor(t, grpcexec.Config{})
	out := execute(t, e, grpcCall(srv.addr, "Numbers", `{"order_note":"`+strings.Repeat("x", 4096)+`"}`, nil))
	wantFailure(t, out, protocol.CodeToolGRPCStatus, false, "RESOURCE_EXHAUSTED")
}

// A secret read from a file with its newline cannot go as metadata: refused before anything is
// sent, naming the header, never the value; not retried.
func TestAHeaderValueMetadataCannotCarry(t *testing.T) {
	for _, descriptors := range []bool{false, true} {
		srv := serveBehave(t, serverOptions{reflection: !descriptors})
		cfg := grpcexec.Config{}
		edit := bearer
		if descriptors {
			cfg.Descriptors = t.TempDir()
			writeDescriptorSet(t, cfg.Descriptors, "behave.pb")
			edit = func(a *protocol.GRPCAction) { bearer(a); a.DescriptorSet = "behave.pb" }
		}
		out := execute(t, withToken(t, srv.addr, token+"\n", cfg), grpcCall(srv.addr, "Run", `{"id":"nl","answer":1}`, edit))
		wantFailure(t, out, protocol.CodeRouteIncomplete, false, "Authorization", "newline")
		noSecret(t, out)
		if srv.tries("nl") != 0 {
			t.Error("the call reached the server")
		}
	}
}

// A status with a huge message: cut in the result, the status's retry kept.
func TestAHugeStatusMessageIsCut(t *testing.T) {
	t.Parallel()
	srv := serveBehave(t, serverOptions{reflection: true})
	e := newExecutor(t, grpcexec.Config{})
	out := execute(t, e, grpcCall(srv.addr, "Run", `{"id":"s","status":"UNAVAILABLE","message":"`+strings.Repeat("m", 600_000)+`"}`, nil))
	wantFailure(t, out, protocol.CodeToolGRPCStatus, true)
	if n := len(out.Result.Content); n > 8<<10 {
		t.Errorf("content holds %d bytes", n)
	}
}

// A route naming another server_name cannot take a value bound to the target's own name: it
// would go to whoever holds a certificate for that other name.
func TestServerNameCannotRedirectASecret(t *testing.T) {
	cert, pool := selfSigned(t, "attacker.example")
	srv := serveBehave(t, serverOptions{reflection: true, tls: credentials.NewServerTLSFromCert(&cert)})
	_, port, _ := net.SplitHostPort(srv.addr)
	t.Setenv("HERMES_GRPC_TEST_TOKEN", token)
	e := newExecutor(t, grpcexec.Config{RootCAs: pool, Resolve: map[string]string{"policy:" + port: srv.addr},
		AllowEnv: []string{"HERMES_GRPC_TEST_TOKEN@https://policy:" + port}})
	out := execute(t, e, grpcCall("policy:"+port, "Run", `{"id":"sn","answer":1}`, func(a *protocol.GRPCAction) {
		bearer(a)
		a.TLS, a.ServerName = true, "attacker.example"
	}))
	wantFailure(t, out, protocol.CodeEnvNotAllowed, false, "HERMES_GRPC_TEST_TOKEN")
	if srv.tries("sn") != 0 {
		t.Error("the call reached the server")
	}
}

func wideFile() *descriptorpb.FileDescriptorProto {
	opt := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	var fields []*descriptorpb.FieldDescriptorProto
	for i := 1; i <= 200; i++ {
		fields = append(fields, &descriptorpb.FieldDescriptorProto{Name: proto.String(fmt.Sprintf("field_number_%03d", i)), Number: proto.Int32(int32(i)), Type: descriptorpb.FieldDescriptorProto_TYPE_INT64.Enum(), Label: opt})
	}
	return &descriptorpb.FileDescriptorProto{
		Name: proto.String("wide.proto"), Package: proto.String("wide"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("Wide"), Field: fields},
			{Name: proto.String("Big"), Field: []*descriptorpb.FieldDescriptorProto{{Name: proto.String("items"), Number: proto.Int32(1), Type: descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum(), TypeName: proto.String(".wide.Wide"), Label: descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()}}},
		},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("Svc"), Method: []*descriptorpb.MethodDescriptorProto{
			{Name: proto.String("Get"), InputType: proto.String(".wide.Big"), OutputType: proto.String(".wide.Big")}}}},
	}
}

// A server whose small answer of a wide schema would be written out a thousandfold in JSON (every
// unset field of 200 000 empty elements): refused as too large before it is written.
func TestAWideAnswerIsBoundedBeforeItIsWritten(t *testing.T) {
	fd, err := protodesc.NewFile(wideFile(), protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	b, _ := proto.Marshal(&descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{wideFile()}})
	os.WriteFile(filepath.Join(dir, "wide.pb"), b, 0o600)
	md := fd.Services().Get(0).Methods().Get(0)
	srv := grpc.NewServer()
	srv.RegisterService(&grpc.ServiceDesc{ServiceName: "wide.Svc", HandlerType: (*any)(nil), Methods: []grpc.MethodDesc{{MethodName: "Get",
		Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := dynamicpb.NewMessage(md.Input())
			dec(in)
			out := dynamicpb.NewMessage(md.Output())
			l := out.Mutable(md.Output().Fields().ByNumber(1)).List()
			for range 200_000 {
				l.Append(protoreflect.ValueOfMessage(dynamicpb.NewMessage(fd.Messages().ByName("Wide"))))
			}
			return out, nil
		}}}}, struct{}{})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)
	defer srv.Stop()
	e := newExecutor(t, grpcexec.Config{Descriptors: dir})
	c := grpcCall(ln.Addr().String(), "Get", `{}`, func(a *protocol.GRPCAction) { a.Service = "wide.Svc"; a.DescriptorSet = "wide.pb" })
	c.Timeout = 60 * time.Second
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	out := execute(t, e, c)
	runtime.ReadMemStats(&after)
	wantFailure(t, out, protocol.CodeResultTooLarge, false)
	// The wire answer is ~400 KB; written out it would be ~1 GB. What was allocated stays
	// near the wire's size.
	if grew := (after.TotalAlloc - before.TotalAlloc) >> 20; grew > 256 {
		t.Errorf("%d MiB allocated for a ~400 KB answer", grew)
	}
}

// serveOne serves the one method of fdp answering answer, and writes its descriptor set (x.pb).
func serveOne(t *testing.T, fdp *descriptorpb.FileDescriptorProto, answer func(md protoreflect.MethodDescriptor) proto.Message) (string, string) {
	fd, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	set := &descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{fdp}}
	for _, dep := range fdp.Dependency {
		f, _ := protoregistry.GlobalFiles.FindFileByPath(dep)
		set.File = append([]*descriptorpb.FileDescriptorProto{protodesc.ToFileDescriptorProto(f)}, set.File...)
	}
	b, _ := proto.Marshal(set)
	os.WriteFile(filepath.Join(dir, "x.pb"), b, 0o600)
	md := fd.Services().Get(0).Methods().Get(0)
	srv := grpc.NewServer()
	srv.RegisterService(&grpc.ServiceDesc{ServiceName: string(fd.Services().Get(0).FullName()), HandlerType: (*any)(nil), Methods: []grpc.MethodDesc{{MethodName: string(md.Name()),
		Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			dec(dynamicpb.NewMessage(md.Input()))
			return answer(md), nil
		}}}}, struct{}{})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String(), dir
}

// allocated runs c on e and says what it gave and how many MiB it allocated.
func allocated(t *testing.T, e *grpcexec.Executor, c *worker.Call) (worker.Outcome, uint64) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	out := execute(t, e, c)
	runtime.ReadMemStats(&after)
	return out, (after.TotalAlloc - before.TotalAlloc) >> 20
}

// Long enum names (1 byte on the wire, 1000 in JSON), and Any within Any 8000 deep: refused as
// too large, without writing them out.
func TestAmplifyingAnswersAreRefusedUnwritten(t *testing.T) {
	long := strings.Repeat("N", 1000)
	enums := &descriptorpb.FileDescriptorProto{
		Name: proto.String("en.proto"), Package: proto.String("en"), Syntax: proto.String("proto3"),
		EnumType: []*descriptorpb.EnumDescriptorProto{{Name: proto.String("E"), Value: []*descriptorpb.EnumValueDescriptorProto{
			{Name: proto.String("Z"), Number: proto.Int32(0)}, {Name: proto.String("O" + long), Number: proto.Int32(1)}}}},
		MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("M"), Field: []*descriptorpb.FieldDescriptorProto{
			{Name: proto.String("es"), Number: proto.Int32(1), Type: descriptorpb.FieldDescriptorProto_TYPE_ENUM.Enum(), TypeName: proto.String(".en.E"), Label: descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()}}}},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("Svc"), Method: []*descriptorpb.MethodDescriptorProto{
			{Name: proto.String("Get"), InputType: proto.String(".en.M"), OutputType: proto.String(".en.M")}}}},
	}
	anys := &descriptorpb.FileDescriptorProto{
		Name: proto.String("an.proto"), Package: proto.String("an"), Syntax: proto.String("proto3"),
		Dependency: []string{"google/protobuf/any.proto"},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("Svc"), Method: []*descriptorpb.MethodDescriptorProto{
			{Name: proto.String("Get"), InputType: proto.String(".google.protobuf.Any"), OutputType: proto.String(".google.protobuf.Any")}}}},
	}
	nested := nestedAny(8000)
	for _, c := range []struct {
		service string
		fdp     *descriptorpb.FileDescriptorProto
		answer  func(md protoreflect.MethodDescriptor) proto.Message
	}{
		{"en.Svc", enums, func(md protoreflect.MethodDescriptor) proto.Message {
			out := dynamicpb.NewMessage(md.Output())
			l := out.Mutable(md.Output().Fields().ByNumber(1)).List()
			for range 1_000_000 {
				l.Append(protoreflect.ValueOfEnum(1))
			}
			return out
		}},
		{"an.Svc", anys, func(protoreflect.MethodDescriptor) proto.Message { return nested }},
	} {
		t.Run(c.service, func(t *testing.T) {
			addr, dir := serveOne(t, c.fdp, c.answer)
			call := grpcCall(addr, "Get", `{}`, func(a *protocol.GRPCAction) { a.Service = c.service; a.DescriptorSet = "x.pb" })
			call.Timeout = time.Minute
			out, mib := allocated(t, newExecutor(t, grpcexec.Config{Descriptors: dir}), call)
			wantFailure(t, out, protocol.CodeResultTooLarge, false)
			if mib > 256 {
				t.Errorf("%d MiB allocated", mib)
			}
		})
	}
}

// nestedAny is an Any holding an Any, depth levels deep around an empty one: what anypb.New
// makes wrapping each level around the last, its bytes written once, outermost first (wrapping
// marshals every level inside again, which takes seconds at 8000).
func nestedAny(depth int) *anypb.Any {
	const url = "type.googleapis.com/google.protobuf.Any"
	size := make([]int, depth) // size[i]: the encoded size of the Any i levels inside the one returned
	for i := 1; i < depth; i++ {
		size[i] = protowire.SizeTag(1) + protowire.SizeBytes(len(url))
		if size[i-1] > 0 {
			size[i] += protowire.SizeTag(2) + protowire.SizeBytes(size[i-1])
		}
	}
	b := make([]byte, 0, size[depth-1])
	for i := depth - 1; i > 0; i-- {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, url)
		if size[i-1] > 0 {
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(size[i-1]))
		}
	}
	return &anypb.Any{TypeUrl: url, Value: b}
}

// nestedAny makes what wrapping with anypb.New makes.
func TestNestedAnyIsAnyWithinAny(t *testing.T) {
	t.Parallel()
	var want proto.Message = &anypb.Any{}
	for depth := 1; depth <= 40; depth++ {
		want, _ = anypb.New(want)
		if got := nestedAny(depth); !proto.Equal(got, want) {
			t.Fatalf("depth %d: %v, want %v", depth, got, want)
		}
	}
}

// What the mapping writes compactly is not taken for large: a google.protobuf.Value of 120 000
// empty strings (~360 KB of JSON, under the 1 MiB limit) is answered.
func TestACompactWellKnownAnswerFits(t *testing.T) {
	t.Parallel()
	srv := serveBehave(t, serverOptions{reflection: true})
	answer := "[" + strings.TrimSuffix(strings.Repeat(`"",`, 120_000), ",") + "]"
	wantOK(t, execute(t, newExecutor(t, grpcexec.Config{}), grpcCall(srv.addr, "Run", `{"id":"v","answer":`+answer+`}`, nil)))
}

// A compressed answer past the limit is the client's refusal, RESULT_TOO_LARGE, not a server
// rate limiting.
func TestACompressedAnswerPastTheLimit(t *testing.T) {
	t.Parallel()
	srv := serveBehave(t, serverOptions{reflection: true, extra: []grpc.ServerOption{grpc.ChainUnaryInterceptor(
		func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			grpc.SetSendCompressor(ctx, "gzip")
			return h(ctx, req)
		})}})
	out := execute(t, newExecutor(t, grpcexec.Config{}), grpcCall(srv.addr, "Run", `{"id":"big","size":2000000}`, nil))
	wantFailure(t, out, protocol.CodeResultTooLarge, false)
}

// Two routes to one service with different credentials never share a lookup: one's refusal,
// and the credentials it repeats, never reach the other.
func TestRoutesWithOtherCredentialsDoNotShareALookup(t *testing.T) {
	const tokA, tokB = "tenant-A-secret-0123456789", "tenant-B-secret-9876543210"
	// Each reflection lookup is held at the server until both routes' calls are under way.
	arrived, release := make(chan struct{}, 2), make(chan struct{})
	srv := serveBehave(t, serverOptions{reflection: true, extra: []grpc.ServerOption{grpc.StreamInterceptor(
		func(_ any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, _ grpc.StreamHandler) error {
			md, _ := metadata.FromIncomingContext(ss.Context())
			arrived <- struct{}{}
			<-release
			return status.Errorf(codes.PermissionDenied, "token %v may not list services", md.Get("authorization"))
		})}})
	t.Setenv("HERMES_GRPC_TOK_A", tokA)
	t.Setenv("HERMES_GRPC_TOK_B", tokB)
	e := newExecutor(t, grpcexec.Config{AllowEnv: []string{"HERMES_GRPC_TOK_A@http://" + srv.addr, "HERMES_GRPC_TOK_B@http://" + srv.addr}})
	call := func(name string) *worker.Call {
		return grpcCall(srv.addr, "Run", `{"id":"x","answer":1}`, func(a *protocol.GRPCAction) {
			a.Headers = map[string]string{"Authorization": "Bearer ${env." + name + "}"}
		})
	}
	var (
		wg         sync.WaitGroup
		outA, outB worker.Outcome
	)
	arrive := func() bool {
		select {
		case <-arrived:
			return true
		case <-time.After(5 * time.Second):
			return false
		}
	}
	wg.Go(func() { outA = execute(t, e, call("HERMES_GRPC_TOK_A")) })
	if !arrive() {
		close(release)
		wg.Wait()
		t.Fatal("route A's lookup never reached the server")
	}
	wg.Go(func() { outB = execute(t, e, call("HERMES_GRPC_TOK_B")) }) // while A's lookup is held
	ownLookup := arrive()
	close(release)
	wg.Wait()
	if !ownLookup {
		t.Error("route B's call waited on route A's lookup: its own credentials never reached the server")
	}
	for _, o := range []worker.Outcome{outA, outB} {
		r := o.Result
		if r.ErrorCode != protocol.CodeGRPCMethodUnknown || strings.Contains(r.RecoveryHint+string(r.Content), tokA) ||
			strings.Contains(r.RecoveryHint+string(r.Content), tokB) {
			t.Errorf("%s %q %s", r.ErrorCode, r.RecoveryHint, r.Content)
		}
	}
}

// A status whose metadata passes the worker's bound is the server's fault, not retried.
func TestAStatusPastTheMetadataBound(t *testing.T) {
	t.Parallel()
	srv := serveBehave(t, serverOptions{reflection: true})
	out := execute(t, newExecutor(t, grpcexec.Config{}), grpcCall(srv.addr, "Run",
		`{"id":"s","status":"NOT_FOUND","message":"`+strings.Repeat("m", 1_500_000)+`"}`, nil))
	wantFailure(t, out, protocol.CodeToolBadResponse, false, "could not send")
}
