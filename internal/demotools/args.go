package demotools

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// args are the arguments of one tool call as the Hermes tool worker sends them: the members
// of a JSON object body (POST, PUT, PATCH) or the query string (GET, DELETE, HEAD), where a
// string travels as its text, a number or boolean as its JSON text, an array as repeated keys
// and an object as its JSON text. The accessors accept both forms, so a tool reads its
// arguments the same way whatever method it is routed with.
type args struct {
	body   map[string]json.RawMessage
	query  url.Values
	prefix string // prepended to argument names in errors, e.g. "barrier."
}

// bodyMethod reports whether a call made with method carries its arguments in the body.
func bodyMethod(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
		return true
	}
	return false
}

// readBody reads the request body, bounded by maxBodyBytes; a larger body is a 413.
func readBody(r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, &toolError{Status: http.StatusRequestEntityTooLarge, Code: "PAYLOAD_TOO_LARGE",
				Hint:    "send a request body of at most 1 MiB",
				Message: "request body larger than 1 MiB"}
		}
		return nil, &toolError{Status: http.StatusBadRequest, Code: "INVALID_ARGUMENT",
			Hint: "resend the request body", Message: "reading request body: " + err.Error()}
	}
	return b, nil
}

// parseObject decodes body as a JSON object, keeping every member's exact bytes. An empty body
// is an empty object.
func parseObject(body []byte) (map[string]json.RawMessage, error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return map[string]json.RawMessage{}, nil
	}
	var m map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	err := dec.Decode(&m)
	if err == nil && dec.More() {
		err = errors.New("data after the JSON object")
	}
	if err == nil && m == nil {
		err = errors.New("null is not an object")
	}
	if err != nil {
		return nil, &toolError{Status: http.StatusBadRequest, Code: "INVALID_ARGUMENT",
			Hint:    "send the arguments as one JSON object in the request body",
			Message: "request body is not a JSON object: " + err.Error()}
	}
	return m, nil
}

// requestArgs returns the call's arguments: the JSON object body for POST, PUT and PATCH, the
// query string otherwise.
func requestArgs(r *http.Request) (args, error) {
	if !bodyMethod(r.Method) {
		return args{query: r.URL.Query()}, nil
	}
	body, err := readBody(r)
	if err != nil {
		return args{}, err
	}
	m, err := parseObject(body)
	if err != nil {
		return args{}, err
	}
	return args{body: m, query: r.URL.Query()}, nil
}

// name is field as it appears in errors.
func (a args) name(field string) string { return a.prefix + field }

// lookup returns the argument's JSON value or query text; isJSON says which. A JSON null and
// an empty query value count as absent.
func (a args) lookup(field string) (raw []byte, isJSON, ok bool) {
	if v, ok := a.body[field]; ok && string(v) != "null" {
		return v, true, true
	}
	if vs, ok := a.query[field]; ok && len(vs) > 0 && vs[0] != "" {
		return []byte(vs[0]), false, true
	}
	return nil, false, false
}

// has reports whether the argument is present.
func (a args) has(field string) bool {
	_, _, ok := a.lookup(field)
	return ok
}

// str returns the argument as text, trimmed of surrounding space: a JSON string's value, a
// number's or boolean's JSON text. ok is false when the argument is absent or blank.
func (a args) str(field string) (s string, ok bool, err error) {
	raw, isJSON, ok := a.lookup(field)
	if !ok {
		return "", false, nil
	}
	s = string(raw)
	if isJSON {
		switch raw[0] {
		case '"':
			if err := json.Unmarshal(raw, &s); err != nil {
				return "", false, badArg(a.name(field), "a string", err.Error())
			}
		case '{', '[':
			return "", false, badArg(a.name(field), "a string", "got a JSON "+jsonKind(raw))
		}
	}
	s = strings.TrimSpace(s)
	return s, s != "", nil
}

// firstStr returns the first of fields that is present, and which one it was.
func (a args) firstStr(fields ...string) (s, field string, err error) {
	for _, f := range fields {
		s, ok, err := a.str(f)
		if err != nil {
			return "", f, err
		}
		if ok {
			return s, f, nil
		}
	}
	return "", "", nil
}

// integer returns the argument as a whole number within [lo, hi]; it accepts a JSON number, a
// numeric string and an integral float such as 30.0. ok is false when the argument is absent.
func (a args) integer(field string, lo, hi int64) (n int64, ok bool, err error) {
	s, ok, err := a.str(field)
	if err != nil || !ok {
		return 0, false, err
	}
	want := "a whole number from " + strconv.FormatInt(lo, 10) + " to " + strconv.FormatInt(hi, 10)
	n, perr := strconv.ParseInt(s, 10, 64)
	if perr != nil {
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || f != math.Trunc(f) || f < math.MinInt64 || f > math.MaxInt64 {
			return 0, false, badArg(a.name(field), want, "not a whole number: "+quote(s))
		}
		n = int64(f)
	}
	if n < lo || n > hi {
		return 0, false, badArg(a.name(field), want, "out of range: "+s)
	}
	return n, true, nil
}

// number returns the argument as a finite number within [lo, hi]; it accepts a JSON number and
// a numeric string. ok is false when the argument is absent.
func (a args) number(field string, lo, hi float64) (f float64, ok bool, err error) {
	s, ok, err := a.str(field)
	if err != nil || !ok {
		return 0, false, err
	}
	want := "a number from " + strconv.FormatFloat(lo, 'f', -1, 64) + " to " + strconv.FormatFloat(hi, 'f', -1, 64)
	f, perr := strconv.ParseFloat(s, 64)
	if perr != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false, badArg(a.name(field), want, "not a number: "+quote(s))
	}
	if f < lo || f > hi {
		return 0, false, badArg(a.name(field), want, "out of range: "+s)
	}
	return f, true, nil
}

// object returns the argument as a JSON object (an object in the body, or a query value holding
// the object's JSON text), with the prefix for its members' errors. ok is false when absent.
func (a args) object(field string) (obj args, ok bool, err error) {
	raw, _, ok := a.lookup(field)
	if !ok {
		return args{}, false, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return args{}, false, badArg(a.name(field), "a JSON object", "not a JSON object: "+quote(string(raw)))
	}
	return args{body: m, prefix: a.name(field) + "."}, true, nil
}

// jsonKind names the kind of JSON value raw starts.
func jsonKind(raw []byte) string {
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// quote quotes s for an error message, cut to a readable length.
func quote(s string) string {
	const max = 40
	if r := []rune(s); len(r) > max {
		return strconv.Quote(string(r[:max])) + "…"
	}
	return strconv.Quote(s)
}
