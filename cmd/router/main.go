// Command router runs a Hermes router worker: it routes requests to tools and aggregates results into responses.
package main

import (
	"os"

	"github.com/hermesbus/hermes/internal/app"
)

func main() {
	os.Exit(app.Exec(app.RunRouter, os.Args[1:], app.Env{Stdout: os.Stdout, Stderr: os.Stderr}))
}
