package protocol

import (
	"encoding/binary"
	"fmt"
)

// MaxDepth bounds the nesting of arrays and maps in a msgpack message.
const MaxDepth = 32

// MaxElements bounds the elements of one msgpack array, and the entries of one map: far above
// what any Hermes message holds (a request's calls, a response's results, a plan's call ids
// are bounded by Limits.MaxToolCalls, at most this), so that a message of tiny elements cannot
// make a decoder allocate a struct for each of millions.
const MaxElements = 4096

// CheckMsgpack walks data as exactly one msgpack value without decoding it and fails, wrapping
// ErrMalformed, when a declared length exceeds the bytes that remain, an array or map holds more
// than MaxElements, nesting exceeds maxDepth, a reserved byte appears, or bytes trail the value.
// After it passes, a decoder allocates at most in proportion to len(data) (every element takes
// at least one byte), and no slice of structs longer than MaxElements.
func CheckMsgpack(data []byte, maxDepth int) error {
	// pending[i] is how many values are still expected at nesting level i.
	pending := make([]uint64, 1, 8)
	pending[0] = 1
	p := 0
	for len(pending) > 0 {
		if pending[len(pending)-1] == 0 {
			pending = pending[:len(pending)-1]
			continue
		}
		pending[len(pending)-1]--
		if p >= len(data) {
			return fmt.Errorf("%w: msgpack ends early at byte %d", ErrMalformed, p)
		}
		c := data[p]
		p++
		var skip, children uint64 // bytes of payload to skip; child values to expect
		switch {
		case c <= 0x7f || c >= 0xe0: // fixint
		case c <= 0x8f: // fixmap
			children = 2 * uint64(c&0x0f)
		case c <= 0x9f: // fixarray
			children = uint64(c & 0x0f)
		case c <= 0xbf: // fixstr
			skip = uint64(c & 0x1f)
		default:
			var n uint64
			var err error
			switch c {
			case 0xc0, 0xc2, 0xc3: // nil, false, true
			case 0xc1:
				return fmt.Errorf("%w: reserved msgpack byte 0xc1 at %d", ErrMalformed, p-1)
			case 0xc4, 0xd9: // bin8, str8
				n, p, err = readLen(data, p, 1)
				skip = n
			case 0xc5, 0xda: // bin16, str16
				n, p, err = readLen(data, p, 2)
				skip = n
			case 0xc6, 0xdb: // bin32, str32
				n, p, err = readLen(data, p, 4)
				skip = n
			case 0xc7: // ext8
				n, p, err = readLen(data, p, 1)
				skip = n + 1
			case 0xc8: // ext16
				n, p, err = readLen(data, p, 2)
				skip = n + 1
			case 0xc9: // ext32
				n, p, err = readLen(data, p, 4)
				skip = n + 1
			case 0xca, 0xce, 0xd2: // float32, uint32, int32
				skip = 4
			case 0xcb, 0xcf, 0xd3: // float64, uint64, int64
				skip = 8
			case 0xcc, 0xd0: // uint8, int8
				skip = 1
			case 0xcd, 0xd1: // uint16, int16
				skip = 2
			case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16
				skip = 1 + (uint64(1) << (c - 0xd4))
			case 0xdc: // array16
				children, p, err = readLen(data, p, 2)
			case 0xdd: // array32
				children, p, err = readLen(data, p, 4)
			case 0xde: // map16
				n, p, err = readLen(data, p, 2)
				children = 2 * n
			case 0xdf: // map32
				n, p, err = readLen(data, p, 4)
				children = 2 * n
			}
			if err != nil {
				return err
			}
		}
		remaining := uint64(len(data) - p)
		if skip > remaining {
			return fmt.Errorf("%w: msgpack declares %d bytes at %d but %d remain", ErrMalformed, skip, p, remaining)
		}
		p += int(skip)
		if children > 0 {
			elems := children // an array's elements, or a map's entries
			if c&0xf0 == 0x80 || c == 0xde || c == 0xdf {
				elems /= 2
			}
			if elems > MaxElements {
				return fmt.Errorf("%w: msgpack array or map of %d elements at %d (at most %d)", ErrMalformed, elems, p, MaxElements)
			}
			if children > remaining {
				return fmt.Errorf("%w: msgpack declares %d elements at %d but %d bytes remain", ErrMalformed, children, p, remaining)
			}
			if len(pending) >= maxDepth {
				return fmt.Errorf("%w: msgpack nests deeper than %d", ErrMalformed, maxDepth)
			}
			pending = append(pending, children)
		}
	}
	if p != len(data) {
		return fmt.Errorf("%w: %d bytes trail the msgpack value", ErrMalformed, len(data)-p)
	}
	return nil
}

func readLen(data []byte, p, size int) (uint64, int, error) {
	if len(data)-p < size {
		return 0, p, fmt.Errorf("%w: msgpack length header cut short at %d", ErrMalformed, p)
	}
	switch size {
	case 1:
		return uint64(data[p]), p + 1, nil
	case 2:
		return uint64(binary.BigEndian.Uint16(data[p:])), p + 2, nil
	default:
		return uint64(binary.BigEndian.Uint32(data[p:])), p + 4, nil
	}
}
