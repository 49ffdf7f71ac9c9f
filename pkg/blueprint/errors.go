package blueprint

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Sentinels, matched with errors.Is.
var (
	// ErrNotCompiled is returned by a step's run-time methods before its blueprint's Compile
	// has succeeded.
	ErrNotCompiled = errors.New("blueprint: not compiled")
	// ErrMissing matches every *MissingError: a path of an input mapping found nothing.
	ErrMissing = errors.New("blueprint: a path finds nothing")
	// ErrCondition matches every *ConditionError: a condition could not be evaluated.
	ErrCondition = errors.New("blueprint: a condition cannot be evaluated")
	// ErrContextTooLarge is returned by CheckContext for a run context over MaxContextBytes.
	ErrContextTooLarge = errors.New("blueprint: the run context is too large")
)

// Error says why a blueprint was refused: the step's place (steps[1],
// steps[2].parallel[0], steps[0].fallback.step, fallback.step; empty for the blueprint's own
// fields), the field within it (condition, input_mapping.order_id), the line of the YAML or
// JSON it was read from (0 when unknown) and the reason. Its text is bounded.
type Error struct {
	Step   string
	Field  string
	Line   int
	Reason string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	where := e.Step
	if e.Field != "" {
		if where != "" {
			where += "."
		}
		where += e.Field
	}
	if where != "" {
		b.WriteString(protocol.Shorten(where, 256))
		b.WriteString(": ")
	}
	b.WriteString(protocol.Shorten(e.Reason, 1<<10))
	return b.String()
}

// MissingError says that a path of a step's input mapping found nothing in the run context:
// the step's place, the mapping's field (input_mapping.order_id) and the path as written.
type MissingError struct {
	Step  string
	Field string
	Path  string
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("%s.%s: %s finds nothing", e.Step, protocol.Shorten(e.Field, 256), protocol.Shorten(e.Path, 256))
}

// Is reports whether target is ErrMissing.
func (e *MissingError) Is(target error) bool { return target == ErrMissing }

// ConditionError says why a step's condition could not be evaluated against a run context:
// a value of the wrong type for its operator (ordering a missing value: nil < 3), or a path
// used as a truth value that found something other than true or false.
type ConditionError struct {
	Step      string
	Condition string
	Reason    string
}

func (e *ConditionError) Error() string {
	return fmt.Sprintf("%s.condition %q: %s", e.Step, protocol.Shorten(e.Condition, 256), protocol.Shorten(e.Reason, 512))
}

// Is reports whether target is ErrCondition.
func (e *ConditionError) Is(target error) bool { return target == ErrCondition }
