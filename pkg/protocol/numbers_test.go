package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

func TestCheckArgumentsBoundsNumbers(t *testing.T) {
	for _, c := range []struct {
		args  string
		field string // "" when accepted
	}{
		{`{}`, ""},
		{`{"a":0,"b":-0,"c":0.0,"d":-0.0e-0,"e":1E+2}`, ""},
		{`{"n":9223372036854775807,"m":-9223372036854775808,"u":18446744073709551615}`, ""},
		{`{"f":1.7976931348623157e308,"g":-2.2250738585072014e-308,"h":5e-324,"i":4.9406564584124654e-324}`, ""},
		{`{"d":` + strings.Repeat("9", 64) + `,"e":0.` + strings.Repeat("1", 63) + `}`, ""},
		{`{"e":1e324,"f":9.99e-324,"g":` + strings.Repeat("0", 1) + `e324}`, ""},
		{`{"s":"1e999999 in a string","k":{"1e999999":true}}`, ""},
		{`{"e":1e0000000000000000000000000000000000000000000000000000000000000000000000005}`, ""},
		{`{"a":1.` + strings.Repeat("0", 400) + `,"b":1` + strings.Repeat("0", 300) + `,"c":0.` + strings.Repeat("0", 300) + `1}`, ""},
		{`{"a":` + strings.Repeat("0", 1) + `.` + strings.Repeat("0", 1000) + `}`, ""},

		{`{"delay_ms":1e999999}`, "tool_calls[0].arguments.delay_ms"},
		{`{"a":1,"b":{"c":[1,2,-1e325]}}`, "tool_calls[0].arguments.b.c[2]"},
		{`{"a":1e-325}`, "tool_calls[0].arguments.a"},
		{`{"a":0e325}`, "tool_calls[0].arguments.a"},
		{`{"a":0.` + strings.Repeat("0", 400) + `1}`, "tool_calls[0].arguments.a"},
		{`{"a":` + strings.Repeat("1", 65) + `}`, "tool_calls[0].arguments.a"},
		{`{"a":1.` + strings.Repeat("0", 63) + `1}`, "tool_calls[0].arguments.a"},
		{`{"a":1` + strings.Repeat("0", 325) + `}`, "tool_calls[0].arguments.a"},
		{`{"a b":[{"x\"y":[],"z\u00e9":99e999}]}`, `tool_calls[0].arguments["a b"][0]["zé"]`},
		{`{"":[[0,[1e400]]]}`, `tool_calls[0].arguments[""][0][1][0]`},
	} {
		err := CheckArguments("tool_calls[0].arguments", []byte(c.args), Limits{})
		var fe *FieldError
		switch {
		case c.field == "" && err != nil:
			t.Errorf("%.80s refused: %v", c.args, err)
		case c.field != "" && (!errors.As(err, &fe) || fe.Field != c.field):
			t.Errorf("%.80s: %v, want a FieldError naming %s", c.args, err, c.field)
		case c.field != "" && !strings.Contains(fe.Reason, "at most 64 significant digits and an exponent within ±324"):
			t.Errorf("%.80s: %q does not name the bounds", c.args, fe.Reason)
		}
	}
	// Bounds of one's own.
	if err := CheckArguments("a", []byte(`{"n":123456}`), Limits{MaxNumberDigits: 5}); err == nil {
		t.Error("6 digits passed a bound of 5")
	}
	if err := CheckArguments("a", []byte(`{"n":1e11}`), Limits{MaxNumberExponent: 10}); err == nil {
		t.Error("1e11 passed a bound of 10")
	}
}

// A request whose arguments hold 1e999999 was accepted, and a contract's minimum or maximum
// then wrote a megabyte of its exact value to the record: the door refuses it now, naming the
// field, in a message of bounded size however long the number.
func TestDecodeRequestRefusesHugeNumbers(t *testing.T) {
	for _, num := range []string{"1e999999", "1" + strings.Repeat("0", 300<<10) + "e-999999"} {
		body := `{"request_id":"r1","tool_calls":[{"tool_call_id":"c","name":"sleep","arguments":{"delay_ms":` + num + `}}]}`
		_, err := DecodeRequestJSON([]byte(body), Limits{MaxArgumentsBytes: 2 << 20})
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "tool_calls[0].arguments.delay_ms" {
			t.Fatalf("%.40s: %v; want a FieldError naming tool_calls[0].arguments.delay_ms", num, err)
		}
		if want := fmt.Sprintf("is a number of %d characters", len(num)); !strings.HasPrefix(fe.Reason, want) || len(err.Error()) > 256 {
			t.Errorf("%.40s: %q", num, err)
		}
	}
	// The same from the bus (an external client's msgpack request).
	r := &Request{RequestID: "r1", ToolCalls: []ToolCall{{ToolCallID: "c", Name: "sleep", Arguments: json.RawMessage(`{"delay_ms":1e999999}`)}}}
	m, _ := NewMessage(TypeRequest, r)
	m.MsgID, m.RequestID, m.SessionID = MsgIDRequest("r1"), "r1", "r1"
	data, _ := Marshal(m)
	m2, err := Unmarshal(data)
	if err != nil {
		t.Fatal(err)
	}
	var fe *FieldError
	if _, err := m2.DecodeRequest(Limits{}); !errors.As(err, &fe) || fe.Field != "tool_calls[0].arguments.delay_ms" {
		t.Errorf("from the bus: %v", err)
	}
}

// Every float64, as encoders write it, and every 64-bit integer passes the default bounds.
func TestEveryFloat64AndIntegerPasses(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(lit string) {
		t.Helper()
		if err := checkNumbers("n", []byte(lit), DefaultMaxNumberDigits, DefaultMaxNumberExponent); err != nil {
			t.Fatalf("%s: %v", lit, err)
		}
	}
	specials := []float64{0, math.MaxFloat64, -math.MaxFloat64, math.SmallestNonzeroFloat64, 2.2250738585072014e-308, 1e21, 1e-7, 0.1}
	for i := range 5000 {
		f := math.Float64frombits(rng.Uint64())
		if i < len(specials) {
			f = specials[i]
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			continue
		}
		b, _ := json.Marshal(f)
		check(string(b))
		for _, format := range []byte{'e', 'g', 'E', 'G'} {
			check(strconv.FormatFloat(f, format, -1, 64))
			check(strconv.FormatFloat(f, format, 17, 64))
		}
	}
	for _, n := range []string{strconv.FormatInt(math.MinInt64, 10), strconv.FormatUint(math.MaxUint64, 10)} {
		check(n)
	}
}

// FuzzCheckNumbers holds the scanner to encoding/json's own reading of the same bytes: on
// valid JSON it finds exactly the numbers json.Decoder finds (with UseNumber), in order and at
// the same paths, and for each it reads the digits and exponent math/big reads.
func FuzzCheckNumbers(f *testing.F) {
	for _, s := range []string{
		`{"delay_ms":1e999999}`, `{"a":[1,2,{"b":-0.5e-3}],"c":"\"1\\"}`, `[0,-0,1E+2,1e-2,123.456e78]`,
		`{"a\\\"b":{"":[[],{},[1]]}}`, `0.0000000000001`, `"str"`, `{"a b":{"x":{"y":[true,false,null,3]}}}`,
		`{"e":1e0000000000000000000000000000000000000000000000000000000000000005}`, `{"u":18446744073709551615}`, `[1.000e5,0.0010,100]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		err := checkNumbers("x", data, 64, 324) // never panics, on any bytes
		if !json.Valid(data) {
			return
		}
		want, err2 := decoderNumbers(data)
		if err2 != nil {
			t.Fatalf("json.Valid, yet the decoder fails: %v", err2)
		}
		var got []found
		walkNumbers(data, func(path []pathStep, lit []byte) bool {
			got = append(got, found{path: renderPath("x", path), lit: string(lit)})
			return true
		})
		if len(got) != len(want) {
			t.Fatalf("found %d numbers, the decoder %d:\n%v\n%v", len(got), len(want), got, want)
		}
		firstBad := -1
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("number %d: %+v, the decoder %+v", i, got[i], want[i])
			}
			n := parseNumber([]byte(got[i].lit))
			if ref, ok := bigNumber(got[i].lit); ok && n != ref {
				t.Fatalf("%s: read %+v, math/big %+v", got[i].lit, n, ref)
			}
			if firstBad < 0 && (n.digits > 64 || n.exp > 324 || n.exp < -324) {
				firstBad = i
			}
		}
		var fe *FieldError
		switch {
		case firstBad < 0 && err != nil:
			t.Fatalf("refused with every number in bounds: %v", err)
		case firstBad >= 0 && (!errors.As(err, &fe) || fe.Field != want[firstBad].path):
			t.Fatalf("%s out of bounds: %v, want its path %s", want[firstBad].lit, err, want[firstBad].path)
		}
	})
}

type found struct{ path, lit string }

// decoderNumbers is every number json.Decoder reads in data, with its path as renderPath
// writes it within field x. The walker counts an array's commas, the decoder its values: the
// same in valid JSON.
func decoderNumbers(data []byte) ([]found, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var (
		out  []found
		path []pathStep
	)
	// value is called after each complete value: the next token of an object is a key again.
	value := func() {
		if len(path) > 0 {
			top := &path[len(path)-1]
			top.index++
			top.wantKey = top.inObject
		}
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(path) > 0 {
			if top := &path[len(path)-1]; top.inObject && top.wantKey {
				if k, ok := tok.(string); ok {
					raw, _ := json.Marshal(k) // renderPath decodes what it finds; any spelling of k will do
					top.key, top.wantKey = raw[1:len(raw)-1], false
					continue
				}
			}
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				path = append(path, pathStep{inObject: true, wantKey: true})
			case '[':
				path = append(path, pathStep{})
			default:
				path = path[:len(path)-1]
				value()
			}
		case json.Number:
			out = append(out, found{path: renderPath("x", path), lit: string(v)})
			value()
		default:
			value()
		}
	}
}

// bigNumber reads lit with math/big: its significant digits (counted on its text with the
// point and the zeros at either end taken away) and its exponent written d.ddd×10^e, found by
// comparing its exact value with powers of ten. ok is false where that would be costly (long
// numbers, huge exponents) and for zero (whose exponent is the written one, which math/big does
// not keep).
func bigNumber(lit string) (number, bool) {
	mant, exp, hasExp := strings.Cut(strings.ToLower(strings.TrimPrefix(lit, "-")), "e")
	var n number
	n.digits = len(strings.Trim(strings.Replace(mant, ".", "", 1), "0"))
	if hasExp {
		if e, err := strconv.Atoi(exp); err != nil || e > 5000 || e < -5000 {
			return n, false
		}
	}
	if len(mant) > 1000 {
		return n, false
	}
	r, ok := new(big.Rat).SetString(lit)
	if !ok || r.Sign() == 0 {
		return n, false
	}
	r.Abs(r)
	pow := func(e int) *big.Rat {
		p := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(max(e, -e))), nil)
		if e >= 0 {
			return new(big.Rat).SetInt(p)
		}
		return new(big.Rat).SetFrac(big.NewInt(1), p)
	}
	e := len(r.Num().String()) - len(r.Denom().String())
	for r.Cmp(pow(e)) < 0 {
		e--
	}
	for r.Cmp(pow(e+1)) >= 0 {
		e++
	}
	n.exp = int64(e)
	return n, true
}

func BenchmarkCheckArguments256KiB(b *testing.B) {
	var buf bytes.Buffer
	buf.WriteString(`{"items":[`)
	for i := 0; buf.Len() < 256<<10-200; i++ {
		if i > 0 {
			buf.WriteByte(',')
		}
		fmt.Fprintf(&buf, `{"id":%d,"price":%g,"name":"item \"%d\" of the catalogue","tags":["a","b"],"ok":true}`, i*7919, float64(i)*1.37e-3, i)
	}
	buf.WriteString(`]}`)
	args := buf.Bytes()
	if err := CheckArguments("arguments", args, Limits{}); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(args)))
	b.ReportAllocs()
	b.Run("numbers only", func(b *testing.B) {
		b.SetBytes(int64(len(args)))
		for b.Loop() {
			if err := checkNumbers("arguments", args, DefaultMaxNumberDigits, DefaultMaxNumberExponent); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Valid", func(b *testing.B) {
		b.SetBytes(int64(len(args)))
		for b.Loop() {
			if !json.Valid(args) {
				b.Fatal("invalid")
			}
		}
	})
	b.Run("CheckArguments", func(b *testing.B) {
		b.SetBytes(int64(len(args)))
		for b.Loop() {
			if err := CheckArguments("arguments", args, Limits{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// A failed result's text is bounded whatever it quotes: a hostile argument echoed in Hermes'
// message cannot make the result, hint included, larger than a few KiB.
func TestErrorResultTextIsBounded(t *testing.T) {
	for _, text := range []string{
		"tool_calls[0].arguments.delay_ms must be at most 100, got " + strings.Repeat("1", 1<<20),
		strings.Repeat("<é>\x00", 100_000),
		strings.Repeat("\xff", 10_000),
	} {
		r := ErrorResult(CodeBadArguments, OriginHermes, text, text)
		if len(r.Content) > MaxErrorTextBytes || len(r.RecoveryHint) > MaxHintBytes+len("…") {
			t.Errorf("content %d bytes, hint %d", len(r.Content), len(r.RecoveryHint))
		}
		var s string
		if err := json.Unmarshal(r.Content, &s); err != nil || !strings.HasSuffix(s, "…") {
			t.Errorf("content %.60s…: %v", r.Content, err)
		}
		m, _ := NewMessage(TypeToolResult, &r)
		if b, _ := Marshal(m); len(b) > 8<<10 {
			t.Errorf("the result message is %d bytes", len(b))
		}
	}
	if r := ErrorResult(CodeNoRoute, OriginHermes, "h", "short"); string(r.Content) != `"short"` {
		t.Errorf("a short text changed: %s", r.Content)
	}
	body := json.RawMessage(`{"error":"` + strings.Repeat("x", 10_000) + `"}`)
	if r := ErrorResult(CodeToolHTTP4xx, OriginTool, "h", body); !bytes.Equal(r.Content, body) {
		t.Error("a tool's own JSON body was changed")
	}
}
