package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/hermesbus/hermes/internal/record"
	"github.com/hermesbus/hermes/internal/routes"
	"github.com/hermesbus/hermes/internal/whatif"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

const replayUsage = `hermes replay --session S [--since D | --from-seq N] [--json] [--nats URL]
       hermes replay --routes FILE [--session S] [--since D | --from-seq N] [--json] [--nats URL]
       hermes replay --policies FILE [--session S] [--since D | --from-seq N] [--json] [--nats URL]
       hermes replay --blueprint FILE [--since D] [--json] [--nats URL]

With --session: print the session's recorded history in stream order, then exit 0.
With --routes: match every recorded call again against FILE, as the router would, without
running or publishing anything, and print the calls that would be routed differently.
With --policies: decide every recorded call again under the policy file FILE, as the router's
policy stage would (rate windows counted over the recorded times), and print the calls that
would be decided differently.
With --blueprint: walk every recorded run of the blueprint FILE names (as the runs' bucket
keeps them; --since: those created since) again along FILE's blueprint, with the answers the
run's own calls got, calling no tool, and print the runs that would take another path, each
where it would part first.
Exit status of the three: 0 nothing would change, 1 something would, 2 trouble (bad flags, a
bad file, NATS unreachable)`

// RunReplay reads the record back: a session's history, or what a new routes file, policy
// file or blueprint would change (a what-if that runs nothing): hermes replay.
func RunReplay(ctx context.Context, args []string, env Env) error {
	fs := newFlagSet("replay", replayUsage, env.Stderr)
	natsURL := natsFlag(fs)
	session := fs.String("session", "", "the session to replay (with --routes: compare only its requests)")
	routesFile := fs.String("routes", "", "what-if: compare each recorded call's route with this routes file's")
	policiesFile := fs.String("policies", "", "what-if: compare what each recorded call's tool policy decided with this policy file's decision")
	blueprintFile := fs.String("blueprint", "", "what-if: walk each recorded run of this blueprint's name again along it, and compare the paths")
	since := fs.String("since", "", "start at messages stored this long ago (90s, 15m, 2h) or since an RFC 3339 time")
	fromSeq := fs.Uint64("from-seq", 0, "start at this stream sequence")
	asJSON := fs.Bool("json", false, "print JSON lines")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	usage := func(format string, a ...any) error {
		return &ExitError{Code: 2, Err: fmt.Errorf("replay: "+format, a...)}
	}
	if *session == "" && *routesFile == "" && *policiesFile == "" && *blueprintFile == "" {
		return usage("give --session S (a session's history), --routes FILE (what a routes file would change), --policies FILE (what a policy file would change) or --blueprint FILE (what a blueprint would change); see -h")
	}
	if n := len(slices.DeleteFunc([]string{*routesFile, *policiesFile, *blueprintFile}, func(f string) bool { return f == "" })); n > 1 {
		return usage("give only one of --routes, --policies and --blueprint")
	}
	if *blueprintFile != "" && (*session != "" || *fromSeq != 0) {
		return usage("--blueprint compares runs: give --since, not --session or --from-seq")
	}
	var from record.Start
	if *since != "" {
		if *fromSeq != 0 {
			return usage("give --since or --from-seq, not both")
		}
		t, err := record.ParseSince(*since, time.Now())
		if err != nil {
			return usage("%v", err)
		}
		from.Time = t
	}
	from.Seq = *fromSeq
	var filters []string
	if *session != "" {
		var err error
		if filters, err = record.SessionFilters("--session", *session); err != nil {
			return usage("%v", err)
		}
	}
	if *routesFile != "" {
		return whatIf(ctx, env, natsURL, *routesFile, filters, from, *asJSON)
	}
	if *policiesFile != "" {
		return whatIfPolicies(ctx, env, natsURL, *policiesFile, filters, from, *asJSON)
	}
	if *blueprintFile != "" {
		return whatIfBlueprint(ctx, env, natsURL, *blueprintFile, from, *asJSON)
	}

	nc, js, err := dialRecord(ctx, natsURL, "replay")
	if err != nil {
		return err
	}
	defer nc.Close()
	out, flush := buffered(env.Stdout)
	p := newPrinter(out, *asJSON, true, colorFor(env.Stdout))
	n, err := record.Read(ctx, js, filters, from, p.print)
	if ferr := flush(); err == nil {
		err = ferr
	}
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if n == 0 {
		fmt.Fprintf(env.Stderr, "no messages for session %s (%s) on %s\n", *session, from, bus.Redact(natsURL.url))
	}
	return nil
}

// whatIf compares the recorded routing of every call (of session, when filters name one) with
// the routes file's. It runs nothing and publishes nothing.
func whatIf(ctx context.Context, env Env, natsURL *natsTarget, file string, filters []string, from record.Start, asJSON bool) error {
	table, err := routes.Load(file)
	if err != nil {
		return replayTrouble(err)
	}
	if filters == nil {
		// Requests, tool calls and results of every session; "*" stands for every tool.
		filters = append([]string{protocol.FilterRequests, protocol.FilterResults}, protocol.FiltersAllToolCalls()...)
	}
	nc, js, err := dialRecord(ctx, natsURL, "replay")
	if err != nil {
		return replayTrouble(err)
	}
	defer nc.Close()
	requestSubjects := protocol.PrefixRequests
	var rec whatif.Record
	if _, err := record.Read(ctx, js, filters, from, func(e *record.Entry) error {
		if e.Err != nil {
			if (e.Msg != nil && e.Msg.Type == protocol.TypeRequest) || strings.HasPrefix(protocol.CanonicalSubject(e.Subject), requestSubjects) {
				rec.AddUnreadable()
			}
			return nil
		}
		rec.Add(e.Msg, e.Payload)
		return nil
	}); err != nil {
		return replayTrouble(err)
	}
	rep := rec.Compare(table)
	return reportWhatIf(env, asJSON, len(rep.Changed),
		func(w io.Writer) error { return writeWhatIfJSON(w, rep, table, from) },
		func(w io.Writer) { writeWhatIf(w, rep, table, from) })
}

// reportWhatIf writes a what-if's report to standard output, as JSON or as text, and exits 1
// when changed says anything would change (2 when the report could not be written).
func reportWhatIf(env Env, asJSON bool, changed int, writeJSON func(io.Writer) error, writeText func(io.Writer)) error {
	out, flush := buffered(env.Stdout)
	var err error
	if asJSON {
		err = writeJSON(out)
	} else {
		writeText(out)
	}
	if ferr := flush(); err == nil {
		err = ferr
	}
	if err != nil {
		return replayTrouble(err)
	}
	if changed > 0 {
		return &ExitError{Code: 1}
	}
	return nil
}

func writeWhatIf(w io.Writer, rep *whatif.Report, t *routes.Table, from record.Start) {
	for _, c := range rep.Changed {
		fmt.Fprintf(w, "%s %s %s: %s -> %s", c.RequestID, c.ToolCallID, c.Tool, c.Before, c.After)
		if len(c.Differences) > 0 {
			fmt.Fprintf(w, " (same rule, changed: %s)", strings.Join(c.Differences, ", "))
		}
		fmt.Fprintln(w)
	}
	for _, c := range rep.NotDispatched {
		fmt.Fprintf(w, "%s %s %s: not dispatched yet -> %s (not compared)\n", c.RequestID, c.ToolCallID, c.Tool, c.After)
	}
	fmt.Fprintf(w, "%d of %s in %s would route differently with %s (record read %s)",
		len(rep.Changed), plural(rep.Calls, "call"), plural(rep.Requests, "request"), t.File, from)
	var notes []string
	if n := len(rep.NotDispatched); n > 0 {
		notes = append(notes, fmt.Sprintf("%s not dispatched yet, not compared", plural(n, "call")))
	}
	if rep.Duplicates > 0 {
		notes = append(notes, fmt.Sprintf("%s of a request_id seen before, counted once", plural(rep.Duplicates, "repeated record")))
	}
	if rep.Unreadable > 0 {
		notes = append(notes, fmt.Sprintf("%s skipped", plural(rep.Unreadable, "unreadable request")))
	}
	if len(notes) > 0 {
		fmt.Fprintf(w, "; %s", strings.Join(notes, "; "))
	}
	fmt.Fprintln(w)
}

// whatIfOutcome is an Outcome in JSON.
type whatIfOutcome struct {
	State string `json:"state"` // routed, no_route or not_dispatched
	Rule  string `json:"rule,omitempty"`
}

func outcomeJSON(o whatif.Outcome) whatIfOutcome {
	switch o.Kind {
	case whatif.Routed:
		return whatIfOutcome{State: "routed", Rule: o.Rule}
	case whatif.NoRoute:
		return whatIfOutcome{State: "no_route"}
	}
	return whatIfOutcome{State: "not_dispatched"}
}

func writeWhatIfJSON(w io.Writer, rep *whatif.Report, t *routes.Table, from record.Start) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	type call struct {
		Kind        string        `json:"kind"` // changed or not_dispatched
		RequestID   string        `json:"request_id"`
		SessionID   string        `json:"session_id"`
		ToolCallID  string        `json:"tool_call_id"`
		Tool        string        `json:"tool"`
		Before      whatIfOutcome `json:"before"`
		After       whatIfOutcome `json:"after"`
		Differences []string      `json:"differences,omitempty"`
	}
	for _, group := range []struct {
		kind  string
		calls []whatif.Call
	}{{"changed", rep.Changed}, {"not_dispatched", rep.NotDispatched}} {
		for _, c := range group.calls {
			if err := enc.Encode(call{Kind: group.kind, RequestID: c.RequestID, SessionID: c.SessionID, ToolCallID: c.ToolCallID,
				Tool: c.Tool, Before: outcomeJSON(c.Before), After: outcomeJSON(c.After), Differences: c.Differences}); err != nil {
				return err
			}
		}
	}
	return enc.Encode(struct {
		Kind          string `json:"kind"`
		Routes        string `json:"routes"`
		Digest        string `json:"digest"`
		From          string `json:"from"`
		Requests      int    `json:"requests"`
		Calls         int    `json:"calls"`
		Changed       int    `json:"changed"`
		NotDispatched int    `json:"not_dispatched"`
		Duplicates    int    `json:"duplicates"`
		Unreadable    int    `json:"unreadable"`
	}{"summary", t.File, t.Digest, from.String(), rep.Requests, rep.Calls, len(rep.Changed), len(rep.NotDispatched), rep.Duplicates, rep.Unreadable})
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// replayTrouble is what replay exits with when it cannot tell (2): err.
func replayTrouble(err error) error {
	return &ExitError{Code: 2, Err: fmt.Errorf("replay: %w", err)}
}
