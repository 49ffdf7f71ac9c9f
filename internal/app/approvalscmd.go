package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hermesbus/hermes/internal/approvals"
	"github.com/hermesbus/hermes/internal/gateway"
	"github.com/hermesbus/hermes/pkg/protocol"
)

const approvalsUsage = `hermes approvals ls [--state S] [--session ID] | get ID | approve ID [--reason R] | deny ID --reason R [flags]

The calls a tool's policy parked for confirmation (confirm_required), through a gateway: ls lists
those the API key may see (newest first), get shows one, approve runs its call (once), deny
refuses it with a reason. Exit status: 0 done, 1 the gateway refused (decided before, expired,
not the key's to decide, unknown), 2 bad usage or trouble reaching the gateway`

// approvalList is GET /v1/approvals.
type approvalList struct {
	Approvals []gateway.ApprovalView `json:"approvals"`
}

// RunApprovals lists, shows, approves and denies approvals through a gateway: hermes approvals.
func RunApprovals(ctx context.Context, args []string, env Env) error {
	usage := func(format string, a ...any) error {
		return &ExitError{Code: 2, Err: fmt.Errorf("approvals: "+format, a...)}
	}
	if len(args) == 0 {
		fmt.Fprintf(env.Stderr, "Usage: %s\n", approvalsUsage)
		return usage("say ls, get, approve or deny")
	}
	sub, args := args[0], args[1:]
	if sub == "-h" || sub == "--help" || sub == "help" {
		fmt.Fprintf(env.Stderr, "Usage: %s\n", approvalsUsage)
		return flag.ErrHelp
	}
	fset := newFlagSet("approvals "+sub, approvalsUsage, env.Stderr)
	var api gatewayAPI
	api.register(fset)
	state := fset.String("state", "", "ls: only approvals in this state: "+stateNames())
	session := fset.String("session", "", "ls: only approvals of this session")
	limit := fset.Int("limit", 100, "ls: list at most this many (1 to 1000)")
	reason := fset.String("reason", "", "approve, deny: why (required to deny), recorded with the decision")
	asJSON := fset.Bool("json", false, "print the gateway's JSON")
	// The approval's id may come before the flags, among them or after them.
	var rest []string
	for {
		if err := fset.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return usage("%v", err)
		}
		if fset.NArg() == 0 {
			break
		}
		rest, args = append(rest, fset.Arg(0)), fset.Args()[1:]
	}
	var id string
	if len(rest) > 0 {
		id = rest[0]
	}
	if len(rest) > 1 {
		return usage("%s: unexpected argument %q", sub, rest[1])
	}
	needID := func() error {
		switch {
		case id == "":
			return usage("%s: name the approval (its id, apr-…; hermes approvals ls lists them)", sub)
		case !approvals.IsID(id):
			return usage("%s: %q is not an approval id (apr- and 24 hex digits)", sub, id)
		}
		return nil
	}
	switch sub {
	case "ls":
		if id != "" {
			return usage("ls: unexpected argument %q (filter with --state and --session)", id)
		}
		q := url.Values{}
		if *state != "" {
			q.Set("state", *state)
		}
		if *session != "" {
			q.Set("session_id", *session)
		}
		if *limit < 1 || *limit > 1000 {
			return usage("ls: --limit %d: list 1 to 1000", *limit)
		}
		q.Set("limit", fmt.Sprint(*limit))
		var list approvalList
		if err := api.do(ctx, http.MethodGet, "/v1/approvals?"+q.Encode(), "", nil, &list); err != nil {
			return approvalFailed("ls", "", err)
		}
		if *asJSON {
			return printJSON(env, list)
		}
		printApprovals(env, list.Approvals)
		return nil
	case "get":
		if err := needID(); err != nil {
			return err
		}
		var v gateway.ApprovalView
		if err := api.do(ctx, http.MethodGet, "/v1/approvals/"+id, "", nil, &v); err != nil {
			return approvalFailed("get", id, err)
		}
		if *asJSON {
			return printJSON(env, v)
		}
		printApproval(env, v)
		return nil
	case "approve", "deny":
		if err := needID(); err != nil {
			return err
		}
		r := strings.TrimSpace(*reason)
		if sub == "deny" && r == "" {
			return usage("deny: say why with --reason (it is recorded, and shown to the requester)")
		}
		var body []byte
		if r != "" {
			body, _ = json.Marshal(map[string]string{"reason": r})
		}
		ct := ""
		if body != nil {
			ct = "application/json"
		}
		var v gateway.ApprovalView
		if err := api.do(ctx, http.MethodPost, "/v1/approvals/"+id+"/"+sub, ct, body, &v); err != nil {
			return approvalFailed(sub, id, err)
		}
		if *asJSON {
			return printJSON(env, v)
		}
		printDecision(env, v)
		return nil
	}
	return usage("unknown subcommand %q; say ls, get, approve or deny", sub)
}

func stateNames() string {
	return strings.Join([]string{string(approvals.Pending), string(approvals.Approved), string(approvals.Denied),
		string(approvals.Expired), string(approvals.Used)}, ", ")
}

// approvalFailed says in words why the gateway refused sub on approval id: exit status 1 for
// a refusal of the approval itself, 2 for trouble.
func approvalFailed(sub, id string, err error) error {
	var ae *apiError
	if !errors.As(err, &ae) {
		return &ExitError{Code: 2, Err: fmt.Errorf("approvals %s: %w", sub, err)}
	}
	why := ae.Msg
	switch {
	case ae.Code == protocol.CodeAlreadyDecided:
		return &ExitError{Code: 1, Err: fmt.Errorf("approvals %s %s: decided before; nothing changed (%s %s)", sub, id, ae.Code, why)}
	case ae.Code == protocol.CodeApprovalExpired:
		return &ExitError{Code: 1, Err: fmt.Errorf("approvals %s %s: it expired before anyone decided it; its call does not run (%s %s)", sub, id, ae.Code, why)}
	case ae.Status == http.StatusForbidden && id != "":
		return &ExitError{Code: 1, Err: fmt.Errorf("approvals %s %s: not yours to decide (%s)", sub, id, why)}
	case ae.Status == http.StatusNotFound && id != "":
		return &ExitError{Code: 1, Err: fmt.Errorf("approvals %s %s: no such approval this API key may see", sub, id)}
	}
	return &ExitError{Code: 2, Err: fmt.Errorf("approvals %s: %w", sub, err)}
}

// requesterName names an approval's requester for people.
func requesterName(c *protocol.Caller) string {
	if c == nil {
		return "-"
	}
	s := c.Name
	if s == "" {
		s = c.ID
	}
	if c.Role != "" {
		s += " (" + c.Role + ")"
	}
	if c.User != "" {
		s += " for " + c.User
	}
	return s
}

func printApprovals(env Env, list []gateway.ApprovalView) {
	if len(list) == 0 {
		fmt.Fprintln(env.Stdout, "(no approvals)")
		return
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tTOOL\tSESSION\tREQUESTER\tCREATED\tEXPIRES\tYOU DECIDE")
	for _, v := range list {
		decide := "-"
		if v.CanDecide {
			decide = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.ID, v.State, v.Tool, v.SessionID, requesterName(v.Requester),
			v.CreatedAt.Local().Format("2006-01-02 15:04:05"), v.ExpiresAt.Local().Format("15:04:05"), decide)
	}
	_ = tw.Flush()
}

func printApproval(env Env, v gateway.ApprovalView) {
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	line := func(k, format string, a ...any) { fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{k}, a...)...) }
	state := string(v.State)
	if v.CanDecide {
		state += " (yours to decide: hermes approvals approve|deny " + v.ID + ")"
	}
	line("approval", "%s", v.ID)
	line("state", "%s", state)
	line("tool", "%s", v.Tool)
	line("arguments", "%s", v.Arguments)
	line("session", "%s", v.SessionID)
	line("call", "%s of request %s", v.ToolCallID, v.RequestID)
	line("requester", "%s", requesterName(v.Requester))
	if len(v.Approvers) > 0 {
		line("approvers", "%s (not the requester)", strings.Join(v.Approvers, ", "))
	}
	line("parked by", "confirm_required (%s v%d)", v.Source, v.Version)
	line("created", "%s", v.CreatedAt.Local().Format(time.RFC3339))
	line("expires", "%s", v.ExpiresAt.Local().Format(time.RFC3339))
	if v.DecidedBy != "" {
		line("decided", "%s by %s at %s", decidedWord(v.State), v.DecidedBy, v.DecidedAt.Local().Format(time.RFC3339))
	}
	if v.Reason != "" {
		line("reason", "%s", v.Reason)
	}
	if v.RunRequestID != "" {
		line("runs as", "request %s", v.RunRequestID)
	}
	if v.UsedBy != "" {
		line("used by", "%s at %s", v.UsedBy, v.UsedAt.Local().Format(time.RFC3339))
	}
	_ = tw.Flush()
}

// decidedWord is what a person decided of an approval now in state s.
func decidedWord(s approvals.State) string {
	if s == approvals.Denied {
		return "denied"
	}
	return "approved"
}

func printDecision(env Env, v gateway.ApprovalView) {
	switch {
	case v.State == approvals.Denied:
		fmt.Fprintf(env.Stdout, "%s: denied by %s: %s; %s %s does not run\n", v.ID, v.DecidedBy, v.Reason, v.Tool, v.ToolCallID)
	case v.RunRequestID != "":
		fmt.Fprintf(env.Stdout, "%s: approved by %s; %s %s runs as request %s in session %s\n", v.ID, v.DecidedBy, v.Tool, v.ToolCallID, v.RunRequestID, v.SessionID)
	default:
		fmt.Fprintf(env.Stdout, "%s: approved by %s; the requester's next call of %s with the same arguments runs, once\n", v.ID, v.DecidedBy, v.Tool)
	}
}
