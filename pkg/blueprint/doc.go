// Package blueprint is the model of a blueprint: a composed tool, run as ordered steps. Each
// step calls one tool with arguments mapped from the run context, or runs a group of such calls
// at once; a step may be skipped by its condition, and a fallback says what becomes of the run
// when a step fails for good (seed-examples/blueprint-check-and-urge.json).
//
// This package is the blueprint as written and what running it needs from the model: Parse
// reads one (JSON, or YAML converted to the same model), Compile checks and compiles it against
// the tool set, Nodes is the sequence to run, and a compiled Step maps its arguments (Inputs),
// decides its condition (Allowed) and says its bounds; InputSchema is its user_input as a JSON
// Schema, for the doors that offer it as a tool. Running it is the runner's part.
//
// # The run context
//
// A run's context is a JSON object: "user_input" holds the input the blueprint was called
// with, and each step's output_key holds that step's result once it ran (its default_value,
// or null, when its condition skipped it). Values are decoded JSON as encoding/json decodes it
// into any: map[string]any, []any, float64, string, bool and nil. The runner bounds the
// context's size with CheckContext (MaxContextBytes).
//
// # Paths
//
// A path is an RFC 9535 JSONPath query written from the context's root, starting "$.": its
// first segment names user_input or the output_key of a step that runs before the one reading
// it (for a member of a parallel group: a step before the group, never a sibling; for a step's
// fallback step: a step before that step; for the blueprint's fallback step: any step).
// Compile refuses every other path.
//
// # Input mappings
//
// A step's input_mapping is its tool's arguments as a JSON object. A string value starting
// with "$." is a path, wherever it stands (nested objects and arrays are walked); every other
// value is a literal, passed as written. A singular query ($.a.b, $.a[0]) gives the one value
// it selects; any other query ($.a[*].id, $..id) gives the JSON array of all it selects. A path
// that selects nothing is a *MissingError: the run takes the step's fallback, or the
// blueprint's.
//
// # Conditions
//
// A condition decides whether its step runs. Its grammar is small and closed:
//
//	condition  = or
//	or         = and { "||" and }
//	and        = unary { "&&" unary }
//	unary      = "!" unary | comparison
//	comparison = operand [ ( "==" | "!=" | "<" | ">" | "<=" | ">=" ) operand ]
//	operand    = path | string | number | "true" | "false" | "null" | "(" condition ")"
//
// Strings are single- or double-quoted, with backslash escapes; "$." inside a string is text,
// not a path. A path in a condition is singular and stands for the value it selects, or null
// when it selects nothing. Numbers compare by value whatever their form (a JSON 50 equals the
// literal 50); == and != compare any two values (a missing value equals null); ordering a
// value that is not a number or a string, or two values of different kinds, is a
// *ConditionError, as is a path used as a truth value (alone, or beside &&, || or !) that
// finds anything but true or false. Conditions are compiled once, by Compile, with
// github.com/expr-lang/expr, and every construct outside this grammar (function calls, member
// access, arithmetic, other operators) is refused there. Evaluating one takes time linear in
// its length: it has no loops and no calls.
//
// # Bounds
//
// A blueprint is at most MaxBytes as written and MaxSteps steps in all (group members and
// fallback steps counted); a group has at most MaxParallel members; a condition is at most
// MaxConditionBytes; an input_mapping has at most MaxMappingEntries keys; a default_value is
// at most MaxDefaultBytes; a timeout is from MinTimeout to MaxTimeout and a retry from 1 to
// MaxAttempts attempts. Every refusal is an *Error naming the step's place, the field, the
// line when the blueprint was read by Parse, and the reason.
//
// A compiled Blueprint is not changed by its run-time methods, which are safe for concurrent
// use.
package blueprint
