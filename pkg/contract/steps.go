package contract

import "fmt"

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

// Refusals of a check for what it would cost, before it runs.
var (
	errTooManySteps = fmt.Errorf("checking it would take more than %d schema steps, more than one check may take (contract.MaxCheckSteps)", MaxCheckSteps)
	errTooDeep      = fmt.Errorf("it is nested more than %d levels deep where the schema checks it, deeper than a check goes (contract.MaxCheckDepth)", MaxCheckDepth)
)

// checkSteps counts the steps checking v under p would take at most, weighted as above: every
// subschema applied to every part of v (itself, each property's value and name, each item),
// the keys, items and bytes it goes over, the enum and const values it compares. It returns
// errTooManySteps past limit, errTooDeep where the subschemas go deeper than MaxCheckDepth,
// having stopped counting there.
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
