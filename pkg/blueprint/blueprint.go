package blueprint

import (
	"encoding/json"
	"fmt"
	"time"
)

// Bounds of a blueprint and of its runs.
const (
	// MaxBytes bounds a blueprint as written.
	MaxBytes = 256 << 10
	// MaxSteps bounds the steps of a blueprint, counting every group, every group member and
	// every fallback step.
	MaxSteps = 64
	// MaxParallel bounds the members of a parallel group.
	MaxParallel = 16
	// MaxContextBytes bounds a run context as JSON. The runner enforces it (CheckContext)
	// after each step's output is added.
	MaxContextBytes = 1 << 20
	// MaxConditionBytes bounds a condition.
	MaxConditionBytes = 4 << 10
	// MaxMappingEntries bounds the keys of an input_mapping.
	MaxMappingEntries = 64
	// MaxDefaultBytes bounds a default_value as JSON.
	MaxDefaultBytes = 64 << 10
	// MaxAttempts bounds retry.max_attempts.
	MaxAttempts = 10
	// MinTimeout and MaxTimeout bound a step's timeout.
	MinTimeout = time.Millisecond
	MaxTimeout = 10 * time.Minute
	// MaxTextBytes bounds a description and a fallback's message.
	MaxTextBytes = 4 << 10
)

// UserInput is the key of the run context that holds the blueprint's input.
const UserInput = "user_input"

// Blueprint is a composed tool: its steps run in order, and its fallback is taken when a step
// fails for good or a value a step requires is missing, and that step has no fallback of its
// own. It marshals to JSON as written (its exported fields); Parse reads that JSON back to an
// equal blueprint.
type Blueprint struct {
	// Name is the composed tool's name, a tool name (letters, digits, '-' and '_').
	Name string `json:"name"`
	// Description says what the composed tool does.
	Description string `json:"description,omitempty"`
	// Steps run in order.
	Steps []Step `json:"steps"`
	// Fallback is taken when a step fails for good and has no fallback of its own.
	Fallback *Fallback `json:"fallback,omitempty"`

	// lines holds the line of each field as read by Parse (keys: name, steps, fallback,
	// fallback.transfer_to, …); nil when the blueprint was not parsed.
	lines    map[string]int
	compiled bool
}

// Step is a tool step (Tool set) or a parallel group (Parallel set), never both. A group has
// no tool, input_mapping, output_key, default_value, timeout or retry of its own; it may have a
// condition and a fallback.
type Step struct {
	// Tool is the tool the step calls.
	Tool string `json:"tool,omitempty"`
	// InputMapping is the tool's arguments: a string starting with "$." is a path into the run
	// context, wherever it stands; anything else is a literal. Numbers read by Parse are
	// json.Number, so they are passed on as written.
	InputMapping map[string]any `json:"input_mapping,omitempty"`
	// Condition, when set, decides whether the step runs (see the package doc).
	Condition string `json:"condition,omitempty"`
	// OutputKey is the run-context key the step's result is kept under, for later steps.
	OutputKey string `json:"output_key,omitempty"`
	// DefaultValue is what OutputKey holds when the condition skips the step (null when it is
	// not written).
	DefaultValue json.RawMessage `json:"default_value,omitempty"`
	// Timeout bounds one attempt of the call, as a Go duration ("5s", "1500ms"); empty leaves
	// the tool's own.
	Timeout string `json:"timeout,omitempty"`
	// Retry, when set, overrides how many times the call is attempted.
	Retry *Retry `json:"retry,omitempty"`
	// Parallel makes the step a group: its members, tool steps, all run at once.
	Parallel []Step `json:"parallel,omitempty"`
	// Fallback is taken when this step fails for good or one of its paths finds nothing.
	Fallback *Fallback `json:"fallback,omitempty"`

	// Set by Parse.
	line  int
	lines map[string]int
	// Set by Compile.
	compiled bool
	id       string
	place    string
	mapping  map[string]*path
	reads    []string
	cond     *condition
	def      any
	timeout  time.Duration
}

// Retry overrides how many times a step's call is attempted.
type Retry struct {
	// MaxAttempts is the number of attempts, the first included: 1 to MaxAttempts.
	MaxAttempts int `json:"max_attempts"`
}

// Fallback says what becomes of a run whose step failed: a message for the user, a hand-off
// (TransferTo, such as human_agent), a step to run instead, or several of these. At least one
// is set.
type Fallback struct {
	// Message is said to the user.
	Message string `json:"message,omitempty"`
	// TransferTo names who the conversation is handed to, a token.
	TransferTo string `json:"transfer_to,omitempty"`
	// Step is run instead: a tool step with no parallel group and no fallback of its own.
	Step *Step `json:"step,omitempty"`
}

// Node is one element of a blueprint's top-level sequence. Step is the top-level step as
// written; for a parallel group, Group holds its members, which all run at once once the
// group's condition (Step.Condition) allows it.
type Node struct {
	Index int
	Step  *Step
	Group []*Step
}

// Nodes is b's top-level sequence, in the order its steps run.
func (b *Blueprint) Nodes() []Node {
	nodes := make([]Node, len(b.Steps))
	for i := range b.Steps {
		s := &b.Steps[i]
		nodes[i] = Node{Index: i, Step: s}
		for j := range s.Parallel {
			nodes[i].Group = append(nodes[i].Group, &s.Parallel[j])
		}
	}
	return nodes
}

// Compiled reports whether b's last Compile succeeded.
func (b *Blueprint) Compiled() bool { return b.compiled }

// ID is s's stable id, set by Compile: "1" for steps[1], "2.0" for steps[2].parallel[0],
// "1.fallback" for steps[1].fallback.step, "fallback" for the blueprint's fallback step.
func (s *Step) ID() string { return s.id }

// Place is where s is written, set by Compile: "steps[1]", "steps[2].parallel[0]",
// "steps[1].fallback.step", "fallback.step".
func (s *Step) Place() string { return s.place }

// IsGroup reports whether s is a parallel group.
func (s *Step) IsGroup() bool { return len(s.Parallel) > 0 }

// Default is s's default_value decoded (numbers as float64), nil when it has none or before
// Compile.
func (s *Step) Default() any { return s.def }

// TimeoutDuration bounds one attempt of s's call; 0 leaves the tool's own.
func (s *Step) TimeoutDuration() time.Duration { return s.timeout }

// Attempts is how many times s's call is attempted; 0 leaves the tool's own.
func (s *Step) Attempts() int {
	if s.Retry == nil {
		return 0
	}
	return s.Retry.MaxAttempts
}

// Paths lists every path s reads, in its input_mapping (by key, in order) and then in its
// condition, each once; nil before Compile.
func (s *Step) Paths() []string { return s.reads }

// CheckContext refuses a run context that is not JSON or is larger than MaxContextBytes as
// JSON; the error matches ErrContextTooLarge in the second case.
func CheckContext(ctx map[string]any) error {
	b, err := json.Marshal(ctx)
	if err != nil {
		return fmt.Errorf("blueprint: the run context is not JSON: %w", err)
	}
	if len(b) > MaxContextBytes {
		return fmt.Errorf("%w: %d bytes as JSON; MaxContextBytes is %d", ErrContextTooLarge, len(b), MaxContextBytes)
	}
	return nil
}

// UnmarshalJSON reads b as Parse does, refusing unknown fields. It does not compile it.
func (b *Blueprint) UnmarshalJSON(data []byte) error {
	p, err := Parse(data)
	if err != nil {
		return err
	}
	*b = *p
	return nil
}
