package worker_test

import (
	"context"
	"encoding/json"
	"log"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/worker"
)

// A Go program serves a tool of its own on a Hermes bus: calls routed to it with
// `action: {go: {}}` run here, with Hermes' retries, timeouts, ledger and record.
func ExampleNewFuncs() {
	ctx := context.Background()
	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	b, err := bus.Provision(ctx, js, bus.Config{})
	if err != nil {
		log.Fatal(err)
	}
	funcs, err := worker.NewFuncs(map[string]worker.Func{
		"shout": func(ctx context.Context, args json.RawMessage) (any, error) {
			var in struct{ Text string }
			if err := json.Unmarshal(args, &in); err != nil {
				return nil, &worker.ToolError{Code: "INVALID_TEXT", Hint: "send {\"text\": \"…\"}", Err: err}
			}
			return map[string]string{"text": strings.ToUpper(in.Text)}, nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	w, err := worker.New(worker.Config{Bus: b, Instance: "shouter", Executors: []worker.Executor{funcs}})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Run(ctx); err != nil { // until ctx is done
		log.Fatal(err)
	}
}
