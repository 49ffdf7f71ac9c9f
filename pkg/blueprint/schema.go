package blueprint

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"

	"github.com/theory/jsonpath/spec"
)

// ArgSchema gives the JSON Schema of a tool's argument (a property of its input schema), nil
// when it is not known.
type ArgSchema func(tool, arg string) json.RawMessage

// InputSchema is a JSON Schema of b's user_input, for the doors that offer b as a tool (MCP's
// tools/list, the chat loop's function definitions): an object with a property for each key
// of user_input a step reads — a path $.user_input.<key>… in any step's input_mapping or
// condition, group members and fallback steps included. A property is unconstrained ({})
// unless a step's input_mapping passes the key whole as one of its tool's arguments
// ("order_id": "$.user_input.order_id") and arg knows that argument's schema: the first such
// step's, in the order the steps are written, is taken. arg may be nil.
//
// The keys the first step's input_mapping reads are required when that step runs whatever
// happens (a tool step without a condition): a run is refused without them. A path that reads
// user_input whole, or by a selector that is not a name ($.user_input[*]), adds no property.
// Other keys are allowed. Before Compile succeeds, the schema is {"type":"object"}.
func (b *Blueprint) InputSchema(arg ArgSchema) json.RawMessage {
	if !b.compiled {
		return json.RawMessage(`{"type":"object"}`)
	}
	props := map[string]json.RawMessage{}
	visit := func(s *Step) {
		for _, text := range s.reads {
			if key := userInputKey(text); key != "" && props[key] == nil {
				props[key] = json.RawMessage(`{}`)
			}
		}
		if arg == nil {
			return
		}
		for _, name := range slices.Sorted(maps.Keys(s.InputMapping)) {
			text, ok := s.InputMapping[name].(string)
			if !ok {
				continue
			}
			key, whole := userInputArg(text)
			if !whole || !bytes.Equal(props[key], []byte(`{}`)) {
				continue
			}
			if sch := arg(s.Tool, name); isObject(sch) {
				props[key] = sch
			}
		}
	}
	for i := range b.Steps {
		walkSteps(&b.Steps[i], visit)
	}
	if b.Fallback != nil && b.Fallback.Step != nil {
		walkSteps(b.Fallback.Step, visit)
	}
	var required []string
	if first := &b.Steps[0]; !first.IsGroup() && first.Condition == "" {
		for _, text := range first.reads {
			if key := userInputKey(text); key != "" && !slices.Contains(required, key) {
				required = append(required, key)
			}
		}
	}
	out := struct {
		Type       string                     `json:"type"`
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required,omitempty"`
	}{"object", props, required}
	data, _ := json.Marshal(out) // every property is a JSON object (isObject)
	return data
}

// walkSteps visits s, then its group's members, then its fallback step, each in turn.
func walkSteps(s *Step, visit func(*Step)) {
	visit(s)
	for j := range s.Parallel {
		walkSteps(&s.Parallel[j], visit)
	}
	if s.Fallback != nil && s.Fallback.Step != nil {
		walkSteps(s.Fallback.Step, visit)
	}
}

// userInputKey is the key of user_input a path reads ($.user_input.<key>…), "" when it reads
// another key of the run context, user_input whole, or user_input by a selector that is not a
// name.
func userInputKey(text string) string {
	key, _ := userInputArg(text)
	return key
}

// userInputArg is userInputKey, and whether the path is exactly $.user_input.<key>.
func userInputArg(text string) (key string, whole bool) {
	p, err := compilePath(text)
	if err != nil || p.root != UserInput {
		return "", false
	}
	segs := p.query.Query().Segments()
	if len(segs) < 2 || segs[1].IsDescendant() || len(segs[1].Selectors()) != 1 {
		return "", false
	}
	name, ok := segs[1].Selectors()[0].(spec.Name)
	if !ok {
		return "", false
	}
	return string(name), len(segs) == 2
}

// isObject reports whether data is a JSON object.
func isObject(data json.RawMessage) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(data, &m) == nil && m != nil
}
