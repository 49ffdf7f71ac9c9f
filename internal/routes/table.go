package routes

import (
	"regexp"
	"slices"
	"strings"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Table is a loaded, validated routes file. It is immutable: all methods are safe for
// concurrent use and nothing reachable from it may be modified. A Table that did not come from
// [Load] or [Parse] matches nothing.
type Table struct {
	// File is the path the table was loaded from ("" for Parse without a name).
	File string
	// Version is the file format version, always "1.0" today.
	Version string
	// Digest is "sha256:" and the hex SHA-256 of the file's bytes; equal digests mean equal files.
	Digest string
	// Rules are in file order.
	Rules []Rule

	byTool    map[string][]int // tool name → indexes into Rules, in file order
	toolNames []string         // distinct tool names, sorted
}

// Rule is one entry of the routes file.
type Rule struct {
	// Name identifies the rule; it is unique in the file and reported as the route of a result.
	Name string
	// Description is free text.
	Description string
	// Line is the line of the rule in the file.
	Line int
	// ReadOnly says the tool only reads (read_only: true), for tools without a contract that
	// says so (effects: none): its calls may take the fast lane.
	ReadOnly bool
	// Match holds the rule's conditions.
	Match Match
	// Action is the resolved action, defaults applied.
	Action protocol.Action
}

// Match holds a rule's conditions as written in the file.
type Match struct {
	// ToolName must equal the call's tool name.
	ToolName string
	// IntentContains, when not empty, needs at least one keyword to be a substring of the intent.
	IntentContains []string
	// IntentRegex, when not empty, must match at the start of the intent. It is kept as written
	// in the file; the compiled form is Python-translated and anchored.
	IntentRegex string

	re         *regexp.Regexp // compiled IntentRegex, anchored at the start; nil without one
	paramNames []string       // paramNames[i] is the parameter name of group i (index 0 unused)
}

// Match returns the first rule, in file order, whose conditions all hold for a call of toolName
// with the given intent, and the parameters captured by the rule's intent_regex (nil when the
// rule has no capture groups). ok is false when no rule matches. The returned rule belongs to
// the table and must not be modified. Match allocates only the params of a rule whose regexp
// has capture groups; rules without intent_regex never allocate.
func (t *Table) Match(toolName, intent string) (rule *Rule, params map[string]string, ok bool) {
	if t == nil {
		return nil, nil, false
	}
	for _, i := range t.byTool[toolName] {
		r := &t.Rules[i]
		if params, ok := r.Match.match(intent); ok {
			return r, params, true
		}
	}
	return nil, nil, false
}

// ToolNames lists the distinct tool names the table routes, sorted. The slice is the caller's.
func (t *Table) ToolNames() []string {
	if t == nil {
		return nil
	}
	return slices.Clone(t.toolNames)
}

// KindsOf lists the action kinds of the rules routing toolName, in file order, each once.
func (t *Table) KindsOf(toolName string) []string {
	if t == nil {
		return nil
	}
	var kinds []string
	for _, i := range t.byTool[toolName] {
		if k := t.Rules[i].Action.Kind; !slices.Contains(kinds, k) {
			kinds = append(kinds, k)
		}
	}
	return kinds
}

// index builds the tool-name index; Parse calls it once the rules are final.
func (t *Table) index() {
	t.byTool = make(map[string][]int)
	for i := range t.Rules {
		name := t.Rules[i].Match.ToolName
		if _, seen := t.byTool[name]; !seen {
			t.toolNames = append(t.toolNames, name)
		}
		t.byTool[name] = append(t.byTool[name], i)
	}
	slices.Sort(t.toolNames)
}

// match reports whether the intent conditions hold (the tool name was matched by the index) and
// returns the captured parameters.
func (m *Match) match(intent string) (map[string]string, bool) {
	if len(m.IntentContains) > 0 && !containsAny(intent, m.IntentContains) {
		return nil, false
	}
	if m.re == nil {
		return nil, true
	}
	if len(m.paramNames) <= 1 {
		return nil, m.re.MatchString(intent)
	}
	loc := m.re.FindStringSubmatchIndex(intent)
	if loc == nil {
		return nil, false
	}
	params := make(map[string]string, len(m.paramNames)-1)
	for g := 1; g < len(m.paramNames); g++ {
		if start, end := loc[2*g], loc[2*g+1]; start >= 0 {
			params[m.paramNames[g]] = intent[start:end]
		}
	}
	return params, true
}

func containsAny(s string, keywords []string) bool {
	for _, k := range keywords {
		if strings.Contains(s, k) {
			return true
		}
	}
	return false
}
