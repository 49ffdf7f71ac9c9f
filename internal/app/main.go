package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// Command is one runnable command.
type Command func(ctx context.Context, args []string, env Env) error

// Commands of the hermes binary.
var Commands = map[string]Command{
	"up":           RunUp,
	"nats":         RunNATS,
	"router":       RunRouter,
	"toolworker":   RunToolWorker,
	"gateway":      RunGateway,
	"demo-tools":   RunDemoTools,
	"route":        RunRoute,
	"dlq":          RunDLQ,
	"keys":         RunKeys,
	"provision":    RunProvision,
	"migrate":      RunMigrate,
	"nats-auth":    RunNATSAuth,
	"seal-key":     RunSealKey,
	"dead-letters": RunDeadLetters,
	"eraser":       RunEraser,
	"audit":        RunAudit,
	"cancel":       RunCancel,
	"approvals":    RunApprovals,
	"coordination": RunCoordination,
	"memory":       RunMemory,
	"bench":        RunBench,
	"tail":         RunTail,
	"replay":       RunReplay,
	"tools":        RunTools,
	"policies":     RunPolicies,
	"blueprints":   RunBlueprints,
	"apply":        RunApply,
	"mcp":          RunMCP,
	"scripted-llm": RunScriptedLLM,
}

const usage = `Hermes: a message bus for AI agents on NATS JetStream.

Usage: hermes <command> [flags]

Commands:
  up          run everything in one process: embedded NATS, router, tool worker, gateway, demo tools
  nats        run the embedded NATS server (JetStream) alone
  router      run a router worker against --nats
  toolworker  run a tool worker against --nats
  gateway     run the HTTP gateway against --nats
  demo-tools  run the demo tool service alone
  route       post a request file to a gateway and print the response
  cancel      cancel a request: its calls not started never start, running ones are stopped
  approvals   calls a tool's policy parked for confirmation: approvals ls, get ID, approve ID,
              deny ID --reason R
  coordination the resources that calls change one at a time: coordination ls (who holds each,
              who waits)
  memory      what Hermes remembers about users, through a gateway: memory ls, get KEY, rm KEY,
              forget --yes (--user U: an application's end user; --owner O: anyone's)
  dlq         list dead letters (dlq ls) or re-drive one (dlq retry SEQ)
  keys        manage callers' API keys: keys create --name N --role R, keys ls, keys revoke ID
  seal-key    make a key for sealing: a router's or gateway's (calls and results; workers
              given its public line run only sealed calls), or with --tools a worker's (the
              results of those tools only)
  nats-auth   make a deployment's NATS users (one per service role, and external clients that
              may publish requests only), a seal key per service with the trusted-seals file,
              and TLS certificates: an auth.conf to include
  provision   set Hermes up on a NATS server (streams, buckets, consumers) and exit; services
              then run with --no-provision, without the right to manage streams
  migrate     remove what earlier Hermes versions left on the bus once no work is pending
              there (run it before rolling this version out; see README "Upgrading")
  dead-letters run the dead-letter processor alone (router, toolworker and gateway take
              --dead-letters to run it beside them; the router does by default)
  eraser      run the eraser alone: it erases from the record what owners ask to have erased
              (DELETE /v1/memory); hermes up runs one
  audit       project the record into PostgreSQL (--postgres DSN): requests, steps, policy
              decisions, approvals, blueprint runs, the model's choices; never a value
  tail        print the live message flow, of every session or one (--session S), until Ctrl-C
  replay      print a session's recorded history (--session S), or what a new routes file
              would route differently (--routes FILE; exit 1 when anything would change)
  tools       tools' contracts through a gateway: tools ls, tools get NAME, tools register -f
              FILE, tools check NAME, tools rm NAME (changing them needs the tools:admin
              permission)
  policies    tools' policies through a gateway: policies ls, policies get TOOL, policies
              apply -f FILE, policies rm TOOL (changing them needs the tools:admin permission)
  blueprints  composed tools through a gateway: blueprints ls, get NAME, apply -f FILE, rm NAME
              (changing them needs tools:admin); run NAME --input JSON, run-get RUN_ID
  mcp         the MCP servers tool workers hold (--mcp FILE) and their states: mcp ls
  apply       make the registered contracts what files say (-f DIR_OR_FILE): prints the diff;
              --dry-run changes nothing, --prune removes what the files no longer name
  bench       measure Hermes against the same tool called directly
  scripted-llm serve an OpenAI-compatible chat API that answers from a script (no model needed;
              default: the seed's meeting assistant)

Run 'hermes <command> -h' for a command's flags.
`

// Main runs the command named by args[0] until SIGINT or SIGTERM and returns the exit code.
func Main(args []string) int {
	env := Env{Stdout: os.Stdout, Stderr: os.Stderr}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(env.Stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := Commands[args[0]]
	if !ok {
		fmt.Fprintf(env.Stderr, "hermes: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	return Exec(cmd, args[1:], env)
}

// ExitError ends a command with exit code Code. Exec prints Err, when set, like any other
// error; an ExitError without Err exits silently (the command has said what it had to).
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// Exec runs cmd with args until SIGINT or SIGTERM and returns the exit code: 0 on success or
// -h, the code of an *ExitError, else 1.
func Exec(cmd Command, args []string, env Env) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := cmd(ctx, args, env)
	var exit *ExitError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &exit):
		if exit.Err != nil {
			fmt.Fprintf(env.Stderr, "hermes: %v\n", exit.Err)
		}
		return exit.Code
	default:
		fmt.Fprintf(env.Stderr, "hermes: %v\n", err)
		return 1
	}
}
