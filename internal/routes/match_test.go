package routes

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// lines joins its arguments as the lines of a file, so that argument k is line k.
func lines(l ...string) string { return strings.Join(l, "\n") + "\n" }

func mustParse(t testing.TB, data string) *Table {
	t.Helper()
	tab, err := Parse("routes.yaml", []byte(data))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return tab
}

var matchRoutes = lines(
	`version: 1`,
	`rules:`,
	`  - name: contains_and_regex`,
	`    match: {tool_name: t, intent_contains: [alpha, beta], intent_regex: 'go (\w+)'}`,
	`    action: {http: {url: "http://s/1"}}`,
	`  - name: regex_named`,
	`    match: {tool_name: t, intent_regex: '(?P<verb>get|put) (?P<obj>\w+)(?: (now))?'}`,
	`    action: {http: {url: "http://s/2"}}`,
	`  - name: contains_only`,
	`    match: {tool_name: t, intent_contains: [alpha]}`,
	`    action: {http: {url: "http://s/3"}}`,
	`  - name: tool_only`,
	`    match: {tool_name: t}`,
	`    action: {http: {url: "http://s/4"}}`,
	`  - name: shadowed`,
	`    match: {tool_name: t}`,
	`    action: {http: {url: "http://s/5"}}`,
	`  - name: unicode_escape`,
	`    match: {tool_name: u, intent_regex: "[\\u4e00-\\u9fa5]+(\\d*)"}`,
	`    action: {http: {url: "http://s/6"}}`,
	`  - name: escaped_backslash`,
	`    match: {tool_name: u, intent_regex: '\\u0041'}`,
	`    action: {http: {url: "http://s/7"}}`,
	`  - name: optional_group`,
	`    match: {tool_name: v, intent_regex: '(a)|(b)'}`,
	`    action: {grpc: {service: s.S, method: M}}`,
	`  - name: unicode_word`,
	`    match: {tool_name: w, intent_regex: '查询(?P<name>\w+?)的保单'}`,
	`    action: {http: {url: "http://s/8"}}`,
	`  - name: unicode_digit`,
	`    match: {tool_name: d, intent_regex: '\D*(\d+)$'}`,
	`    action: {http: {url: "http://s/9"}}`,
	`  - name: unicode_space`,
	`    match: {tool_name: s, intent_regex: 'a\sb'}`,
	`    action: {http: {url: "http://s/10"}}`,
)

func TestMatch(t *testing.T) {
	tab := mustParse(t, matchRoutes)
	tests := []struct {
		name, tool, intent string
		wantRule           string
		wantParams         map[string]string
	}{
		{"all conditions hold", "t", "go fast, alpha", "contains_and_regex", map[string]string{"match_1": "fast"}},
		{"second keyword counts", "t", "go home beta", "contains_and_regex", map[string]string{"match_1": "home"}},
		{"regex only later in the intent does not count", "t", "alpha: go fast", "contains_only", nil},
		{"regex without keyword fails the rule", "t", "go fast", "tool_only", nil},
		{"named groups and an unnamed one", "t", "get milk now", "regex_named",
			map[string]string{"verb": "get", "obj": "milk", "match_3": "now"}},
		{"group that did not participate is omitted", "t", "put milk", "regex_named",
			map[string]string{"verb": "put", "obj": "milk"}},
		{"regex is anchored at the start", "t", "please get milk", "tool_only", nil},
		{"first match wins over later rules", "t", "", "tool_only", nil},
		{"unknown tool", "nope", "go fast alpha", "", nil},
		{"tool name is exact", "T", "anything", "", nil},
		{"python \\u escapes", "u", "中文42", "unicode_escape", map[string]string{"match_1": "42"}},
		{"empty group participates", "u", "中文", "unicode_escape", map[string]string{"match_1": ""}},
		{"escaped backslash then u is literal", "u", `\u0041`, "escaped_backslash", nil},
		{"escaped backslash does not become an escape", "u", "A", "", nil},
		{"alternative group 1", "v", "a", "optional_group", map[string]string{"match_1": "a"}},
		{"alternative group 2", "v", "b", "optional_group", map[string]string{"match_2": "b"}},
		{"python \\w is Unicode", "w", "查询王五的保单", "unicode_word", map[string]string{"name": "王五"}},
		{"python \\d is Unicode", "d", "编号１２３", "unicode_digit", map[string]string{"match_1": "１２３"}},
		{"python \\s is Unicode", "s", "a\u3000b", "unicode_space", nil},
		{"\\w does not match punctuation", "w", "查询，的保单", "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkMatch(t, tab, tt.tool, tt.intent, tt.wantRule, tt.wantParams)
		})
	}
}

func TestMatchNilTable(t *testing.T) {
	var tab *Table
	if r, p, ok := tab.Match("t", "x"); r != nil || p != nil || ok {
		t.Errorf("nil table matched: %v %v %v", r, p, ok)
	}
	if tab.ToolNames() != nil {
		t.Error("nil table has tool names")
	}
	if _, _, ok := (&Table{}).Match("t", "x"); ok {
		t.Error("zero table matched")
	}
}

func TestToolNames(t *testing.T) {
	tab := mustParse(t, matchRoutes)
	want := []string{"d", "s", "t", "u", "v", "w"}
	got := tab.ToolNames()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ToolNames() = %q; want %q", got, want)
	}
	got[0] = "changed"
	if tab.ToolNames()[0] != want[0] {
		t.Error("ToolNames returned the table's own slice")
	}
}

func TestMatchDoesNotAllocateWithoutRegexp(t *testing.T) {
	tab := mustParse(t, lines(
		"version: 1.0",
		"rules:",
		"  - name: keywords",
		"    match: {tool_name: t, intent_contains: [保单号, 我的保单]}",
		"    action: {http: {url: 'http://s/1'}}",
		"  - name: fallback",
		"    match: {tool_name: t}",
		"    action: {http: {url: 'http://s/2'}}",
		"  - name: keywords_only",
		"    match: {tool_name: u, intent_contains: [x]}",
		"    action: {http: {url: 'http://s/3'}}",
	))
	for _, call := range [][2]string{{"t", "我的保单号是多少"}, {"t", "nothing"}, {"u", "nothing"}, {"nope", "x"}} {
		if n := testing.AllocsPerRun(100, func() { tab.Match(call[0], call[1]) }); n != 0 {
			t.Errorf("Match(%q, %q) allocates %v times; want 0", call[0], call[1], n)
		}
	}
}

func TestTranslatePython(t *testing.T) {
	tests := []struct{ in, want string }{
		{`abc`, `abc`},
		{`[\u4e00-\u9fa5]`, `[\x{4e00}-\x{9fa5}]`},
		{`\u00e9\u00C9`, `\x{00e9}\x{00C9}`},
		{`\\u4e00`, `\\u4e00`},
		{`\\\u4e00`, `\\\x{4e00}`},
		{`\u12`, `\u12`},
		{`\u12g4`, `\u12g4`},
		{`\U0001F600`, `\x{0001F600}`},
		{`end\Z`, `end\z`},
		{`\d+\.\w`, `\p{Nd}+\.[_\p{L}\p{N}]`},
		{`[\w-]`, `[_\p{L}\p{N}-]`},
		{`[^\d\s]\S\W\D`, `[^\p{Nd}\t\n\v\f\r\x1c-\x1f\x85\p{Z}][^\t\n\v\f\r\x1c-\x1f\x85\p{Z}][^_\p{L}\p{N}]\P{Nd}`},
		{`[\W\S]`, `[\W\S]`},
		{`[]\w]\w`, `[]_\p{L}\p{N}][_\p{L}\p{N}]`},
		{`[^]\w]`, `[^]_\p{L}\p{N}]`},
		{`[[:alpha:]\w]\w`, `[[:alpha:]_\p{L}\p{N}][_\p{L}\p{N}]`},
		{`\[\w\]`, `\[[_\p{L}\p{N}]\]`},
		{`[\]\w]`, `[\]_\p{L}\p{N}]`},
		{`\\w`, `\\w`},
		{`[\Z]`, `[\Z]`},
		{`trailing\`, `trailing\`},
		{`(?P<name>x)`, `(?P<name>x)`},
	}
	for _, tt := range tests {
		if got := translatePython(tt.in); got != tt.want {
			t.Errorf("translatePython(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

// BenchmarkMatch measures Match on a table of 200 tools (3 rules each) plus the seed rules.
func BenchmarkMatch(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("version: 1.0\nrules:\n")
	for i := range 200 {
		for j, cond := range []string{
			`intent_regex: '^(?:find|get) (\w+) now'`,
			`intent_contains: [urgent, asap]`,
			``,
		} {
			fmt.Fprintf(&sb, "  - name: r%d_%d\n    match: {tool_name: tool_%d, %s}\n    action: {http: {url: \"http://s/%d\"}}\n", i, j, i, cond, i)
		}
	}
	seed := mustRead(b, "testdata/routes-insurance.yaml")
	_, seedRules, _ := strings.Cut(seed, "rules:\n")
	sb.WriteString(seedRules)
	tab := mustParse(b, sb.String())

	cases := []struct{ name, tool, intent string }{
		{"contains", "get_policy_number", "我的保单号是多少"},
		{"regex_capture", "get_policy_status", "查询王五的保单状态"},
		{"regex_fallthrough", "tool_7", "please find it now"},
		{"tool_only", "tool_150", "whatever the user said"},
		{"no_route", "unknown_tool", "anything"},
	}
	for _, c := range cases {
		if _, _, ok := tab.Match(c.tool, c.intent); ok == (c.name == "no_route") {
			b.Fatalf("%s: Match ok = %v", c.name, ok)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				tab.Match(c.tool, c.intent)
			}
		})
	}
}

func mustRead(t testing.TB, path string) string {
	t.Helper()
	data, err := readFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
