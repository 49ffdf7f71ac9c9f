// Command hermes runs Hermes: everything in one process (hermes up), or one part of it.
package main

import (
	"os"

	"github.com/hermesbus/hermes/internal/app"
)

func main() { os.Exit(app.Main(os.Args[1:])) }
