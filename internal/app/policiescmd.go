package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/hermesbus/hermes/internal/gateway"
	"github.com/hermesbus/hermes/pkg/policy"
)

const policiesUsage = `hermes policies ls | get TOOL | apply -f FILE | rm TOOL [flags]`

// RunPolicies manages tools' policies through a gateway: hermes policies.
func RunPolicies(ctx context.Context, args []string, env Env) error {
	if len(args) == 0 {
		fmt.Fprintf(env.Stderr, "Usage: %s\n", policiesUsage)
		return errors.New("policies: say ls, get, apply or rm")
	}
	sub, args := args[0], args[1:]
	fset := newFlagSet("policies "+sub, policiesUsage, env.Stderr)
	var api gatewayAPI
	api.register(fset)
	file := fset.String("f", "", "apply: the policy file (YAML or JSON, a mapping policies: tool → policy; - reads standard input)")
	asJSON := fset.Bool("json", false, "print the gateway's JSON")
	tool, err := parseNamed(fset, args)
	if err != nil {
		return err
	}
	needTool := func() error { return needName("policies "+sub, "the tool", tool) }
	switch sub {
	case "ls":
		var list gateway.PolicyList
		if err := api.do(ctx, http.MethodGet, "/api/v1/policies", "", nil, &list); err != nil {
			return fmt.Errorf("policies ls: %w", err)
		}
		if *asJSON {
			return printJSON(env, list)
		}
		printPolicies(env, list)
		return nil
	case "get":
		if err := needTool(); err != nil {
			return err
		}
		var v gateway.PolicyView
		if err := api.do(ctx, http.MethodGet, "/api/v1/policies/"+url.PathEscape(tool), "", nil, &v); err != nil {
			return fmt.Errorf("policies get: %w", err)
		}
		if *asJSON {
			return printJSON(env, v)
		}
		printPolicy(env, v)
		return nil
	case "apply":
		var list gateway.PolicyList
		if err := api.applyFile(ctx, "policies apply", *file, "/api/v1/policies", &list); err != nil {
			return err
		}
		if *asJSON {
			return printJSON(env, list)
		}
		for _, v := range list.Policies {
			if v.Changed != nil && !*v.Changed {
				fmt.Fprintf(env.Stdout, "%s: unchanged (version %d)\n", v.Tool, v.Version)
				continue
			}
			fmt.Fprintf(env.Stdout, "%s: version %d applied: %s\n", v.Tool, v.Version, v.Summary)
		}
		return nil
	case "rm":
		if err := needTool(); err != nil {
			return err
		}
		var v gateway.PolicyView
		if err := api.do(ctx, http.MethodDelete, "/api/v1/policies/"+url.PathEscape(tool), "", nil, &v); err != nil {
			return fmt.Errorf("policies rm: %w", err)
		}
		fmt.Fprintf(env.Stdout, "%s: policy removed (version %d records the removal; a policy in its contract stands again)\n", tool, v.Version)
		return nil
	}
	return fmt.Errorf("policies: unknown subcommand %q; say ls, get, apply or rm", sub)
}

func printPolicies(env Env, list gateway.PolicyList) {
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOOL\tSOURCE\tVERSION\tAPPLIED\tBY\tPOLICY")
	for _, v := range list.Policies {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", v.Tool, v.Source, v.Version, v.AppliedAt.Local().Format("2006-01-02 15:04"), v.By, v.Summary)
	}
	_ = tw.Flush()
	if len(list.Policies) == 0 {
		fmt.Fprintln(env.Stdout, "(no policies: every tool runs for every caller who may submit)")
	}
}

func printPolicy(env Env, v gateway.PolicyView) {
	what := "applied"
	switch {
	case v.Removed:
		what = "removed: the tool has no policy"
	case v.Source != "policy":
		what = "in its contract"
	}
	fmt.Fprintf(env.Stdout, "# %s, %s version %d (%s %s by %s)\n", v.Tool, v.Source, v.Version, what, v.AppliedAt.Local().Format(time.RFC3339), v.By)
	if v.Policy != nil {
		data, _ := json.MarshalIndent(v.Policy, "", "  ")
		fmt.Fprintf(env.Stdout, "%s\n", data)
		fmt.Fprintf(env.Stdout, "# %s\n", v.Summary)
	}
	if len(v.History) > 0 {
		fmt.Fprintln(env.Stdout, "# applied versions:")
	}
	for _, h := range v.History {
		what := policyText(h.Policy)
		if h.Removed {
			what = "removed"
		}
		fmt.Fprintf(env.Stdout, "#   v%d  %s  by %s: %s\n", h.Version, h.AppliedAt.Local().Format("2006-01-02 15:04:05"), h.By, what)
	}
}

// policyText is p's summary ("" for none).
func policyText(p *policy.Policy) string {
	if p == nil {
		return ""
	}
	return p.Summary()
}
