package blueprint

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/file"
	"github.com/expr-lang/expr/parser"
	"github.com/expr-lang/expr/types"
	"github.com/expr-lang/expr/vm"
	"github.com/theory/jsonpath"
	"github.com/theory/jsonpath/spec"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// path is a compiled path: its text as written, its query, and the run-context key its first
// segment names.
type path struct {
	text     string
	query    *jsonpath.Path
	singular bool
	root     string
}

// compilePath parses text as an RFC 9535 query whose first segment names one key of the run
// context.
func compilePath(text string) (*path, error) {
	q, err := jsonpath.Parse(text)
	if err != nil {
		return nil, fmt.Errorf("%q is no JSONPath: %s", shorten(text), strings.TrimPrefix(err.Error(), "jsonpath: "))
	}
	segs := q.Query().Segments()
	var root string
	if len(segs) > 0 && !segs[0].IsDescendant() && len(segs[0].Selectors()) == 1 {
		if name, ok := segs[0].Selectors()[0].(spec.Name); ok {
			root = string(name)
		}
	}
	if root == "" {
		return nil, fmt.Errorf("%q does not begin with a name ($.user_input, $.<output_key>)", shorten(text))
	}
	return &path{text: text, query: q, singular: q.Query().Singular() != nil, root: root}, nil
}

// value is what a singular path selects in ctx, nil when nothing.
func (p *path) value(ctx map[string]any) any {
	nodes := p.query.Select(ctx)
	if len(nodes) == 0 {
		return nil
	}
	return nodes[0]
}

// condition is a compiled condition: its program, whose variable __p<i> stands for paths[i].
type condition struct {
	text    string
	paths   []*path
	program *vm.Program
}

// Names the compiled program uses besides the path variables.
const (
	nullName  = "null"
	truthName = "__truth"
	varPrefix = "__p"
)

func varName(i int) string { return varPrefix + strconv.Itoa(i) }

// compileCondition compiles text: its paths become variables, the rest must stay within the
// grammar of the package doc. Errors are the reason only.
func compileCondition(text string) (*condition, error) {
	if len(text) > MaxConditionBytes {
		return nil, fmt.Errorf("is %d bytes; a condition has at most %d", len(text), MaxConditionBytes)
	}
	if strings.TrimSpace(text) == "" {
		return nil, errors.New("is blank; leave it out rather than write none")
	}
	code, texts := rewrite(text)
	c := &condition{text: text}
	for _, t := range texts {
		p, err := compilePath(t)
		if err != nil {
			return nil, err
		}
		if !p.singular {
			return nil, fmt.Errorf("%q may select several values; a condition's path selects one ($.a.b, $.a[0])", shorten(t))
		}
		c.paths = append(c.paths, p)
	}
	tree, err := parser.Parse(code)
	if err != nil {
		return nil, fmt.Errorf("does not compile: %s", exprReason(err))
	}
	g := &grammar{vars: map[string]int{}, used: map[string]int{}}
	for i := range c.paths {
		g.vars[varName(i)] = i
	}
	ast.Walk(&tree.Node, g)
	if g.err != nil {
		return nil, g.err
	}
	for name, n := range g.used {
		if _, ok := g.vars[name]; ok && n != 1 {
			return nil, fmt.Errorf("uses %s, which is no path or literal", name)
		}
	}
	if id, ok := tree.Node.(*ast.IdentifierNode); ok {
		if i, ok := g.vars[id.Value]; ok {
			code = fmt.Sprintf("%s(%s, %d)", truthName, code, i)
		}
	}
	env := types.Map{nullName: types.Nil}
	for name := range g.vars {
		env[name] = types.Any
	}
	paths := c.paths
	truth := func(params ...any) (any, error) {
		b, ok := params[0].(bool)
		if !ok {
			return nil, fmt.Errorf("%s is used as true or false and finds %s", paths[params[1].(int)].text, describe(params[0]))
		}
		return b, nil
	}
	c.program, err = expr.Compile(code,
		expr.Env(env),
		expr.AsBool(),
		expr.Optimize(false),
		expr.DisableAllBuiltins(),
		expr.Function(truthName, truth, new(func(any, int) bool)),
		expr.Patch(truthPatch{vars: g.vars}),
	)
	if err != nil {
		return nil, fmt.Errorf("does not compile: %s", exprReason(err))
	}
	return c, nil
}

// eval decides c against ctx: its result, and the value each path found (nil for nothing).
func (c *condition) eval(ctx map[string]any) (bool, map[string]any, error) {
	env := make(map[string]any, len(c.paths)+1)
	env[nullName] = nil
	values := make(map[string]any, len(c.paths))
	for i, p := range c.paths {
		v := p.value(ctx)
		env[varName(i)] = number(v)
		values[p.text] = v
	}
	out, err := expr.Run(c.program, env)
	if err != nil {
		return false, values, errors.New(exprReason(err))
	}
	b, ok := out.(bool)
	if !ok {
		return false, values, fmt.Errorf("gives %s, not true or false", describe(out))
	}
	return b, values, nil
}

// number is v with a JSON number kept as written (json.Number, from a context decoded with
// UseNumber) made a float64, as a condition compares it; anything else as it is.
func number(v any) any {
	if n, ok := v.(json.Number); ok {
		if f, err := n.Float64(); err == nil {
			return f
		}
		return string(n)
	}
	return v
}

// rewrite replaces each path outside string literals in src with a variable __p<i>, and
// returns the paths' texts by i. A path starts "$." and runs through names, dots, '*' and
// bracketed selectors.
func rewrite(src string) (string, []string) {
	var b strings.Builder
	var texts []string
	for i := 0; i < len(src); {
		switch c := src[i]; {
		case c == '\'' || c == '"' || c == '`':
			j := stringEnd(src, i)
			b.WriteString(src[i:j])
			i = j
		case c == '$' && i+1 < len(src) && src[i+1] == '.':
			j := pathEnd(src, i)
			b.WriteString(varName(len(texts)))
			texts = append(texts, src[i:j])
			i = j
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String(), texts
}

// stringEnd is the index after the string literal opening at s[i], or len(s).
func stringEnd(s string, i int) int {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			if q != '`' { // a raw string has no escapes
				j++
			}
		case q:
			return j + 1
		}
	}
	return len(s)
}

// pathEnd is the index after the path starting at s[i].
func pathEnd(s string, i int) int {
	j := i + 1
	for j < len(s) {
		c := s[j]
		switch {
		case c == '.' || c == '*' || c == '_' || c >= 0x80 ||
			c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9':
			j++
		case c == '[':
			j = bracketEnd(s, j)
		default:
			return j
		}
	}
	return j
}

// bracketEnd is the index after the bracketed selector opening at s[i], or len(s).
func bracketEnd(s string, i int) int {
	depth := 0
	for j := i; j < len(s); {
		switch s[j] {
		case '\'', '"':
			j = stringEnd(s, j)
			continue
		case '[':
			depth++
		case ']':
			depth--
			if depth == 0 {
				return j + 1
			}
		}
		j++
	}
	return len(s)
}

// grammar refuses every node outside a condition's grammar, and counts the identifiers used.
type grammar struct {
	vars map[string]int
	used map[string]int
	err  error
}

// grammarHint says what a condition may hold.
const grammarHint = "a condition holds only paths, literals, ==, !=, <, >, <=, >=, &&, || and ! (not)"

var operators = map[string]bool{"==": true, "!=": true, "<": true, ">": true, "<=": true, ">=": true, "&&": true, "||": true}

func (g *grammar) Visit(node *ast.Node) {
	if g.err != nil {
		return
	}
	switch n := (*node).(type) {
	case *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode, *ast.StringNode:
	case *ast.IdentifierNode:
		if _, ok := g.vars[n.Value]; !ok && n.Value != nullName {
			g.err = fmt.Errorf("uses %s, which is no path or literal; a path starts with $. (dollar, dot)", shorten(n.Value))
		}
		g.used[n.Value]++
	case *ast.UnaryNode:
		switch n.Operator {
		case "!":
		case "-", "+":
			switch n.Node.(type) {
			case *ast.IntegerNode, *ast.FloatNode:
			default:
				g.err = fmt.Errorf("uses %s on something other than a number; a condition does no arithmetic", n.Operator)
			}
		default:
			g.err = fmt.Errorf("uses %q; "+grammarHint, n.Operator)
		}
	case *ast.BinaryNode:
		if !operators[n.Operator] {
			g.err = fmt.Errorf("uses %q; "+grammarHint, n.Operator)
		}
	case *ast.NilNode:
		g.err = errors.New("uses nil; write null")
	case *ast.CallNode, *ast.BuiltinNode:
		g.err = errors.New("calls a function; " + grammarHint)
	case *ast.MemberNode, *ast.ChainNode, *ast.SliceNode:
		g.err = errors.New("reads a member or an index outside a path; write it in the path ($.a.b[0])")
	default:
		g.err = fmt.Errorf("uses %s; "+grammarHint, shorten((*node).String()))
	}
}

// truthPatch makes each path variable beside &&, || or ! a call of __truth, which refuses a
// value that is not true or false.
type truthPatch struct{ vars map[string]int }

func (p truthPatch) Visit(node *ast.Node) {
	switch n := (*node).(type) {
	case *ast.BinaryNode:
		if n.Operator == "&&" || n.Operator == "||" {
			p.wrap(&n.Left)
			p.wrap(&n.Right)
		}
	case *ast.UnaryNode:
		if n.Operator == "!" {
			p.wrap(&n.Node)
		}
	}
}

func (p truthPatch) wrap(node *ast.Node) {
	id, ok := (*node).(*ast.IdentifierNode)
	if !ok {
		return
	}
	i, ok := p.vars[id.Value]
	if !ok {
		return
	}
	ast.Patch(node, &ast.CallNode{
		Callee:    &ast.IdentifierNode{Value: truthName},
		Arguments: []ast.Node{&ast.IdentifierNode{Value: id.Value}, &ast.IntegerNode{Value: i}},
	})
}

// exprReason is an expr error's message, without its snippet (whose positions are those of the
// rewritten text).
func exprReason(err error) string {
	var fe *file.Error
	if errors.As(err, &fe) {
		msg := fe.Message
		if fe.Prev != nil && msg == "" {
			msg = fe.Prev.Error()
		}
		return strings.ReplaceAll(msg, truthName, "a truth value")
	}
	return err.Error()
}

// describe names v's kind for an error: "nothing (null)", "a number", ….
func describe(v any) string {
	switch v.(type) {
	case nil:
		return "nothing (null)"
	case bool:
		return "a boolean"
	case float64, float32, int, int64, int32, uint, uint64, uint32, json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("a %T", v)
}

// shorten cuts text for an error.
func shorten(s string) string {
	if len(s) > 64 {
		return protocol.Shorten(s, 64) + "…"
	}
	return s
}
