package grpcexec

import (
	"encoding/json"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	_ "google.golang.org/protobuf/types/known/wrapperspb" // google/protobuf/wrappers.proto

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
)

// A route's captures fill wrapper fields and enums (by name or number) too.
func TestCapturesFillWrappersAndEnums(t *testing.T) {
	t.Parallel()
	opt := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	fdp := &descriptorpb.FileDescriptorProto{
		Name: proto.String("w.proto"), Package: proto.String("w"), Syntax: proto.String("proto3"),
		Dependency: []string{"google/protobuf/wrappers.proto"},
		EnumType: []*descriptorpb.EnumDescriptorProto{{Name: proto.String("K"), Value: []*descriptorpb.EnumValueDescriptorProto{
			{Name: proto.String("K_ZERO"), Number: proto.Int32(0)}, {Name: proto.String("K_TWO"), Number: proto.Int32(2)}}}},
		MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("Req"), Field: []*descriptorpb.FieldDescriptorProto{
			{Name: proto.String("order_id"), Number: proto.Int32(1), Type: descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum(), TypeName: proto.String(".google.protobuf.StringValue"), Label: opt},
			{Name: proto.String("kind"), Number: proto.Int32(2), Type: descriptorpb.FieldDescriptorProto_TYPE_ENUM.Enum(), TypeName: proto.String(".w.K"), Label: opt},
			{Name: proto.String("urgent"), Number: proto.Int32(3), Type: descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum(), TypeName: proto.String(".google.protobuf.BoolValue"), Label: opt},
		}}},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("S"), Method: []*descriptorpb.MethodDescriptorProto{
			{Name: proto.String("M"), InputType: proto.String(".w.Req"), OutputType: proto.String(".w.Req")}}}},
	}
	fd, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	md := fd.Services().Get(0).Methods().Get(0)
	e := &Executor{}
	for want, params := range map[string]map[string]string{
		`{"orderId":"o-42"}`:             {"order_id": "o-42"},
		`{"kind":"K_TWO"}`:               {"kind": "K_TWO"},
		`{"kind":"K_TWO","urgent":true}`: {"kind": "2", "urgent": "true"},
	} {
		msg := dynamicpb.NewMessage(md.Input())
		c := &worker.Call{Dispatch: &protocol.Dispatch{Call: protocol.ToolCall{Arguments: json.RawMessage(`{}`)}, Params: params}}
		if err := e.request(c, &method{desc: md, types: dynamicpb.NewTypes(protoregistry.GlobalFiles)}, msg); err != nil {
			t.Fatalf("%v: %v", params, err)
		}
		var got, w any
		b, _ := protojson.Marshal(msg)
		json.Unmarshal(b, &got)
		json.Unmarshal([]byte(want), &w)
		if gb, _ := json.Marshal(got); string(gb) != string(mustJSON(w)) {
			t.Errorf("%v → %s, want %s", params, b, want)
		}
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
