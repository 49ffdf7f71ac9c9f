package grpcexec

import (
	"math"
	"strconv"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// maxAnyDepth bounds how deep google.protobuf.Any values may nest in an answer: each level is
// decoded again to be written out.
const maxAnyDepth = 16

// sizer says how many bytes the protobuf JSON mapping (protojson with UseProtoNames and
// EmitUnpopulated, as Execute writes answers) takes for a message — within a few bytes per
// value, strings counted without their escapes — before anything is written: a server chooses
// the schema, and a small answer of a wide one (every unset field of many elements, long enum
// names, Any within Any) could otherwise be written out a thousandfold. It stops counting once
// past budget, and counts an Any nested past maxAnyDepth as past it.
type sizer struct {
	types  *dynamicpb.Types
	budget int64
	n      int64
	buf    []byte
}

// jsonSize is sizer's count for m, at most a little past budget.
func jsonSize(m protoreflect.Message, types *dynamicpb.Types, budget int64) int64 {
	s := &sizer{types: types, budget: budget, buf: make([]byte, 0, 32)}
	s.message(m, 0)
	return s.n
}

func (s *sizer) over() bool { return s.n > s.budget }

func (s *sizer) message(m protoreflect.Message, depth int) {
	if s.over() {
		return
	}
	if s.wellKnown(m, depth) {
		return
	}
	s.n += 2 // {}
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len() && !s.over(); i++ {
		fd := fields.Get(i)
		has := m.Has(fd)
		if fd.ContainingOneof() != nil && !has {
			continue // an unset oneof member (proto3 optional too) is not written
		}
		s.n += int64(len(fd.Name())) + 4 // "name":,
		switch {
		case fd.IsList():
			l := m.Get(fd).List()
			s.n += 2
			for j := 0; j < l.Len() && !s.over(); j++ {
				s.value(fd, l.Get(j), depth)
				s.n++
			}
		case fd.IsMap():
			s.n += 2
			m.Get(fd).Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
				s.n += stringSize(k.String()) + 2
				s.value(fd.MapValue(), v, depth)
				return !s.over()
			})
		case !has && (fd.Message() != nil || fd.HasPresence()):
			s.n += 4 // null
		default:
			s.value(fd, m.Get(fd), depth) // set, or the zero value written for it
		}
	}
	// Extensions (set ones only are written), as "[full.name]".
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if !fd.IsExtension() {
			return true
		}
		s.n += int64(len(fd.FullName())) + 6
		switch {
		case fd.IsList():
			l := v.List()
			s.n += 2
			for j := 0; j < l.Len() && !s.over(); j++ {
				s.value(fd, l.Get(j), depth)
				s.n++
			}
		default:
			s.value(fd, v, depth)
		}
		return !s.over()
	})
}

// value counts one value of fd's kind.
func (s *sizer) value(fd protoreflect.FieldDescriptor, v protoreflect.Value, depth int) {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		s.message(v.Message(), depth)
	case protoreflect.StringKind:
		s.n += stringSize(v.String())
	case protoreflect.BytesKind:
		s.n += (int64(len(v.Bytes()))+2)/3*4 + 2
	case protoreflect.BoolKind:
		s.n += 5
	case protoreflect.EnumKind:
		if fd.Enum().FullName() == "google.protobuf.NullValue" {
			s.n += 4
		} else if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			s.n += int64(len(ev.Name())) + 2
		} else {
			s.n += int64(len(strconv.AppendInt(s.buf[:0], int64(v.Enum()), 10)))
		}
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		s.n += int64(len(strconv.AppendInt(s.buf[:0], v.Int(), 10)))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		s.n += int64(len(strconv.AppendUint(s.buf[:0], v.Uint(), 10)))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		s.n += int64(len(strconv.AppendInt(s.buf[:0], v.Int(), 10))) + 2 // quoted
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		s.n += int64(len(strconv.AppendUint(s.buf[:0], v.Uint(), 10))) + 2
	case protoreflect.FloatKind:
		s.n += floatSize(v.Float(), 32)
	case protoreflect.DoubleKind:
		s.n += floatSize(v.Float(), 64)
	default:
		s.n += 24
	}
}

// floatSize is how protojson writes f: "NaN" and the infinities quoted, else 'f' form unless
// the magnitude is under 1e-6 or from 1e21, in bits' precision.
func floatSize(f float64, bits int) int64 {
	switch {
	case math.IsNaN(f):
		return 5
	case math.IsInf(f, 1):
		return 10
	case math.IsInf(f, -1):
		return 11
	}
	format := byte('f')
	if a := math.Abs(f); a != 0 {
		if bits == 32 {
			a = float64(float32(a))
		}
		if a < 1e-6 || a >= 1e21 {
			format = 'e'
		}
	}
	var b [40]byte
	out := strconv.AppendFloat(b[:0], f, format, -1, bits)
	if n := len(out); format == 'e' && n >= 4 && out[n-4] == 'e' && out[n-2] == '0' {
		return int64(n - 1) // e-07 is written e-7
	}
	return int64(len(out))
}

// stringSize is s quoted, with the escapes JSON needs.
func stringSize(s string) int64 {
	n := int64(len(s)) + 2
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f':
			n++
		case c < 0x20:
			n += 5
		}
	}
	return n
}

// wellKnown counts the types the mapping writes in a form of their own, and reports whether m
// was one.
func (s *sizer) wellKnown(m protoreflect.Message, depth int) bool {
	d := m.Descriptor()
	fields := d.Fields()
	switch d.FullName() {
	case "google.protobuf.Any":
		url, value := m.Get(fields.ByNumber(1)).String(), m.Get(fields.ByNumber(2)).Bytes()
		s.n += int64(len(url)) + 14 // {"@type":"…",}
		if depth >= maxAnyDepth || int64(len(value)) > s.budget-s.n {
			s.n = s.budget + 1
			return true
		}
		mt, err := s.types.FindMessageByURL(url)
		if err != nil {
			s.n += int64(len(value)) * 2 // not written at all: protojson refuses it
			return true
		}
		inner := mt.New()
		// Decoded as protojson decodes it; what it cannot decode is not counted as small.
		if err := (proto.UnmarshalOptions{AllowPartial: true, Resolver: s.types}).Unmarshal(value, inner.Interface()); err != nil {
			s.n = s.budget + 1
			return true
		}
		s.message(inner, depth+1)
		s.n += 9 // "value": for a well-known inner type, at most
		return true
	case "google.protobuf.Struct":
		s.n += 2
		m.Get(fields.ByNumber(1)).Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
			s.n += stringSize(k.String()) + 2
			s.message(v.Message(), depth)
			return !s.over()
		})
		return true
	case "google.protobuf.ListValue":
		l := m.Get(fields.ByNumber(1)).List()
		s.n += 2
		for j := 0; j < l.Len() && !s.over(); j++ {
			s.message(l.Get(j).Message(), depth)
			s.n++
		}
		return true
	case "google.protobuf.Value":
		od := d.Oneofs().Get(0)
		if fd := m.WhichOneof(od); fd != nil {
			s.value(fd, m.Get(fd), depth)
		} else {
			s.n += 4
		}
		return true
	case "google.protobuf.DoubleValue", "google.protobuf.FloatValue", "google.protobuf.Int64Value", "google.protobuf.UInt64Value",
		"google.protobuf.Int32Value", "google.protobuf.UInt32Value", "google.protobuf.BoolValue", "google.protobuf.StringValue",
		"google.protobuf.BytesValue":
		fd := fields.ByNumber(1)
		s.value(fd, m.Get(fd), depth)
		return true
	case "google.protobuf.Timestamp":
		s.n += 22 // "1970-01-01T00:00:00Z"
		switch nanos := m.Get(fields.ByNumber(2)).Int(); {
		case nanos == 0:
		case nanos%1_000_000 == 0:
			s.n += 4
		case nanos%1000 == 0:
			s.n += 7
		default:
			s.n += 10
		}
		return true
	case "google.protobuf.Duration":
		s.n += 24
		return true
	case "google.protobuf.FieldMask":
		l := m.Get(fields.ByNumber(1)).List()
		s.n += 2
		for j := 0; j < l.Len(); j++ {
			s.n += int64(len(l.Get(j).String())) + 1
		}
		return true
	case "google.protobuf.Empty":
		s.n += 2
		return true
	}
	return false
}
