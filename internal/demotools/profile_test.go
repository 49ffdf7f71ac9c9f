package demotools

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/dynamicpb"
)

func serveProfiles(t *testing.T) *grpc.ClientConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeProfiles(ctx, ln, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// The seed's customer.ProfileService answers GetProfile with a believable profile (64-bit
// points written exactly by protojson), refuses what is no customer id, finds no C000000, and
// tells its methods by server reflection.
func TestTheProfileService(t *testing.T) {
	conn := serveProfiles(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m := profileMethod()
	call := func(id string) (string, error) {
		in := dynamicpb.NewMessage(m.Input())
		if err := protojson.Unmarshal([]byte(`{"customer_id":"`+id+`"}`), in); err != nil {
			t.Fatal(err)
		}
		out := dynamicpb.NewMessage(m.Output())
		if err := conn.Invoke(ctx, "/customer.ProfileService/GetProfile", in, out); err != nil {
			return "", err
		}
		b, err := protojson.Marshal(out)
		return string(b), err
	}
	got, err := call("C102938")
	if err != nil || !strings.Contains(got, `"customerId":"C102938"`) || !strings.Contains(got, `"level":`) || !strings.Contains(got, `"points":"`) {
		t.Fatalf("GetProfile: %s %v", got, err)
	}
	if again, _ := call("C102938"); again != got {
		t.Errorf("the same customer, another profile: %s / %s", got, again)
	}
	if _, err := call("C000000"); status.Code(err) != codes.NotFound {
		t.Errorf("C000000: %v", err)
	}
	if _, err := call("bob"); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "C followed by 6 digits") {
		t.Errorf("bob: %v", err)
	}

	stream, err := rpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: ProfileService}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil || resp.GetFileDescriptorResponse() == nil || len(resp.GetFileDescriptorResponse().FileDescriptorProto) == 0 {
		t.Fatalf("reflection: %v %v", resp, err)
	}
}

// callProfile answers GetProfile for JSON arguments as Hermes' gRPC executor gives them back:
// the protobuf JSON mapping with the .proto's field names and zero values.
func callProfile(args json.RawMessage) (json.RawMessage, error) {
	m := profileMethod()
	in := dynamicpb.NewMessage(m.Input())
	if err := protojson.Unmarshal(args, in); err != nil {
		return nil, err
	}
	out := dynamicpb.NewMessage(m.Output())
	if err := getProfile(context.Background(), in, out); err != nil {
		return nil, err
	}
	return protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(out)
}
