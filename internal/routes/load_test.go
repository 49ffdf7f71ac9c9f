package routes

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp/syntax"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// rule1 returns a file whose only rule (named r1, at line 3) has the given match and action
// lines: the match block starts at line 4 and the action block follows it.
func rule1(body ...string) string {
	return lines(append([]string{"version: 1.0", "rules:", "  - name: r1"}, body...)...)
}

// okAction is a valid action block, two lines long.
var okAction = []string{"    action:", "      http: {url: 'http://svc:8000/x'}"}

func withAction(match ...string) string {
	return rule1(append(match, okAction...)...)
}

func httpBlock(fields ...string) string {
	return rule1(append([]string{"    match: {tool_name: t}", "    action:", "      http:"}, fields...)...)
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		data string
		want string
	}{
		// The file as a whole.
		{"root is a list", "- a\n- b\n",
			"routes.yaml:1: a routes file must be a mapping with version and rules, got a list"},
		{"empty file", "", "routes.yaml:1: the file is empty; want version and rules"},
		{"comments only", "# nothing\n", "routes.yaml:1: the file is empty; want version and rules"},
		{"unknown top-level field", lines("version: 1.0", "rulez: []"),
			"routes.yaml:2: rulez: unknown field (did you mean rules?)"},
		{"unknown field without suggestion", lines("version: 1.0", "defaults: {}"),
			"routes.yaml:2: defaults: unknown field; want one of version, rules"},
		{"two documents", lines("version: 1.0", "rules: []", "---", "version: 1.0"),
			"routes.yaml:4: a routes file holds one YAML document; found another"},

		// version
		{"version missing", lines("rules:", "  - name: r1"),
			"routes.yaml:1: version: is required (supported: 1.0)"},
		{"version 2", lines("version: 2", "rules: []"),
			`routes.yaml:1: version: unsupported version "2" (supported: 1.0)`},
		{"version 1.1 string", lines(`version: "1.1"`, "rules: []"),
			`routes.yaml:1: version: unsupported version "1.1" (supported: 1.0)`},
		{"version is a list", lines("version: [1]", "rules: []"),
			"routes.yaml:1: version: unsupported version a list (supported: 1.0)"},

		// rules
		{"rules missing", lines("version: 1.0"),
			"routes.yaml:1: rules: is required and must list at least one rule"},
		{"rules null", lines("version: 1.0", "rules:"),
			"routes.yaml:2: rules: is required and must list at least one rule"},
		{"rules empty", lines("version: 1.0", "rules: []"),
			"routes.yaml:2: rules: must list at least one rule"},
		{"rules is a mapping", lines("version: 1.0", "rules: {a: 1}"),
			"routes.yaml:2: rules: must be a list of rules, got a mapping"},
		{"rule is a string", lines("version: 1.0", "rules:", "  - just a string"),
			"routes.yaml:3: rules[0]: must be a mapping with name, match and action, got a string"},

		// rule
		{"name missing", lines("version: 1.0", "rules:", "  - match: {tool_name: t}", okAction[0], okAction[1]),
			"routes.yaml:3: rules[0].name: is required"},
		{"name empty", lines("version: 1.0", "rules:", "  - name: ''", "    match: {tool_name: t}", okAction[0], okAction[1]),
			"routes.yaml:3: rules[0].name: must not be empty"},
		{"match missing", rule1(okAction...),
			"routes.yaml:3: rules[0].match: is required"},
		{"action missing", rule1("    match: {tool_name: t}"),
			"routes.yaml:3: rules[0].action: is required"},
		{"duplicate rule name", lines(
			"version: 1.0",
			"rules:",
			"  - name: r1",
			"    match: {tool_name: a}",
			"    action: {http: {url: 'http://s/a'}}",
			"  - name: r2",
			"    match: {tool_name: b}",
			"    action: {http: {url: 'http://s/b'}}",
			"  - name: r1",
			"    match: {tool_name: c}",
			"    action: {http: {url: 'http://s/c'}}",
		), `routes.yaml:9: rules[2].name: duplicate rule name "r1" (first at line 3)`},
		{"duplicate key", withAction("    match:", "      tool_name: a", "      tool_name: b"),
			"routes.yaml:6: rules[0].match.tool_name: duplicate key (first at line 5)"},
		{"unknown rule field", withAction("    match: {tool_name: t}", "    descripton: typo"),
			"routes.yaml:5: rules[0].descripton: unknown field (did you mean description?)"},
		{"merge key", withAction("    match: {<<: {tool_name: t}}"),
			`routes.yaml:4: rules[0].match["<<"]: merge keys are not supported`},

		// match
		{"tool_name missing", withAction("    match:", "      intent_contains: [a]"),
			"routes.yaml:4: rules[0].match.tool_name: is required"},
		{"tool_name null", withAction("    match:", "      tool_name:"),
			"routes.yaml:5: rules[0].match.tool_name: is required"},
		{"match null", withAction("    match:"),
			"routes.yaml:4: rules[0].match.tool_name: is required"},
		{"tool_name with a dot", withAction("    match:", "      tool_name: a.b"),
			`routes.yaml:5: rules[0].match.tool_name: "a.b" is not a valid tool name: want 1 to 64 of A-Z a-z 0-9 _ - (it becomes a NATS subject token)`},
		{"tool_name with a wildcard", withAction("    match: {tool_name: 'get>'}"),
			`routes.yaml:4: rules[0].match.tool_name: "get>" is not a valid tool name: want 1 to 64 of A-Z a-z 0-9 _ - (it becomes a NATS subject token)`},
		{"tool_name too long", withAction("    match: {tool_name: " + strings.Repeat("x", 65) + "}"),
			`routes.yaml:4: rules[0].match.tool_name: "` + strings.Repeat("x", 65) + `" is not a valid tool name: want 1 to 64 of A-Z a-z 0-9 _ - (it becomes a NATS subject token)`},
		{"tool_name is a list", withAction("    match: {tool_name: [a]}"),
			"routes.yaml:4: rules[0].match.tool_name: must be a string, got a list"},
		{"unknown match field", withAction("    match:", "      tool_nam: t"),
			"routes.yaml:5: rules[0].match.tool_nam: unknown field (did you mean tool_name?)"},
		{"match is a string", withAction("    match: t"),
			"routes.yaml:4: rules[0].match: must be a mapping, got a string"},
		{"intent_contains is a string", withAction("    match:", "      tool_name: t", "      intent_contains: abc"),
			"routes.yaml:6: rules[0].match.intent_contains: must be a list of strings, got a string"},
		{"intent_contains empty list", withAction("    match:", "      tool_name: t", "      intent_contains: []"),
			"routes.yaml:6: rules[0].match.intent_contains: must list at least one keyword (leave it out to match any intent)"},
		{"empty keyword", withAction("    match:", "      tool_name: t", "      intent_contains:", "        - a", "        - ''"),
			"routes.yaml:8: rules[0].match.intent_contains[1]: must not be empty"},
		{"keyword is a mapping", withAction("    match:", "      tool_name: t", "      intent_contains: [a, {b: c}]"),
			"routes.yaml:6: rules[0].match.intent_contains[1]: must be a string, got a mapping"},
		{"regex with lookahead", withAction("    match:", "      tool_name: t", "      intent_regex: 'a(?=b)'"),
			"routes.yaml:6: rules[0].match.intent_regex: is not a valid RE2 regexp (RE2 has no lookaround or backreferences): error parsing regexp: invalid or unsupported Perl syntax: `(?=`"},
		{"regex with backreference", withAction("    match:", "      tool_name: t", `      intent_regex: '(a)\1'`),
			"routes.yaml:6: rules[0].match.intent_regex: is not a valid RE2 regexp (RE2 has no lookaround or backreferences): error parsing regexp: invalid escape sequence: `\\1`"},
		{"unbalanced regex", withAction("    match:", "      tool_name: t", "      intent_regex: 'a)|(b'"),
			"routes.yaml:6: rules[0].match.intent_regex: is not a valid RE2 regexp: error parsing regexp: unexpected ): `a)|(b`"},
		{"regex repeat too large", withAction("    match:", "      tool_name: t", "      intent_regex: '(a{1000}){1000}'"),
			"routes.yaml:6: rules[0].match.intent_regex: is not a valid RE2 regexp: error parsing regexp: invalid repeat count: `{1000}`"},
		{"empty regex", withAction("    match:", "      tool_name: t", "      intent_regex: ''"),
			"routes.yaml:6: rules[0].match.intent_regex: must not be empty"},
		{"group name clashes with a group number", withAction("    match:", "      tool_name: t", "      intent_regex: '(?P<match_2>a)(b)'"),
			`routes.yaml:6: rules[0].match.intent_regex: groups 1 and 2 both give parameter "match_2"`},

		// action
		{"both http and grpc", rule1(
			"    match: {tool_name: t}",
			"    action:",
			"      http: {url: 'http://s/x'}",
			"      grpc: {service: s.S, method: M}",
		), "routes.yaml:5: rules[0].action: has http and grpc; want exactly one"},
		{"neither http nor grpc", rule1("    match: {tool_name: t}", "    action: {}"),
			"routes.yaml:5: rules[0].action: needs one of http, go, mcp, grpc"},
		{"action null", rule1("    match: {tool_name: t}", "    action:"),
			"routes.yaml:5: rules[0].action: needs one of http, go, mcp, grpc"},
		{"unknown action kind", rule1("    match: {tool_name: t}", "    action:", "      htp: {url: 'http://s/x'}"),
			"routes.yaml:6: rules[0].action.htp: unknown field (did you mean http?)"},
		{"http null", rule1("    match: {tool_name: t}", "    action:", "      http:"),
			"routes.yaml:6: rules[0].action.http.url: is required"},
		{"http and go", rule1("    match: {tool_name: t}", "    action: {http: {url: 'http://s/x'}, go: {}}"),
			"routes.yaml:5: rules[0].action: has http and go; want exactly one"},
		{"go with a url", rule1("    match: {tool_name: t}", "    action: {go: {url: 'http://s/x'}}"),
			"routes.yaml:5: rules[0].action.go.url: unknown field; want one of timeout_ms, retry"},
		{"grpc service missing", rule1("    match: {tool_name: t}", "    action:", "      grpc:", "        method: M"),
			"routes.yaml:6: rules[0].action.grpc.service: is required"},
		{"grpc method with a space", rule1("    match: {tool_name: t}", "    action:", "      grpc:", "        service: s.S", "        method: Get It"),
			"routes.yaml:8: rules[0].action.grpc.method: must not contain spaces or control characters"},

		// http
		{"url missing", httpBlock("        method: GET"),
			"routes.yaml:6: rules[0].action.http.url: is required"},
		{"env placeholder in host", httpBlock("        url: http://${env.HOST}/x"),
			"routes.yaml:7: rules[0].action.http.url: must not contain ${…} placeholders (only header values may use ${env.NAME})"},
		{"env placeholder in query", httpBlock("        url: 'http://h/x?key=${env.KEY}'"),
			"routes.yaml:7: rules[0].action.http.url: must not contain ${…} placeholders (only header values may use ${env.NAME})"},
		{"placeholder in host", httpBlock("        url: 'http://{host}/x'"),
			`routes.yaml:7: rules[0].action.http.url: is not a valid URL: invalid character "{" in host name`},
		{"placeholder in port", httpBlock("        url: 'http://h:{port}/x'"),
			`routes.yaml:7: rules[0].action.http.url: is not a valid URL: invalid port ":{port}" after host`},
		{"placeholder in query", httpBlock("        url: 'http://h/x?id={id}'"),
			"routes.yaml:7: rules[0].action.http.url: may hold {name} placeholders only in its path"},
		{"placeholder with a bad name", httpBlock("        url: 'http://h/x/{1id}'"),
			"routes.yaml:7: rules[0].action.http.url: placeholder {1id} is not {name} with name matching [A-Za-z_][A-Za-z0-9_]*"},
		{"unclosed placeholder", httpBlock("        url: 'http://h/x/{id'"),
			"routes.yaml:7: rules[0].action.http.url: has an unclosed { placeholder"},
		{"stray closing brace", httpBlock("        url: 'http://h/x/id}'"),
			"routes.yaml:7: rules[0].action.http.url: has a } that closes no {name} placeholder"},
		{"relative url", httpBlock("        url: /v1/x"),
			"routes.yaml:7: rules[0].action.http.url: must be an absolute http:// or https:// URL"},
		{"ftp url", httpBlock("        url: ftp://h/x"),
			"routes.yaml:7: rules[0].action.http.url: must be an absolute http:// or https:// URL"},
		{"url without host", httpBlock("        url: 'http://:8000/x'"),
			"routes.yaml:7: rules[0].action.http.url: must name a host"},
		{"url with credentials", httpBlock("        url: 'http://user:secret@h/x'"),
			"routes.yaml:7: rules[0].action.http.url: must not hold credentials; send them in a header with ${env.NAME}"},
		{"url with fragment", httpBlock("        url: 'http://h/x#top'"),
			"routes.yaml:7: rules[0].action.http.url: must not have a fragment (#…)"},
		{"url with port out of range", httpBlock("        url: 'http://h:70000/x'"),
			"routes.yaml:7: rules[0].action.http.url: port must be between 1 and 65535"},
		{"url with a space", httpBlock("        url: 'http://h/a b'"),
			"routes.yaml:7: rules[0].action.http.url: must not contain spaces or control characters"},
		{"bad method", httpBlock("        url: http://h/x", "        method: FETCH"),
			`routes.yaml:8: rules[0].action.http.method: must be one of GET, POST, PUT, PATCH, DELETE, got "FETCH"`},
		{"timeout 0", httpBlock("        url: http://h/x", "        timeout_ms: 0"),
			"routes.yaml:8: rules[0].action.http.timeout_ms: must be between 1 and 600000, got 0"},
		{"timeout too long", httpBlock("        url: http://h/x", "        timeout_ms: 600001"),
			"routes.yaml:8: rules[0].action.http.timeout_ms: must be between 1 and 600000, got 600001"},
		{"timeout as a string", httpBlock("        url: http://h/x", "        timeout_ms: '3000'"),
			"routes.yaml:8: rules[0].action.http.timeout_ms: must be an integer, got a string"},
		{"timeout as a float", httpBlock("        url: http://h/x", "        timeout_ms: 2.5"),
			"routes.yaml:8: rules[0].action.http.timeout_ms: must be an integer, got a number"},
		{"timeout overflows", httpBlock("        url: http://h/x", "        timeout_ms: 99999999999999999999"),
			"routes.yaml:8: rules[0].action.http.timeout_ms: must be an integer, got a number"},
		{"unknown http field", httpBlock("        url: http://h/x", "        timeout: 5"),
			"routes.yaml:8: rules[0].action.http.timeout: unknown field; want one of url, method, timeout_ms, headers, retry"},

		// headers
		{"headers is a list", httpBlock("        url: http://h/x", "        headers: [a]"),
			"routes.yaml:8: rules[0].action.http.headers: must be a mapping, got a list"},
		{"malformed env placeholder", httpBlock("        url: http://h/x", "        headers:", "          X-Token: Bearer ${env.}"),
			"routes.yaml:9: rules[0].action.http.headers.X-Token: has a malformed placeholder at byte offset 7; want ${env.NAME} with NAME matching [A-Za-z_][A-Za-z0-9_]*"},
		{"non-env placeholder", httpBlock("        url: http://h/x", "        headers:", "          X-Token: ${HOME}"),
			"routes.yaml:9: rules[0].action.http.headers.X-Token: has a malformed placeholder at byte offset 0; want ${env.NAME} with NAME matching [A-Za-z_][A-Za-z0-9_]*"},
		{"unclosed env placeholder", httpBlock("        url: http://h/x", "        headers:", "          X-Token: ok ${env.A} ${env.B"),
			"routes.yaml:9: rules[0].action.http.headers.X-Token: has an unclosed ${ at byte offset 12"},
		{"header value is a mapping", httpBlock("        url: http://h/x", "        headers:", "          X-Token: {a: b}"),
			"routes.yaml:9: rules[0].action.http.headers.X-Token: must be a string, got a mapping"},
		{"header value with a newline", httpBlock("        url: http://h/x", "        headers:", `          X-Token: "a\nb"`),
			"routes.yaml:9: rules[0].action.http.headers.X-Token: must not contain control characters (byte offset 1)"},
		{"header name with a space", httpBlock("        url: http://h/x", "        headers:", "          Bad Header: x"),
			`routes.yaml:9: rules[0].action.http.headers["Bad Header"]: is not a valid HTTP header name`},
		{"reserved header", httpBlock("        url: http://h/x", "        headers:", "          Content-Type: text/plain"),
			"routes.yaml:9: rules[0].action.http.headers.Content-Type: Content-Type is set by Hermes and cannot be configured"},
		{"reserved header in another case", httpBlock("        url: http://h/x", "        headers:", "          x-request-id: abc"),
			"routes.yaml:9: rules[0].action.http.headers.x-request-id: X-Request-ID is set by Hermes and cannot be configured"},
		{"traceparent", httpBlock("        url: http://h/x", "        headers:", "          Traceparent: abc"),
			"routes.yaml:9: rules[0].action.http.headers.Traceparent: traceparent is set by Hermes and cannot be configured"},
		{"header twice in different case", httpBlock("        url: http://h/x", "        headers:", "          X-A: a", "          x-a: b"),
			"routes.yaml:10: rules[0].action.http.headers.x-a: duplicate header (first at line 9; header names ignore case)"},

		// retry
		{"max_attempts 0", httpBlock("        url: http://h/x", "        retry: {max_attempts: 0}"),
			"routes.yaml:8: rules[0].action.http.retry.max_attempts: must be between 1 and 10, got 0"},
		{"max_attempts 11", httpBlock("        url: http://h/x", "        retry:", "          max_attempts: 11"),
			"routes.yaml:9: rules[0].action.http.retry.max_attempts: must be between 1 and 10, got 11"},
		{"backoff_factor below 1", httpBlock("        url: http://h/x", "        retry:", "          backoff_factor: 0.5"),
			"routes.yaml:9: rules[0].action.http.retry.backoff_factor: must be a number from 1 to 1000, got 0.5"},
		{"backoff_factor infinite", httpBlock("        url: http://h/x", "        retry:", "          backoff_factor: .inf"),
			"routes.yaml:9: rules[0].action.http.retry.backoff_factor: must be a number from 1 to 1000, got .inf"},
		{"backoff_factor as a string", httpBlock("        url: http://h/x", "        retry:", "          backoff_factor: fast"),
			"routes.yaml:9: rules[0].action.http.retry.backoff_factor: must be a number, got a string"},
		{"negative jitter", httpBlock("        url: http://h/x", "        retry:", "          jitter_ms: -1"),
			"routes.yaml:9: rules[0].action.http.retry.jitter_ms: must be between 0 and 300000, got -1"},
		{"initial interval 0", httpBlock("        url: http://h/x", "        retry:", "          initial_interval_ms: 0"),
			"routes.yaml:9: rules[0].action.http.retry.initial_interval_ms: must be between 1 and 300000, got 0"},
		{"max interval below initial", httpBlock("        url: http://h/x", "        retry:", "          initial_interval_ms: 500", "          max_interval_ms: 200"),
			"routes.yaml:10: rules[0].action.http.retry.max_interval_ms: must be at least initial_interval_ms (500), got 200"},
		{"max interval too long", httpBlock("        url: http://h/x", "        retry:", "          max_interval_ms: 300001"),
			"routes.yaml:9: rules[0].action.http.retry.max_interval_ms: must be between 1 and 300000, got 300001"},
		{"unknown retry field", httpBlock("        url: http://h/x", "        retry:", "          max_attempt: 3"),
			"routes.yaml:9: rules[0].action.http.retry.max_attempt: unknown field (did you mean max_attempts?)"},
		{"grpc retry checked too", rule1("    match: {tool_name: t}", "    action:", "      grpc: {service: s.S, method: M, retry: {max_attempts: 0}}"),
			"routes.yaml:6: rules[0].action.grpc.retry.max_attempts: must be between 1 and 10, got 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tab, err := Parse("routes.yaml", []byte(tt.data))
			if err == nil {
				t.Fatalf("Parse succeeded with %d rules; want error %q\n%s", len(tab.Rules), tt.want, tt.data)
			}
			if err.Error() != tt.want {
				t.Errorf("error:\n got %s\nwant %s", err, tt.want)
			}
			var le *LoadError
			if !errors.As(err, &le) || !errors.Is(err, ErrInvalid) {
				t.Errorf("error %T is not a *LoadError matching ErrInvalid", err)
			} else if le.File != "routes.yaml" || le.Line < 1 {
				t.Errorf("LoadError{File %q, Line %d}; want the file and a line", le.File, le.Line)
			}
		})
	}
}

func TestRegexpErrorUnwraps(t *testing.T) {
	_, err := Parse("r.yaml", []byte(withAction("    match: {tool_name: t, intent_regex: 'a(?=b)'}")))
	var se *syntax.Error
	if !errors.As(err, &se) || se.Code != syntax.ErrInvalidPerlOp {
		t.Errorf("error %v does not unwrap to the regexp syntax error", err)
	}
}

func TestSyntaxErrors(t *testing.T) {
	tests := []struct {
		name string
		data string
		want string
	}{
		{"mapping value on the first line", lines("version: 1.0: x", "rules: []"),
			"r.yaml:1: invalid YAML: mapping values are not allowed in this context"},
		{"mapping value later", lines("version: 1.0", "rules:", "  - name: a: b"),
			"r.yaml:3: invalid YAML: mapping values are not allowed in this context"},
		{"unclosed flow mapping", lines("version: 1.0", "rules:", "  - name: a", "    match: {tool_name: t", "    action: x"),
			"r.yaml:4: invalid YAML: did not find expected ',' or '}'"},
		{"unclosed flow sequence", lines("version: 1.0", "rules:", "  - name: a", "    match:", "      intent_contains: [a, b", "z: 1"),
			"r.yaml:5: invalid YAML: did not find expected ',' or ']'"},
		{"bad indentation", lines("version: 1.0", "rules:", "  - name: a", " oops: 1"),
			"r.yaml:4: invalid YAML: did not find expected key"},
		{"tab indentation", lines("version: 1.0", "rules:", "\t- name: a"),
			"r.yaml:3: invalid YAML: found character that cannot start any token"},
		{"unknown escape", lines("version: 1.0", "rules:", `  - name: "a\qb"`),
			"r.yaml:3: invalid YAML: found unknown escape character"},
		{"unclosed quote", lines("version: 1.0", "rules:", "  - name: 'abc", "  - name: b"),
			"r.yaml:3: invalid YAML: found unexpected end of stream"},
		{"unknown anchor", lines("version: 1.0", "rules:", "  - name: a", "    match: *nope"),
			"r.yaml:4: invalid YAML: unknown anchor 'nope' referenced"},
		{"control character", lines("version: 1.0", "rules:", "  - name: a\x01"),
			"r.yaml:3: character U+0001 is not allowed in YAML"},
		{"invalid UTF-8", lines("version: 1.0", "rules:", "", "  - name: \xff"),
			"r.yaml:4: invalid UTF-8; a routes file must be UTF-8 text"},
		{"syntax error in a second document", lines("version: 1.0", "rules: []", "---", "a: [1"),
			"r.yaml:4: invalid YAML: did not find expected ',' or ']'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("r.yaml", []byte(tt.data))
			if err == nil {
				t.Fatalf("Parse succeeded; want %q", tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error:\n got %s\nwant %s", err, tt.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not match ErrInvalid", err)
			}
		})
	}
}

func TestParseWithoutName(t *testing.T) {
	_, err := Parse("", []byte("version: 3\n"))
	if want := `<input>:1: version: unsupported version "3" (supported: 1.0)`; err == nil || err.Error() != want {
		t.Errorf("error = %v; want %s", err, want)
	}
}

func TestVersionForms(t *testing.T) {
	for _, v := range []string{"1", "1.0", `"1"`, `"1.0"`, `'1.0'`} {
		tab := mustParse(t, lines("version: "+v, "rules:", "  - name: r", "    match: {tool_name: t}", "    action: {grpc: {service: s, method: m}}"))
		if tab.Version != "1.0" {
			t.Errorf("version %s loaded as %q; want 1.0", v, tab.Version)
		}
	}
}

func TestDefaultsAndNormalisation(t *testing.T) {
	tab := mustParse(t, lines(
		"version: 1.0",
		"rules:",
		"  - name: defaults",
		"    match: {tool_name: t}",
		"    action: {http: {url: 'https://svc.example:8443/v1/users/{user_id}/orders/{order_id}?verbose=1'}}",
		"  - name: lower-case method, slow start",
		"    description: retry with a long first delay",
		"    match: {tool_name: u, intent_regex: '(?P<x>a)'}",
		"    action:",
		"      http:",
		"        url: http://svc/x",
		"        method: patch",
		"        headers: {X-Api-Key: '${env.API_KEY}', X-Mixed: 'v=${env.A_1}-${env.b}', X-Dollar: 'cost $5 {x}'}",
		"        retry: {initial_interval_ms: 20000, jitter_ms: 0, backoff_factor: 3}",
	))
	r := tab.Rules[0]
	want := protocol.Action{
		Kind:      protocol.ActionHTTP,
		TimeoutMS: protocol.DefaultTimeoutMS,
		Retry:     defaultRetry(),
		HTTP:      &protocol.HTTPAction{URL: "https://svc.example:8443/v1/users/{user_id}/orders/{order_id}?verbose=1", Method: "POST"},
	}
	if !reflect.DeepEqual(r.Action, want) {
		t.Errorf("defaults: got %+v %+v; want %+v %+v", r.Action, r.Action.HTTP, want, want.HTTP)
	}
	r = tab.Rules[1]
	if r.Name != "lower-case method, slow start" || r.Description != "retry with a long first delay" || r.Line != 6 {
		t.Errorf("rule = %q %q line %d", r.Name, r.Description, r.Line)
	}
	if r.Action.HTTP.Method != "PATCH" {
		t.Errorf("method = %q; want PATCH", r.Action.HTTP.Method)
	}
	wantRetry := protocol.RetryPolicy{MaxAttempts: 1, BackoffFactor: 3, InitialIntervalMS: 20000, MaxIntervalMS: 20000}
	if r.Action.Retry != wantRetry {
		t.Errorf("retry = %+v; want %+v (max interval raised to the initial one)", r.Action.Retry, wantRetry)
	}
	wantHeaders := map[string]string{"X-Api-Key": "${env.API_KEY}", "X-Mixed": "v=${env.A_1}-${env.b}", "X-Dollar": "cost $5 {x}"}
	if !reflect.DeepEqual(r.Action.HTTP.Headers, wantHeaders) {
		t.Errorf("headers = %v; want %v", r.Action.HTTP.Headers, wantHeaders)
	}
	if r.Match.IntentRegex != "(?P<x>a)" {
		t.Errorf("IntentRegex = %q; want it as written", r.Match.IntentRegex)
	}
	if !strings.HasPrefix(tab.Digest, "sha256:") || len(tab.Digest) != len("sha256:")+64 {
		t.Errorf("Digest = %q", tab.Digest)
	}
}

func TestGoAction(t *testing.T) {
	tab := mustParse(t, lines(
		"version: 1.0",
		"rules:",
		"  - name: weather_in_process",
		"    match: {tool_name: weather}",
		"    action: {go: {}}",
		"  - name: slow_go",
		"    match: {tool_name: weather, intent_contains: [slow]}",
		"    action: {go: {timeout_ms: 250, retry: {max_attempts: 2}}}",
		"  - name: weather_http",
		"    match: {tool_name: weather}",
		"    action: {http: {url: 'http://svc/w'}}",
	))
	want := protocol.Action{Kind: protocol.ActionGo, TimeoutMS: protocol.DefaultTimeoutMS, Retry: defaultRetry()}
	if !reflect.DeepEqual(tab.Rules[0].Action, want) {
		t.Errorf("go action = %+v; want %+v", tab.Rules[0].Action, want)
	}
	if a := tab.Rules[1].Action; a.TimeoutMS != 250 || a.Retry.MaxAttempts != 2 || a.HTTP != nil || a.GRPC != nil {
		t.Errorf("go action with timing = %+v", a)
	}
	if got := tab.KindsOf("weather"); !reflect.DeepEqual(got, []string{protocol.ActionGo, protocol.ActionHTTP}) {
		t.Errorf("KindsOf(weather) = %v", got)
	}
	if got := tab.KindsOf("nothing"); got != nil {
		t.Errorf("KindsOf(nothing) = %v", got)
	}
}

func TestAliasesAreFollowed(t *testing.T) {
	tab := mustParse(t, lines(
		"version: 1.0",
		"rules:",
		"  - name: a",
		"    match: {tool_name: t, intent_contains: &kw [x, y]}",
		"    action: &act {http: {url: 'http://s/a', timeout_ms: 1234}}",
		"  - name: b",
		"    match: {tool_name: u, intent_contains: *kw}",
		"    action: *act",
	))
	if got := tab.Rules[1]; got.Action.TimeoutMS != 1234 || !reflect.DeepEqual(got.Match.IntentContains, []string{"x", "y"}) {
		t.Errorf("aliased rule = %+v", got)
	}
}

func TestLoadFileErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing.yaml")); !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrInvalid) {
		t.Errorf("missing file: error %v; want fs.ErrNotExist", err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, []byte(strings.Repeat("#", MaxFileSize+1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); !errors.Is(err, ErrTooLarge) {
		t.Errorf("big file: error %v; want ErrTooLarge", err)
	}
	bad := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(bad, []byte(withAction("    match: {tool_name: a.b}")), 0o644); err != nil {
		t.Fatal(err)
	}
	var le *LoadError
	if _, err := Load(bad); !errors.As(err, &le) || le.File != bad || le.Line != 4 || le.Field != "rules[0].match.tool_name" {
		t.Errorf("bad file: error %#v; want a LoadError naming %s, line 4 and the field", err, bad)
	}
}

func TestErrorsDoNotLeakSecrets(t *testing.T) {
	const secret = "s3cr3t-t0ken"
	for _, data := range []string{
		httpBlock("        url: 'http://h/x?key=" + secret + "#frag'"),
		httpBlock("        url: 'http://user:" + secret + "@h/x'"),
		httpBlock("        url: 'http://h/x?key=" + secret + "&x=${env.A}'"),
		httpBlock("        url: http://h/x", "        headers: {X-Token: 'Bearer "+secret+" ${env.}'}"),
		httpBlock("        url: http://h/x", "        headers: {X-Token: \"Bearer "+secret+"\\n\"}"),
		httpBlock("        url: http://h/x", "        headers: {X-Token: 'Bearer ${"+secret+"'}"),
	} {
		_, err := Parse("routes.yaml", []byte(data))
		if err == nil {
			t.Fatalf("Parse succeeded:\n%s", data)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("error leaks the secret: %v", err)
		}
	}
}

// A credential written into a route — a header that carries one with literal text, a
// well-known secret shape in any header, a credential in the URL's query — is refused at load,
// pointing at ${env.NAME}, and the error never repeats it. Placeholders, and headers that carry
// none, load.
func TestLiteralCredentialsAreRefused(t *testing.T) {
	const secret = "sk-proj-abcdefghijklmnop"
	for _, data := range []string{
		httpBlock("        url: http://h/x", "        headers: {Authorization: 'Bearer "+secret+"'}"),
		httpBlock("        url: http://h/x", "        headers: {Authorization: 'Basic dXNlcjpwYXNzd29yZA=='}"),
		httpBlock("        url: http://h/x", "        headers: {X-Api-Key: 'abc123secretvalue'}"),
		httpBlock("        url: http://h/x", "        headers: {X-Auth-Token: 'Bearer ${env.A} plus-literal'}"),
		httpBlock("        url: http://h/x", "        headers: {X-Custom: '"+secret+"'}"),
		httpBlock("        url: http://h/x", "        headers: {Cookie: 'session=abcdef'}"),
		httpBlock("        url: 'http://h/x?api_key=abcdef123'"),
		httpBlock("        url: 'http://h/x?access_token=abcdef123&q=1'"),
		httpBlock("        url: 'http://h/x?key=abcdef123'"),
		httpBlock("        url: 'http://h/x?q=1;api_key=abcdef123'"),
		httpBlock("        url: http://h/x", "        headers: {X-Session-Context: 'eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abcdef123'}"),
	} {
		_, err := Parse("routes.yaml", []byte(data))
		if err == nil {
			t.Errorf("Parse succeeded:\n%s", data)
			continue
		}
		if !strings.Contains(err.Error(), "${env.NAME}") {
			t.Errorf("the error does not point at ${env.NAME}: %v", err)
		}
		for _, leak := range []string{secret, "dXNlcjpwYXNzd29yZA", "abc123secretvalue", "abcdef123", "plus-literal"} {
			if strings.Contains(err.Error(), leak) {
				t.Errorf("the error repeats the credential: %v", err)
			}
		}
	}
	for _, data := range []string{
		httpBlock("        url: http://h/x", "        headers: {Authorization: 'Bearer ${env.TOKEN}'}"),
		httpBlock("        url: http://h/x", "        headers: {X-Auth-Token: '${env.POLICY_TOKEN}', X-Tenant: acme, Accept-Language: zh-CN}"),
		httpBlock("        url: 'http://h/x?q=weather&units=metric&keyword=x'"),
	} {
		if _, err := Parse("routes.yaml", []byte(data)); err != nil {
			t.Errorf("refused: %v\n%s", err, data)
		}
	}
}

// An mcp action names a server of the workers' own configuration and the tool's name there;
// nothing else (no command, no URL: those come only from a worker's own file).
func TestMCPActions(t *testing.T) {
	tab := mustParse(t, lines(
		"version: 1.0",
		"rules:",
		"  - name: echo",
		"    match: {tool_name: everything__echo}",
		"    action: {mcp: {server: everything, tool: echo, timeout_ms: 2000, retry: {max_attempts: 3}}}",
	))
	a := tab.Rules[0].Action
	if a.Kind != protocol.ActionMCP || a.MCP == nil || a.MCP.Server != "everything" || a.MCP.Tool != "echo" || a.TimeoutMS != 2000 || a.Retry.MaxAttempts != 3 {
		t.Fatalf("mcp action = %+v %+v", a, a.MCP)
	}
	actionsRefused(t, map[string]string{
		"{mcp: {tool: echo}}":                        "server",
		"{mcp: {server: 'a b', tool: echo}}":         "server",
		"{mcp: {server: s}}":                         "tool",
		"{mcp: {server: s, tool: x, command: [sh]}}": "command",
		"{mcp: {server: s, tool: \"a\\u0000b\"}}":    "tool",
	})
}

// A grpc action names where the method is served (target), how (tls, server_name), and, for
// servers without reflection, a descriptor set by name; the seed's rule, with none of them,
// still loads.
func TestGRPCActionTargets(t *testing.T) {
	tab := mustParse(t, lines(
		"version: 1.0",
		"rules:",
		"  - name: profile",
		"    match: {tool_name: get_customer_profile}",
		"    action: {grpc: {service: customer.ProfileService, method: GetProfile, target: 'profile:50051', tls: true, server_name: profile.internal, descriptor_set: customer.pb, timeout_ms: 3000}}",
		"  - name: seed",
		"    match: {tool_name: get_customer_profile}",
		"    action: {grpc: {service: customer.ProfileService, method: GetProfile, timeout_ms: 3000}}",
	))
	g := tab.Rules[0].Action.GRPC
	if g == nil || g.Target != "profile:50051" || !g.TLS || g.ServerName != "profile.internal" || g.DescriptorSet != "customer.pb" {
		t.Fatalf("grpc action = %+v", g)
	}
	if g := tab.Rules[1].Action.GRPC; g.Target != "" || g.TLS {
		t.Errorf("the seed's rule = %+v", g)
	}
	actionsRefused(t, map[string]string{
		"{grpc: {service: s.S, method: M, target: 'no-port'}}":              "target",
		"{grpc: {service: s.S, method: M, target: 'h:99999'}}":              "target",
		"{grpc: {service: s.S, method: M, target: 'h:1', tls: maybe}}":      "tls",
		"{grpc: {service: s.S, method: M, descriptor_set: ../etc/passwd}}":  "descriptor_set",
		"{grpc: {service: s.S, method: M, descriptor_set: /tmp/x.pb}}":      "descriptor_set",
		"{grpc: {service: s.S, method: M, target: 'unix:///tmp/s.sock:1'}}": "target",
	})
}

// actionsRefused checks that each action (as YAML) is refused naming its field.
func actionsRefused(t *testing.T, refused map[string]string) {
	t.Helper()
	for doc, want := range refused {
		_, err := Parse("r.yaml", []byte(lines("version: 1.0", "rules:", "  - name: r", "    match: {tool_name: t}", "    action: "+doc)))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want an error naming %s", doc, err, want)
		}
	}
}

// TestReadOnly: read_only: true marks a rule's tool as one that only reads; anything but a
// boolean is refused, naming the field.
func TestReadOnly(t *testing.T) {
	tab, err := Parse("routes.yaml", []byte(rule1("    read_only: true", "    match: {tool_name: t}", okAction[0], okAction[1])))
	if err != nil {
		t.Fatal(err)
	}
	if r, _, ok := tab.Match("t", ""); !ok || !r.ReadOnly {
		t.Fatalf("rule %+v, want read_only", r)
	}
	tab, err = Parse("routes.yaml", []byte(withAction("    match: {tool_name: t}")))
	if err != nil {
		t.Fatal(err)
	}
	if r, _, _ := tab.Match("t", ""); r.ReadOnly {
		t.Fatal("a rule without read_only reads only")
	}
	for _, v := range []string{`"yes"`, "1", "[true]"} {
		_, err := Parse("routes.yaml", []byte(rule1("    read_only: "+v, "    match: {tool_name: t}", okAction[0], okAction[1])))
		if err == nil || !strings.Contains(err.Error(), "rules[0].read_only: must be true or false") {
			t.Errorf("read_only: %s: %v", v, err)
		}
	}
}
