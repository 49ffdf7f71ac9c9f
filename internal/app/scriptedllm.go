package app

import (
	"context"
	"fmt"
	"os"

	"github.com/hermesbus/hermes/internal/scriptedllm"
)

// scriptedLLMAddr is where hermes scripted-llm listens by default.
const scriptedLLMAddr = "127.0.0.1:8099"

// RunScriptedLLM serves an OpenAI-compatible chat completions API answering from a script:
// hermes scripted-llm. Without --script it is the seed's meeting assistant.
func RunScriptedLLM(ctx context.Context, args []string, env Env) error {
	fs := newFlagSet("scripted-llm", "hermes scripted-llm [flags]", env.Stderr)
	level := "info"
	addr := fs.String("listen", scriptedLLMAddr, "listen address; the API is at http://ADDR/v1")
	script := fs.String("script", "", "script file (YAML: models, conversations, otherwise); empty: the seed's meeting assistant")
	keyEnv := fs.String("api-key-env", "", "environment variable holding the Bearer key callers must send; empty: none")
	fs.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	log, err := parse(fs, args, env, &level)
	if err != nil {
		return err
	}
	s := scriptedllm.Meeting()
	if *script != "" {
		if s, err = scriptedllm.Load(*script); err != nil {
			return fmt.Errorf("--script: %w", err)
		}
	}
	key := ""
	if *keyEnv != "" {
		if key = os.Getenv(*keyEnv); key == "" {
			return fmt.Errorf("--api-key-env %s: the variable is not set", *keyEnv)
		}
	}
	srv, err := scriptedllm.New(s, key)
	if err != nil {
		return err
	}
	ln, err := listen(*addr, "scripted LLM")
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "Scripted LLM (OpenAI-compatible) at http://%s/v1. Ctrl-C stops.\n", ln.Addr())
	return scriptedllm.Serve(ctx, ln, srv, log.With("service", "scripted-llm"))
}
