// Command gateway runs the Hermes HTTP gateway.
package main

import (
	"os"

	"github.com/hermesbus/hermes/internal/app"
)

func main() {
	os.Exit(app.Exec(app.RunGateway, os.Args[1:], app.Env{Stdout: os.Stdout, Stderr: os.Stderr}))
}
