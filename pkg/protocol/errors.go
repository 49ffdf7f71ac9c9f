package protocol

import (
	"errors"
	"strings"
)

// ErrMalformed is wrapped by every decoding error: the bytes are not a valid message of the
// expected kind. Such a message can never succeed, however often it is retried.
var ErrMalformed = errors.New("protocol: malformed message")

// FieldError reports one invalid field. Field is a path such as "tool_calls[1].tool_call_id"
// and Reason completes the sentence, e.g. "is required".
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return e.Field + " " + e.Reason
}

// Is makes every FieldError match ErrInvalid.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

// ErrInvalid is matched by every FieldError: the value was well-formed but breaks a rule.
var ErrInvalid = errors.New("protocol: invalid field")

func fieldErr(field, reason string) *FieldError { return &FieldError{Field: field, Reason: reason} }

func joinField(prefix, name string) string {
	if prefix == "" {
		return name
	}
	if strings.HasPrefix(name, "[") {
		return prefix + name
	}
	return prefix + "." + name
}
