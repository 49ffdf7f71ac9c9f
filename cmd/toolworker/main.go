// Command toolworker runs a Hermes tool worker: it executes tool calls. Run as many as you like.
package main

import (
	"os"

	"github.com/hermesbus/hermes/internal/app"
)

func main() {
	os.Exit(app.Exec(app.RunToolWorker, os.Args[1:], app.Env{Stdout: os.Stdout, Stderr: os.Stderr}))
}
