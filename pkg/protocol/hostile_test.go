package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"runtime"
	"strings"
	"testing"
)

// hostileInputs declare sizes far beyond their own length: the classic ways to make a msgpack
// decoder allocate gigabytes from a few bytes.
func hostileInputs() map[string][]byte {
	header := func(code byte, n uint32, tail ...byte) []byte {
		b := []byte{code, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[1:], n)
		return append(b, tail...)
	}
	envelopeWith := func(field string, value []byte) []byte {
		// {"schema_version":1, field: value}
		b := []byte{0x82, 0xae}
		b = append(b, "schema_version"...)
		b = append(b, 0x01, byte(0xa0|len(field)))
		b = append(b, field...)
		return append(b, value...)
	}
	return map[string][]byte{
		"bin32 4 GiB":              header(0xc6, 0xffffffff),
		"str32 2 GiB":              header(0xdb, 0x7fffffff, 'a'),
		"array32 4G elements":      header(0xdd, 0xffffffff, 0x00),
		"map32 4G pairs":           header(0xdf, 0xffffffff, 0xa1, 'k', 0x00),
		"ext32 4 GiB":              header(0xc9, 0xffffffff, 0x01),
		"payload bin32 4 GiB":      envelopeWith("payload", header(0xc6, 0xffffffff)),
		"msg_id str32 2 GiB":       envelopeWith("msg_id", header(0xdb, 0x7fffffff)),
		"nested arrays past limit": append(repeat(0x91, 10000), 0x00),
		"nested maps past limit":   append(repeat2(0x81, 0xa1, 'k', 10000), 0x00),
	}
}

func repeat(b byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

func repeat2(a, b, c byte, n int) []byte {
	out := make([]byte, 0, 3*n)
	for range n {
		out = append(out, a, b, c)
	}
	return out
}

// TestHostileInputAllocatesLittle decodes each hostile input and checks it is refused having
// allocated at most a small multiple of its own size.
func TestHostileInputAllocatesLittle(t *testing.T) {
	for name, data := range hostileInputs() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err := Unmarshal(data)
		runtime.ReadMemStats(&after)
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > uint64(64<<10+16*len(data)) {
			t.Errorf("%s: decoding %d hostile bytes allocated %d bytes", name, len(data), grew)
		}
	}
}

// 7 MB of empty tool calls on the bus: refused before a decoder allocates a struct for each
// (it took 791 MiB before the element bound).
func TestMillionsOfTinyElementsAreRefusedBeforeAllocating(t *testing.T) {
	const n = 7 << 20
	req := []byte{0x82, 0xaa}
	req = append(req, "request_id"...)
	req = append(req, 0xa1, 'r', 0xaa)
	req = append(req, "tool_calls"...)
	req = binary.BigEndian.AppendUint32(append(req, 0xdd), n)
	req = append(req, bytes.Repeat([]byte{0x80}, n)...)
	m, err := NewMessage(TypeRequest, &Request{RequestID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID, m.Payload = "m", "r", "r", req
	data, err := Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	env, err := Unmarshal(data)
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err = env.DecodeRequest(Limits{})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "elements") {
		t.Fatalf("decode: %v", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Errorf("refusing it allocated %d MiB", grew>>20)
	}
	// What Hermes sends stays well within: a request of MaxElements calls decodes.
	if err := CheckMsgpack(append(binary.BigEndian.AppendUint16([]byte{0xdc}, MaxElements), bytes.Repeat([]byte{0x80}, MaxElements)...), MaxDepth); err != nil {
		t.Errorf("%d elements: %v", MaxElements, err)
	}
}
