package hermes_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"time"

	"github.com/hermesbus/hermes/pkg/hermes"
)

// A tool is a typed Go function: its contract — the JSON Schemas of its arguments and answer,
// the failures it declares, its execution policy — is derived from the function's types and
// the options, and registered when Serve starts serving it.
func ExampleTool() {
	type In struct {
		City string `json:"city"`
	}
	type Out struct {
		TempC float64 `json:"temp_c"`
	}
	weather := hermes.Tool("weather_now", "the current temperature of a city",
		func(ctx context.Context, in In) (Out, error) {
			if in.City == "" {
				return Out{}, hermes.Fail("UNKNOWN_CITY", "name a city", fmt.Errorf("no city"))
			}
			return Out{TempC: 21.5}, nil
		},
		hermes.Errors("UNKNOWN_CITY"), hermes.Timeout(2*time.Second), hermes.Retries(2))
	if err := weather.Err(); err != nil {
		log.Fatal(err)
	}
	c := weather.Contract()
	policy, _ := json.Marshal(c.ExecutionPolicy)
	fmt.Println(c.Name)
	fmt.Println(string(c.InputSchema))
	fmt.Println(string(c.OutputSchema))
	fmt.Println(string(policy))
	// Output:
	// weather_now
	// {"$schema":"https://json-schema.org/draft/2020-12/schema","additionalProperties":false,"properties":{"city":{"type":"string"}},"required":["city"],"type":"object"}
	// {"failure":{"properties":{"error_code":{"enum":["UNKNOWN_CITY","BAD_INPUT"],"type":"string"},"recovery_hint":{"type":"string"}},"required":["error_code"],"type":"object"},"success":{"$schema":"https://json-schema.org/draft/2020-12/schema","additionalProperties":false,"properties":{"temp_c":{"type":"number"}},"required":["temp_c"],"type":"object"}}
	// {"max_retries":2}
}
