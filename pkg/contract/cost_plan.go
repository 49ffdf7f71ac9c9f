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
