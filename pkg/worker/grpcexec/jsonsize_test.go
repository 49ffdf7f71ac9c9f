package grpcexec

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const p3 = `
name: "r3.proto" package: "r3" syntax: "proto3"
dependency: ["google/protobuf/any.proto","google/protobuf/struct.proto","google/protobuf/wrappers.proto","google/protobuf/timestamp.proto","google/protobuf/duration.proto","google/protobuf/field_mask.proto","google/protobuf/empty.proto"]
enum_type { name: "E" value { name: "E_ZERO" number: 0 } value { name: "E_ONE_WITH_A_LONG_NAME" number: 1 } }
message_type {
  name: "All"
  field { name: "s" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING json_name: "s" }
  field { name: "b" number: 2 label: LABEL_OPTIONAL type: TYPE_BYTES json_name: "b" }
  field { name: "d" number: 3 label: LABEL_OPTIONAL type: TYPE_DOUBLE json_name: "d" }
  field { name: "f" number: 4 label: LABEL_OPTIONAL type: TYPE_FLOAT json_name: "f" }
  field { name: "i64" number: 5 label: LABEL_OPTIONAL type: TYPE_INT64 json_name: "i64" }
  field { name: "u64" number: 6 label: LABEL_OPTIONAL type: TYPE_FIXED64 json_name: "u64" }
  field { name: "i32" number: 7 label: LABEL_OPTIONAL type: TYPE_SINT32 json_name: "i32" }
  field { name: "u32" number: 8 label: LABEL_OPTIONAL type: TYPE_UINT32 json_name: "u32" }
  field { name: "bo" number: 9 label: LABEL_OPTIONAL type: TYPE_BOOL json_name: "bo" }
  field { name: "e" number: 10 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".r3.E" json_name: "e" }
  field { name: "rd" number: 11 label: LABEL_REPEATED type: TYPE_DOUBLE json_name: "rd" }
  field { name: "rf" number: 12 label: LABEL_REPEATED type: TYPE_FLOAT json_name: "rf" }
  field { name: "re" number: 13 label: LABEL_REPEATED type: TYPE_ENUM type_name: ".r3.E" json_name: "re" }
  field { name: "rs" number: 14 label: LABEL_REPEATED type: TYPE_STRING json_name: "rs" }
  field { name: "child" number: 15 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".r3.All" json_name: "child" }
  field { name: "kids" number: 16 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".r3.All" json_name: "kids" }
  field { name: "m_ss" number: 17 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".r3.All.MSsEntry" json_name: "mSs" }
  field { name: "m_im" number: 18 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".r3.All.MImEntry" json_name: "mIm" }
  field { name: "m_be" number: 19 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".r3.All.MBeEntry" json_name: "mBe" }
  field { name: "m_ud" number: 20 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".r3.All.MUdEntry" json_name: "mUd" }
  field { name: "m_sb" number: 21 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".r3.All.MSbEntry" json_name: "mSb" }
  field { name: "o_s" number: 22 label: LABEL_OPTIONAL type: TYPE_STRING oneof_index: 0 json_name: "oS" }
  field { name: "o_m" number: 23 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".r3.All" oneof_index: 0 json_name: "oM" }
  field { name: "opt_name_that_is_fairly_long" number: 24 label: LABEL_OPTIONAL type: TYPE_INT32 oneof_index: 1 proto3_optional: true json_name: "x" }
  field { name: "any" number: 30 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".google.protobuf.Any" json_name: "any" }
  field { name: "anys" number: 31 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".google.protobuf.Any" json_name: "anys" }
  field { name: "st" number: 32 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".google.protobuf.Struct" json_name: "st" }
  field { name: "val" number: 33 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".google.protobuf.Value" json_name: "val" }
  field { name: "lv" number: 34 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".google.protobuf.ListValue" json_name: "lv" }
  field { name: "w_d" number: 35 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".google.protobuf.DoubleValue" json_name: "wD" }
  field { name: "w_s" number: 36 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".google.protobuf.StringValue" json_name: "wS" }
  field { name: "w_i64" number: 37 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".google.protobuf.Int64Value" json_name: "wI64" }
  field { name: "w_b" number: 38 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".google.protobuf.BytesValue" json_name: "wB" }
  field { name: "ts" number: 39 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".google.protobuf.Timestamp" json_name: "ts" }
  field { name: "du" number: 40 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".google.protobuf.Duration" json_name: "du" }
  field { name: "fm" number: 41 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".google.protobuf.FieldMask" json_name: "fm" }
  field { name: "em" number: 42 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".google.protobuf.Empty" json_name: "em" }
  field { name: "rts" number: 43 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".google.protobuf.Timestamp" json_name: "rts" }
  field { name: "rwb" number: 44 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".google.protobuf.BoolValue" json_name: "rwb" }
  field { name: "nv" number: 45 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".google.protobuf.NullValue" json_name: "nv" }
  nested_type { name: "MSsEntry" field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING json_name: "key" } field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_STRING json_name: "value" } options { map_entry: true } }
  nested_type { name: "MImEntry" field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_INT32 json_name: "key" } field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".r3.All" json_name: "value" } options { map_entry: true } }
  nested_type { name: "MBeEntry" field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_BOOL json_name: "key" } field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".r3.E" json_name: "value" } options { map_entry: true } }
  nested_type { name: "MUdEntry" field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_UINT64 json_name: "key" } field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_DOUBLE json_name: "value" } options { map_entry: true } }
  nested_type { name: "MSbEntry" field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_SINT64 json_name: "key" } field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_BYTES json_name: "value" } options { map_entry: true } }
  oneof_decl { name: "o" }
  oneof_decl { name: "_opt_name_that_is_fairly_long" }
}
message_type { name: "Opts" field { name: "a_rather_long_optional_field_name_1" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING oneof_index: 0 proto3_optional: true json_name: "a1" }
  field { name: "a_rather_long_optional_field_name_2" number: 2 label: LABEL_OPTIONAL type: TYPE_STRING oneof_index: 1 proto3_optional: true json_name: "a2" }
  field { name: "id" number: 3 label: LABEL_OPTIONAL type: TYPE_INT32 json_name: "id" }
  oneof_decl { name: "_a1" } oneof_decl { name: "_a2" } }
message_type { name: "OptsList" field { name: "items" number: 1 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".r3.Opts" json_name: "items" } }
`

const p2 = `
name: "r2.proto" package: "r2" syntax: "proto2"
enum_type { name: "E2" value { name: "A" number: 1 } value { name: "B" number: 2 } }
message_type {
  name: "P2"
  field { name: "s" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING default_value: "a default that is long" json_name: "s" }
  field { name: "i" number: 2 label: LABEL_OPTIONAL type: TYPE_INT32 default_value: "42" json_name: "i" }
  field { name: "e" number: 3 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".r2.E2" default_value: "B" json_name: "e" }
  field { name: "d" number: 4 label: LABEL_OPTIONAL type: TYPE_DOUBLE default_value: "inf" json_name: "d" }
  field { name: "grp" number: 5 label: LABEL_OPTIONAL type: TYPE_GROUP type_name: ".r2.P2.Grp" json_name: "grp" }
  nested_type { name: "Grp" field { name: "x" number: 6 label: LABEL_OPTIONAL type: TYPE_INT32 json_name: "x" } }
  extension_range { start: 100 end: 200 }
}
message_type { name: "Wide" }
message_type {
  name: "Req"
  field { name: "r" number: 1 label: LABEL_REQUIRED type: TYPE_INT32 json_name: "r" }
  field { name: "items" number: 2 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".r2.Wide" json_name: "items" }
}
extension { name: "ext_items" number: 100 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".r2.Wide" extendee: ".r2.P2" json_name: "extItems" }
`

func wideDesc(n int) *descriptorpb.DescriptorProto {
	d := &descriptorpb.DescriptorProto{Name: proto.String("Wide")}
	for i := 1; i <= n; i++ {
		d.Field = append(d.Field, &descriptorpb.FieldDescriptorProto{Name: proto.String(fmt.Sprintf("wide_field_number_%04d", i)),
			Number: proto.Int32(int32(i)), Type: descriptorpb.FieldDescriptorProto_TYPE_INT64.Enum(), Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()})
	}
	return d
}

func sizeTypes(t *testing.T) (*protoregistry.Files, *dynamicpb.Types) {
	files := &protoregistry.Files{}
	for _, f := range []protoreflect.FileDescriptor{anypb.File_google_protobuf_any_proto, structpb.File_google_protobuf_struct_proto,
		wrapperspb.File_google_protobuf_wrappers_proto, timestamppb.File_google_protobuf_timestamp_proto, durationpb.File_google_protobuf_duration_proto,
		fieldmaskpb.File_google_protobuf_field_mask_proto, emptypb.File_google_protobuf_empty_proto} {
		files.RegisterFile(f)
	}
	for _, src := range []string{p3, p2} {
		fdp := &descriptorpb.FileDescriptorProto{}
		if err := prototext.Unmarshal([]byte(src), fdp); err != nil {
			t.Fatal(err)
		}
		if fdp.GetName() == "r2.proto" {
			for i, m := range fdp.MessageType {
				if m.GetName() == "Wide" {
					fdp.MessageType[i] = wideDesc(200)
				}
			}
		}
		fd, err := protodesc.NewFile(fdp, files)
		if err != nil {
			t.Fatal(err)
		}
		if err := files.RegisterFile(fd); err != nil {
			t.Fatal(err)
		}
	}
	return files, dynamicpb.NewTypes(files)
}

type builder struct {
	t     *testing.T
	types *dynamicpb.Types
}

func (b builder) msg(name string, set func(m *dynamicpb.Message)) *dynamicpb.Message {
	mt, err := b.types.FindMessageByName(protoreflect.FullName(name))
	if err != nil {
		b.t.Fatal(err)
	}
	m := mt.New().(*dynamicpb.Message)
	if set != nil {
		set(m)
	}
	return m
}

func fld(m *dynamicpb.Message, name string) protoreflect.FieldDescriptor {
	fd := m.Descriptor().Fields().ByName(protoreflect.Name(name))
	if fd == nil {
		panic(name)
	}
	return fd
}

func anyOf(m proto.Message) *dynamicpb.Message {
	b, err := proto.MarshalOptions{AllowPartial: true}.Marshal(m)
	if err != nil {
		panic(err)
	}
	a := dynamicpb.NewMessage(anypb.File_google_protobuf_any_proto.Messages().ByName("Any"))
	a.Set(a.Descriptor().Fields().ByNumber(1), protoreflect.ValueOfString("type.googleapis.com/"+string(m.ProtoReflect().Descriptor().FullName())))
	a.Set(a.Descriptor().Fields().ByNumber(2), protoreflect.ValueOfBytes(b))
	return a
}

// jsonSize counts within a quarter of what protojson writes, for every shape of message — well-
// known types, maps, oneofs, optional fields, proto2 defaults, extensions, Any within Any, and
// the answers that once got past the count (an Any whose message lacks a required field, or
// carries an extension).
func TestJSONSizeFollowsProtojson(t *testing.T) {
	t.Parallel()
	_, types := sizeTypes(t)
	b := builder{t, types}
	v := protoreflect.ValueOf
	vm := func(m proto.Message) protoreflect.Value { return protoreflect.ValueOfMessage(m.ProtoReflect()) }
	list := func(m *dynamicpb.Message, name string, vals ...protoreflect.Value) {
		l := m.Mutable(fld(m, name)).List()
		for _, x := range vals {
			l.Append(x)
		}
	}
	repeat := func(n int, x protoreflect.Value) []protoreflect.Value {
		out := make([]protoreflect.Value, n)
		for i := range out {
			out[i] = x
		}
		return out
	}
	wide := func() *dynamicpb.Message { return b.msg("r2.Wide", nil) }
	cases := []struct {
		name string
		m    proto.Message
	}{
		{"empty All", b.msg("r3.All", nil)},
		{"scalars", b.msg("r3.All", func(m *dynamicpb.Message) {
			m.Set(fld(m, "s"), v("hello"))
			m.Set(fld(m, "b"), v([]byte("abcde")))
			m.Set(fld(m, "d"), v(math.Pi))
			m.Set(fld(m, "f"), v(float32(0.1)))
			m.Set(fld(m, "i64"), v(int64(-1)))
			m.Set(fld(m, "u64"), v(uint64(math.MaxUint64)))
			m.Set(fld(m, "i32"), v(int32(math.MinInt32)))
			m.Set(fld(m, "bo"), v(true))
			m.Set(fld(m, "e"), protoreflect.ValueOfEnum(1))
		})},
		{"unknown enum numbers", b.msg("r3.All", func(m *dynamicpb.Message) {
			list(m, "re", repeat(1000, protoreflect.ValueOfEnum(-2147483648))...)
		})},
		{"NaN/Inf doubles", b.msg("r3.All", func(m *dynamicpb.Message) {
			list(m, "rd", repeat(1000, v(math.NaN()))...)
			list(m, "rd", repeat(1000, v(math.Inf(-1)))...)
		})},
		{"doubles 1e20", b.msg("r3.All", func(m *dynamicpb.Message) { list(m, "rd", repeat(10000, v(1e20))...) })},
		{"doubles 1.2345e20", b.msg("r3.All", func(m *dynamicpb.Message) { list(m, "rd", repeat(10000, v(1.2345e20))...) })},
		{"doubles 5e-6", b.msg("r3.All", func(m *dynamicpb.Message) { list(m, "rd", repeat(10000, v(5e-6))...) })},
		{"doubles 1e-7", b.msg("r3.All", func(m *dynamicpb.Message) { list(m, "rd", repeat(10000, v(1e-7))...) })},
		{"floats 1e20", b.msg("r3.All", func(m *dynamicpb.Message) { list(m, "rf", repeat(10000, v(float32(1e20)))...) })},
		{"floats 0.1", b.msg("r3.All", func(m *dynamicpb.Message) { list(m, "rf", repeat(10000, v(float32(0.1)))...) })},
		{"floats 3.4e38 (e form)", b.msg("r3.All", func(m *dynamicpb.Message) { list(m, "rf", repeat(10000, v(float32(3.4e38)))...) })},
		{"bytes", b.msg("r3.All", func(m *dynamicpb.Message) { m.Set(fld(m, "b"), v(make([]byte, 100001))) })},
		{"strings of control chars", b.msg("r3.All", func(m *dynamicpb.Message) { m.Set(fld(m, "s"), v(strings.Repeat("\x01", 100000))) })},
		{"strings of quotes", b.msg("r3.All", func(m *dynamicpb.Message) { m.Set(fld(m, "s"), v(strings.Repeat(`"`, 100000))) })},
		{"maps", b.msg("r3.All", func(m *dynamicpb.Message) {
			mp := m.Mutable(fld(m, "m_ss")).Map()
			mi := m.Mutable(fld(m, "m_im")).Map()
			mb := m.Mutable(fld(m, "m_be")).Map()
			mu := m.Mutable(fld(m, "m_ud")).Map()
			ms := m.Mutable(fld(m, "m_sb")).Map()
			for i := range 200 {
				mp.Set(protoreflect.MapKey(v(fmt.Sprint("k", i))), v("val"))
				mi.Set(protoreflect.MapKey(v(int32(-i))), vm(b.msg("r3.All", nil)))
				mu.Set(protoreflect.MapKey(v(uint64(i)*1e15)), v(float64(i)*1e19))
				ms.Set(protoreflect.MapKey(v(int64(-i)*1e15)), v([]byte("xy")))
			}
			mb.Set(protoreflect.MapKey(v(true)), protoreflect.ValueOfEnum(1))
			mb.Set(protoreflect.MapKey(v(false)), protoreflect.ValueOfEnum(77))
		})},
		{"oneof string", b.msg("r3.All", func(m *dynamicpb.Message) { m.Set(fld(m, "o_s"), v("")) })},
		{"oneof msg", b.msg("r3.All", func(m *dynamicpb.Message) { m.Set(fld(m, "o_m"), vm(b.msg("r3.All", nil))) })},
		{"proto3 optional set", b.msg("r3.All", func(m *dynamicpb.Message) { m.Set(fld(m, "opt_name_that_is_fairly_long"), v(int32(0))) })},
		{"proto3 optional unset x2000 (list)", b.msg("r3.OptsList", func(m *dynamicpb.Message) {
			list(m, "items", repeat(2000, vm(b.msg("r3.Opts", nil)))...)
		})},
		{"children", b.msg("r3.All", func(m *dynamicpb.Message) { list(m, "kids", repeat(50, vm(b.msg("r3.All", nil)))...) })},
		{"wkt set", b.msg("r3.All", func(m *dynamicpb.Message) {
			m.Set(fld(m, "w_d"), vm(wrapperspb.Double(1e20)))
			m.Set(fld(m, "w_s"), vm(wrapperspb.String("str")))
			m.Set(fld(m, "w_i64"), vm(wrapperspb.Int64(-5)))
			m.Set(fld(m, "w_b"), vm(wrapperspb.Bytes([]byte("bytes"))))
			m.Set(fld(m, "ts"), vm(&timestamppb.Timestamp{Seconds: 253402300799, Nanos: 999999999}))
			m.Set(fld(m, "du"), vm(&durationpb.Duration{Seconds: -315576000000, Nanos: -999999999}))
			m.Set(fld(m, "fm"), vm(&fieldmaskpb.FieldMask{Paths: []string{"a_b", "c.d_e"}}))
			m.Set(fld(m, "em"), vm(&emptypb.Empty{}))
			st, _ := structpb.NewStruct(map[string]any{"a": 1.5, "b": []any{"x", true, nil, map[string]any{"c": "d"}}})
			m.Set(fld(m, "st"), vm(st))
			m.Set(fld(m, "val"), vm(structpb.NewNullValue()))
			lv, _ := structpb.NewList([]any{1, 2, "three"})
			m.Set(fld(m, "lv"), vm(lv))
		})},
		{"timestamps x1000 epoch", b.msg("r3.All", func(m *dynamicpb.Message) {
			list(m, "rts", repeat(1000, vm(&timestamppb.Timestamp{}))...)
		})},
		{"bool wrappers x1000", b.msg("r3.All", func(m *dynamicpb.Message) { list(m, "rwb", repeat(1000, vm(wrapperspb.Bool(false)))...) })},
		{"any regular", b.msg("r3.All", func(m *dynamicpb.Message) { m.Set(fld(m, "any"), vm(anyOf(b.msg("r3.All", nil)))) })},
		{"any of Struct", b.msg("r3.All", func(m *dynamicpb.Message) {
			st, _ := structpb.NewStruct(map[string]any{"k": "v"})
			m.Set(fld(m, "any"), vm(anyOf(st)))
		})},
		{"any of Timestamp x100", b.msg("r3.All", func(m *dynamicpb.Message) {
			list(m, "anys", repeat(100, vm(anyOf(&timestamppb.Timestamp{Seconds: 1})))...)
		})},
		{"any of any of Duration", b.msg("r3.All", func(m *dynamicpb.Message) {
			m.Set(fld(m, "any"), vm(anyOf(anyOf(durationpb.New(1500)))))
		})},
		{"any of Empty", b.msg("r3.All", func(m *dynamicpb.Message) { m.Set(fld(m, "any"), vm(anyOf(&emptypb.Empty{}))) })},
		{"any of wrapper", b.msg("r3.All", func(m *dynamicpb.Message) { m.Set(fld(m, "any"), vm(anyOf(wrapperspb.String("x")))) })},
		{"proto2 defaults unset", b.msg("r2.P2", nil)},
		{"proto2 set", b.msg("r2.P2", func(m *dynamicpb.Message) {
			m.Set(fld(m, "s"), v("x"))
			m.Set(fld(m, "e"), protoreflect.ValueOfEnum(1))
			m.Set(fld(m, "d"), v(math.Inf(1)))
			m.Set(fld(m, "grp"), vm(b.msg("r2.P2.Grp", nil)))
		})},
		{"wide x100 plain", b.msg("r2.Req", func(m *dynamicpb.Message) {
			m.Set(fld(m, "r"), v(int32(1)))
			list(m, "items", repeat(100, vm(wide()))...)
		})},
		{"AMPLIFY: Any of proto2 message missing its required field", b.msg("r3.All", func(m *dynamicpb.Message) {
			req := b.msg("r2.Req", nil) // r unset
			list(req, "items", repeat(100, vm(wide()))...)
			m.Set(fld(m, "any"), vm(anyOf(req)))
		})},
		{"AMPLIFY: Any of message with an extension", b.msg("r3.All", func(m *dynamicpb.Message) {
			p := b.msg("r2.P2", nil)
			xt, err := types.FindExtensionByName("r2.ext_items")
			if err != nil {
				t.Fatal(err)
			}
			l := p.NewField(xt.TypeDescriptor()).List()
			for range 100 {
				l.Append(vm(wide()))
			}
			p.Set(xt.TypeDescriptor(), protoreflect.ValueOfList(l))
			m.Set(fld(m, "any"), vm(anyOf(p)))
		})},
	}
	for _, c := range cases {
		wire, err := proto.MarshalOptions{AllowPartial: true}.Marshal(c.m)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		// What the worker holds: the answer as decoded from the wire (grpc's codec).
		got := dynamicpb.NewMessage(c.m.ProtoReflect().Descriptor())
		if err := (proto.UnmarshalOptions{AllowPartial: true, Resolver: types}).Unmarshal(wire, got); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		out, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true, Resolver: types, AllowPartial: true}.Marshal(got)
		if err != nil {
			t.Logf("%-60s protojson error: %v", c.name, err)
			continue
		}
		n := jsonSize(got.ProtoReflect(), types, 1<<40)
		if ratio := float64(n) / float64(len(out)); ratio < 0.75 || ratio > 1.25 {
			t.Errorf("%s: counted %d, protojson writes %d (%.2f×)", c.name, n, len(out), ratio)
		}
	}
}
