package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Number bounds of DefaultLimits. Any int64, uint64 or float64 an encoder writes fits them (a
// float64 needs at most 17 significant digits, and its exponent runs from -324, the smallest
// subnormal, to 308), and so do decimals of up to 64 digits. What they rule out is text like
// 1e999999, which costs nothing to send and a megabyte to whatever reads it as an exact number (a
// contract's minimum and maximum compare rationals): within them, a number's exact value is a
// fraction of at most about 400 digits above and below.
const (
	DefaultMaxNumberDigits   = 64
	DefaultMaxNumberExponent = 324
)

// maxNumberShown bounds the part of a number an error quotes.
const maxNumberShown = 40

// maxPathBytes bounds the path of an argument an error names.
const maxPathBytes = 256

// CheckArguments checks the arguments of one call, named field (such as
// "tool_calls[0].arguments"), against lim (zero fields: defaults): at most MaxArgumentsBytes of
// one JSON object whose every number is within MaxNumberDigits and MaxNumberExponent. It
// returns a FieldError naming the field, or the path of the number within it; an empty args
// passes (a call without arguments has {}).
func CheckArguments(field string, args []byte, lim Limits) error {
	lim = lim.orDefault()
	if len(args) > lim.MaxArgumentsBytes {
		return fieldErr(field, fmt.Sprintf("are %d bytes long; the limit is %d", len(args), lim.MaxArgumentsBytes))
	}
	if len(args) == 0 {
		return nil
	}
	if !isJSONObject(args) {
		return fieldErr(field, "must be a JSON object")
	}
	return checkNumbers(field, args, lim.MaxNumberDigits, lim.MaxNumberExponent)
}

// checkNumbers returns a FieldError for the first number of the JSON value data that has more
// than maxDigits significant digits, or whose magnitude, written d.ddd×10^e, has |e| > maxExp
// (zero: its exponent as written). data must be valid JSON (json.Valid); on other bytes it returns
// some answer, never panics, and reads each byte a bounded number of times.
func checkNumbers(field string, data []byte, maxDigits, maxExp int) error {
	var bad error
	walkNumbers(data, func(path []pathStep, lit []byte) bool {
		n := parseNumber(lit)
		if n.digits <= maxDigits && n.exp >= -int64(maxExp) && n.exp <= int64(maxExp) {
			return true
		}
		shown := string(lit)
		if len(shown) > maxNumberShown {
			shown = shown[:maxNumberShown] + "…"
		}
		bad = fieldErr(renderPath(field, path), fmt.Sprintf("is a number of %d characters (%s); numbers may have at most %d significant digits and an exponent within ±%d",
			len(lit), shown, maxDigits, maxExp))
		return false
	})
	return bad
}

// pathStep is one step into a JSON value: a key of an object (key, as written between its
// quotes, escapes kept) or an index of an array (key nil).
type pathStep struct {
	key      []byte
	index    int
	inObject bool
	wantKey  bool // in an object: the next string is a key
}

// walkNumbers calls visit with the path and the literal of each number in the JSON value
// data, in order, until visit returns false. data should be valid JSON; on other bytes it
// ends without panicking (what it visits then is unspecified). path is reused: visit must not
// keep it.
func walkNumbers(data []byte, visit func(path []pathStep, lit []byte) bool) {
	var path []pathStep
	for i := 0; i < len(data); {
		switch c := data[i]; c {
		case '{':
			path = append(path, pathStep{inObject: true, wantKey: true})
			i++
		case '[':
			path = append(path, pathStep{})
			i++
		case '}', ']':
			if len(path) > 0 {
				path = path[:len(path)-1]
			}
			i++
		case ',':
			if len(path) > 0 {
				top := &path[len(path)-1]
				top.index++
				top.wantKey = top.inObject
			}
			i++
		case '"':
			end := stringEnd(data, i)
			if len(path) > 0 {
				if top := &path[len(path)-1]; top.inObject && top.wantKey {
					top.key, top.wantKey = data[i+1:max(end-1, i+1)], false
				}
			}
			i = end
		case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			end := numberEnd(data, i)
			if !visit(path, data[i:end]) {
				return
			}
			i = end
		default: // whitespace, ':', true, false, null (and, in invalid input, anything)
			i++
		}
	}
}

// stringEnd returns the index just past the string that starts with the quote at data[i] (or
// len(data) when it is not closed).
func stringEnd(data []byte, i int) int {
	// Short strings (keys, mostly) are read byte by byte; past shortString, the search jumps
	// from quote to quote.
	const shortString = 32
	j := i + 1
	for j < len(data) && j-i <= shortString {
		switch data[j] {
		case '"':
			return j + 1
		case '\\':
			j += 2
		default:
			j++
		}
	}
	for j < len(data) {
		k := bytes.IndexByte(data[j:], '"')
		if k < 0 {
			break
		}
		q := j + k
		bs := 0 // backslashes right before the quote: an odd run escapes it
		for p := q - 1; p > i && data[p] == '\\'; p-- {
			bs++
		}
		if bs%2 == 0 {
			return q + 1
		}
		j = q + 1
	}
	return len(data)
}

// numberEnd returns the index just past the number that starts at data[i]: the longest run of
// the characters a JSON number is made of.
func numberEnd(data []byte, i int) int {
	j := i + 1
	for j < len(data) {
		switch data[j] {
		case '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '.', 'e', 'E', '+', '-':
			j++
		default:
			return j
		}
	}
	return j
}

// number is what the bounds look at in a number literal.
type number struct {
	digits int   // significant digits: of the mantissa (before e or E), from its first digit but 0 to its last
	exp    int64 // e of the number written d.ddd×10^e; for zero, the exponent as written
}

// expCap caps an exponent as read, so that arithmetic on it cannot overflow: any exponent this
// large is out of bounds anyway.
const expCap = 1 << 40

// parseNumber reads lit as a JSON number (-?int(.frac)?([eE][+-]?digits)?) without converting
// it. Bytes that are not part of that grammar are skipped as they come; nothing panics.
func parseNumber(lit []byte) number {
	var n number
	i := 0
	if i < len(lit) && lit[i] == '-' {
		i++
	}
	// Among the mantissa's digits: how many, the first and the last that are not 0 (-1: none),
	// and how many come before the point.
	all, first, last := 0, -1, -1
	digit := func(c byte) {
		if c != '0' {
			if first < 0 {
				first = all
			}
			last = all
		}
		all++
	}
	for ; i < len(lit) && isDigit(lit[i]); i++ {
		digit(lit[i])
	}
	intDigits := all
	if i < len(lit) && lit[i] == '.' {
		for i++; i < len(lit) && isDigit(lit[i]); i++ {
			digit(lit[i])
		}
	}
	if first >= 0 {
		n.digits = last - first + 1
	}
	var written int64
	if i < len(lit) && (lit[i] == 'e' || lit[i] == 'E') {
		i++
		neg := false
		if i < len(lit) && (lit[i] == '+' || lit[i] == '-') {
			neg = lit[i] == '-'
			i++
		}
		for ; i < len(lit) && isDigit(lit[i]); i++ {
			written = min(written*10+int64(lit[i]-'0'), expCap)
		}
		if neg {
			written = -written
		}
	}
	n.exp = written
	if first >= 0 {
		n.exp = written + int64(intDigits-1-first)
	}
	return n
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// renderPath is the path of a value within field, as errors name it:
// tool_calls[0].arguments.when.slots[2]; a key that is not a plain name is quoted
// (["a b"]). It is cut to maxPathBytes.
func renderPath(field string, path []pathStep) string {
	var b strings.Builder
	b.WriteString(field)
	for _, s := range path {
		if b.Len() > maxPathBytes {
			break
		}
		if !s.inObject {
			b.WriteString("[" + strconv.Itoa(s.index) + "]")
			continue
		}
		key := string(s.key)
		if bytes.IndexByte(s.key, '\\') >= 0 || !utf8.Valid(s.key) { // as a decoder reads it
			_ = json.Unmarshal([]byte(`"`+key+`"`), &key)
		}
		key = Shorten(key, 64)
		if plainKey(key) {
			b.WriteString("." + key)
		} else {
			b.WriteString("[" + strconv.Quote(key) + "]")
		}
	}
	if b.Len() > maxPathBytes {
		return Shorten(b.String(), maxPathBytes) + "…"
	}
	return b.String()
}

// plainKey reports whether key can be written after a dot: letters, digits, '_' and '-'.
func plainKey(key string) bool { return ValidToken(key, len(key)) }
