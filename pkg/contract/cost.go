package contract

import (
	"fmt"
	"slices"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// What a check costs is bounded twice. When a schema is compiled, checkCost refuses one that
// could make a value expensive whatever its size: subschemas that fan out, and recursions that
// check the part below each level two or more times (exponential in the value's depth). Before
// each check, checkSteps counts what checking that value would take under the schema, and the
// check is refused past MaxCheckSteps or MaxCheckDepth, before the validator runs.
//
// Both work on a costPlan: every subschema reachable from the root, with the subschemas it
// applies to the same value ($ref, allOf, anyOf, oneOf, not, if, then, else, dependentSchemas)
// and to the value's parts (properties, patternProperties, additionalProperties,
// unevaluatedProperties, propertyNames, prefixItems, items, contains, unevaluatedItems). Where
// the validator may or may not apply a subschema (anyOf after a match, then or else), the plan
// counts it as applied: its counts are upper bounds of the validator's. Hermes compiles
// without content assertions, so contentSchema is never applied.

// costPlan is what checking a value against one compiled schema may apply. It is read-only
// once built: safe for concurrent use.
type costPlan struct {
	nodes []costNode // nodes[0] is the root
	ids   map[*jsonschema.Schema]int
}

// costNode is one subschema of a plan.
type costNode struct {
	s *jsonschema.Schema
	// same lists the subschemas applied to the same value, as often as written.
	same []int
	// What is applied to the value's parts (-1: nothing).
	props    map[string]int // properties, by name
	patterns []patternPart  // patternProperties
	other    int            // additionalProperties, or unevaluatedProperties: a property none of the above takes
	names    int            // propertyNames: each property's name
	prefix   []int          // prefixItems (items as a list, before draft 2020-12)
	rest     int            // items, additionalItems or unevaluatedItems: the items after prefix
	contains int            // contains: every item
	// local is what one application takes apart from the value's parts: applySteps, what
	// comparing the values of enum and const with the value may take, and a number's
	// comparison with minimum, maximum or multipleOf.
	local int64

	// For the nodes a value is entered by (the root, what is applied to parts and to names):
	// what applying the node applies to one value, itself included, each with how often; and
	// the sums a check's steps are counted from.
	entry   bool
	closure []weighted
	apps    int64 // applications to the value: Σ counts
	work    int64 // Σ count × local
	perPart int64 // Σ count × (1 + patterns × patternSteps): what each key or item adds
	uniq    int64 // Σ count over subschemas with uniqueItems (each compares the items)
	name    int64 // Σ count × the work of propertyNames: what each key adds
}

type patternPart struct {
	re jsonschema.Regexp
	to int
}

// weighted is a node applied n times.
type weighted struct {
	id int
	n  int64
}

// Weights of a check's steps. A step is some 10 to 40 ns of the validator's time: comparing
// two strings, going over a key. Applying a subschema to a value takes 32 (the validator
// allocates its state for each application), and 4 more per level of the value it is
// applied at (its errors carry their path); comparing two numbers takes 64 (the validator
// reads both as exact rationals, each time); matching a pattern against a key, 4; going over
// a key where unevaluated properties or items are tracked, 16 more (each application copies
// and merges the keys); going over a string (copied and counted for each application), one
// per 4 bytes.
const (
	applySteps         = 32
	depthSteps         = 4
	numberCompareSteps = 64
	patternSteps       = 4
	unevaluatedSteps   = 16
	stringBytesPerStep = 4
)

// saturated stands for "more than can be counted"; sums and products stop there.
const saturated = int64(1) << 60

func addSat(a, b int64) int64 {
	if a > saturated-b {
		return saturated
	}
	return a + b
}

func mulSat(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a > saturated/b {
		return saturated
	}
	return a * b
}

// errTooIntricate refuses a schema whose cost takes too long to work out.
var errTooIntricate = fmt.Errorf("too intricate to bound what checking a value may take (more than %d steps to work it out)", maxPlanWork)

// maxPlanWork bounds the work of checkCost (steps of its walks).
const maxPlanWork = 4_000_000

// newCostPlan collects the subschemas reachable from root. It refuses a reference resolved
// as the value is checked ($dynamicRef to a $dynamicAnchor, $recursiveRef to a
// $recursiveAnchor): where it leads depends on the way there, which the plan cannot follow.
func newCostPlan(root *jsonschema.Schema) (*costPlan, error) {
	p := &costPlan{ids: map[*jsonschema.Schema]int{}}
	p.id(root)
	for i := 0; i < len(p.nodes); i++ { // p.nodes grows as fill finds subschemas
		if err := p.fill(i); err != nil {
			return nil, err
		}
	}
	p.nodes[0].entry = true
	for i := range p.nodes {
		n := &p.nodes[i]
		for _, to := range n.partTargets() {
			p.nodes[to].entry = true
		}
		if n.names >= 0 {
			p.nodes[n.names].entry = true
		}
	}
	return p, nil
}

func (p *costPlan) id(s *jsonschema.Schema) int {
	if s == nil {
		return -1
	}
	if id, ok := p.ids[s]; ok {
		return id
	}
	p.ids[s] = len(p.nodes)
	p.nodes = append(p.nodes, costNode{s: s, other: -1, names: -1, rest: -1, contains: -1})
	return len(p.nodes) - 1
}

func (p *costPlan) fill(i int) error {
	s := p.nodes[i].s
	if r := s.RecursiveRef; r != nil && r.RecursiveAnchor {
		return fmt.Errorf("$recursiveRef at %s is resolved as values are checked, which bounds nothing; write $ref", shortLocation(s.Location))
	}
	if d := s.DynamicRef; d != nil && d.Anchor != "" && d.Ref.DynamicAnchor == d.Anchor {
		return fmt.Errorf("$dynamicRef at %s is resolved as values are checked, which bounds nothing; write $ref", shortLocation(s.Location))
	}
	n := costNode{s: s, other: -1, names: -1, rest: -1, contains: -1, local: applySteps}
	same := []*jsonschema.Schema{s.Ref, s.RecursiveRef, s.Not, s.If, s.Then, s.Else}
	if s.DynamicRef != nil {
		same = append(same, s.DynamicRef.Ref)
	}
	same = append(append(append(same, s.AllOf...), s.AnyOf...), s.OneOf...)
	for _, k := range sortedKeys(s.DependentSchemas) {
		same = append(same, s.DependentSchemas[k])
	}
	for _, k := range sortedKeys(s.Dependencies) {
		if d, ok := s.Dependencies[k].(*jsonschema.Schema); ok {
			same = append(same, d)
		}
	}
	for _, b := range same {
		if b != nil {
			n.same = append(n.same, p.id(b))
		}
	}
	if len(s.Properties) > 0 {
		n.props = make(map[string]int, len(s.Properties))
		for _, k := range sortedKeys(s.Properties) {
			n.props[k] = p.id(s.Properties[k])
		}
	}
	res := make([]jsonschema.Regexp, 0, len(s.PatternProperties))
	for re := range s.PatternProperties {
		res = append(res, re)
	}
	slices.SortFunc(res, func(a, b jsonschema.Regexp) int { return strings.Compare(a.String(), b.String()) })
	for _, re := range res {
		n.patterns = append(n.patterns, patternPart{re: re, to: p.id(s.PatternProperties[re])})
	}
	if a, ok := s.AdditionalProperties.(*jsonschema.Schema); ok {
		n.other = p.id(a)
	} else if s.AdditionalProperties == nil {
		// Without additionalProperties, unevaluatedProperties takes what s does not.
		n.other = p.id(s.UnevaluatedProperties)
	}
	n.names = p.id(s.PropertyNames)
	for _, it := range s.PrefixItems {
		n.prefix = append(n.prefix, p.id(it))
	}
	switch items := s.Items.(type) {
	case *jsonschema.Schema:
		n.rest = p.id(items)
	case []*jsonschema.Schema:
		for _, it := range items {
			n.prefix = append(n.prefix, p.id(it))
		}
		if a, ok := s.AdditionalItems.(*jsonschema.Schema); ok {
			n.rest = p.id(a)
		}
	}
	if s.Items2020 != nil {
		n.rest = p.id(s.Items2020)
	}
	if _, itemsAll := s.Items.(*jsonschema.Schema); n.rest < 0 && !itemsAll && s.AdditionalItems == nil {
		// Without items for the rest, unevaluatedItems takes what s does not.
		n.rest = p.id(s.UnevaluatedItems)
	}
	n.contains = p.id(s.Contains)
	if s.Const != nil {
		n.local += valueSteps(*s.Const)
	}
	if s.Enum != nil {
		for _, v := range s.Enum.Values {
			n.local = addSat(n.local, valueSteps(v))
		}
	}
	if s.Minimum != nil || s.Maximum != nil || s.ExclusiveMinimum != nil || s.ExclusiveMaximum != nil || s.MultipleOf != nil {
		n.local += numberCompareSteps
	}
	p.nodes[i] = n
	return nil
}

// valueSteps is what comparing v with a value may take, or hashing it (uniqueItems): each
// node of it, a number as numberCompareSteps, a long string by its length.
func valueSteps(v any) int64 {
	switch v := v.(type) {
	case map[string]any:
		n := int64(1)
		for _, x := range v {
			n = addSat(n, valueSteps(x))
		}
		return n
	case []any:
		n := int64(1)
		for _, x := range v {
			n = addSat(n, valueSteps(x))
		}
		return n
	case string:
		return 1 + int64(len(v)/64)
	case bool, nil:
		return 1
	}
	return numberCompareSteps
}

// partTargets lists what n applies to the value's parts (not to names).
func (n *costNode) partTargets() []int {
	var out []int
	for _, k := range sortedKeys(n.props) {
		out = append(out, n.props[k])
	}
	for _, pp := range n.patterns {
		out = append(out, pp.to)
	}
	out = append(out, n.prefix...)
	for _, to := range []int{n.other, n.rest, n.contains} {
		if to >= 0 {
			out = append(out, to)
		}
	}
	return out
}

// where names node i, as its location in the schema (cut past 128 bytes).
func (p *costPlan) where(i int) string { return brief(shortLocation(p.nodes[i].s.Location), 128) }

func shortLocation(loc string) string {
	if _, frag, ok := strings.Cut(loc, "#"); ok {
		return "#" + frag
	}
	return loc
}

// hasPatterns reports whether a subschema of the plan matches patterns (pattern,
// patternProperties).
func (p *costPlan) hasPatterns() bool {
	for _, n := range p.nodes {
		if n.s.Pattern != nil || len(n.patterns) > 0 {
			return true
		}
	}
	return false
}

// position is a part of a value: a property's value by its name, or an item by its index.
type position struct {
	array bool
	index int
	name  string
	// anyName (in checkCost): a name no subschema names, taken to match every pattern.
	anyName bool
}

// tally sums weighted nodes by id.
type tally struct {
	list []weighted
	at   map[int]int // index in list, once the list is long
}

func (t *tally) reset() {
	t.list = t.list[:0]
	t.at = nil
}

func (t *tally) add(id int, n int64) {
	if t.at == nil && len(t.list) >= 16 {
		t.at = make(map[int]int, 2*len(t.list))
		for i, w := range t.list {
			t.at[w.id] = i
		}
	}
	if t.at != nil {
		if i, ok := t.at[id]; ok {
			t.list[i].n = addSat(t.list[i].n, n)
			return
		}
		t.at[id] = len(t.list)
	} else if i := slices.IndexFunc(t.list, func(w weighted) bool { return w.id == id }); i >= 0 {
		t.list[i].n = addSat(t.list[i].n, n)
		return
	}
	t.list = append(t.list, weighted{id, n})
}

// partsAt adds to t what the entries in apply to the part at pos, each times how often.
func (p *costPlan) partsAt(in []weighted, pos position, t *tally) {
	for _, e := range in {
		for _, c := range p.nodes[e.id].closure {
			p.nodes[c.id].applyAt(pos, mulSat(e.n, c.n), t)
		}
	}
}

// applyAt adds to t what n itself applies to the part at pos, each as often as times.
func (n *costNode) applyAt(pos position, times int64, t *tally) {
	if pos.array {
		if pos.index < len(n.prefix) {
			t.add(n.prefix[pos.index], times)
		} else if n.rest >= 0 {
			t.add(n.rest, times)
		}
		if n.contains >= 0 {
			t.add(n.contains, times)
		}
		return
	}
	taken := false
	if to, ok := n.props[pos.name]; ok && !pos.anyName {
		t.add(to, times)
		taken = true
	}
	for _, pp := range n.patterns {
		if pos.anyName || pp.re.MatchString(pos.name) {
			t.add(pp.to, times)
			taken = true
		}
	}
	if n.other >= 0 && (!taken || pos.anyName) {
		t.add(n.other, times)
	}
}

// checkCost refuses a compiled schema that could make one value expensive to check, naming
// where: a subschema applied to the same value through itself (a loop); a value entered by a
// subschema that applies more than MaxSchemaExpansion subschemas to it, or to it and the parts
// along one path of it (branches that fan out); a recursion that comes back to a subschema by
// two ways for the same part of the value (through anyOf's branches, if and then, items and
// contains, a property and a pattern that matches its name, dependentSchemas: each level would
// check the one below it twice or more, 2^depth checks in all). A recursion that comes back one
// way per part (a tree, a nullable linked list) costs in proportion to the value and is
// taken. It returns the schema's plan.
func checkCost(root *jsonschema.Schema) (*costPlan, error) {
	p, err := newCostPlan(root)
	if err != nil {
		return nil, err
	}
	w := &costWalk{p: p}
	if err := w.loops(); err != nil {
		return nil, err
	}
	if err := w.closures(); err != nil {
		return nil, err
	}
	if err := w.recursions(); err != nil {
		return nil, err
	}
	w.memo = make([]int64, len(p.nodes))
	w.state = make([]uint8, len(p.nodes))
	c := w.expansion(0)
	if w.err != nil {
		return nil, w.err
	}
	if c > MaxSchemaExpansion {
		return nil, fanOut(c, "along one path of its parts")
	}
	return p, nil
}

func fanOut(n int64, where string) error {
	shown := fmt.Sprint(n)
	if n > 10*MaxSchemaExpansion {
		shown = fmt.Sprintf("more than %d", 10*MaxSchemaExpansion)
	}
	return fmt.Errorf("could take %s subschemas to check one value (%s), at most %d: branches that fan out", shown, where, MaxSchemaExpansion)
}

type costWalk struct {
	p    *costPlan
	work int
	err  error
	// for expansion: what each entry node costs, and where the walk stands
	memo  []int64
	state []uint8 // 0 not seen, 1 on the walk's path, 2 done
}

// spend counts n steps of the walk; false once it has taken too many.
func (w *costWalk) spend(n int) bool {
	if w.work += n; w.work > maxPlanWork {
		if w.err == nil {
			w.err = errTooIntricate
		}
		return false
	}
	return true
}

// loops refuses a subschema applied to the same value through itself.
func (w *costWalk) loops() error {
	state := make([]uint8, len(w.p.nodes))
	var visit func(i int) error
	visit = func(i int) error {
		state[i] = 1
		for _, b := range w.p.nodes[i].same {
			switch state[b] {
			case 1:
				return fmt.Errorf("%s is applied to the same value again through %s, never to a part of it: a loop", w.p.where(b), w.p.where(i))
			case 0:
				if err := visit(b); err != nil {
					return err
				}
			}
		}
		state[i] = 2
		return nil
	}
	for i := range w.p.nodes {
		if state[i] == 0 {
			if err := visit(i); err != nil {
				return err
			}
		}
	}
	return nil
}

// sameClosure counts the ways from node i to each node applied to the same value (i itself
// once), keeping to the nodes keep allows (nil: any).
func (w *costWalk) sameClosure(i int, keep func(int) bool) []weighted {
	var order []int // post-order: a node after all it leads to
	seen := map[int]bool{}
	var visit func(u int)
	visit = func(u int) {
		seen[u] = true
		for _, b := range w.p.nodes[u].same {
			if !seen[b] && (keep == nil || keep(b)) {
				visit(b)
			}
		}
		order = append(order, u)
	}
	visit(i)
	w.spend(len(order))
	count := map[int]int64{i: 1}
	for k := len(order) - 1; k >= 0; k-- { // the loops are refused: this order is topological
		u := order[k]
		for _, b := range w.p.nodes[u].same {
			if keep == nil || keep(b) {
				count[b] = addSat(count[b], count[u])
			}
		}
	}
	out := make([]weighted, 0, len(order))
	for _, u := range order {
		out = append(out, weighted{u, count[u]})
	}
	slices.SortFunc(out, func(a, b weighted) int { return a.id - b.id })
	return out
}

// closures works out what the entry nodes apply to one value, refusing a fan-out.
func (w *costWalk) closures() error {
	nodes := w.p.nodes
	for i := range nodes {
		n := &nodes[i]
		if !n.entry {
			continue
		}
		n.closure = w.sameClosure(i, nil)
		if w.err != nil {
			return w.err
		}
		for _, c := range n.closure {
			u := &nodes[c.id]
			n.apps = addSat(n.apps, c.n)
			n.work = addSat(n.work, mulSat(c.n, u.local))
			n.perPart = addSat(n.perPart, mulSat(c.n, int64(1+patternSteps*len(u.patterns))))
			if u.s.UniqueItems {
				n.uniq = addSat(n.uniq, c.n)
			}
		}
		if n.apps > MaxSchemaExpansion {
			return fanOut(n.apps, "from "+w.p.where(i))
		}
		if slices.ContainsFunc(n.closure, func(c weighted) bool {
			u := nodes[c.id].s
			return u.UnevaluatedProperties != nil || u.UnevaluatedItems != nil
		}) {
			n.perPart = addSat(n.perPart, mulSat(n.apps, unevaluatedSteps))
		}
	}
	for i := range nodes {
		n := &nodes[i]
		for _, c := range n.closure {
			if names := nodes[c.id].names; names >= 0 {
				n.name = addSat(n.name, mulSat(c.n, nodes[names].work))
			}
		}
	}
	return nil
}

// expansion is what checking a value entered by node i may apply to it and to the parts
// along one path of it: its applications, and those of the part that takes most. A
// recursion's return counts its applications once (the parts below are the same again).
func (w *costWalk) expansion(i int) int64 {
	switch w.state[i] {
	case 1:
		return w.p.nodes[i].apps
	case 2:
		return w.memo[i]
	}
	w.state[i] = 1
	n := &w.p.nodes[i]
	best := int64(0) // a name's, to begin with
	for _, c := range n.closure {
		if names := w.p.nodes[c.id].names; names >= 0 {
			best = addSat(best, mulSat(c.n, w.p.nodes[names].apps))
		}
	}
	var t tally
	at := func(pos position) {
		t.reset()
		w.p.partsAt([]weighted{{i, 1}}, pos, &t)
		if !w.spend(len(n.closure) + len(t.list)) {
			return
		}
		sum := int64(0)
		for _, c := range t.list {
			sum = addSat(sum, mulSat(c.n, w.expansion(c.id)))
		}
		best = max(best, sum)
	}
	names, items := map[string]bool{}, 0
	for _, c := range n.closure {
		u := &w.p.nodes[c.id]
		for k := range u.props {
			names[k] = true
		}
		items = max(items, len(u.prefix))
	}
	for _, k := range sortedKeys(names) {
		at(position{name: k})
	}
	at(position{anyName: true})
	for k := range items + 1 {
		at(position{array: true, index: k})
	}
	w.memo[i], w.state[i] = addSat(n.apps, best), 2
	return w.memo[i]
}

// recursions refuses a recursion that comes back to a subschema by two ways for the same
// part of the value. Such a pair of ways lies within one strongly connected component of the
// plan (its subschemas reach one another); it is found there by following two ways at once,
// from where they part, through parts that a value can have in common, until they meet.
func (w *costWalk) recursions() error {
	for _, comp := range w.components() {
		if err := w.meetings(comp); err != nil {
			return err
		}
	}
	return w.err
}

// components lists the plan's strongly connected components that hold a recursion (Tarjan's
// algorithm, over what nodes apply to the same value and to parts; names are left out, a
// name has no parts).
func (w *costWalk) components() [][]int {
	nodes := w.p.nodes
	index, low := make([]int, len(nodes)), make([]int, len(nodes))
	on := make([]bool, len(nodes))
	var stack []int
	var out [][]int
	next := 1
	var visit func(u int)
	visit = func(u int) {
		index[u], low[u] = next, next
		next++
		stack = append(stack, u)
		on[u] = true
		edges := append(slices.Clone(nodes[u].same), nodes[u].partTargets()...)
		w.spend(len(edges))
		for _, v := range edges {
			if index[v] == 0 {
				visit(v)
				low[u] = min(low[u], low[v])
			} else if on[v] {
				low[u] = min(low[u], index[v])
			}
		}
		if low[u] != index[u] {
			return
		}
		var comp []int
		for {
			v := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			on[v] = false
			comp = append(comp, v)
			if v == u {
				break
			}
		}
		if len(comp) > 1 || slices.Contains(nodes[u].partTargets(), u) {
			slices.Sort(comp)
			out = append(out, comp)
		}
	}
	for u := range nodes {
		if index[u] == 0 {
			visit(u)
		}
	}
	return out
}

// step is one way from a node to a part within a component: through the subschema via
// (applied to the same value), a part by label, to the node to.
type step struct {
	label label
	via   int
	to    int
}

// label says which parts of a value a subschema is applied to.
type label struct {
	kind  labelKind
	name  string            // propName
	re    jsonschema.Regexp // propPattern
	owner int               // propPattern, propOther: the subschema that holds it
	index int               // itemAt, itemFrom
}

type labelKind uint8

const (
	propName    labelKind = iota // the property of that name
	propPattern                  // a property whose name matches re
	propOther                    // a property its owner's properties and patterns do not take
	itemAt                       // the item at index
	itemFrom                     // the items from index on
	itemAny                      // every item
)

// overlaps reports whether a value can have a part that both labels take.
func (w *costWalk) overlaps(a, b label) bool {
	if (a.kind >= itemAt) != (b.kind >= itemAt) {
		return false
	}
	if a.kind > b.kind {
		a, b = b, a
	}
	switch a.kind {
	case propName:
		switch b.kind {
		case propName:
			return a.name == b.name
		case propPattern:
			return b.re.MatchString(a.name)
		case propOther:
			o := &w.p.nodes[b.owner]
			t := tally{}
			o.applyAt(position{name: a.name}, 1, &t)
			return slices.ContainsFunc(t.list, func(x weighted) bool { return x.id == o.other })
		}
	case propPattern:
		// Two patterns, or a pattern and another's additionalProperties, are taken to share
		// a name; a subschema's own patterns and additionalProperties never do.
		return b.kind != propOther || b.owner != a.owner
	case itemAt:
		switch b.kind {
		case itemAt:
			return a.index == b.index
		case itemFrom:
			return a.index >= b.index
		}
	}
	return true
}

// partSteps lists node i's steps to parts, each with its label.
func (w *costWalk) partSteps(i int) []step {
	n := &w.p.nodes[i]
	var out []step
	for _, k := range sortedKeys(n.props) {
		out = append(out, step{label{kind: propName, name: k}, i, n.props[k]})
	}
	for _, pp := range n.patterns {
		out = append(out, step{label{kind: propPattern, re: pp.re, owner: i}, i, pp.to})
	}
	if n.other >= 0 {
		out = append(out, step{label{kind: propOther, owner: i}, i, n.other})
	}
	for k, to := range n.prefix {
		out = append(out, step{label{kind: itemAt, index: k}, i, to})
	}
	if n.rest >= 0 {
		out = append(out, step{label{kind: itemFrom, index: len(n.prefix)}, i, n.rest})
	}
	if n.contains >= 0 {
		out = append(out, step{label{kind: itemAny}, i, n.contains})
	}
	return out
}

// meetings refuses two ways within comp that part and meet again for the same part.
func (w *costWalk) meetings(comp []int) error {
	in := func(u int) bool { _, ok := slices.BinarySearch(comp, u); return ok }
	// From each node, the steps to parts within comp, through what it applies to the same
	// value within comp: two ways to one node already meet.
	ways := map[int][]step{}
	for _, u := range comp {
		for _, c := range w.sameClosure(u, in) {
			if c.n > 1 {
				return fmt.Errorf("a recursion comes back to %s through %d subschemas that %s applies to the same value: each level would check the one below it %d times or more, %d^depth in all", w.p.where(c.id), c.n, w.p.where(u), c.n, c.n)
			}
			steps := w.partSteps(c.id)
			w.spend(len(steps))
			for _, s := range steps {
				if in(s.to) {
					ways[u] = append(ways[u], s)
				}
			}
		}
		if w.err != nil {
			return w.err
		}
	}
	type pair struct{ a, b int }
	type origin struct {
		from       int
		one, other step
	}
	met := func(o origin, at int) error {
		return fmt.Errorf("a recursion comes back to %s by two ways from %s (through %s and %s) for the same part of the value: each level would check the one below it twice or more, 2^depth in all",
			w.p.where(at), w.p.where(o.from), w.p.where(o.one.to), w.p.where(o.other.to))
	}
	seen := map[pair]origin{}
	var queue []pair
	push := func(a, b int, o origin) error {
		if a == b {
			return met(o, a)
		}
		p := pair{min(a, b), max(a, b)}
		if _, ok := seen[p]; !ok {
			seen[p] = o
			queue = append(queue, p)
		}
		return nil
	}
	for _, u := range comp {
		ws := ways[u]
		for i := range ws {
			for j := i + 1; j < len(ws); j++ {
				if !w.spend(1) {
					return w.err
				}
				if w.overlaps(ws[i].label, ws[j].label) {
					if err := push(ws[i].to, ws[j].to, origin{u, ws[i], ws[j]}); err != nil {
						return err
					}
				}
			}
		}
	}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		o := seen[p]
		for _, x := range ways[p.a] {
			for _, y := range ways[p.b] {
				if !w.spend(1) {
					return w.err
				}
				if w.overlaps(x.label, y.label) {
					if err := push(x.to, y.to, o); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// Refusals of a check for what it would cost, before it runs.
var (
	errTooManySteps = fmt.Errorf("checking it would take more than %d schema steps, more than one check may take (contract.MaxCheckSteps)", MaxCheckSteps)
	errTooDeep      = fmt.Errorf("it is nested more than %d levels deep where the schema checks it, deeper than a check goes (contract.MaxCheckDepth)", MaxCheckDepth)
)

// checkSteps counts the steps checking v under p would take at most: every subschema applied
// to every part of v (itself, each property's value and name, each item) is a step, with a
// step more for each of the value's keys or items (or 64 bytes of a string) it goes over, and
// for each node of the enum and const values it compares. It returns errTooManySteps past
// limit, errTooDeep where the subschemas go deeper than MaxCheckDepth, having stopped
// counting there.
func (p *costPlan) checkSteps(v any, limit int64) (int64, error) {
	c := stepCount{p: p, limit: limit}
	c.value(v, []weighted{{0, 1}}, 0)
	return c.total, c.err
}

type stepCount struct {
	p       *costPlan
	limit   int64
	total   int64
	err     error
	tallies []*tally // by depth: what is applied to a part there (reused from part to part)
}

func (c *stepCount) add(n int64) bool {
	if c.total = addSat(c.total, n); c.total > c.limit && c.err == nil {
		c.err = errTooManySteps
	}
	return c.err == nil
}

// value counts the steps of checking v with the entry nodes in applied to it, depth levels
// below the checked value.
func (c *stepCount) value(v any, in []weighted, depth int) {
	if depth > MaxCheckDepth {
		c.err = errTooDeep
		return
	}
	var apps, work, perPart, uniq, name int64
	for _, e := range in {
		n := &c.p.nodes[e.id]
		apps = addSat(apps, mulSat(e.n, n.apps))
		work = addSat(work, mulSat(e.n, n.work))
		perPart = addSat(perPart, mulSat(e.n, n.perPart))
		uniq = addSat(uniq, mulSat(e.n, n.uniq))
		name = addSat(name, mulSat(e.n, n.name))
	}
	work = addSat(work, mulSat(apps, int64(depth*depthSteps)))
	var width int64
	switch v := v.(type) {
	case map[string]any:
		width = int64(len(v))
		work = addSat(work, mulSat(width, name))
	case []any:
		width = int64(len(v))
		if uniq > 0 {
			// uniqueItems compares the items whole: pairwise up to 20 of them, by hash past that.
			times := int64(2)
			if width <= 20 {
				times = max(times, width)
			}
			work = addSat(work, mulSat(mulSat(uniq, boundedValueSteps(v, c.limit)), times))
		}
	case string:
		width = int64(len(v) / stringBytesPerStep)
	}
	if !c.add(addSat(work, mulSat(width, perPart))) {
		return
	}
	if len(c.tallies) <= depth {
		c.tallies = append(c.tallies, &tally{})
	}
	t := c.tallies[depth]
	at := func(x any, pos position) bool {
		t.reset()
		c.p.partsAt(in, pos, t)
		if len(t.list) > 0 {
			c.value(x, t.list, depth+1)
		}
		return c.err == nil
	}
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if !at(x, position{name: k}) {
				return
			}
		}
	case []any:
		for i, x := range v {
			if !at(x, position{array: true, index: i}) {
				return
			}
		}
	}
}

// boundedValueSteps is valueSteps(v), counted no further than past limit.
func boundedValueSteps(v any, limit int64) int64 {
	n := int64(1)
	switch v := v.(type) {
	case map[string]any:
		for _, x := range v {
			if n > limit {
				break
			}
			n += boundedValueSteps(x, limit-n)
		}
	case []any:
		for _, x := range v {
			if n > limit {
				break
			}
			n += boundedValueSteps(x, limit-n)
		}
	default:
		n = valueSteps(v)
	}
	return n
}
