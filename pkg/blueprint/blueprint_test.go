package blueprint

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// toolSet is a tools function knowing names.
func toolSet(names ...string) func(string) bool {
	return func(name string) bool {
		for _, n := range names {
			if n == name {
				return true
			}
		}
		return false
	}
}

// compiled parses and compiles src with every tool known.
func compiled(t *testing.T, src string) *Blueprint {
	t.Helper()
	b, err := Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Compile(nil); err != nil {
		t.Fatal(err)
	}
	return b
}

// runContext decodes a run context as a runner does.
func runContext(t *testing.T, src string) map[string]any {
	t.Helper()
	var ctx map[string]any
	if err := json.Unmarshal([]byte(src), &ctx); err != nil {
		t.Fatal(err)
	}
	return ctx
}

func TestTheSeedBlueprintLoadsUnchangedAndRuns(t *testing.T) {
	data, err := os.ReadFile("testdata/check_and_urge.json")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Compile(toolSet("order_query", "logistics_urge")); err != nil {
		t.Fatal(err)
	}
	if b.Name != "check_and_urge" || len(b.Steps) != 2 || b.Fallback.TransferTo != "human_agent" || b.Fallback.Message != "订单状态异常，已转人工客服" {
		t.Fatalf("%+v", b)
	}
	nodes := b.Nodes()
	if len(nodes) != 2 || nodes[1].Index != 1 || nodes[1].Group != nil || nodes[1].Step.ID() != "1" || nodes[1].Step.Place() != "steps[1]" {
		t.Fatalf("nodes %+v", nodes)
	}
	query, urge := nodes[0].Step, nodes[1].Step

	ctx := runContext(t, `{"user_input": {"order_id": "A-17"}}`)
	args, err := query.Inputs(ctx)
	if err != nil || string(args) != `{"order_id":"A-17"}` {
		t.Fatalf("%s %v", args, err)
	}
	if ev, err := query.Allowed(ctx); err != nil || !ev.Result || ev.Values != nil {
		t.Fatalf("%+v %v", ev, err)
	}

	ctx["order_data"] = runContext(t, `{"success": {"order_id": "A-17", "status": "paid"}}`)
	ev, err := urge.Allowed(ctx)
	if err != nil || !ev.Result || !reflect.DeepEqual(ev.Values, map[string]any{"$.order_data.success.status": "paid"}) {
		t.Fatalf("%+v %v", ev, err)
	}
	args, err = urge.Inputs(ctx)
	if err != nil || string(args) != `{"order_id":"A-17","reason":"用户咨询发货进度"}` {
		t.Fatalf("%s %v", args, err)
	}
	if got := urge.Paths(); !reflect.DeepEqual(got, []string{"$.order_data.success.order_id", "$.order_data.success.status"}) {
		t.Fatalf("paths %q", got)
	}

	ctx["order_data"] = runContext(t, `{"success": {"order_id": "A-17", "status": "shipped"}}`)
	if ev, err := urge.Allowed(ctx); err != nil || ev.Result || ev.Values["$.order_data.success.status"] != "shipped" {
		t.Fatalf("%+v %v", ev, err)
	}

	ctx["order_data"] = runContext(t, `{"failure": {"code": "NOT_FOUND"}}`)
	if ev, err := urge.Allowed(ctx); err != nil || ev.Result || ev.Values["$.order_data.success.status"] != nil {
		t.Fatalf("a missing status: %+v %v", ev, err)
	}
	_, err = urge.Inputs(ctx)
	var missing *MissingError
	if !errors.As(err, &missing) || !errors.Is(err, ErrMissing) || missing.Path != "$.order_data.success.order_id" ||
		err.Error() != "steps[1].input_mapping.order_id: $.order_data.success.order_id finds nothing" {
		t.Fatalf("%v", err)
	}
}

func TestTravelAdviceTakesOneOfTwoConditionalSteps(t *testing.T) {
	b := compiled(t, `
name: travel_advice
steps:
  - tool: weather_search
    input_mapping: {city: $.user_input.city, days: 3}
    output_key: weather
    timeout: 5s
    retry: {max_attempts: 2}
  - tool: umbrella_tip
    condition: $.weather.precipitation_chance_pct >= 50
    input_mapping: {chance: $.weather.precipitation_chance_pct}
    output_key: rain_advice
    default_value: {tip: none}
  - tool: sunscreen_tip
    condition: $.weather.precipitation_chance_pct < 50
    output_key: sun_advice
    default_value: null
`)
	weather, rain, sun := &b.Steps[0], &b.Steps[1], &b.Steps[2]
	if weather.TimeoutDuration() != 5*time.Second || weather.Attempts() != 2 || rain.Attempts() != 0 || rain.TimeoutDuration() != 0 {
		t.Fatal("bounds")
	}
	if !reflect.DeepEqual(rain.Default(), map[string]any{"tip": "none"}) || sun.Default() != nil || weather.Default() != nil {
		t.Fatalf("defaults %v %v", rain.Default(), sun.Default())
	}
	args, err := weather.Inputs(runContext(t, `{"user_input": {"city": "杭州"}}`))
	if err != nil || string(args) != `{"city":"杭州","days":3}` {
		t.Fatalf("%s %v", args, err)
	}
	for chance, wantRain := range map[string]bool{"80": true, "50": true, "49.5": false, "0": false} {
		ctx := runContext(t, `{"user_input": {}, "weather": {"precipitation_chance_pct": `+chance+`}}`)
		r, err1 := rain.Allowed(ctx)
		s, err2 := sun.Allowed(ctx)
		if err1 != nil || err2 != nil || r.Result != wantRain || s.Result == wantRain {
			t.Errorf("chance %s: rain %+v %v, sun %+v %v", chance, r, err1, s, err2)
		}
	}
	_, err = rain.Allowed(runContext(t, `{"weather": {}}`))
	var ce *ConditionError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCondition) || !strings.Contains(err.Error(), `steps[1].condition "$.weather.precipitation_chance_pct >= 50"`) {
		t.Fatalf("ordering nothing: %v", err)
	}
}

func TestAParallelGroup(t *testing.T) {
	b := compiled(t, `{
  "name": "trip",
  "steps": [
    {"tool": "geo", "input_mapping": {"q": "$.user_input.city"}, "output_key": "place"},
    {"condition": "$.place.found == true", "parallel": [
      {"tool": "weather", "input_mapping": {"at": {"lat": "$.place.lat", "tags": ["fixed", "$.place.tags[*]"]}}, "output_key": "w"},
      {"tool": "hotels", "input_mapping": {"near": "$.place.lat"}, "output_key": "h",
       "fallback": {"step": {"tool": "hotels_cache", "input_mapping": {"city": "$.user_input.city"}, "output_key": "h_cached"}}}
    ], "fallback": {"message": "no trip today"}},
    {"tool": "plan", "input_mapping": {"w": "$.w", "h": "$.h", "hc": "$.h_cached"}}
  ],
  "fallback": {"step": {"tool": "apologise", "input_mapping": {"plan": "$.w"}}, "transfer_to": "human_agent"}
}`)
	nodes := b.Nodes()
	if len(nodes) != 3 || nodes[1].Step != &b.Steps[1] || len(nodes[1].Group) != 2 || !nodes[1].Step.IsGroup() {
		t.Fatalf("%+v", nodes)
	}
	ids := map[string]string{}
	for _, s := range []*Step{nodes[1].Step, nodes[1].Group[0], nodes[1].Group[1], nodes[1].Group[1].Fallback.Step, b.Fallback.Step} {
		ids[s.ID()] = s.Place()
	}
	if !reflect.DeepEqual(ids, map[string]string{"1": "steps[1]", "1.0": "steps[1].parallel[0]", "1.1": "steps[1].parallel[1]",
		"1.1.fallback": "steps[1].parallel[1].fallback.step", "fallback": "fallback.step"}) {
		t.Fatalf("%v", ids)
	}
	ctx := runContext(t, `{"user_input": {"city": "Oslo"}, "place": {"found": true, "lat": 59.9, "tags": ["cold", "north"]}}`)
	if ev, err := nodes[1].Step.Allowed(ctx); err != nil || !ev.Result {
		t.Fatalf("%+v %v", ev, err)
	}
	args, err := nodes[1].Group[0].Inputs(ctx)
	if err != nil || string(args) != `{"at":{"lat":59.9,"tags":["fixed",["cold","north"]]}}` {
		t.Fatalf("%s %v", args, err)
	}
	if args, err := nodes[1].Step.Inputs(ctx); err != nil || string(args) != `{}` {
		t.Fatalf("a group's inputs: %s %v", args, err)
	}
}

func TestRefusalsNameTheStepTheFieldAndTheReason(t *testing.T) {
	const head = "name: bp\nsteps:\n  - tool: a\n    output_key: x\n"
	for src, want := range map[string]string{
		head + "  - tool: nope\n":                             `line 5: steps[1].tool: "nope" is no known tool`,
		head + "  - tool: b\n    input_mapping: {v: $.y.z}\n": `line 6: steps[1].input_mapping.v: $.y.z reads y, which neither user_input nor any earlier step provides`,
		head + "  - tool: b\n    output_key: x\n":             `line 6: steps[1].output_key: "x" is used twice: by steps[0] and steps[1]`,
		head + "  - tool: b\n    condition: $.x.a ==\n":       `line 6: steps[1].condition: does not compile: `,
		head + "  - tool: b\n    condition: $.x.a == 1\n    output_key: z\n  - tool: c\n    fallback: {step: {tool: b, output_key: x}}\n": `steps[2].fallback.step.output_key: "x" is used twice: by steps[0] and steps[2].fallback.step`,
		head + "  - tool: b\n    condition: $.later.a == 1\n  - tool: c\n    output_key: later\n":                                         `steps[1].condition: $.later.a reads later, which steps[2] writes, and that step does not run before this one`,
		head + "  - parallel:\n    - {tool: b, output_key: p}\n    - {tool: c, input_mapping: {v: $.p}}\n":                                `line 7: steps[1].parallel[1].input_mapping.v: $.p reads p, which steps[1].parallel[0] writes, and that step does not run before this one`,
		head + "  - tool: b\n    fallback: {step: {tool: c, input_mapping: {v: $.mine}}}\n    output_key: mine\n":                         `steps[1].fallback.step.input_mapping.v: $.mine reads mine, which steps[1] writes`,
		head + "  - tool: b\n    parallel: [{tool: c}]\n":                                                                                 `steps[1].tool: a step is a tool step or a parallel group, not both`,
		head + "  - parallel: [{parallel: [{tool: c}]}]\n":                                                                                `steps[1].parallel[0].parallel: a group's members are tool steps; groups do not nest`,
		head + "  - parallel: [{tool: c}]\n    output_key: g\n":                                                                           `steps[1].output_key: a parallel group has none`,
		head + "  - parallel: []\n":                                                     `steps[1].parallel: is empty`,
		head + "  - {}\n":                                                               `line 5: steps[1].tool: is required`,
		head + "  - tool: b\n    output_key: user_input\n":                              `steps[1].output_key: user_input holds the blueprint's input`,
		head + "  - tool: b\n    output_key: 1x\n":                                      `steps[1].output_key: "1x" is no key`,
		head + "  - tool: b\n    timeout: 11m\n":                                        `line 6: steps[1].timeout: must be from 1ms to 10m0s`,
		head + "  - tool: b\n    timeout: soon\n":                                       `steps[1].timeout: "soon" is no duration`,
		head + "  - tool: b\n    retry: {max_attempts: 11}\n":                           `steps[1].retry.max_attempts: must be from 1 to 10`,
		head + "  - tool: b\n    retry: {}\n":                                           `steps[1].retry.max_attempts: is required`,
		head + "  - tool: b\n    default_value: 1\n":                                    `steps[1].default_value: is what output_key holds when the step is skipped`,
		head + "  - tool: b\n    input_mapping: {'': 1}\n":                              `steps[1].input_mapping: an argument's name is a non-empty string`,
		head + "  - tool: b\n    input_mapping: {v: '$.x[?'}\n":                         `steps[1].input_mapping.v: "$.x[?" is no JSONPath`,
		head + "  - tool: b\n    input_mapping: {v: '$..x'}\n":                          `steps[1].input_mapping.v: "$..x" does not begin with a name`,
		head + "  - tool: b\n    fallback: {}\n":                                        `steps[1].fallback: says nothing`,
		head + "  - tool: b\n    fallback: {transfer_to: 'a b'}\n":                      `steps[1].fallback.transfer_to: must hold only letters`,
		head + "  - tool: b\n    fallback: {step: {tool: c, fallback: {message: m}}}\n": `steps[1].fallback.step.fallback: a fallback step has no fallback of its own`,
		head + "  - tool: b\n    fallback: {step: {parallel: [{tool: c}]}}\n":           `steps[1].fallback.step.parallel: a fallback step is a tool step, not a group`,
		head + "  - tool: b\n    colour: red\n":                                         `line 6: steps[1].colour: unknown field; a step has tool, input_mapping`,
		head + "  - tool: b\n    tool: c\n":                                             `line 6: steps[1].tool: duplicate key`,
		head + "  - tool: 3\n":                                                          `line 5: steps[1].tool: must be a string`,
		head + "fallback: {step: {tool: b, input_mapping: {v: $.nope}}}\n":              `line 5: fallback.step.input_mapping.v: $.nope reads nope`,
		head + "fallback: {message: 7}\n":                                               `line 5: fallback.message: must be a string`,
		head + "  - tool: b\n    input_mapping: {v: !!binary aGk=}\n":                   `steps[1].input_mapping.v: a value tagged !!binary is not JSON`,
		head + "  - tool: b\n    input_mapping: {v: 1e400}\n":                           `steps[1].input_mapping.v: 1e400 is beyond the numbers JSON readers hold`,
		"name: 'a b'\nsteps: [{tool: a}]\n":                                             `line 1: name: must hold only letters`,
		"name: bp\nsteps: []\n":                                                         `line 2: steps: has no step`,
		"name: bp\nsteps: [{tool: a}]\nextra: 1\n":                                      `line 3: extra: unknown field; a blueprint has name, description, steps, fallback`,
		"name: bp\nsteps: [{tool: a}]\n---\nname: bp2\n":                                `more than one document`,
		"name: &n bp\nsteps: [{tool: *n}]\n":                                            `anchors and aliases are not read`,
		"":                                                                              `the document is empty`,
		"{":                                                                             `not YAML or JSON`,
		"[1]":                                                                           `a blueprint is a mapping of name, description, steps, fallback`,
	} {
		b, err := Parse([]byte(src))
		if err == nil {
			err = b.Compile(toolSet("a", "b", "c"))
		}
		var e *Error
		if err == nil || !errors.As(err, &e) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q:\n got %v\nwant %s", src, err, want)
		}
	}
}

func TestBounds(t *testing.T) {
	if _, err := Parse(make([]byte, MaxBytes+1)); err == nil || !strings.Contains(err.Error(), "a blueprint has at most 262144") {
		t.Fatal(err)
	}
	b := &Blueprint{Name: "many"}
	for range MaxSteps + 1 {
		b.Steps = append(b.Steps, Step{Tool: "a"})
	}
	if err := b.Compile(nil); err == nil || err.Error() != "steps: has 65 steps in all (group members and fallback steps counted); a blueprint has at most 64" {
		t.Fatal(err)
	}
	g := Step{}
	for range MaxParallel + 1 {
		g.Parallel = append(g.Parallel, Step{Tool: "a"})
	}
	b = &Blueprint{Name: "wide", Steps: []Step{g}}
	if err := b.Compile(nil); err == nil || err.Error() != "steps[0].parallel: has 17 steps; a group has at most 16" {
		t.Fatal(err)
	}
	b = &Blueprint{Name: "big", Steps: []Step{{Tool: "a", OutputKey: "k", DefaultValue: json.RawMessage(`"` + strings.Repeat("x", MaxDefaultBytes) + `"`)}}}
	if err := b.Compile(nil); err == nil || !strings.Contains(err.Error(), "steps[0].default_value: is 65538 bytes; at most 65536") {
		t.Fatal(err)
	}
	if err := CheckContext(map[string]any{"user_input": strings.Repeat("x", MaxContextBytes)}); !errors.Is(err, ErrContextTooLarge) || !strings.Contains(err.Error(), "MaxContextBytes is 1048576") {
		t.Fatal(err)
	}
	if err := CheckContext(map[string]any{"user_input": map[string]any{"a": 1.5}}); err != nil {
		t.Fatal(err)
	}
}

func TestUncompiledStepsSaySo(t *testing.T) {
	b, err := Parse([]byte(`{"name": "x", "steps": [{"tool": "t"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Steps[0].Inputs(nil); !errors.Is(err, ErrNotCompiled) {
		t.Fatal(err)
	}
	if _, err := b.Steps[0].Allowed(nil); !errors.Is(err, ErrNotCompiled) {
		t.Fatal(err)
	}
	if err := b.Compile(toolSet()); err == nil || b.Compiled() {
		t.Fatal("compiled with no tools")
	}
	if err := b.Compile(toolSet("t")); err != nil || !b.Compiled() {
		t.Fatal(err)
	}
}

func TestJSONRoundTrip(t *testing.T) {
	src := `{"name":"r","description":"d","steps":[{"tool":"a","input_mapping":{"big":12345678901234567890,"f":1.50,"n":null,"o":{"p":"$.user_input.x","l":[1,true,"s"]}},"condition":"$.user_input.x != null","output_key":"k","default_value":{"z":1e3},"timeout":"1500ms","retry":{"max_attempts":3},"fallback":{"message":"m","transfer_to":"t","step":{"tool":"b"}}},{"parallel":[{"tool":"c"}]}],"fallback":{"message":"all"}}`
	b := compiled(t, src)
	out, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	back := compiled(t, string(out))
	again, _ := json.Marshal(back)
	if string(out) != string(again) {
		t.Fatalf("\n%s\n%s", out, again)
	}
	if !strings.Contains(string(out), `"big":12345678901234567890`) || !strings.Contains(string(out), `"f":1.50`) {
		t.Fatalf("numbers not as written: %s", out)
	}
	var un Blueprint
	if err := json.Unmarshal(out, &un); err != nil || un.Name != "r" {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(`{"name":"r","steps":[],"nope":1}`), &un); err == nil {
		t.Fatal("an unknown field was read")
	}
}

// Load is Parse and Compile: a blueprint that parses but names an unknown tool is refused.
func TestLoad(t *testing.T) {
	doc := []byte(`{"name":"b","steps":[{"tool":"t","output_key":"x"}]}`)
	if b, err := Load(doc, nil); err != nil || !b.Compiled() {
		t.Fatalf("%v", err)
	}
	if _, err := Load(doc, func(string) bool { return false }); err == nil || !strings.Contains(err.Error(), "steps[0]") {
		t.Fatalf("an unknown tool: %v", err)
	}
	if _, err := Load([]byte(`{"name":"b","steps":[],"nope":1}`), nil); err == nil {
		t.Fatal("an unknown field loaded")
	}
}
