package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
)

// Digest is what the audit keeps of a JSON value — a call's arguments, a tool's result — in
// place of it: its shape, never a value. Field names are kept only when they look like names
// (an identifier of at most MaxFieldName bytes); other keys, which may be data (an e-mail
// address, a customer's name), are only counted.
type Digest struct {
	// Kind is the value's JSON type: object, array, string, number, bool, null; "invalid"
	// when it is no JSON.
	Kind string `json:"kind"`
	// Size is the value's length in bytes.
	Size int `json:"size"`
	// Count is an object's members or an array's elements.
	Count int `json:"count,omitempty"`
	// Fields are an object's field names, or those of an array's objects, sorted, at most
	// MaxFields; Unnamed counts the keys left out as not names, and beyond MaxFields.
	Fields  []string `json:"fields,omitempty"`
	Unnamed int      `json:"unnamed,omitempty"`
}

// Bounds of a Digest's field names.
const (
	MaxFields    = 32
	MaxFieldName = 40
)

// DigestOf returns the digest of data, a JSON value.
func DigestOf(data []byte) Digest {
	d := Digest{Size: len(data), Kind: "invalid"}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	names := map[string]bool{}
	unnamed := 0
	key := func(k string) {
		if !isName(k) {
			unnamed++
		} else if !names[k] {
			names[k] = true
		}
	}
	tok, err := dec.Token()
	if err != nil {
		return d
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '{' {
			d.Kind = "object"
			if d.Count, err = members(dec, key); err != nil {
				return Digest{Size: len(data), Kind: "invalid"}
			}
		} else {
			d.Kind = "array"
			if d.Count, err = elements(dec, key); err != nil {
				return Digest{Size: len(data), Kind: "invalid"}
			}
		}
	case string:
		d.Kind = "string"
	case json.Number:
		d.Kind = "number"
	case bool:
		d.Kind = "bool"
	case nil:
		d.Kind = "null"
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Digest{Size: len(data), Kind: "invalid"} // more after the value
	}
	for n := range names {
		d.Fields = append(d.Fields, n)
	}
	slices.Sort(d.Fields)
	if len(d.Fields) > MaxFields {
		unnamed += len(d.Fields) - MaxFields
		d.Fields = d.Fields[:MaxFields]
	}
	d.Unnamed = unnamed
	return d
}

// members reads an object's members after its '{', naming each key, and returns how many.
func members(dec *json.Decoder, key func(string)) (int, error) {
	n := 0
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return n, err
		}
		k, ok := tok.(string)
		if !ok {
			return n, errors.New("a key that is no string")
		}
		key(k)
		if err := skip(dec); err != nil {
			return n, err
		}
		n++
	}
	_, err := dec.Token() // '}'
	return n, err
}

// elements reads an array's elements after its '[', naming the keys of those that are objects,
// and returns how many.
func elements(dec *json.Decoder, key func(string)) (int, error) {
	n := 0
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return n, err
		}
		if t, ok := tok.(json.Delim); ok {
			if t == '{' {
				_, err = members(dec, key)
			} else {
				err = skipRest(dec)
			}
			if err != nil {
				return n, err
			}
		}
		n++
	}
	_, err := dec.Token() // ']'
	return n, err
}

// skip reads one value, whatever it is, and keeps nothing of it.
func skip(dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if _, ok := tok.(json.Delim); ok {
		return skipRest(dec)
	}
	return nil
}

// skipRest reads what is left of an object or array whose opening token was read.
func skipRest(dec *json.Decoder) error {
	for depth := 1; depth > 0; {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		if t, ok := tok.(json.Delim); ok {
			if t == '{' || t == '[' {
				depth++
			} else {
				depth--
			}
		}
	}
	return nil
}

// isName reports whether k looks like a field's name rather than data: letters, digits, '_',
// '-' and '.', starting with a letter or '_', at most MaxFieldName bytes.
func isName(k string) bool {
	if k == "" || len(k) > MaxFieldName {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '_':
		case (c >= '0' && c <= '9' || c == '-' || c == '.') && i > 0:
		default:
			return false
		}
	}
	return true
}
