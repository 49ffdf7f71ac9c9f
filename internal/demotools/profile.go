package demotools

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/reflection"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// The seed's gRPC service (seed 000 §3.2, ../shared/seed-examples/routes-knowledge.yaml:
// customer.ProfileService/GetProfile), served with server reflection so that a client needs
// nothing but the address. Its descriptors are built here, without generated code.

// ProfileFiles holds the descriptors of customer/profile.proto: customer.ProfileService with
// GetProfile(GetProfileRequest) returns (Profile).
var ProfileFiles = mustProfileFiles()

// ProfileService is the full name of the service; ProfileTool the tool examples/routes.yaml
// routes to its GetProfile (the seed's name).
const (
	ProfileService = "customer.ProfileService"
	ProfileTool    = "get_customer_profile"
)

func mustProfileFiles() *protoregistry.Files {
	str := descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum()
	i64 := descriptorpb.FieldDescriptorProto_TYPE_INT64.Enum()
	opt := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	field := func(name string, n int32, t *descriptorpb.FieldDescriptorProto_Type) *descriptorpb.FieldDescriptorProto {
		json := name
		if i := strings.IndexByte(name, '_'); i > 0 { // customer_id → customerId
			json = name[:i] + strings.ToUpper(name[i+1:i+2]) + name[i+2:]
		}
		return &descriptorpb.FieldDescriptorProto{Name: proto.String(name), Number: proto.Int32(n), Type: t, Label: opt, JsonName: proto.String(json)}
	}
	fdp := &descriptorpb.FileDescriptorProto{
		Name:    proto.String("customer/profile.proto"),
		Package: proto.String("customer"),
		Syntax:  proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("GetProfileRequest"), Field: []*descriptorpb.FieldDescriptorProto{field("customer_id", 1, str)}},
			{Name: proto.String("Profile"), Field: []*descriptorpb.FieldDescriptorProto{
				field("customer_id", 1, str), field("name", 2, str), field("phone", 3, str), field("level", 4, str),
				field("points", 5, i64), field("member_since", 6, str), field("city", 7, str)}},
		},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("ProfileService"), Method: []*descriptorpb.MethodDescriptorProto{{
			Name: proto.String("GetProfile"), InputType: proto.String(".customer.GetProfileRequest"), OutputType: proto.String(".customer.Profile")}}}},
	}
	fd, err := protodesc.NewFile(fdp, nil)
	if err != nil {
		panic(err)
	}
	files := &protoregistry.Files{}
	if err := files.RegisterFile(fd); err != nil {
		panic(err)
	}
	return files
}

// profileMethod is GetProfile's descriptor.
func profileMethod() protoreflect.MethodDescriptor {
	d, err := ProfileFiles.FindDescriptorByName(ProfileService + ".GetProfile")
	if err != nil {
		panic(err)
	}
	return d.(protoreflect.MethodDescriptor)
}

var (
	profileLevels = []string{"普通会员", "银卡会员", "金卡会员", "钻石会员"}
	surnames      = []string{"张", "王", "李", "赵", "刘", "陈", "杨", "黄", "周", "吴"}
	givenNames    = []string{"伟", "娜", "敏", "静", "磊", "洋", "婷", "强", "芳", "军"}
)

// getProfile answers GetProfile: a believable profile derived from the id (C followed by 6
// digits); NOT_FOUND for C000000, INVALID_ARGUMENT for anything that is no customer id.
func getProfile(_ context.Context, in protoreflect.Message, out protoreflect.Message) error {
	f := in.Descriptor().Fields()
	id := in.Get(f.ByName("customer_id")).String()
	if len(id) != 7 || id[0] != 'C' || strings.Trim(id[1:], "0123456789") != "" {
		return status.Errorf(codes.InvalidArgument, "customer_id %q is not a customer id: C followed by 6 digits, e.g. C102938", id)
	}
	if id == "C000000" {
		return status.Errorf(codes.NotFound, "no customer %s", id)
	}
	r := seeded("profile", id)
	of := out.Descriptor().Fields()
	set := func(name string, v protoreflect.Value) { out.Set(of.ByName(protoreflect.Name(name)), v) }
	set("customer_id", protoreflect.ValueOfString(id))
	set("name", protoreflect.ValueOfString(pick(r, surnames)+pick(r, givenNames)))
	set("phone", protoreflect.ValueOfString("138****"+digits(r, 4)))
	set("level", protoreflect.ValueOfString(pick(r, profileLevels)))
	set("points", protoreflect.ValueOfInt64(int64(between(r, 0, 80_000))*1_000_003)) // past 2^53 for some: exact 64-bit integers
	set("member_since", protoreflect.ValueOfString(time.Date(2015+between(r, 0, 10), time.Month(between(r, 1, 12)), between(r, 1, 28), 0, 0, 0, 0, demoZone).Format(dateLayout)))
	set("city", protoreflect.ValueOfString(pick(r, shipCities)))
	return nil
}

// NewProfileServer returns a gRPC server serving customer.ProfileService, with server
// reflection when reflect is true, made with opts.
func NewProfileServer(reflect bool, opts ...grpc.ServerOption) *grpc.Server {
	m := profileMethod()
	s := grpc.NewServer(opts...)
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: ProfileService,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "GetProfile", Handler: func(_ any, ctx context.Context, dec func(any) error, icp grpc.UnaryServerInterceptor) (any, error) {
			in := dynamicpb.NewMessage(m.Input())
			if err := dec(in); err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "the request is not a GetProfileRequest: %v", err)
			}
			run := func(ctx context.Context, req any) (any, error) {
				out := dynamicpb.NewMessage(m.Output())
				if err := getProfile(ctx, req.(*dynamicpb.Message), out); err != nil {
					return nil, err
				}
				return out, nil
			}
			if icp == nil {
				return run(ctx, in)
			}
			return icp(ctx, in, &grpc.UnaryServerInfo{FullMethod: "/" + ProfileService + "/GetProfile"}, run)
		}}},
		Metadata: "customer/profile.proto",
	}, struct{}{})
	if reflect {
		rpb.RegisterServerReflectionServer(s, reflection.NewServerV1(reflection.ServerOptions{Services: s, DescriptorResolver: ProfileFiles}))
	}
	return s
}

// ServeProfiles serves customer.ProfileService (with reflection) on ln until ctx is done, then
// stops gracefully (in-flight calls get up to 5 s).
func ServeProfiles(ctx context.Context, ln net.Listener, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := NewProfileServer(true)
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ln) }()
	logger.Info("demo gRPC service listening", "addr", ln.Addr().String(), "service", ProfileService)
	select {
	case err := <-errc:
		return fmt.Errorf("demotools: gRPC: %w", err)
	case <-ctx.Done():
	}
	done := make(chan struct{})
	go func() { s.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(shutdownGrace):
		s.Stop()
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("demotools: gRPC: %w", err)
	}
	return nil
}
