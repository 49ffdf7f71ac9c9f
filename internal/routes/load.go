package routes

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// SupportedVersion is the routes file version this package reads. A file may write it as 1,
// 1.0, "1" or "1.0".
const SupportedVersion = "1.0"

// Field names, as allowed in each mapping of a routes file.
var (
	topFields    = []string{"version", "rules"}
	ruleFields   = []string{"name", "description", "read_only", "match", "action"}
	matchFields  = []string{"tool_name", "intent_contains", "intent_regex"}
	actionFields = []string{"http", "go", "mcp", "grpc"}
)

// toolNamePattern is what a tool name may be: it becomes a NATS subject token.
var toolNamePattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Load reads and validates the routes file at path. A file that cannot be read yields the
// underlying error (errors.Is(err, fs.ErrNotExist) works) or [ErrTooLarge]; an invalid file
// yields a [*LoadError] naming path, line and field.
func Load(path string) (*Table, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// readFile reads at most MaxFileSize bytes of path.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("routes: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("routes: %w", err)
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("routes: %s: %w (limit %d bytes)", path, ErrTooLarge, MaxFileSize)
	}
	return data, nil
}

// Parse validates a routes file held in data; name is used as the file name in the table and in
// errors. The error, if any, is a [*LoadError] describing the first problem in the file.
func Parse(name string, data []byte) (*Table, error) {
	d := &decoder{file: name}
	root, err := d.document(data)
	if err != nil {
		return nil, err
	}
	if root = resolve(root); root.Kind != yaml.MappingNode {
		return nil, d.errorf(root.Line, "", "a routes file must be a mapping with version and rules, got %s", kindOf(root))
	}
	top, err := d.mapping(root, "", root.Line, topFields)
	if err != nil {
		return nil, err
	}
	version, err := d.version(top)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	t := &Table{File: name, Version: version, Digest: "sha256:" + hex.EncodeToString(sum[:])}

	e, ok := top.present("rules")
	if !ok {
		return nil, d.errorf(top.missingLine("rules"), "rules", "is required and must list at least one rule")
	}
	seq := resolve(e.value)
	if seq.Kind != yaml.SequenceNode {
		return nil, d.errorf(e.key.Line, "rules", "must be a list of rules, got %s", kindOf(seq))
	}
	if len(seq.Content) == 0 {
		return nil, d.errorf(e.key.Line, "rules", "must list at least one rule")
	}
	t.Rules = make([]Rule, 0, len(seq.Content))
	firstLine := make(map[string]int, len(seq.Content)) // rule name → line of its first use
	for i, item := range seq.Content {
		path := fmt.Sprintf("rules[%d]", i)
		r, err := d.rule(item, path)
		if err != nil {
			return nil, err
		}
		if prev, dup := firstLine[r.Name]; dup {
			return nil, d.errorf(r.nameLine, path+".name", "duplicate rule name %q (first at line %d)", r.Name, prev)
		}
		firstLine[r.Name] = r.nameLine
		t.Rules = append(t.Rules, r.Rule)
	}
	t.index()
	return t, nil
}

// version checks the version field and returns it in canonical form.
func (d *decoder) version(top fields) (string, error) {
	e, ok := top.present("version")
	if !ok {
		return "", d.errorf(top.missingLine("version"), "version", "is required (supported: %s)", SupportedVersion)
	}
	v := resolve(e.value)
	if v.Kind == yaml.ScalarNode && (v.Tag == "!!int" || v.Tag == "!!float" || v.Tag == "!!str") &&
		(v.Value == "1" || v.Value == "1.0") {
		return SupportedVersion, nil
	}
	got := kindOf(v)
	if v.Kind == yaml.ScalarNode {
		got = fmt.Sprintf("%q", truncate(v.Value, 32))
	}
	return "", d.errorf(e.key.Line, "version", "unsupported version %s (supported: %s)", got, SupportedVersion)
}

// parsedRule is a rule with the line of its name, for duplicate checks.
type parsedRule struct {
	Rule
	nameLine int
}

// rule decodes one element of rules.
func (d *decoder) rule(n *yaml.Node, path string) (parsedRule, error) {
	n = resolve(n)
	var r parsedRule
	r.Line = n.Line
	if n.Kind != yaml.MappingNode {
		return r, d.errorf(n.Line, path, "must be a mapping with name, match and action, got %s", kindOf(n))
	}
	f, err := d.mapping(n, path, n.Line, ruleFields)
	if err != nil {
		return r, err
	}
	if r.Name, r.nameLine, err = d.str(f, "name", true); err != nil {
		return r, err
	}
	if strings.ContainsFunc(r.Name, isControl) {
		return r, d.errorf(r.nameLine, path+".name", "must not contain control characters")
	}
	if r.Description, err = d.text(f, "description"); err != nil {
		return r, err
	}
	if r.ReadOnly, err = d.boolean(f, "read_only", path+".read_only"); err != nil {
		return r, err
	}
	if !f.has("match") {
		return r, d.errorf(f.line, path+".match", "is required")
	}
	if r.Match, err = d.match(f.byKey["match"], path+".match"); err != nil {
		return r, err
	}
	if !f.has("action") {
		return r, d.errorf(f.line, path+".action", "is required")
	}
	if r.Action, err = d.action(f.byKey["action"], path+".action"); err != nil {
		return r, err
	}
	return r, nil
}

// match decodes a rule's match block.
func (d *decoder) match(e entry, path string) (Match, error) {
	var m Match
	f, err := d.mapping(e.value, path, e.key.Line, matchFields)
	if err != nil {
		return m, err
	}
	name, line, err := d.str(f, "tool_name", true)
	if err != nil {
		return m, err
	}
	if !toolNamePattern.MatchString(name) {
		return m, d.errorf(line, path+".tool_name",
			"%q is not a valid tool name: want 1 to 64 of A-Z a-z 0-9 _ - (it becomes a NATS subject token)", truncate(name, 80))
	}
	m.ToolName = name

	if m.IntentContains, err = d.keywords(f, path+".intent_contains"); err != nil {
		return m, err
	}

	pattern, line, err := d.str(f, "intent_regex", false)
	if err != nil {
		return m, err
	}
	if pattern != "" {
		re, params, err := compileIntentRegex(pattern)
		if err != nil {
			return m, &LoadError{File: d.file, Line: line, Field: path + ".intent_regex", Reason: err.Error(), Err: err}
		}
		m.IntentRegex, m.re, m.paramNames = pattern, re, params
	}
	return m, nil
}

// keywords decodes intent_contains: a non-empty list of non-empty strings.
func (d *decoder) keywords(f fields, path string) ([]string, error) {
	e, ok := f.present("intent_contains")
	if !ok {
		return nil, nil
	}
	seq := resolve(e.value)
	if seq.Kind != yaml.SequenceNode {
		return nil, d.errorf(e.key.Line, path, "must be a list of strings, got %s", kindOf(seq))
	}
	if len(seq.Content) == 0 {
		return nil, d.errorf(e.key.Line, path, "must list at least one keyword (leave it out to match any intent)")
	}
	out := make([]string, 0, len(seq.Content))
	for i, item := range seq.Content {
		item = resolve(item)
		field := fmt.Sprintf("%s[%d]", path, i)
		if item.Kind != yaml.ScalarNode || item.Tag == "!!null" {
			return nil, d.errorf(item.Line, field, "must be a string, got %s", kindOf(item))
		}
		if item.Value == "" {
			return nil, d.errorf(item.Line, field, "must not be empty")
		}
		out = append(out, item.Value)
	}
	return out, nil
}

// isControl reports whether r is an ASCII or C1 control character (tab included).
func isControl(r rune) bool {
	return r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f)
}

// truncate shortens s to at most n bytes (on a rune boundary) for error messages.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
