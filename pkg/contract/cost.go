package contract

import (
	"fmt"
	"slices"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// errTooIntricate refuses a schema whose cost takes too long to work out.
var errTooIntricate = fmt.Errorf("too intricate to bound what checking a value may take (more than %d steps to work it out)", maxPlanWork)

// maxPlanWork bounds the work of checkCost (steps of its walks).
const maxPlanWork = 4_000_000

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
