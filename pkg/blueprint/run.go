package blueprint

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Eval is a condition's decision: whether the step runs, and the value each path of the
// condition found (by the path as written; nil when it found nothing), so that a reader can
// see why a step was skipped.
type Eval struct {
	Result bool
	Values map[string]any
}

// Inputs is s's tool arguments in the run context ctx: a JSON object of its input_mapping,
// literals as written and each path replaced by what it selects (see the package doc). A path
// that selects nothing is a *MissingError. A group's Inputs is {}.
func (s *Step) Inputs(ctx map[string]any) (json.RawMessage, error) {
	if !s.compiled {
		return nil, ErrNotCompiled
	}
	args := make(map[string]any, len(s.InputMapping))
	for _, k := range slices.Sorted(maps.Keys(s.InputMapping)) {
		v, err := s.resolve(ctx, s.InputMapping[k], "input_mapping."+protocol.Shorten(k, 64))
		if err != nil {
			return nil, err
		}
		args[k] = v
	}
	b, err := json.Marshal(args)
	if err != nil {
		return nil, fmt.Errorf("%s.input_mapping: the arguments are not JSON: %w", s.place, err)
	}
	return b, nil
}

// resolve is v with each path in it replaced by what it selects.
func (s *Step) resolve(ctx map[string]any, v any, field string) (any, error) {
	switch v := v.(type) {
	case string:
		p := s.mapping[v]
		if p == nil {
			return v, nil
		}
		nodes := p.query.Select(ctx)
		if len(nodes) == 0 {
			return nil, &MissingError{Step: s.place, Field: field, Path: v}
		}
		if p.singular {
			return nodes[0], nil
		}
		return []any(nodes), nil
	case map[string]any:
		out := make(map[string]any, len(v))
		for _, k := range slices.Sorted(maps.Keys(v)) {
			x, err := s.resolve(ctx, v[k], field+"."+protocol.Shorten(k, 64))
			if err != nil {
				return nil, err
			}
			out[k] = x
		}
		return out, nil
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			x, err := s.resolve(ctx, e, fmt.Sprintf("%s[%d]", field, i))
			if err != nil {
				return nil, err
			}
			out[i] = x
		}
		return out, nil
	}
	return v, nil
}

// Allowed decides s's condition in the run context ctx. Without a condition the step runs
// (Result true, no Values). A condition that cannot be evaluated is a *ConditionError, with
// the values its paths found.
func (s *Step) Allowed(ctx map[string]any) (Eval, error) {
	if !s.compiled {
		return Eval{}, ErrNotCompiled
	}
	if s.cond == nil {
		return Eval{Result: true}, nil
	}
	ok, values, err := s.cond.eval(ctx)
	if err != nil {
		return Eval{Values: values}, &ConditionError{Step: s.place, Condition: s.Condition, Reason: err.Error()}
	}
	return Eval{Result: ok, Values: values}, nil
}
