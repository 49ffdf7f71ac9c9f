package grpcexec

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// jsonSize estimates, from below, how many bytes the protobuf JSON mapping writes for m with
// every unset field given (EmitUnpopulated), and stops counting once past budget: what marshal
// would cost is known before it runs, whatever the schema's width. Strings and bytes count as
// their length; each field its name, quotes, colon and comma; unset fields their zero value.
func jsonSize(m protoreflect.Message, types *dynamicpb.Types, budget int64) int64 {
	var n int64 = 2 // {}
	if m.Descriptor().FullName() == "google.protobuf.Any" {
		// Written as the message it holds, unset fields and all.
		fields := m.Descriptor().Fields()
		url, value := m.Get(fields.ByNumber(1)).String(), m.Get(fields.ByNumber(2)).Bytes()
		if mt, err := types.FindMessageByURL(url); err == nil {
			inner := mt.New()
			if err := (proto.UnmarshalOptions{Resolver: types}).Unmarshal(value, inner.Interface()); err == nil {
				return n + int64(len(url)) + 12 + jsonSize(inner, types, budget-n)
			}
		}
		return n + int64(len(url)) + int64(len(value))*4/3
	}
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		if n > budget {
			return n
		}
		fd := fields.Get(i)
		if o := fd.ContainingOneof(); o != nil && !o.IsSynthetic() && !m.Has(fd) {
			continue // an unset oneof member is not written
		}
		n += int64(len(fd.JSONName())) + 4 // "name":,
		if !m.Has(fd) {
			n += 1 // the shortest zero value: 0, "", [], {}, null, false
			continue
		}
		v := m.Get(fd)
		switch {
		case fd.IsList():
			l := v.List()
			n += 2
			for j := 0; j < l.Len() && n <= budget; j++ {
				n += valueSize(fd, l.Get(j), types, budget-n) + 1
			}
		case fd.IsMap():
			mp := v.Map()
			n += 2
			mp.Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				n += int64(len(k.String())) + 4 + valueSize(fd.MapValue(), mv, types, budget-n)
				return n <= budget
			})
		default:
			n += valueSize(fd, v, types, budget-n)
		}
	}
	return n
}

// valueSize is one value's share of jsonSize.
func valueSize(fd protoreflect.FieldDescriptor, v protoreflect.Value, types *dynamicpb.Types, budget int64) int64 {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return jsonSize(v.Message(), types, budget)
	case protoreflect.StringKind:
		return int64(len(v.String())) + 2
	case protoreflect.BytesKind:
		return int64(len(v.Bytes()))*4/3 + 2
	}
	return 1
}
