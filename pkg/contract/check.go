package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	msg "golang.org/x/text/message"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Bounds of what a check says: how many problems it reports, and how long its text is (each
// part of a problem is bounded too: a name, a number, a pattern, an enum's values, a path).
const (
	maxProblems     = 8
	maxMessageBytes = 2 << 10 // the problems together
	maxHintBytes    = 3 << 10 // a hint: the problems, and what the fields are for
	maxPatternShown = 128
	maxEnumShown    = 8
	maxPathShown    = 8 // steps of a path; past that, its first and last ones
)

// ArgumentsError says how a call's arguments break the contract's input_schema: each problem
// names the field and the rule ("order_id: does not match ^ORD[0-9]{12}$").
type ArgumentsError struct {
	Tool     string
	Problems []string
	// Missing names the required top-level arguments that are absent.
	Missing []string
	// Hint tells the caller (an LLM, often) what to send instead.
	Hint string
}

func (e *ArgumentsError) Error() string {
	return brief(strings.Join(e.Problems, "; "), maxMessageBytes)
}

// CheckInput checks a call's arguments (a JSON object; empty counts as {}). It returns nil or
// an *ArgumentsError. Arguments that would take more than MaxCheckSteps to check, or that go
// deeper than MaxCheckDepth where the schema checks them, are refused unchecked, the problem
// naming the bound.
func (c *Compiled) CheckInput(args json.RawMessage) error {
	if c.input == nil {
		return nil
	}
	if len(bytes.TrimSpace(args)) == 0 {
		args = json.RawMessage(`{}`)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(args))
	if err != nil {
		return &ArgumentsError{Tool: c.Name, Problems: []string{"the arguments are not JSON"}, Hint: "send the arguments as a JSON object"}
	}
	problems := c.input.check(v, "(the arguments)")
	if len(problems) == 0 || !problems[0].cost {
		problems = append(problems, c.input.caseTwins(v)...)
	}
	if len(problems) == 0 {
		return nil
	}
	e := &ArgumentsError{Tool: c.Name}
	var hints []string
	for _, p := range problems {
		e.Problems = append(e.Problems, p.String())
		if len(p.at) == 1 && p.what == "is required" {
			e.Missing = append(e.Missing, p.at[0])
		}
		if d := c.input.descriptions[p.top()]; d != "" {
			hints = append(hints, brief(p.top(), maxNameBytes)+" is "+brief(d, 256))
		}
	}
	e.Hint = fmt.Sprintf("call %s again with arguments that follow its input_schema: %s", c.Name, e.Error())
	if len(hints) > 0 {
		e.Hint += " (" + strings.Join(dedupe(hints), "; ") + ")"
	}
	e.Hint = brief(e.Hint, maxHintBytes)
	return e
}

// Shaped reports whether the contract's answers are {"success": …} or {"failure": …}.
func (c *Compiled) Shaped() bool { return c.shaped }

// Verdict is what the contract says of one answer.
type Verdict struct {
	// Violation, when not empty, says how the answer breaks the contract.
	Violation string
	// Failure marks a declared failure, with the tool's code and hint.
	Failure bool
	Code    string
	Hint    string
}

// CheckOutput checks an answer the tool gave (its JSON, as given), with errorStatus when it came
// with an error status (HTTP 4xx/5xx). A shaped contract judges every answer: a success must
// come with a success status and match output_schema.success; a failure must carry an error
// code (^[A-Z0-9_]{1,64}$, not Hermes' own) and match output_schema.failure, exactly (an enum
// is compared byte for byte). An error status whose body has neither is not judged (a proxy's
// error page, say: the caller keeps its own verdict, and retries). A plain contract judges the
// answers of successful calls only. An answer that would cost more to check than a check may
// (MaxCheckSteps, MaxCheckDepth) is a violation that names the bound.
func (c *Compiled) CheckOutput(answer json.RawMessage, errorStatus bool) Verdict {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(answer))
	if err != nil {
		return Verdict{Violation: "the answer is not JSON"}
	}
	if !c.shaped {
		if errorStatus || c.plain == nil {
			return Verdict{}
		}
		return violation(c.plain.check(v, "(the answer)"))
	}
	obj, ok := v.(map[string]any)
	_, hasSuccess := obj["success"]
	_, hasFailure := obj["failure"]
	if errorStatus && !hasSuccess && !hasFailure {
		// An error status without the contract's shape (a proxy's 503 page, a 429): not an
		// answer of the tool's, the caller keeps its own verdict (retried as such).
		return Verdict{}
	}
	if !ok || len(obj) != 1 {
		return Verdict{Violation: `the answer must be {"success": …} or {"failure": {"error_code": …, "recovery_hint": …}}, got ` + describe(v)}
	}
	if s, ok := obj["success"]; ok {
		if errorStatus {
			return Verdict{Violation: "a success answer came with an error status"}
		}
		return c.checkSuccess(s)
	}
	f, ok := obj["failure"]
	if !ok {
		return Verdict{Violation: `the answer must be {"success": …} or {"failure": …}, got ` + describe(v)}
	}
	return c.checkFailure(f)
}

// CheckValue checks a value a tool returned as its success (a Go function's result): against
// output_schema.success when the contract is shaped, the plain schema otherwise.
func (c *Compiled) CheckValue(value json.RawMessage) Verdict {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(value))
	if err != nil {
		return Verdict{Violation: "the answer is not JSON"}
	}
	if !c.shaped {
		if c.plain == nil {
			return Verdict{}
		}
		return violation(c.plain.check(v, "(the answer)"))
	}
	return c.checkSuccess(v)
}

// CheckFailure checks a failure a tool reported as a code and a hint (a Go function's error):
// against output_schema.failure when the contract is shaped (a plain contract does not judge
// failures: the Verdict is empty).
func (c *Compiled) CheckFailure(code, hint string) Verdict {
	if !c.shaped {
		return Verdict{}
	}
	f := map[string]any{"error_code": code}
	if hint != "" {
		f["recovery_hint"] = hint
	}
	return c.checkFailure(f)
}

func (c *Compiled) checkSuccess(s any) Verdict {
	if c.success == nil {
		return Verdict{}
	}
	return violation(c.success.check(s, "success"))
}

func (c *Compiled) checkFailure(f any) Verdict {
	if c.failure != nil {
		if out := violation(c.failure.check(f, "failure")); out.Violation != "" {
			return out
		}
	}
	fm, ok := f.(map[string]any)
	if !ok {
		return Verdict{Violation: "failure must be an object with error_code and recovery_hint, got " + describe(f)}
	}
	code, _ := fm["error_code"].(string)
	switch {
	case code == "":
		return Verdict{Violation: "failure.error_code: is required (a string)"}
	case protocol.IsHermesCode(code):
		return Verdict{Violation: "failure.error_code: " + code + " is one of Hermes' own codes"}
	case !declarable(code):
		return Verdict{Violation: fmt.Sprintf("failure.error_code: %s is not an error code (^[A-Z0-9_]{1,64}$)", quote(code))}
	}
	hint, isString := fm["recovery_hint"].(string)
	if _, has := fm["recovery_hint"]; has && !isString {
		return Verdict{Violation: "failure.recovery_hint: must be a string"}
	}
	return Verdict{Failure: true, Code: code, Hint: hint}
}

func violation(ps []problem) Verdict {
	if len(ps) == 0 {
		return Verdict{}
	}
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return Verdict{Violation: brief(strings.Join(s, "; "), maxMessageBytes)}
}

// problem is one way a value breaks a schema.
type problem struct {
	at   []string // where, in the value
	root string   // what the value is called
	what string
	// cost: the value was not checked, it would cost more than a check may.
	cost bool
}

func (p problem) String() string {
	if len(p.at) == 0 {
		return p.root + ": " + p.what
	}
	path := p.at
	if len(path) > maxPathShown {
		// A deep path: its first steps and its last.
		path = slices.Concat(path[:3], []string{"…"}, path[len(path)-maxPathShown+4:])
	}
	at := make([]string, len(path))
	for i, tok := range path {
		at[i] = brief(tok, maxNameBytes) // names come from the value: shown briefly
	}
	if p.root == "success" || p.root == "failure" {
		return p.root + "." + strings.Join(at, ".") + ": " + p.what
	}
	return strings.Join(at, ".") + ": " + p.what
}

// maxNameBytes bounds a field name as a problem shows it.
const maxNameBytes = 64

// top is the top-level field the problem is in ("" for the whole value).
func (p problem) top() string {
	if len(p.at) == 0 {
		return ""
	}
	return p.at[0]
}

// caseTwins lists the arguments named as a field the schema names but for case (ORDER_ID
// beside order_id), at any depth the schema describes: a Go tool decoding JSON matches names
// regardless of case, so such an argument could reach it unchecked in the field's place.
func (s *schema) caseTwins(v any) []problem {
	var out []problem
	twins(v, s.s, nil, &out, 0)
	for i := range out {
		out[i].root = "(the arguments)"
	}
	return out
}

func twins(v any, s *jsonschema.Schema, path []string, out *[]problem, depth int) {
	if depth > 64 || len(*out) >= maxProblems {
		return
	}
	switch v := v.(type) {
	case map[string]any:
		declared := map[string][]*jsonschema.Schema{}
		for _, t := range closure(s) {
			for name, c := range t.Properties {
				declared[name] = append(declared[name], c)
			}
		}
		for _, k := range sortedKeys(v) {
			at := append(append([]string{}, path...), k)
			if subs, ok := declared[k]; ok {
				for _, c := range subs {
					twins(v[k], c, at, out, depth+1)
				}
				continue
			}
			for _, p := range sortedKeys(declared) {
				if strings.EqualFold(k, p) {
					*out = append(*out, problem{at: at, what: "differs from the field " + p + " only in case"})
				}
			}
		}
	case []any:
		for _, t := range closure(s) {
			items, _ := t.Items.(*jsonschema.Schema)
			for _, it := range []*jsonschema.Schema{t.Items2020, items} {
				if it == nil {
					continue
				}
				for i, e := range v {
					twins(e, it, append(append([]string{}, path...), strconv.Itoa(i)), out, depth+1)
				}
			}
		}
	}
}

// closure lists s and the schemas it applies to the same value ($ref, allOf, anyOf, …).
func closure(s *jsonschema.Schema) []*jsonschema.Schema {
	var out []*jsonschema.Schema
	seen := map[*jsonschema.Schema]bool{}
	var walk func(*jsonschema.Schema)
	walk = func(s *jsonschema.Schema) {
		if s == nil || seen[s] || len(out) > MaxSchemaExpansion {
			return
		}
		seen[s] = true
		out = append(out, s)
		for _, b := range sameValue(s) {
			walk(b)
		}
	}
	walk(s)
	return out
}

// check validates v and lists what is wrong (nil when nothing is).
func (s *schema) check(v any, root string) []problem {
	if s.patterns {
		// Patterns match strings of MaxPatternInput bytes at most: a longer string or name is
		// refused here, never let through by what a pattern would not say of it.
		if long := tooLong(v, nil); long != nil {
			return []problem{*long.in(root)}
		}
	}
	if _, err := s.plan.checkSteps(v, MaxCheckSteps); err != nil {
		return []problem{{root: root, what: err.Error(), cost: true}}
	}
	err := s.s.Validate(v)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return []problem{{root: root, what: brief(err.Error(), 256)}}
	}
	var out []problem
	seen := map[string]bool{}
	for _, leaf := range leaves(ve) {
		for _, p := range explain(leaf, root) {
			if key := p.String(); !seen[key] {
				seen[key] = true
				out = append(out, p)
			}
		}
	}
	// In the order of the fields' names (the validator's is a map's), at most maxProblems.
	slices.SortStableFunc(out, func(a, b problem) int { return strings.Compare(a.String(), b.String()) })
	return out[:min(len(out), maxProblems)]
}

// tooLong finds a string or a name longer than patterns match, at path.
func tooLong(v any, path []string) *problem {
	switch v := v.(type) {
	case string:
		if len(v) > MaxPatternInput {
			return &problem{at: path, what: fmt.Sprintf("is %d bytes long; this contract's patterns take at most %d", len(v), MaxPatternInput)}
		}
	case map[string]any:
		for _, k := range sortedKeys(v) {
			at := append(append([]string{}, path...), k)
			if len(k) > MaxPatternInput {
				return &problem{at: at, what: fmt.Sprintf("is a name %d bytes long; this contract's patterns take at most %d", len(k), MaxPatternInput)}
			}
			if p := tooLong(v[k], at); p != nil {
				return p
			}
		}
	case []any:
		for i, e := range v {
			if p := tooLong(e, append(append([]string{}, path...), strconv.Itoa(i))); p != nil {
				return p
			}
		}
	}
	return nil
}

func (p *problem) in(root string) *problem {
	p.root = root
	return p
}

// leaves returns the errors at the bottom of e's tree (the ones that say what is wrong).
func leaves(e *jsonschema.ValidationError) []*jsonschema.ValidationError {
	if len(e.Causes) == 0 {
		return []*jsonschema.ValidationError{e}
	}
	var out []*jsonschema.ValidationError
	for _, c := range e.Causes {
		out = append(out, leaves(c)...)
	}
	return out
}

// explain says what one leaf error means, one problem per field it names.
func explain(e *jsonschema.ValidationError, root string) []problem {
	at := e.InstanceLocation
	switch k := e.ErrorKind.(type) {
	case *kind.Required:
		out := make([]problem, len(k.Missing))
		for i, m := range k.Missing {
			out[i] = problem{at: append(append([]string{}, at...), m), root: root, what: "is required"}
		}
		return out
	case *kind.AdditionalProperties:
		out := make([]problem, len(k.Properties))
		for i, name := range k.Properties {
			out[i] = problem{at: append(append([]string{}, at...), name), root: root, what: "is not a field the contract names"}
		}
		return out
	}
	return []problem{{at: at, root: root, what: message(e)}}
}

var printer = msg.NewPrinter(language.English)

// message says what is wrong in the words a person or an LLM can act on.
func message(e *jsonschema.ValidationError) string {
	switch k := e.ErrorKind.(type) {
	case *kind.Pattern:
		return "does not match " + brief(k.Want, maxPatternShown)
	case *kind.Type:
		return fmt.Sprintf("is %s, want %s", article(k.Got), strings.Join(k.Want, " or "))
	case *kind.Enum:
		var want []string
		for i, w := range k.Want {
			if i == maxEnumShown {
				want = append(want, fmt.Sprintf("… (%d in all)", len(k.Want)))
				break
			}
			want = append(want, describe(w))
		}
		return fmt.Sprintf("is %s; must be one of %s", describe(k.Got), strings.Join(want, ", "))
	case *kind.Const:
		return fmt.Sprintf("is %s; must be %s", describe(k.Got), describe(k.Want))
	case *kind.MinLength:
		return fmt.Sprintf("is %d characters long; at least %d", k.Got, k.Want)
	case *kind.MaxLength:
		return fmt.Sprintf("is %d characters long; at most %d", k.Got, k.Want)
	case *kind.Minimum:
		return fmt.Sprintf("is %s; at least %s", rat(k.Got), rat(k.Want))
	case *kind.Maximum:
		return fmt.Sprintf("is %s; at most %s", rat(k.Got), rat(k.Want))
	case *kind.ExclusiveMinimum:
		return fmt.Sprintf("is %s; must be more than %s", rat(k.Got), rat(k.Want))
	case *kind.ExclusiveMaximum:
		return fmt.Sprintf("is %s; must be less than %s", rat(k.Got), rat(k.Want))
	case *kind.MultipleOf:
		return fmt.Sprintf("is %s; must be a multiple of %s", rat(k.Got), rat(k.Want))
	case *kind.MinItems:
		return fmt.Sprintf("has %d items; at least %d", k.Got, k.Want)
	case *kind.MaxItems:
		return fmt.Sprintf("has %d items; at most %d", k.Got, k.Want)
	case *kind.FalseSchema:
		return "is not allowed"
	}
	return brief(e.ErrorKind.LocalizedString(printer), 256)
}

func article(t string) string {
	switch t {
	case "object", "array", "integer":
		return "an " + t
	case "null":
		return "null"
	}
	return "a " + t
}

// maxNumberChars bounds a number as a message shows it.
const maxNumberChars = 32

// rat shows r within maxNumberChars: an integer of up to 30 digits exactly, anything else
// rounded to 12 significant digits (1e+999999, 0.333333333333).
func rat(r *big.Rat) string {
	if r == nil {
		return "?"
	}
	if r.IsInt() && r.Num().BitLen() <= 99 {
		return r.Num().String()
	}
	return sci(new(big.Float).SetPrec(96).SetRat(r))
}

// number shows a number as written in JSON within maxNumberChars.
func number(s string) string {
	if len(s) <= maxNumberChars {
		return s
	}
	f, _, err := new(big.Float).SetPrec(96).Parse(s, 10)
	if err != nil {
		return brief(s, maxNumberChars)
	}
	return sci(f)
}

// sci writes f with 12 significant digits, in e-notation when large or small. Text would
// write out every digit of a large exponent before rounding: the decimal exponent is taken
// apart first.
func sci(f *big.Float) string {
	exp2 := f.MantExp(nil)
	if f.Sign() == 0 || f.IsInf() || (exp2 > -1000 && exp2 < 1000) {
		return f.Text('g', 12)
	}
	exp10 := int64(math.Floor(float64(exp2-1) * math.Log10(2)))
	m := new(big.Float).SetPrec(96).Quo(new(big.Float).Abs(f), pow10(exp10))
	one, ten := big.NewFloat(1), big.NewFloat(10)
	for m.Cmp(ten) >= 0 {
		m.Quo(m, ten)
		exp10++
	}
	for m.Cmp(one) < 0 {
		m.Mul(m, ten)
		exp10--
	}
	mant := m.Text('g', 12)
	if mant == "10" { // 9.99…95 rounded up
		mant, exp10 = "1", exp10+1
	}
	if f.Sign() < 0 {
		mant = "-" + mant
	}
	sign := "+"
	if exp10 < 0 {
		sign, exp10 = "-", -exp10
	}
	return fmt.Sprintf("%se%s%02d", mant, sign, exp10)
}

// pow10 is 10^k to 96 bits.
func pow10(k int64) *big.Float {
	r, b := new(big.Float).SetPrec(96).SetInt64(1), new(big.Float).SetPrec(96).SetInt64(10)
	neg := k < 0
	if neg {
		k = -k
	}
	for ; k > 0; k >>= 1 {
		if k&1 == 1 {
			r.Mul(r, b)
		}
		b.Mul(b, b)
	}
	if neg {
		r.Quo(new(big.Float).SetPrec(96).SetInt64(1), r)
	}
	return r
}

// brief cuts s to at most n bytes (on a character's boundary), marking the cut with "…".
func brief(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return protocol.Shorten(s, n) + "…"
}

// describe shows a value briefly: strings quoted (so a trailing space shows), compound values
// by their kind.
func describe(v any) string {
	switch v := v.(type) {
	case string:
		return quote(v)
	case map[string]any:
		keys := sortedKeys(v)
		if len(keys) > 4 {
			keys = append(keys[:4], "…")
		}
		for i, k := range keys {
			keys[i] = protocol.Shorten(k, maxNameBytes)
		}
		return "an object with " + strings.Join(keys, ", ")
	case []any:
		return fmt.Sprintf("a list of %d", len(v))
	case nil:
		return "null"
	case json.Number:
		return number(string(v))
	}
	return brief(fmt.Sprint(v), maxNumberChars)
}

func quote(s string) string {
	b, _ := json.Marshal(protocol.Shorten(s, 64))
	return string(b)
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	out := s[:0]
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
