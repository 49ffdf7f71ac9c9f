package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/record"
	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/internal/whatif"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// whatIfPolicies decides every recorded call (of session, when filters name one) again under
// the policy file's policies and reports those decided differently. It runs nothing and
// publishes nothing.
func whatIfPolicies(ctx context.Context, env Env, natsURL *natsTarget, file string, filters []string, from record.Start, asJSON bool) error {
	data, err := readBounded(file, policy.MaxFileBytes)
	if err != nil {
		return replayTrouble(err)
	}
	f, err := policy.ParseFile(data)
	if err != nil {
		return replayTrouble(fmt.Errorf("%s: %w", file, err))
	}
	if filters == nil {
		// Requests, tool calls, results and policy events of every session.
		filters = append([]string{protocol.FilterRequests, protocol.FilterResults, protocol.FilterEvents(protocol.EventPolicy)}, protocol.FiltersAllToolCalls()...)
	}
	nc, js, err := dialRecord(ctx, natsURL, "replay")
	if err != nil {
		return replayTrouble(err)
	}
	defer nc.Close()
	contracts, note := replayContracts(ctx, js)
	var rec whatif.Policies
	if _, err := record.Read(ctx, js, filters, from, func(e *record.Entry) error {
		if e.Err != nil {
			if (e.Msg != nil && e.Msg.Type == protocol.TypeRequest) || strings.HasPrefix(protocol.CanonicalSubject(e.Subject), protocol.PrefixRequests) {
				rec.AddUnreadable()
			}
			return nil
		}
		rec.Add(e.Time, e.Msg, e.Payload)
		return nil
	}); err != nil {
		return replayTrouble(err)
	}
	rep := rec.Compare(f, contracts)
	return reportWhatIf(env, asJSON, len(rep.Changed),
		func(w io.Writer) error { return writePolicyWhatIfJSON(w, rep, file, from, note) },
		func(w io.Writer) { writePolicyWhatIf(w, rep, file, from, note) })
}

// readBounded reads file, refusing one larger than limit.
func readBounded(file string, limit int64) ([]byte, error) {
	fh, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", file, limit)
	}
	return data, nil
}

// replayContracts reads the tools' contracts as registered now (what max_recipients counts,
// and the policy blocks of tools the file leaves out). When they cannot be read, calls are
// decided with none, and note says so.
func replayContracts(ctx context.Context, js jetstream.JetStream) (whatif.Contracts, string) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(cctx, bus.BucketContracts)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, ""
	}
	var all []*contract.Compiled
	if err == nil {
		all, err = registry.NewLive(kv, nil).Tools(cctx)
	}
	if err != nil {
		return nil, "the tools' contracts could not be read (" + err.Error() + "): decided with none"
	}
	byName := make(map[string]*contract.Compiled, len(all))
	for _, k := range all {
		byName[k.Name] = k
	}
	return func(tool string) *contract.Compiled { return byName[tool] }, ""
}

func writePolicyWhatIf(w io.Writer, rep *whatif.PolicyReport, file string, from record.Start, note string) {
	for _, c := range rep.Changed {
		fmt.Fprintf(w, "%s %s %s: %s -> %s", c.RequestID, c.ToolCallID, c.Tool, whatif.Decided(c.Before), whatif.Decided(c.After))
		if c.After != nil && c.After.Reason != "" {
			fmt.Fprintf(w, " (%s)", c.After.Reason)
		}
		fmt.Fprintln(w)
	}
	for _, c := range rep.NotDecided {
		fmt.Fprintf(w, "%s %s %s: not decided yet -> %s (not compared)\n", c.RequestID, c.ToolCallID, c.Tool, whatif.Decided(c.After))
	}
	fmt.Fprintf(w, "%d of %s in %s would be decided differently with %s (record read %s)",
		len(rep.Changed), plural(rep.Calls, "call"), plural(rep.Requests, "request"), file, from)
	var notes []string
	if n := len(rep.NotDecided); n > 0 {
		notes = append(notes, fmt.Sprintf("%s not decided yet, not compared", plural(n, "call")))
	}
	if rep.Duplicates > 0 {
		notes = append(notes, fmt.Sprintf("%s of a request_id seen before, counted once", plural(rep.Duplicates, "repeated record")))
	}
	if rep.Unreadable > 0 {
		notes = append(notes, fmt.Sprintf("%s skipped", plural(rep.Unreadable, "unreadable request")))
	}
	if note != "" {
		notes = append(notes, note)
	}
	if len(notes) > 0 {
		fmt.Fprintf(w, "; %s", strings.Join(notes, "; "))
	}
	fmt.Fprintln(w)
}

// policyOutcome is a decision in JSON; decision "allowed" with no source is no policy.
type policyOutcome struct {
	Decision string    `json:"decision"`
	Rule     string    `json:"rule,omitempty"`
	Source   string    `json:"source,omitempty"`
	Version  int       `json:"version,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	RetryAt  time.Time `json:"retry_at,omitzero"`
}

func policyOutcomeJSON(d *protocol.PolicyDecision) policyOutcome {
	if d == nil {
		return policyOutcome{Decision: protocol.PolicyAllowed}
	}
	return policyOutcome{Decision: d.Decision, Rule: d.Rule, Source: d.Source, Version: d.Version, Reason: d.Reason, RetryAt: d.RetryAt}
}

func writePolicyWhatIfJSON(w io.Writer, rep *whatif.PolicyReport, file string, from record.Start, note string) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	type call struct {
		Kind       string        `json:"kind"` // changed or not_decided
		RequestID  string        `json:"request_id"`
		SessionID  string        `json:"session_id"`
		ToolCallID string        `json:"tool_call_id"`
		Tool       string        `json:"tool"`
		At         time.Time     `json:"at"`
		Before     policyOutcome `json:"before"`
		After      policyOutcome `json:"after"`
	}
	for _, group := range []struct {
		kind  string
		calls []whatif.PolicyCall
	}{{"changed", rep.Changed}, {"not_decided", rep.NotDecided}} {
		for _, c := range group.calls {
			if err := enc.Encode(call{Kind: group.kind, RequestID: c.RequestID, SessionID: c.SessionID, ToolCallID: c.ToolCallID, Tool: c.Tool,
				At: c.At.UTC(), Before: policyOutcomeJSON(c.Before), After: policyOutcomeJSON(c.After)}); err != nil {
				return err
			}
		}
	}
	return enc.Encode(struct {
		Kind       string `json:"kind"`
		Policies   string `json:"policies"`
		From       string `json:"from"`
		Requests   int    `json:"requests"`
		Calls      int    `json:"calls"`
		Changed    int    `json:"changed"`
		NotDecided int    `json:"not_decided"`
		Duplicates int    `json:"duplicates"`
		Unreadable int    `json:"unreadable"`
		Note       string `json:"note,omitempty"`
	}{"summary", file, from.String(), rep.Requests, rep.Calls, len(rep.Changed), len(rep.NotDecided), rep.Duplicates, rep.Unreadable, note})
}
