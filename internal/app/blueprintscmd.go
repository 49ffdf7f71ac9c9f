package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/internal/gateway"
	"github.com/hermesbus/hermes/pkg/protocol"
)

const blueprintsUsage = `hermes blueprints ls | get NAME | apply -f FILE | rm NAME | run NAME --input JSON | run-get RUN_ID [flags]`

// RunBlueprints manages and runs blueprints through a gateway: hermes blueprints.
func RunBlueprints(ctx context.Context, args []string, env Env) error {
	if len(args) == 0 {
		fmt.Fprintf(env.Stderr, "Usage: %s\n", blueprintsUsage)
		return errors.New("blueprints: say ls, get, apply, rm, run or run-get")
	}
	sub, args := args[0], args[1:]
	fset := newFlagSet("blueprints "+sub, blueprintsUsage, env.Stderr)
	var api gatewayAPI
	api.register(fset)
	file := fset.String("f", "", "apply: the blueprint (JSON or YAML; - reads standard input)")
	input := fset.String("input", "", "run: the run's user_input, a JSON object")
	runID := fset.String("run-id", "", "run: the run's id (the same id again is the same run; default: a new one)")
	wait := fset.Duration("wait", 60*time.Second, "run, run-get: how long to wait for the run to end (0: do not wait)")
	asJSON := fset.Bool("json", false, "print the gateway's JSON")
	name, err := parseNamed(fset, args)
	if err != nil {
		return err
	}
	named := func() error { return needName("blueprints "+sub, "it", name) }
	switch sub {
	case "ls":
		var list gateway.BlueprintList
		if err := api.do(ctx, http.MethodGet, "/api/v1/blueprints", "", nil, &list); err != nil {
			return fmt.Errorf("blueprints ls: %w", err)
		}
		if *asJSON {
			return printJSON(env, list)
		}
		tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tVERSION\tSTEPS\tAPPLIED\tBY\tDESCRIPTION")
		for _, v := range list.Blueprints {
			steps, desc := 0, ""
			if v.Blueprint != nil {
				steps, desc = len(v.Blueprint.Steps), v.Blueprint.Description
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", v.Name, v.Version, steps, v.AppliedAt.Local().Format("2006-01-02 15:04"), v.By, desc)
		}
		_ = tw.Flush()
		if len(list.Blueprints) == 0 {
			fmt.Fprintln(env.Stdout, "(no blueprints: register one with hermes blueprints apply -f FILE)")
		}
		return nil
	case "get":
		if err := named(); err != nil {
			return err
		}
		var v gateway.BlueprintView
		if err := api.do(ctx, http.MethodGet, "/api/v1/blueprints/"+url.PathEscape(name), "", nil, &v); err != nil {
			return fmt.Errorf("blueprints get: %w", err)
		}
		if *asJSON {
			return printJSON(env, v)
		}
		fmt.Fprintf(env.Stdout, "# %s version %d (applied %s by %s)\n", v.Name, v.Version, v.AppliedAt.Local().Format(time.RFC3339), v.By)
		data, _ := json.MarshalIndent(v.Blueprint, "", "  ")
		fmt.Fprintf(env.Stdout, "%s\n", data)
		return nil
	case "apply":
		var v gateway.BlueprintView
		if err := api.applyFile(ctx, "blueprints apply", *file, "/api/v1/blueprints", &v); err != nil {
			return err
		}
		if *asJSON {
			return printJSON(env, v)
		}
		if v.Changed != nil && !*v.Changed {
			fmt.Fprintf(env.Stdout, "%s: unchanged (version %d)\n", v.Name, v.Version)
			return nil
		}
		fmt.Fprintf(env.Stdout, "%s: version %d applied\n", v.Name, v.Version)
		return nil
	case "rm":
		if err := named(); err != nil {
			return err
		}
		var v gateway.BlueprintView
		if err := api.do(ctx, http.MethodDelete, "/api/v1/blueprints/"+url.PathEscape(name), "", nil, &v); err != nil {
			return fmt.Errorf("blueprints rm: %w", err)
		}
		fmt.Fprintf(env.Stdout, "%s: removed (version %d records the removal; runs going on finish under their version)\n", name, v.Version)
		return nil
	case "run":
		if err := named(); err != nil {
			return err
		}
		if *input == "" {
			return errors.New("blueprints run: --input JSON (the run's user_input) is required")
		}
		if !json.Valid([]byte(*input)) {
			return errors.New("blueprints run: --input is not JSON")
		}
		body, _ := json.Marshal(map[string]any{"run_id": *runID, "user_input": json.RawMessage(*input)})
		var run blueprints.Run
		path := "/v1/blueprints/" + url.PathEscape(name) + "/runs?wait=" + wait.String()
		if err := api.do(ctx, http.MethodPost, path, "application/json", body, &run); err != nil {
			return fmt.Errorf("blueprints run: %w", err)
		}
		return printRun(env, &run, *asJSON)
	case "run-get":
		if err := named(); err != nil {
			return err
		}
		var run blueprints.Run
		if err := api.do(ctx, http.MethodGet, "/v1/runs/"+url.PathEscape(name)+"?wait="+wait.String(), "", nil, &run); err != nil {
			return fmt.Errorf("blueprints run-get: %w", err)
		}
		return printRun(env, &run, *asJSON)
	}
	return fmt.Errorf("blueprints: unknown subcommand %q; say ls, get, apply, rm, run or run-get", sub)
}

// printRun prints a run: its status, then each step with what it did.
func printRun(env Env, r *blueprints.Run, asJSON bool) error {
	if asJSON {
		return printJSON(env, r)
	}
	fmt.Fprintf(env.Stdout, "run %s: %s v%d, %s (session %s)\n", r.RunID, r.Blueprint, r.Version, r.Status, r.SessionID)
	for _, s := range r.Steps {
		line := fmt.Sprintf("  step %-6s %-18s %-16s", s.ID, s.Tool, s.Status)
		if c := s.Condition; c != nil {
			line += fmt.Sprintf(" when %s = %t", c.Expr, c.Result)
			if !c.Result && len(c.Values) > 0 {
				values, _ := json.Marshal(c.Values)
				line += " " + shortJSON(values, 200)
			}
		}
		if s.DurationMS > 0 {
			line += fmt.Sprintf(" (%d ms)", s.DurationMS)
		}
		if s.ApprovalID != "" {
			line += " approval " + s.ApprovalID
		}
		if s.Error != nil {
			line += fmt.Sprintf(" %s: %s", s.Error.Code, s.Error.Message)
		}
		fmt.Fprintln(env.Stdout, line)
		if len(s.Output) > 0 && s.Status == blueprints.StepSucceeded {
			fmt.Fprintf(env.Stdout, "         → %s: %s\n", s.OutputKey, shortJSON(s.Output, 160))
		}
	}
	if fb := r.Fallback; fb != nil {
		fmt.Fprintf(env.Stdout, "  fallback after step %s: %s", fb.Step, fb.Message)
		if fb.TransferTo != "" {
			fmt.Fprintf(env.Stdout, " (transferred to %s)", fb.TransferTo)
		}
		fmt.Fprintln(env.Stdout)
	}
	if r.Error != nil {
		fmt.Fprintf(env.Stdout, "  error: %s: %s\n", r.Error.Code, r.Error.Message)
	}
	return nil
}

// shortJSON is data on one line, cut to at most n bytes.
func shortJSON(data []byte, n int) string {
	var b bytes.Buffer
	if json.Compact(&b, data) != nil {
		return protocol.Shorten(string(data), n)
	}
	return protocol.Shorten(b.String(), n)
}
