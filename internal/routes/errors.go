package routes

import (
	"errors"
	"strconv"
	"strings"
)

// ErrInvalid is matched by every [*LoadError]: the routes file is not valid YAML or breaks a rule
// of the routes format. Use errors.As to get the file, line and field.
var ErrInvalid = errors.New("routes: invalid routes file")

// ErrTooLarge is returned by [Load] and reported by [Watch] when the file is larger than
// [MaxFileSize].
var ErrTooLarge = errors.New("routes: file too large")

// MaxFileSize is the largest routes file Load and Watch read, in bytes.
const MaxFileSize = 4 << 20

// LoadError reports why a routes file was refused. Its message reads
// "file:line: field: reason", for example
//
//	routes.yaml:16: rules[1].match.tool_name: is required
//
// Line is 1-based. Field is the path of the offending field (empty for problems of the file as
// a whole, such as YAML syntax errors). Reason never quotes header values or URLs.
type LoadError struct {
	// File is the file name given to Load or Parse.
	File string
	// Line is the 1-based line of the problem.
	Line int
	// Field is the field path, e.g. rules[0].action.http.url.
	Field string
	// Reason says what is wrong.
	Reason string
	// Err is the underlying error, if any (a regexp compile error, for example).
	Err error
}

// Error returns "file:line: field: reason"; the field part is left out when Field is empty and
// a Parse without a file name shows as "<input>".
func (e *LoadError) Error() string {
	var b strings.Builder
	if e.File == "" {
		b.WriteString("<input>")
	} else {
		b.WriteString(e.File)
	}
	if e.Line > 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(e.Line))
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Reason)
	return b.String()
}

// Is reports whether target is [ErrInvalid].
func (e *LoadError) Is(target error) bool { return target == ErrInvalid }

// Unwrap returns the underlying error, if any.
func (e *LoadError) Unwrap() error { return e.Err }
