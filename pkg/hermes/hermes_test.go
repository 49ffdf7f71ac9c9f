package hermes_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/hermes"
	"github.com/hermesbus/hermes/pkg/worker"
)

type weatherIn struct {
	City string `json:"city" jsonschema:"description=城市名,minLength=1"`
	Date string `json:"date,omitempty" jsonschema:"pattern=^[0-9]{4}-[0-9]{2}-[0-9]{2}$"`
}

type weatherOut struct {
	City  string `json:"city"`
	TempC int    `json:"temp_c"`
	Sky   string `json:"sky" jsonschema:"enum=sunny,enum=cloudy,enum=rain"`
}

func weather(_ context.Context, in weatherIn) (weatherOut, error) {
	if in.City == "Atlantis" {
		return weatherOut{}, hermes.Fail("CITY_NOT_FOUND", "ask for a city on a map", errors.New("no such city"))
	}
	return weatherOut{City: in.City, TempC: 21, Sky: "sunny"}, nil
}

// The contract derives from the Go types: required fields, descriptions, patterns and enums
// from the struct tags; declared failure codes; the reach is a Go tool's.
func TestAToolsContractComesFromItsTypes(t *testing.T) {
	d := hermes.Tool("weather_search", "查询指定城市的实时天气信息", weather, hermes.Errors("CITY_NOT_FOUND"), hermes.Level("L"))
	if d.Err() != nil {
		t.Fatal(d.Err())
	}
	c := d.Contract()
	k, err := contract.Compile(&c, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if c.Reach == nil || c.Reach.Kind != "go" || c.ExecutionPolicy.ResourceLevel != "L" {
		t.Fatalf("%+v %+v", c.Reach, c.ExecutionPolicy)
	}
	for args, want := range map[string]string{
		`{"city":"上海"}`:                  "",
		`{}`:                             "city: is required",
		`{"city":""}`:                    "city: is 0 characters long; at least 1",
		`{"city":"x","date":"tomorrow"}`: "date: does not match ^[0-9]{4}-[0-9]{2}-[0-9]{2}$",
		`{"city":"x","country":"CN"}`:    "country: is not a field the contract names",
	} {
		err := k.CheckInput([]byte(args))
		if (want == "") != (err == nil) || err != nil && err.Error() != want {
			t.Errorf("%s: %v, want %q", args, err, want)
		}
	}
	if v := k.CheckValue([]byte(`{"city":"x","temp_c":3,"sky":"snow"}`)); !strings.Contains(v.Violation, `success.sky: is "snow"`) {
		t.Errorf("an answer outside the enum: %+v", v)
	}
	if v := k.CheckFailure("CITY_NOT_FOUND", "h"); !v.Failure {
		t.Errorf("a declared failure: %+v", v)
	}
	if v := k.CheckFailure("OTHER", "h"); v.Violation == "" {
		t.Errorf("an undeclared failure: %+v", v)
	}
}

type badIn struct {
	Name    string        `json:"name"`
	Updates chan struct{} `json:"updates"`
}

// A type JSON Schema cannot say fails at start, naming the field.
func TestATypeJSONSchemaCannotSayIsRefused(t *testing.T) {
	d := hermes.Tool("bad", "", func(context.Context, badIn) (string, error) { return "", nil })
	if d.Err() == nil || !strings.Contains(d.Err().Error(), "input.updates") {
		t.Fatalf("%v", d.Err())
	}
	if err := hermes.Serve(context.Background(), hermes.Config{NATS: "nats://127.0.0.1:1"}, d); err == nil || !strings.Contains(err.Error(), "input.updates") {
		t.Fatalf("Serve: %v", err)
	}
}

type alertsOut struct {
	Alerts []string          `json:"alerts"`
	Meta   map[string]string `json:"meta"`
	Next   *int              `json:"next"`
}

type node struct {
	Name string `json:"name"`
	Next *node  `json:"next"`
}

// What encoding/json writes for nil slices, maps and pointers keeps the contract; a recursive
// type is refused at start; Retries sets the tries.
func TestNilsRecursionAndRetries(t *testing.T) {
	d := hermes.Tool("alerts", "", func(context.Context, struct{}) (alertsOut, error) { return alertsOut{}, nil }, hermes.Retries(5))
	if d.Err() != nil {
		t.Fatal(d.Err())
	}
	c := d.Contract()
	k, err := contract.Compile(&c, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if v := k.CheckValue([]byte(`{"alerts":null,"meta":null,"next":null}`)); v.Violation != "" {
		t.Errorf("nil fields: %s", v.Violation)
	}
	if a := k.Apply(*c.Reach); a.Retry.MaxAttempts != 6 {
		t.Errorf("Retries(5): %d tries", a.Retry.MaxAttempts)
	}
	r := hermes.Tool("walk", "", func(context.Context, node) (string, error) { return "", nil })
	if r.Err() == nil || !strings.Contains(r.Err().Error(), "input.next") {
		t.Errorf("a recursive type: %v", r.Err())
	}
}

// A Go tool checks its arguments against its own schema before its function sees them: a call
// routed without a registered contract, or a sandbox's invalid case, gets BAD_INPUT naming
// the field, not a function run on zero values.
func TestAToolChecksItsOwnArguments(t *testing.T) {
	ran := false
	d := hermes.Tool("weather", "天气", func(_ context.Context, in weatherIn) (weatherOut, error) {
		ran = true
		return weatherOut{City: in.City}, nil
	})
	_, err := hermes.Call(d, context.Background(), []byte(`{"date":"tomorrow"}`))
	var te *worker.ToolError
	if !errors.As(err, &te) || te.Code != hermes.CodeBadInput || !strings.Contains(err.Error(), "city") || ran {
		t.Fatalf("arguments breaking the schema: %v (ran %v)", err, ran)
	}
	if out, err := hermes.Call(d, context.Background(), []byte(`{"city":"上海"}`)); err != nil || out.(weatherOut).City != "上海" {
		t.Fatalf("good arguments: %v %v", out, err)
	}
}
