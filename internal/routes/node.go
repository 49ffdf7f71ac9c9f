package routes

import (
	"bytes"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// decoder walks yaml.Nodes, checking types and field names and turning every problem into a
// *LoadError that names the file, the line and the field path.
type decoder struct {
	file string
}

func (d *decoder) errorf(line int, field, format string, args ...any) *LoadError {
	return &LoadError{File: d.file, Line: line, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// document parses data as a single YAML document and returns its root node.
func (d *decoder) document(data []byte) (*yaml.Node, error) {
	docs, err := Documents(d.file, data)
	switch {
	case err != nil:
		return nil, err
	case len(docs) == 0:
		return nil, d.errorf(1, "", "the file is empty; want version and rules")
	case len(docs) > 1:
		return nil, d.errorf(docs[1].Line, "", "a routes file holds one YAML document; found another")
	}
	return docs[0], nil
}

// yamlLine finds the line in yaml.v3's error messages ("yaml: line 3: …").
var yamlLine = regexp.MustCompile(`^yaml: line ([0-9]+): (.*)$`)

// yamlParserProblems are the problems yaml.v3 reports from its parser (rather than its
// scanner); for those it prints a 0-based line.
var yamlParserProblems = map[string]bool{
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"did not find expected '-' indicator":    true,
	"did not find expected <document start>": true,
	"did not find expected <stream-start>":   true,
	"did not find expected key":              true,
	"did not find expected node content":     true,
	"found duplicate %TAG directive":         true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found undefined tag handle":             true,
}

// yamlUnknownAnchor matches yaml.v3's message for an alias to an undefined anchor.
var yamlUnknownAnchor = regexp.MustCompile(`^yaml: unknown anchor '(.*)' referenced$`)

// syntaxError turns a yaml.v3 error into a *LoadError with the best line yaml.v3 lets us find:
// it omits the line on the first line and prints 0-based lines for parser errors.
func (d *decoder) syntaxError(data []byte, err error) *LoadError {
	msg := err.Error()
	line := 1
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		n, _ := strconv.Atoi(m[1])
		msg = m[2]
		line = n
		if yamlParserProblems[msg] {
			line++
		}
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
		if m := yamlUnknownAnchor.FindStringSubmatch(err.Error()); m != nil {
			if i := bytes.Index(data, []byte("*"+m[1])); i >= 0 {
				line = 1 + bytes.Count(data[:i], []byte("\n"))
			}
		}
	}
	return &LoadError{File: d.file, Line: line, Reason: "invalid YAML: " + msg, Err: err}
}

// scanText finds what YAML refuses before parsing: invalid UTF-8 and non-printable characters.
// yaml.v3 reports those without a line.
func scanText(data []byte) (line int, reason string) {
	line = 1
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			return line, "invalid UTF-8; a routes file must be UTF-8 text"
		case r == '\n':
			line++
		case !yamlPrintable(r):
			return line, fmt.Sprintf("character %U is not allowed in YAML", r)
		}
		i += size
	}
	return 0, ""
}

// yamlPrintable reports whether YAML 1.2 allows r in a stream.
func yamlPrintable(r rune) bool {
	switch {
	case r == '\t', r == '\n', r == '\r', r == 0x85:
		return true
	case r >= 0x20 && r <= 0x7e:
		return true
	case r >= 0xa0 && r <= 0xd7ff, r >= 0xe000 && r <= 0xfffd, r >= 0x10000 && r <= 0x10ffff:
		return true
	}
	return false
}

// entry is one key/value pair of a mapping.
type entry struct {
	key, value *yaml.Node
}

// fields is a checked mapping: every key is a string, known (when a set of allowed keys was
// given) and unique.
type fields struct {
	path    string           // field path of the mapping itself
	line    int              // line to report for fields missing from the mapping
	entries []entry          // in file order
	byKey   map[string]entry // by key
}

// resolve follows aliases to the node they stand for.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && n.Alias != nil && i < 64; i++ {
		n = n.Alias
	}
	return n
}

// mapping checks that n is a mapping (null counts as an empty one) with string keys, each in
// allowed (any key when allowed is nil) and none repeated. line is reported for missing fields.
func (d *decoder) mapping(n *yaml.Node, path string, line int, allowed []string) (fields, error) {
	f := fields{path: path, line: line, byKey: map[string]entry{}}
	n = resolve(n)
	if isNull(n) {
		return f, nil
	}
	if n.Kind != yaml.MappingNode {
		return f, d.errorf(line, path, "must be a mapping, got %s", kindOf(n))
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Tag == "!!null" {
			return f, d.errorf(n.Content[i].Line, path, "keys must be strings, got %s", kindOf(k))
		}
		if k.Tag == "!!merge" {
			return f, d.errorf(k.Line, join(path, k.Value), "merge keys are not supported")
		}
		field := join(path, k.Value)
		if allowed != nil && !slices.Contains(allowed, k.Value) {
			return f, d.errorf(k.Line, field, "unknown field%s", suggest(k.Value, allowed))
		}
		if prev, dup := f.byKey[k.Value]; dup {
			return f, d.errorf(k.Line, field, "duplicate key (first at line %d)", prev.key.Line)
		}
		e := entry{key: k, value: v}
		f.byKey[k.Value] = e
		f.entries = append(f.entries, e)
	}
	return f, nil
}

// has reports whether the mapping has the key, even with a null value.
func (f fields) has(key string) bool {
	_, ok := f.byKey[key]
	return ok
}

// present returns the key's entry when it is there with a non-null value.
func (f fields) present(key string) (entry, bool) {
	e, ok := f.byKey[key]
	if !ok || isNull(resolve(e.value)) {
		return e, false
	}
	return e, true
}

// missingLine is the line to report when key is required: the key's own line when it is there
// with a null value, else the mapping's.
func (f fields) missingLine(key string) int {
	if e, ok := f.byKey[key]; ok {
		return e.key.Line
	}
	return f.line
}

// str returns the string value of key; a missing or null key is an error when required and ""
// otherwise. Any scalar is taken as its text; an empty string is an error.
func (d *decoder) str(f fields, key string, required bool) (string, int, error) {
	field := join(f.path, key)
	e, ok := f.present(key)
	if !ok {
		if required {
			return "", f.missingLine(key), d.errorf(f.missingLine(key), field, "is required")
		}
		return "", 0, nil
	}
	v := resolve(e.value)
	if v.Kind != yaml.ScalarNode {
		return "", e.key.Line, d.errorf(e.key.Line, field, "must be a string, got %s", kindOf(v))
	}
	if v.Value == "" {
		return "", e.key.Line, d.errorf(e.key.Line, field, "must not be empty")
	}
	return v.Value, e.key.Line, nil
}

// text returns the free-text value of key, "" when it is missing, null or empty.
func (d *decoder) text(f fields, key string) (string, error) {
	e, ok := f.present(key)
	if !ok {
		return "", nil
	}
	v := resolve(e.value)
	if v.Kind != yaml.ScalarNode {
		return "", d.errorf(e.key.Line, join(f.path, key), "must be a string, got %s", kindOf(v))
	}
	return v.Value, nil
}

// boolean decodes an optional true or false under key (false when absent).
func (d *decoder) boolean(f fields, key, path string) (bool, error) {
	e, ok := f.present(key)
	if !ok {
		return false, nil
	}
	v := resolve(e.value)
	if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" {
		return false, d.errorf(e.key.Line, path, "must be true or false, got %s", kindOf(v))
	}
	return v.Value == "true" || v.Value == "True" || v.Value == "TRUE", nil
}

// integer returns the integer value of key, def when it is missing or null, and checks that it
// lies in [lo, hi].
func (d *decoder) integer(f fields, key string, def, lo, hi int) (int, error) {
	field := join(f.path, key)
	e, ok := f.present(key)
	if !ok {
		return def, nil
	}
	v := resolve(e.value)
	if v.Kind != yaml.ScalarNode || v.Tag != "!!int" {
		return 0, d.errorf(e.key.Line, field, "must be an integer, got %s", kindOf(v))
	}
	var n int64
	if err := v.Decode(&n); err != nil || n < int64(lo) || n > int64(hi) {
		return 0, d.errorf(e.key.Line, field, "must be between %d and %d, got %s", lo, hi, v.Value)
	}
	return int(n), nil
}

// number returns the numeric value of key, def when it is missing or null, and checks that it
// is finite and at least lo.
func (d *decoder) number(f fields, key string, def, lo, hi float64) (float64, error) {
	field := join(f.path, key)
	e, ok := f.present(key)
	if !ok {
		return def, nil
	}
	v := resolve(e.value)
	if v.Kind != yaml.ScalarNode || (v.Tag != "!!int" && v.Tag != "!!float") {
		return 0, d.errorf(e.key.Line, field, "must be a number, got %s", kindOf(v))
	}
	var x float64
	if err := v.Decode(&x); err != nil || math.IsNaN(x) || math.IsInf(x, 0) || x < lo || x > hi {
		return 0, d.errorf(e.key.Line, field, "must be a number from %g to %g, got %s", lo, hi, v.Value)
	}
	return x, nil
}

// isNull reports whether n is absent or an explicit YAML null.
func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

// kindOf names a node's kind for error messages.
func kindOf(n *yaml.Node) string {
	if n == nil {
		return "nothing"
	}
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!str":
			return "a string"
		case "!!int":
			return "an integer"
		case "!!float":
			return "a number"
		case "!!bool":
			return "a boolean"
		case "!!null":
			return "null"
		}
		return "a scalar"
	}
	return "nothing"
}

// join appends key to a field path: "a.b", or a["x y"] for keys that would not read well.
func join(path, key string) string {
	if len(key) > 64 {
		key = key[:64] + "…"
	}
	simple := key != ""
	for i := 0; i < len(key) && simple; i++ {
		c := key[i]
		simple = c == '_' || c == '-' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
	}
	if !simple {
		return path + "[" + strconv.Quote(key) + "]"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// suggest names the allowed field closest to an unknown one, or lists them all.
func suggest(unknown string, allowed []string) string {
	best, bestDist := "", 3
	if len(unknown) <= 64 {
		for _, a := range allowed {
			if d := editDistance(strings.ToLower(unknown), a); d < bestDist {
				best, bestDist = a, d
			}
		}
	}
	if best != "" {
		return " (did you mean " + best + "?)"
	}
	return "; want one of " + strings.Join(allowed, ", ")
}

// editDistance is the Levenshtein distance between a and b, by bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
