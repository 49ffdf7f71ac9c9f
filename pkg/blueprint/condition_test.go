package blueprint

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// decide compiles cond as the condition of a step that may read x and y, and evaluates it.
func decide(t *testing.T, cond string, ctx map[string]any) (Eval, error) {
	t.Helper()
	b := &Blueprint{Name: "c", Steps: []Step{{Tool: "t", Condition: cond}}}
	if err := b.Compile(nil); err != nil {
		t.Fatalf("%q: %v", cond, err)
	}
	return b.Steps[0].Allowed(ctx)
}

func TestConditions(t *testing.T) {
	ctx := runContext(t, `{"user_input": {"n": 50, "s": "paid", "yes": true, "no": false, "nil": null, "list": [1, 2], "q": "it's"}}`)
	for cond, want := range map[string]bool{
		"$.user_input.n >= 50":                    true,
		"$.user_input.n > 50":                     false,
		"$.user_input.n == 50":                    true,
		"$.user_input.n == 50.0":                  true,
		"$.user_input.n != 50":                    false,
		"$.user_input.n < 50.5":                   true,
		"$.user_input.n <= -1":                    false,
		"$.user_input.s == 'paid'":                true,
		`$.user_input.s == "paid"`:                true,
		"$.user_input.s < 'z'":                    true,
		"$.user_input.missing == null":            true,
		"$.user_input.missing != null":            false,
		"$.user_input.nil == null":                true,
		"null == $.user_input.missing":            true,
		"$.user_input.missing == 3":               false,
		"$.user_input.missing != 'x'":             true,
		"!($.user_input.s == 'paid')":             false,
		"!$.user_input.no":                        true,
		"$.user_input.yes":                        true,
		"($.user_input.yes)":                      true,
		"$.user_input.yes && $.user_input.no":     false,
		"$.user_input.no || $.user_input.yes":     true,
		"!($.user_input.no || !$.user_input.yes)": true,
		"$.user_input.list[1] == 2":               true,
		"$.user_input['s'] == 'paid'":             true,
		"$.user_input.s == '$.user_input.s'":      false,
		`$.user_input.s != "$.b" && true`:         true,
		`$.user_input.q == 'it\'s'`:               true,
		"true":                                    true,
		"1 < 2 && !false":                         true,
	} {
		ev, err := decide(t, cond, ctx)
		if err != nil || ev.Result != want {
			t.Errorf("%q: %+v %v, want %v", cond, ev, err, want)
		}
	}
	ev, err := decide(t, `$.user_input.s == '$.user_input.n' || $.user_input.n > 1`, ctx)
	if err != nil || !ev.Result || !reflect.DeepEqual(ev.Values, map[string]any{"$.user_input.s": "paid", "$.user_input.n": 50.0}) {
		t.Fatalf("a path in quotes is text: %+v %v", ev, err)
	}
}

func TestConditionsThatCannotBeEvaluated(t *testing.T) {
	ctx := runContext(t, `{"user_input": {"n": 1, "s": "x"}}`)
	for cond, want := range map[string]string{
		"$.user_input.missing < 3":       "invalid operation",
		"$.user_input.s > 3":             "invalid operation",
		"$.user_input.n":                 "$.user_input.n is used as true or false and finds a number",
		"$.user_input.missing":           "$.user_input.missing is used as true or false and finds nothing (null)",
		"!$.user_input.s":                "$.user_input.s is used as true or false and finds a string",
		"true && $.user_input.missing":   "$.user_input.missing is used as true or false",
		"$.user_input.missing || 1 == 1": "$.user_input.missing is used as true or false",
	} {
		ev, err := decide(t, cond, ctx)
		var ce *ConditionError
		if !errors.As(err, &ce) || !errors.Is(err, ErrCondition) || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "steps[0].condition ") || ev.Result {
			t.Errorf("%q: %+v %v, want %q", cond, ev, err, want)
		}
	}
}

func TestConditionsOutsideTheGrammarAreRefused(t *testing.T) {
	for cond, want := range map[string]string{
		"$.user_input.a ==":                       "does not compile",
		"len($.user_input.a) > 1":                 "calls a function",
		"$env":                                    "uses $env, which is no path or literal",
		"x == 1":                                  "uses x, which is no path or literal",
		"__p0 == 1":                               "uses __p0, which is no path or literal",
		"$.user_input.a == 1 || __p0":             "uses __p0, which is no path or literal",
		"$.user_input.a.b == 1 && 'abc'.x":        "reads a member or an index outside a path",
		"'abc'[0] == 'a'":                         "reads a member or an index outside a path",
		"$.user_input.a + 1 > 2":                  `uses "+"`,
		"$.user_input.a in [1, 2]":                `uses [1, 2]`,
		"$.user_input.a in $.user_input.b":        `uses "in"`,
		"$.user_input.a and true":                 `uses "and"`,
		"not $.user_input.a":                      `uses "not"`,
		"$.user_input.a ?? 1":                     `uses "??"`,
		"$.user_input.a matches 'x'":              `uses "matches"`,
		"$.user_input.a == nil":                   "uses nil; write null",
		"-$.user_input.a < 1":                     "uses - on something other than a number",
		"$.user_input.a ? true : false":           "uses",
		"let x = 1; x == 1":                       "uses",
		"'paid'":                                  "does not compile",
		"1 < 'a'":                                 "does not compile",
		"$.user_input[*] == 1":                    "may select several values",
		"$.user_input..a == 1":                    "may select several values",
		"$..a == 1":                               "does not begin with a name",
		"$.nope == 1":                             "$.nope reads nope, which neither user_input nor any earlier step provides",
		"$.user_input.a[ == 1":                    "is no JSONPath",
		"  ":                                      "is blank",
		strings.Repeat("true && ", 1000) + "true": "a condition has at most 4096",
	} {
		b := &Blueprint{Name: "c", Steps: []Step{{Tool: "t", Condition: cond}}}
		err := b.Compile(nil)
		var e *Error
		if !errors.As(err, &e) || e.Step != "steps[0]" || e.Field != "condition" || !strings.Contains(e.Reason, want) {
			t.Errorf("%q: got %v, want %q", cond, err, want)
		}
	}
}

func TestRewriteFindsPathsOutsideStrings(t *testing.T) {
	for src, want := range map[string][]string{
		`$.a.b == '$.c' || $.d["e f"][0] != "x\"$.g"`: {"$.a.b", `$.d["e f"][0]`},
		`($.a==1)&&($.b.c!=2)`:                        {"$.a", "$.b.c"},
		`$.订单.状态 == '已付'`:                             {"$.订单.状态"},
		`'unterminated $.a`:                           nil,
		"$.a == `$.b\\`":                              {"$.a"},
	} {
		_, got := rewrite(src)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%q: %q, want %q", src, got, want)
		}
	}
}
