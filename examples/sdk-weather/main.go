// Command sdk-weather serves a Go function as a Hermes tool (the Go SDK, package
// github.com/hermesbus/hermes/pkg/hermes). With hermes up running in the repository:
//
//	HERMES_NATS_URL=nats://127.0.0.1:4222 HERMES_NATS_NKEY=hermes-data/nats/toolworker.nk \
//	HERMES_URL=http://127.0.0.1:8080 HERMES_API_KEY=$(cat hermes-data/admin.key) \
//	go run ./examples/sdk-weather
//
// then call tool city_weather through the gateway like any other. A worker user made for some
// tools only (hermes nats-auth --worker NAME=city_weather) connects with its own inbox too:
// HERMES_NATS_NKEY=deploy/auth/NAME.nk HERMES_NATS_INBOX=_INBOX_NAME.
package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"os/signal"

	"github.com/hermesbus/hermes/pkg/hermes"
)

// CityIn is what the tool takes; its contract's input_schema comes from it.
type CityIn struct {
	City string `json:"city" jsonschema:"description=城市名，如 上海,minLength=1,maxLength=64"`
}

// CityOut is what it answers; its contract's output_schema comes from it.
type CityOut struct {
	City  string `json:"city"`
	TempC int    `json:"temp_c" jsonschema:"description=气温（摄氏度）"`
	Sky   string `json:"sky" jsonschema:"enum=sunny,enum=cloudy,enum=rain"`
}

func cityWeather(_ context.Context, in CityIn) (CityOut, error) {
	if in.City == "Atlantis" {
		return CityOut{}, hermes.Fail("CITY_NOT_FOUND", "ask for a city on a map", fmt.Errorf("no city %q", in.City))
	}
	h := fnv.New32a()
	h.Write([]byte(in.City))
	n := h.Sum32()
	return CityOut{City: in.City, TempC: int(n%35) - 5, Sky: []string{"sunny", "cloudy", "rain"}[n%3]}, nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	weather := hermes.Tool("city_weather", "查询指定城市的实时天气信息", cityWeather,
		hermes.Errors("CITY_NOT_FOUND"), hermes.Level("L"))
	err := hermes.Serve(ctx, hermes.Config{NATS: os.Getenv("HERMES_NATS_URL"), NKey: os.Getenv("HERMES_NATS_NKEY"),
		Inbox: os.Getenv("HERMES_NATS_INBOX"), Gateway: os.Getenv("HERMES_URL"), APIKey: os.Getenv("HERMES_API_KEY"),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}, weather)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
