package grpcexec_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/hermesbus/hermes/pkg/worker/workertest"
)

// The test service, hermes.test.Behave, built from descriptors (no generated code):
//
//	Run(google.protobuf.Struct) returns (google.protobuf.Value)   — does what a workertest
//	    script asks, or fails with the status its "status" field names
//	Numbers(Numbers) returns (Numbers)                              — echoes 64-bit integers
//	Watch(google.protobuf.Struct) returns (stream google.protobuf.Value)
var behaveFiles = mustBehaveFiles()

const behaveService = "hermes.test.Behave"

func behaveFile() *descriptorpb.FileDescriptorProto {
	opt := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	field := func(name, json string, n int32, t descriptorpb.FieldDescriptorProto_Type) *descriptorpb.FieldDescriptorProto {
		return &descriptorpb.FieldDescriptorProto{Name: proto.String(name), JsonName: proto.String(json), Number: proto.Int32(n), Type: t.Enum(), Label: opt}
	}
	return &descriptorpb.FileDescriptorProto{
		Name: proto.String("hermes/test/behave.proto"), Package: proto.String("hermes.test"), Syntax: proto.String("proto3"),
		Dependency: []string{"google/protobuf/struct.proto"},
		MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("Numbers"), Field: []*descriptorpb.FieldDescriptorProto{
			field("big", "big", 1, descriptorpb.FieldDescriptorProto_TYPE_INT64),
			field("ubig", "ubig", 2, descriptorpb.FieldDescriptorProto_TYPE_UINT64),
			field("order_note", "orderNote", 3, descriptorpb.FieldDescriptorProto_TYPE_STRING),
		}}},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("Behave"), Method: []*descriptorpb.MethodDescriptorProto{
			{Name: proto.String("Run"), InputType: proto.String(".google.protobuf.Struct"), OutputType: proto.String(".google.protobuf.Value")},
			{Name: proto.String("Numbers"), InputType: proto.String(".hermes.test.Numbers"), OutputType: proto.String(".hermes.test.Numbers")},
			{Name: proto.String("Watch"), InputType: proto.String(".google.protobuf.Struct"), OutputType: proto.String(".google.protobuf.Value"), ServerStreaming: proto.Bool(true)},
		}}},
	}
}

func mustBehaveFiles() *protoregistry.Files {
	fd, err := protodesc.NewFile(behaveFile(), protoregistry.GlobalFiles)
	if err != nil {
		panic(err)
	}
	files := &protoregistry.Files{}
	for _, f := range []protoreflect.FileDescriptor{structpb.File_google_protobuf_struct_proto, fd} {
		if err := files.RegisterFile(f); err != nil {
			panic(err)
		}
	}
	return files
}

// writeDescriptorSet writes the service's FileDescriptorSet (imports included) into dir as name.
func writeDescriptorSet(t *testing.T, dir, name string) {
	t.Helper()
	set := &descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{
		protodesc.ToFileDescriptorProto(structpb.File_google_protobuf_struct_proto), behaveFile()}}
	b, err := proto.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// behaveServer serves hermes.test.Behave and remembers what it saw.
type behaveServer struct {
	addr string
	srv  *grpc.Server

	mu      sync.Mutex
	aborted map[string]bool
	calls   map[string]int // by script id
	md      metadata.MD    // the last call's metadata
}

type serverOptions struct {
	reflection bool
	tls        credentials.TransportCredentials
	addr       string // listen here (a restart); "" for a free port
	extra      []grpc.ServerOption
}

func serveBehave(t *testing.T, o serverOptions) *behaveServer {
	t.Helper()
	addr := o.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var (
		ln  net.Listener
		err error
	)
	for range 50 { // a restart may find the port not yet free
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	b := &behaveServer{addr: ln.Addr().String(), aborted: map[string]bool{}, calls: map[string]int{}}
	opts := []grpc.ServerOption{grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil { // the tool crashed: its call fails, the server lives on
				err = status.Errorf(codes.Internal, "panic: %v", p)
			}
		}()
		return h(ctx, req)
	})}
	if o.tls != nil {
		opts = append(opts, grpc.Creds(o.tls))
	}
	opts = append(opts, o.extra...)
	b.srv = grpc.NewServer(opts...)
	sd, err := behaveFiles.FindDescriptorByName(behaveService)
	if err != nil {
		t.Fatal(err)
	}
	methods := sd.(protoreflect.ServiceDescriptor).Methods()
	unary := func(name string, run func(ctx context.Context, in *dynamicpb.Message) (proto.Message, error)) grpc.MethodDesc {
		m := methods.ByName(protoreflect.Name(name))
		return grpc.MethodDesc{MethodName: name, Handler: func(_ any, ctx context.Context, dec func(any) error, icp grpc.UnaryServerInterceptor) (any, error) {
			in := dynamicpb.NewMessage(m.Input())
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) { return run(ctx, req.(*dynamicpb.Message)) }
			if icp == nil {
				return h(ctx, in)
			}
			return icp(ctx, in, &grpc.UnaryServerInfo{FullMethod: "/" + behaveService + "/" + name}, h)
		}}
	}
	b.srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: behaveService, HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{unary("Run", b.run), unary("Numbers", func(_ context.Context, in *dynamicpb.Message) (proto.Message, error) {
			return in, nil
		})},
		Streams: []grpc.StreamDesc{{StreamName: "Watch", ServerStreams: true, Handler: func(any, grpc.ServerStream) error { return nil }}},
	}, struct{}{})
	if o.reflection {
		rpb.RegisterServerReflectionServer(b.srv, reflection.NewServerV1(reflection.ServerOptions{Services: b.srv, DescriptorResolver: behaveFiles}))
	}
	go b.srv.Serve(ln)
	t.Cleanup(b.srv.Stop)
	return b
}

// run does what the call's script says: wait, fail as a status, panic, answer.
func (b *behaveServer) run(ctx context.Context, in *dynamicpb.Message) (proto.Message, error) {
	raw, err := protojson.Marshal(in)
	if err != nil {
		return nil, err
	}
	id, s, err := workertest.ReadScript(raw)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	var extra struct {
		Status  string `json:"status"`
		Message string `json:"message"`
		Echo    string `json:"echo"`
	}
	json.Unmarshal(raw, &extra)
	md, _ := metadata.FromIncomingContext(ctx)
	b.mu.Lock()
	b.calls[id]++
	b.md = md
	b.mu.Unlock()
	if s.Wait(ctx) != nil {
		b.mu.Lock()
		b.aborted[id] = true
		b.mu.Unlock()
		return nil, ctx.Err()
	}
	switch {
	case s.Panic:
		panic("tool bug")
	case extra.Status != "":
		return nil, status.Error(codeOf(extra.Status), extra.Message)
	case s.Fail == workertest.FailRetryable:
		return nil, status.Error(codes.Unavailable, "overloaded")
	case s.Fail == workertest.FailPermanent:
		return nil, status.Error(codes.NotFound, "no such order")
	case s.Size > 0:
		return structpb.NewStringValue(strings.Repeat("x", s.Size)), nil
	case extra.Echo != "":
		return structpb.NewStringValue(strings.Join(md.Get(extra.Echo), ",")), nil
	}
	v := &structpb.Value{}
	if err := protojson.Unmarshal(s.Answer, v); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return v, nil
}

func codeOf(name string) codes.Code {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if strings.EqualFold(strings.ReplaceAll(name, "_", ""), c.String()) || (name == "CANCELLED" && c == codes.Canceled) {
			return c
		}
	}
	return codes.Unknown
}

func (b *behaveServer) wasAborted(id string) bool {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		b.mu.Lock()
		ok := b.aborted[id]
		b.mu.Unlock()
		if ok {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

func (b *behaveServer) tries(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls[id]
}

func (b *behaveServer) metadata(name string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.md.Get(name)
}

func writeFile(dir, name, content string) error {
	return os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600)
}
