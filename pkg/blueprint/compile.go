package blueprint

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// outputKeyPattern is what an output_key may be.
var outputKeyPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// Compile checks b and compiles its paths and conditions, so that its steps can run. tools
// reports whether a tool exists; every step's tool, fallback steps' included, must (nil skips
// this check). It checks, for every step: that it is a tool step or a parallel group (of at most
// MaxParallel tool steps, not nested); its output_key (a token, not user_input, used once in
// the whole blueprint); every path of its input_mapping and condition (RFC 9535, reading
// user_input or what an earlier step writes, as the package doc says); its condition (the
// package's grammar); its timeout, retry and default_value (in their bounds); and for the
// blueprint, its name, at least one step and at most MaxSteps in all. The first problem is
// returned as an *Error naming the step's place, the field and the reason.
//
// Compile sets every step's ID and Place. It may be called again (after a change, or with
// another tool set); until one succeeds, the steps' run-time methods return ErrNotCompiled.
// It must not run concurrently with any other method of b.
func (b *Blueprint) Compile(tools func(name string) bool) error {
	b.compiled = false
	c := &compiler{b: b, tools: tools, writers: map[string]string{}, keys: map[string]string{}}
	if err := c.compile(); err != nil {
		return err
	}
	b.compiled = true
	return nil
}

// Kinds of steps, by where they stand.
type stepKind int

const (
	topStep stepKind = iota
	memberStep
	fallbackStep
)

type compiler struct {
	b     *Blueprint
	tools func(string) bool
	// writers maps each output_key to the place of the first step writing it, for messages.
	writers map[string]string
	// keys maps each output_key checked so far to its place.
	keys map[string]string
}

func (c *compiler) compile() error {
	b := c.b
	if err := protocol.CheckToolName("name", b.Name); err != nil {
		return c.blueprintErr("name", fieldReason(err))
	}
	if len(b.Description) > MaxTextBytes {
		return c.blueprintErr("description", fmt.Sprintf("is %d bytes; at most %d", len(b.Description), MaxTextBytes))
	}
	if len(b.Steps) == 0 {
		return c.blueprintErr("steps", "has no step; a blueprint has at least one")
	}
	n := 0
	for i := range b.Steps {
		n += countSteps(&b.Steps[i])
	}
	if b.Fallback != nil && b.Fallback.Step != nil {
		n += countSteps(b.Fallback.Step)
	}
	if n > MaxSteps {
		return c.blueprintErr("steps", fmt.Sprintf("has %d steps in all (group members and fallback steps counted); a blueprint has at most %d", n, MaxSteps))
	}
	for i := range b.Steps {
		c.noteWriters(&b.Steps[i], fmt.Sprintf("steps[%d]", i))
	}
	if b.Fallback != nil && b.Fallback.Step != nil {
		c.noteWriters(b.Fallback.Step, "fallback.step")
	}
	avail := map[string]bool{UserInput: true}
	for i := range b.Steps {
		s := &b.Steps[i]
		if err := c.step(s, fmt.Sprintf("steps[%d]", i), strconv.Itoa(i), topStep, avail); err != nil {
			return err
		}
		for _, k := range outputKeys(s) {
			avail[k] = true
		}
	}
	if b.Fallback != nil {
		return c.fallback(b.Fallback, nil, "", "", avail)
	}
	return nil
}

// step checks and compiles s, a step of kind at place, which may read the keys in avail.
func (c *compiler) step(s *Step, place, id string, kind stepKind, avail map[string]bool) error {
	s.compiled, s.id, s.place = false, id, place
	s.mapping, s.reads, s.cond, s.def, s.timeout = nil, nil, nil, nil, 0
	bad := func(field, reason string) error { return s.err(field, reason) }
	group := len(s.Parallel) > 0
	switch {
	case s.Parallel != nil && !group:
		return bad("parallel", "is empty; leave it out, or list the group's steps")
	case group && kind == memberStep:
		return bad("parallel", "a group's members are tool steps; groups do not nest")
	case group && kind == fallbackStep:
		return bad("parallel", "a fallback step is a tool step, not a group")
	case group && s.Tool != "":
		return bad("tool", "a step is a tool step or a parallel group, not both")
	case !group && s.Tool == "":
		return bad("tool", "is required: a step calls a tool, or is a parallel group")
	case kind == fallbackStep && s.Fallback != nil:
		return bad("fallback", "a fallback step has no fallback of its own")
	}
	if group {
		for _, f := range []struct {
			name string
			set  bool
		}{{"input_mapping", s.InputMapping != nil}, {"output_key", s.OutputKey != ""}, {"default_value", s.DefaultValue != nil},
			{"timeout", s.Timeout != ""}, {"retry", s.Retry != nil}} {
			if f.set {
				return bad(f.name, "a parallel group has none; give it to the group's steps")
			}
		}
		if len(s.Parallel) > MaxParallel {
			return bad("parallel", fmt.Sprintf("has %d steps; a group has at most %d", len(s.Parallel), MaxParallel))
		}
	} else {
		if err := protocol.CheckToolName("tool", s.Tool); err != nil {
			return bad("tool", fieldReason(err))
		}
		if c.tools != nil && !c.tools(s.Tool) {
			return bad("tool", fmt.Sprintf("%q is no known tool", s.Tool))
		}
	}
	if k := s.OutputKey; k != "" {
		switch {
		case !outputKeyPattern.MatchString(k):
			return bad("output_key", fmt.Sprintf("%q is no key: it starts with a letter or '_' and holds at most 64 letters, digits and '_'", shorten(k)))
		case k == UserInput:
			return bad("output_key", "user_input holds the blueprint's input; a step writes another key")
		case c.keys[k] != "":
			return bad("output_key", fmt.Sprintf("%q is used twice: by %s and %s", k, c.keys[k], place))
		}
		c.keys[k] = place
	}
	if err := c.mapping(s, avail); err != nil {
		return err
	}
	if s.Condition != "" {
		cond, err := compileCondition(s.Condition)
		if err != nil {
			return bad("condition", err.Error())
		}
		for _, p := range cond.paths {
			if reason := c.reads(p, avail); reason != "" {
				return bad("condition", reason)
			}
			s.addRead(p.text)
		}
		s.cond = cond
	}
	if s.DefaultValue != nil {
		switch {
		case s.OutputKey == "":
			return bad("default_value", "is what output_key holds when the step is skipped, and the step has no output_key")
		case len(s.DefaultValue) > MaxDefaultBytes:
			return bad("default_value", fmt.Sprintf("is %d bytes; at most %d", len(s.DefaultValue), MaxDefaultBytes))
		}
		if err := json.Unmarshal(s.DefaultValue, &s.def); err != nil {
			return bad("default_value", "is not JSON")
		}
	}
	if s.Timeout != "" {
		d, err := time.ParseDuration(s.Timeout)
		switch {
		case err != nil:
			return bad("timeout", fmt.Sprintf("%q is no duration: write one such as 5s or 1500ms", shorten(s.Timeout)))
		case d < MinTimeout || d > MaxTimeout:
			return bad("timeout", fmt.Sprintf("must be from %s to %s", MinTimeout, MaxTimeout))
		}
		s.timeout = d
	}
	if s.Retry != nil && (s.Retry.MaxAttempts < 1 || s.Retry.MaxAttempts > MaxAttempts) {
		return bad("retry.max_attempts", fmt.Sprintf("must be from 1 to %d", MaxAttempts))
	}
	for j := range s.Parallel {
		if err := c.step(&s.Parallel[j], fmt.Sprintf("%s.parallel[%d]", place, j), id+"."+strconv.Itoa(j), memberStep, avail); err != nil {
			return err
		}
	}
	if s.Fallback != nil {
		if err := c.fallback(s.Fallback, s, place, id, avail); err != nil {
			return err
		}
	}
	s.compiled = true
	return nil
}

// fallback checks f, the fallback of owner at place (nil and "" for the blueprint's own).
func (c *compiler) fallback(f *Fallback, owner *Step, place, id string, avail map[string]bool) error {
	bad := func(field, reason string) error {
		if owner != nil {
			return owner.err(field, reason)
		}
		return c.blueprintErr(field, reason)
	}
	if f.Message == "" && f.TransferTo == "" && f.Step == nil {
		return bad("fallback", "says nothing: a fallback has a message, a transfer_to or a step")
	}
	if len(f.Message) > MaxTextBytes {
		return bad("fallback.message", fmt.Sprintf("is %d bytes; at most %d", len(f.Message), MaxTextBytes))
	}
	if f.TransferTo != "" {
		if err := protocol.CheckID("transfer_to", f.TransferTo); err != nil {
			return bad("fallback.transfer_to", fieldReason(err))
		}
	}
	if f.Step == nil {
		return nil
	}
	stepID := "fallback"
	if id != "" {
		stepID = id + ".fallback"
	}
	return c.step(f.Step, join(place, "fallback.step"), stepID, fallbackStep, avail)
}

// mapping checks and compiles s's input_mapping.
func (c *compiler) mapping(s *Step, avail map[string]bool) error {
	if s.InputMapping == nil {
		return nil
	}
	if len(s.InputMapping) > MaxMappingEntries {
		return s.err("input_mapping", fmt.Sprintf("has %d arguments; at most %d", len(s.InputMapping), MaxMappingEntries))
	}
	if _, err := json.Marshal(s.InputMapping); err != nil {
		return s.err("input_mapping", "is not JSON: "+err.Error())
	}
	s.mapping = map[string]*path{}
	var walk func(v any, field string) error
	walk = func(v any, field string) error {
		switch v := v.(type) {
		case string:
			if !strings.HasPrefix(v, "$.") {
				return nil
			}
			if _, done := s.mapping[v]; done {
				return nil
			}
			p, err := compilePath(v)
			if err != nil {
				return s.err(field, err.Error())
			}
			if reason := c.reads(p, avail); reason != "" {
				return s.err(field, reason)
			}
			s.mapping[v] = p
			s.addRead(v)
		case map[string]any:
			for _, k := range slices.Sorted(maps.Keys(v)) {
				if err := walk(v[k], field+"."+protocol.Shorten(k, 64)); err != nil {
					return err
				}
			}
		case []any:
			for i, e := range v {
				if err := walk(e, fmt.Sprintf("%s[%d]", field, i)); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, k := range slices.Sorted(maps.Keys(s.InputMapping)) {
		if k == "" || !utf8.ValidString(k) {
			return s.err("input_mapping", "an argument's name is a non-empty string")
		}
		if err := walk(s.InputMapping[k], "input_mapping."+protocol.Shorten(k, 64)); err != nil {
			return err
		}
	}
	return nil
}

// reads is why p may not be read by a step that may read avail, "" when it may.
func (c *compiler) reads(p *path, avail map[string]bool) string {
	if avail[p.root] {
		return ""
	}
	keys := slices.Sorted(maps.Keys(avail))
	if w := c.writers[p.root]; w != "" {
		return fmt.Sprintf("%s reads %s, which %s writes, and that step does not run before this one (this step reads %s)", shorten(p.text), p.root, w, strings.Join(keys, ", "))
	}
	return fmt.Sprintf("%s reads %s, which neither user_input nor any earlier step provides (this step reads %s)", shorten(p.text), shorten(p.root), strings.Join(keys, ", "))
}

// noteWriters notes the place of each output_key's first writer among s and its parts.
func (c *compiler) noteWriters(s *Step, place string) {
	if k := s.OutputKey; k != "" && c.writers[k] == "" {
		c.writers[k] = place
	}
	for j := range s.Parallel {
		c.noteWriters(&s.Parallel[j], fmt.Sprintf("%s.parallel[%d]", place, j))
	}
	if s.Fallback != nil && s.Fallback.Step != nil {
		c.noteWriters(s.Fallback.Step, place+".fallback.step")
	}
}

// outputKeys lists the keys s and its parts write.
func outputKeys(s *Step) []string {
	var keys []string
	if s.OutputKey != "" {
		keys = append(keys, s.OutputKey)
	}
	for j := range s.Parallel {
		keys = append(keys, outputKeys(&s.Parallel[j])...)
	}
	if s.Fallback != nil && s.Fallback.Step != nil {
		keys = append(keys, outputKeys(s.Fallback.Step)...)
	}
	return keys
}

// countSteps counts s and the steps within it.
func countSteps(s *Step) int {
	n := 1
	for j := range s.Parallel {
		n += countSteps(&s.Parallel[j])
	}
	if s.Fallback != nil && s.Fallback.Step != nil {
		n += countSteps(s.Fallback.Step)
	}
	return n
}

func (s *Step) addRead(text string) {
	if !slices.Contains(s.reads, text) {
		s.reads = append(s.reads, text)
	}
}

// err is an *Error about field of s, with its line when s was parsed.
func (s *Step) err(field, reason string) error {
	return &Error{Step: s.place, Field: field, Line: lineOf(s.lines, field, s.line), Reason: reason}
}

func (c *compiler) blueprintErr(field, reason string) error {
	return &Error{Field: field, Line: lineOf(c.b.lines, field, c.b.lines[""]), Reason: reason}
}

// lineOf is the line of field in lines, or of the nearest field it is within, or dflt.
func lineOf(lines map[string]int, field string, dflt int) int {
	for field != "" {
		if l := lines[field]; l > 0 {
			return l
		}
		i := strings.LastIndexAny(field, ".[")
		if i < 0 {
			break
		}
		field = field[:i]
	}
	return dflt
}

// fieldReason is a protocol check's reason without its field's name.
func fieldReason(err error) string {
	var fe *protocol.FieldError
	if errors.As(err, &fe) {
		return fe.Reason
	}
	return err.Error()
}
