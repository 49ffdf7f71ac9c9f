// Package hermes makes Go functions Hermes tools: Tool turns a typed function into a tool whose
// contract — input and output schemas — derives from its Go types, and Serve runs tools as a
// tool worker on the bus, registering their contracts first.
//
//	weather := hermes.Tool("weather_search", "查询指定城市的实时天气信息",
//	    func(ctx context.Context, in WeatherIn) (WeatherOut, error) { … })
//	err := hermes.Serve(ctx, hermes.Config{NATS: url, NKey: seed, Gateway: gw, APIKey: key}, weather)
//
// Struct tags say what the schema says beyond the types: `json` names a field (a field without
// omitempty is required), and `jsonschema:"description=…,enum=a,enum=b,pattern=^…$,minimum=1"`
// (github.com/invopop/jsonschema) the rest. A function fails with Fail(code, hint, err): the
// contract declares the codes given to Errors, and a failure is reported as the tool's own code
// (error_code, origin tool) with its hint.
package hermes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/invopop/jsonschema"

	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
)

// Def is a tool made by Tool: its contract and its function.
type Def struct {
	contract contract.Contract
	fn       worker.Func
	err      error
}

// Name is the tool's name.
func (d *Def) Name() string { return d.contract.Name }

// Contract is the tool's contract as it is registered.
func (d *Def) Contract() contract.Contract { return d.contract }

// Err says why the tool cannot be served (its types cannot be said in JSON Schema, say).
func (d *Def) Err() error { return d.err }

// CodeBadInput is the failure a tool answers when a call's arguments do not decode into its
// input type (Hermes checks them against the input schema first, so only a schema looser than
// the type lets one through). A contract that declares codes (Errors) declares it too.
const CodeBadInput = "BAD_INPUT"

// Option adds to a tool's contract.
type Option func(*contract.Contract, *[]string)

// Errors declares the failure codes the tool reports with Fail.
func Errors(codes ...string) Option {
	return func(_ *contract.Contract, out *[]string) { *out = append(*out, codes...) }
}

// Level sets the tool's resource level: "L", "M" or "H" (its bulkhead in every worker).
func Level(level string) Option {
	return func(c *contract.Contract, _ *[]string) { policy(c).ResourceLevel = level }
}

// Timeout bounds each try of the tool.
func Timeout(d time.Duration) Option {
	return func(c *contract.Contract, _ *[]string) { c.Reach.TimeoutMS = int(max(d.Milliseconds(), 1)) }
}

// Retries bounds the tries that may follow a failed first one (a panic, or a Retryable
// failure); default 2, at most contract.MaxRetries.
func Retries(n int) Option {
	return func(c *contract.Contract, _ *[]string) {
		policy(c).MaxRetries = &n
		c.Reach.Retry.MaxAttempts = min(max(n+1, 1), protocol.MaxAttemptsLimit)
	}
}

// Effects says what calling the tool does: contract.EffectsNone, EffectsIdempotent (the
// default) or EffectsSideEffects.
func Effects(e contract.Effects) Option {
	return func(c *contract.Contract, _ *[]string) { c.Effects = e }
}

// Recipients names the arguments that hold the people a call reaches (a list of ids, or one
// id): what a max_recipients policy counts.
func Recipients(args ...string) Option {
	return func(c *contract.Contract, _ *[]string) { c.Recipients = append(c.Recipients, args...) }
}

func policy(c *contract.Contract) *contract.Policy {
	if c.ExecutionPolicy == nil {
		c.ExecutionPolicy = &contract.Policy{}
	}
	return c.ExecutionPolicy
}

// Fail is the error a tool's function returns to report a failure of its own: code (one the
// contract declares with Errors) and a hint for the caller; retryable when another try may fix
// it.
func Fail(code, hint string, err error) error {
	return &worker.ToolError{Code: code, Hint: hint, Err: err}
}

// Retryable is Fail for a failure another try may fix.
func Retryable(code, hint string, err error) error {
	return &worker.ToolError{Code: code, Hint: hint, Err: err, Retryable: true}
}

// Tool makes fn the tool name, described by description, its input and output schemas derived
// from In and Out (structs, or any type JSON Schema can say). A type that cannot be said (a
// channel, a function, a complex number) is reported by Serve, naming the field.
func Tool[In, Out any](name, description string, fn func(ctx context.Context, in In) (Out, error), opts ...Option) *Def {
	d := &Def{contract: contract.Contract{Name: name, Description: description,
		Reach: &protocol.Action{Kind: protocol.ActionGo, TimeoutMS: protocol.DefaultTimeoutMS,
			Retry: protocol.RetryPolicy{MaxAttempts: 3, BackoffFactor: protocol.DefaultBackoffFactor,
				InitialIntervalMS: protocol.DefaultInitialIntervalMS, MaxIntervalMS: protocol.DefaultMaxIntervalMS}}}}
	var codes []string
	for _, o := range opts {
		o(&d.contract, &codes)
	}
	in, err := schemaOf[In]("input")
	if err != nil {
		d.err = fmt.Errorf("hermes: tool %s: %w", name, err)
		return d
	}
	out, err := schemaOf[Out]("output")
	if err != nil {
		d.err = fmt.Errorf("hermes: tool %s: %w", name, err)
		return d
	}
	d.contract.InputSchema = in
	if len(codes) > 0 {
		// The function's codes, and the SDK's own for arguments its input type cannot take.
		if !slices.Contains(codes, CodeBadInput) {
			codes = append(codes, CodeBadInput)
		}
		failure, _ := json.Marshal(map[string]any{"type": "object", "required": []string{"error_code"},
			"properties": map[string]any{"error_code": map[string]any{"type": "string", "enum": codes}, "recovery_hint": map[string]any{"type": "string"}}})
		d.contract.OutputSchema, _ = json.Marshal(map[string]json.RawMessage{"success": out, "failure": failure})
	} else {
		d.contract.OutputSchema = out
	}
	own, err := contract.Compile(&d.contract, 0, 0)
	if err != nil {
		d.err = fmt.Errorf("hermes: tool %s: %w", name, err)
		return d
	}
	d.fn = func(ctx context.Context, args json.RawMessage) (any, error) {
		// Checked here too, against the tool's own schema: a call may come by a route with no
		// contract registered (or a sandbox's invalid case), and the function must not see
		// arguments its types would take for zero values.
		if err := own.CheckInput(args); err != nil {
			hint := "send arguments that follow the tool's input_schema"
			var ae *contract.ArgumentsError
			if errors.As(err, &ae) && ae.Hint != "" {
				hint = ae.Hint
			}
			return nil, &worker.ToolError{Code: CodeBadInput, Hint: hint, Err: err}
		}
		var v In
		if len(args) > 0 {
			if err := json.Unmarshal(args, &v); err != nil {
				return nil, &worker.ToolError{Code: CodeBadInput, Hint: "send arguments that follow the tool's input_schema", Err: err}
			}
		}
		return fn(ctx, v)
	}
	return d
}

// schemaOf derives the JSON Schema of T, refusing a type JSON Schema cannot say (naming the
// field).
func schemaOf[T any](what string) (json.RawMessage, error) {
	t := reflect.TypeFor[T]()
	if err := expressible(t, what, map[reflect.Type]bool{}); err != nil {
		return nil, err
	}
	r := &jsonschema.Reflector{DoNotReference: true, ExpandedStruct: true}
	s := r.ReflectFromType(t)
	s.Version = "https://json-schema.org/draft/2020-12/schema"
	s.ID = ""
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	if what == "output" {
		// A Go value encodes a nil slice, map or pointer as null; arguments say what they mean.
		nullable(doc, t)
	}
	return json.Marshal(doc)
}

// nullable lets null stand for a nil slice, map or pointer, as encoding/json writes them, in
// the schema derived from t.
func nullable(schema map[string]any, t reflect.Type) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		props, _ := schema["properties"].(map[string]any)
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name := strings.Split(f.Tag.Get("json"), ",")[0]
			if name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			sub, ok := props[name].(map[string]any)
			if !ok {
				continue
			}
			switch f.Type.Kind() {
			case reflect.Slice, reflect.Map, reflect.Pointer:
				if typ, ok := sub["type"].(string); ok {
					sub["type"] = []any{typ, "null"}
				}
			}
			nullable(sub, f.Type)
		}
	case reflect.Slice, reflect.Array:
		if items, ok := schema["items"].(map[string]any); ok {
			nullable(items, t.Elem())
		}
	case reflect.Map:
		if extra, ok := schema["additionalProperties"].(map[string]any); ok {
			nullable(extra, t.Elem())
		}
	}
}

// expressible checks that every part of t can be said in JSON Schema (without references: a
// recursive type cannot).
func expressible(t reflect.Type, at string, seen map[reflect.Type]bool) error {
	if seen[t] {
		if t.Kind() == reflect.Struct {
			return fmt.Errorf("%s: %s contains itself; a recursive type cannot be said here", at, t)
		}
		return nil
	}
	seen[t] = true
	defer delete(seen, t)
	switch t.Kind() {
	case reflect.Chan, reflect.Func, reflect.Complex64, reflect.Complex128, reflect.UnsafePointer, reflect.Interface:
		if t.Kind() == reflect.Interface && t.NumMethod() == 0 {
			return nil // any: any JSON value
		}
		return fmt.Errorf("%s: a %s cannot be said in JSON Schema", at, t)
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return expressible(t.Elem(), at, seen)
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			return fmt.Errorf("%s: a map with %s keys cannot be said in JSON Schema (keys are strings)", at, t.Key())
		}
		return expressible(t.Elem(), at, seen)
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() || f.Tag.Get("json") == "-" {
				continue
			}
			name := strings.Split(f.Tag.Get("json"), ",")[0]
			if name == "" {
				name = f.Name
			}
			if err := expressible(f.Type, at+"."+name, seen); err != nil {
				return err
			}
		}
	}
	return nil
}
