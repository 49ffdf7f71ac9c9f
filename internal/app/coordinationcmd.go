package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/hermesbus/hermes/internal/coordination"
)

const coordinationUsage = `hermes coordination ls [--resource KEY] [--json] [flags]
The resources that calls change one at a time (a contract's resource_key), through a gateway:
who holds each (request/call, transaction id, fencing token, since when) and who waits for it,
in order. Needs an API key with sessions:read_all. Exit status: 0 done, 2 bad usage or trouble
reaching the gateway`

// coordinationList is GET /debug/coordination.
type coordinationList struct {
	Resources []coordination.State `json:"resources"`
	Held      int                  `json:"held"`
	Waiting   int                  `json:"waiting"`
}

// RunCoordination shows the resources' turns through a gateway: hermes coordination ls.
func RunCoordination(ctx context.Context, args []string, env Env) error {
	usage := func(format string, a ...any) error {
		return &ExitError{Code: 2, Err: fmt.Errorf("coordination: "+format, a...)}
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(env.Stderr, "Usage: %s\n", coordinationUsage)
		if len(args) == 0 {
			return usage("say ls")
		}
		return flag.ErrHelp
	}
	sub, args := args[0], args[1:]
	if sub != "ls" {
		return usage("unknown subcommand %q; say ls", sub)
	}
	fset := newFlagSet("coordination ls", coordinationUsage, env.Stderr)
	var api gatewayAPI
	api.register(fset)
	resource := fset.String("resource", "", "only this resource (its key, as the contract's resource_key makes it)")
	asJSON := fset.Bool("json", false, "print the gateway's JSON")
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usage("%v", err)
	}
	if fset.NArg() > 0 {
		return usage("ls: unexpected argument %q (say --resource KEY)", fset.Arg(0))
	}
	path := "/debug/coordination"
	if *resource != "" {
		path += "?" + url.Values{"resource": {*resource}}.Encode()
	}
	var list coordinationList
	if err := api.do(ctx, http.MethodGet, path, "", nil, &list); err != nil {
		return &ExitError{Code: 2, Err: fmt.Errorf("coordination ls: %w", err)}
	}
	if *asJSON {
		return printJSON(env, list)
	}
	printCoordination(env, list)
	return nil
}

func printCoordination(env Env, list coordinationList) {
	if len(list.Resources) == 0 {
		fmt.Fprintln(env.Stdout, "(no resource is held or waited for)")
		return
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RESOURCE\tTURN\tCALL\tTOOL\tTX\tFENCE\tSINCE")
	for _, st := range list.Resources {
		if h := st.Holder; h != nil {
			fmt.Fprintf(tw, "%s\tholds\t%s\t%s\t%s\t%d\t%s\n", st.Resource, h.Who(), h.Tool, h.Tx, h.Fence, h.GrantedAt.Format(time.RFC3339))
		}
		for i, p := range st.Waiting {
			fmt.Fprintf(tw, "%s\twaits #%d\t%s\t%s\t%s\t-\t%s\n", st.Resource, i+1, p.Who(), p.Tool, p.Tx, p.ProposedAt.Format(time.RFC3339))
		}
	}
	_ = tw.Flush()
	fmt.Fprintf(env.Stdout, "%d held, %d waiting\n", list.Held, list.Waiting)
}
