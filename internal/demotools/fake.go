package demotools

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"
)

// toolFunc is a demo tool: it reads its arguments and returns the JSON value to answer, or a
// *toolError.
type toolFunc func(r *http.Request, a args) (any, error)

// tool adapts fn to an HTTP handler: it reads the arguments and writes the result as JSON
// (200) or the error in the tools' error shape.
func (s *server) tool(fn toolFunc) http.Handler {
	return serveTool(fn, func(w http.ResponseWriter, v any, err error) {
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	})
}

// contracted is tool for the tools that answer in the shape of their contract (seed 003
// §3.2): {"success": value} with 200, or {"failure": {"error_code", "recovery_hint",
// "message"}} with the error's status.
func (s *server) contracted(fn toolFunc) http.Handler {
	return serveTool(fn, func(w http.ResponseWriter, v any, err error) {
		if err != nil {
			te, ok := err.(*toolError)
			if !ok {
				te = &toolError{Status: http.StatusInternalServerError, Code: "SERVICE_UNAVAILABLE", Hint: "retry later", Message: err.Error()}
			}
			writeJSON(w, te.Status, map[string]any{"failure": te})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"success": v})
	})
}

// serveTool reads a call's arguments, runs fn and writes what it gave with write.
func serveTool(fn toolFunc, write func(w http.ResponseWriter, v any, err error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, err := requestArgs(r)
		var v any
		if err == nil {
			v, err = fn(r, a)
		}
		write(w, v, err)
	})
}

// seeded returns a random source determined by parts alone (compared case-insensitively and
// without surrounding space), so the same input always yields the same fake data.
func seeded(parts ...string) *rand.Rand {
	h := fnv.New128a()
	for _, p := range parts {
		h.Write([]byte(strings.ToLower(strings.TrimSpace(p))))
		h.Write([]byte{0})
	}
	sum := h.Sum(nil)
	return rand.New(rand.NewPCG(binary.BigEndian.Uint64(sum[:8]), binary.BigEndian.Uint64(sum[8:])))
}

// pick returns one element of list chosen by r.
func pick[T any](r *rand.Rand, list []T) T { return list[r.IntN(len(list))] }

// between returns a whole number in [lo, hi] chosen by r.
func between(r *rand.Rand, lo, hi int) int { return lo + r.IntN(hi-lo+1) }

// digits returns n random decimal digits.
func digits(r *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('0' + r.IntN(10))
	}
	return string(b)
}

// fakeID returns prefix followed by n upper-case hexadecimal digits chosen by r.
func fakeID(r *rand.Rand, prefix string, n int) string {
	const hex = "0123456789ABCDEF"
	b := make([]byte, n)
	for i := range b {
		b[i] = hex[r.IntN(16)]
	}
	return prefix + string(b)
}

// demoZone is the time zone of the demo company: calendars and office hours are in UTC+08:00.
var demoZone = time.FixedZone("UTC+08:00", 8*60*60)

// demoZoneName is how answers name demoZone.
const demoZoneName = "Asia/Shanghai (UTC+08:00)"

// dateLayout is the YYYY-MM-DD form of dates in arguments and answers.
const dateLayout = time.DateOnly

// date returns argument field, a YYYY-MM-DD date, as the start of that day in demoZone. ok
// is false when the argument is absent.
func (a args) date(field string) (d time.Time, ok bool, err error) {
	s, ok, err := a.str(field)
	if err != nil || !ok {
		return time.Time{}, false, err
	}
	d, perr := time.ParseInLocation(dateLayout, s, demoZone)
	if perr != nil {
		return time.Time{}, false, badArg(a.name(field), "a date as YYYY-MM-DD, e.g. \"2026-03-16\"",
			fmt.Sprintf("%s is not a YYYY-MM-DD date", quote(s)))
	}
	return d, true, nil
}

// today returns the start of the current day in demoZone.
func (s *server) today() time.Time {
	y, m, d := s.now().In(demoZone).Date()
	return time.Date(y, m, d, 0, 0, 0, 0, demoZone)
}
