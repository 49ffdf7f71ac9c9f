package app

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/internal/record"
	"github.com/hermesbus/hermes/internal/whatif"
	"github.com/hermesbus/hermes/pkg/blueprint"
)

// whatIfBlueprint walks the recorded runs of the blueprint file names (created since from,
// when set) again along the file's blueprint and reports those that would take another path.
// It calls no tool, runs nothing and publishes nothing.
//
// The runs come from the runs' bucket (hermes-runs), not from the stream: a run's record
// there holds its user_input, which the stream's blueprint_step events and step requests do
// not, and every step's arguments, answer, status and condition in one value, so nothing has
// to be pieced together. A run whose record the bucket no longer keeps (it keeps each for a
// week after its last change) is not compared. Reading the bucket takes credentials that may
// watch it: the admin's (the default of hermes up) or a gateway's.
func whatIfBlueprint(ctx context.Context, env Env, natsURL *natsTarget, file string, from record.Start, asJSON bool) error {
	data, err := readBounded(file, blueprint.MaxBytes)
	if err != nil {
		return replayTrouble(err)
	}
	bp, err := blueprint.Load(data, nil) // the tools taken as known: the walk calls none
	if err != nil {
		return replayTrouble(fmt.Errorf("%s: %w", file, err))
	}
	nc, js, err := dialRecord(ctx, natsURL, "replay")
	if err != nil {
		return replayTrouble(err)
	}
	defer nc.Close()
	runs, unreadable, err := readRuns(ctx, js, bp.Name, from.Time)
	if err != nil {
		return replayTrouble(err)
	}
	rep := whatif.CompareRuns(bp, runs)
	rep.Unreadable += unreadable
	return reportWhatIf(env, asJSON, len(rep.Changed),
		func(w io.Writer) error { return writeBlueprintWhatIfJSON(w, rep, bp.Name, file, from) },
		func(w io.Writer) { writeBlueprintWhatIf(w, rep, bp.Name, file, from) })
}

// readRuns reads the runs of blueprint name created at since or later (every run, when since
// is zero) from the runs' bucket, oldest first; unreadable counts the values of the bucket
// that are no run. A bucket not made yet holds none.
func readRuns(ctx context.Context, js jetstream.JetStream, name string, since time.Time) (runs []*blueprints.Run, unreadable int, err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	kv, err := js.KeyValue(ctx, blueprints.RunsBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("the runs' bucket %s: %w", blueprints.RunsBucket, err)
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, 0, fmt.Errorf("read the runs' bucket %s: %w", blueprints.RunsBucket, err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil, 0, fmt.Errorf("read the runs' bucket %s: %w", blueprints.RunsBucket, ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return nil, 0, fmt.Errorf("read the runs' bucket %s: the watch ended", blueprints.RunsBucket)
			}
			if e == nil {
				// Every run kept now has been read.
				slices.SortStableFunc(runs, func(a, b *blueprints.Run) int {
					return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.RunID, b.RunID))
				})
				return runs, unreadable, nil
			}
			r, err := blueprints.DecodeRun(e.Key(), e.Value())
			switch {
			case err != nil:
				unreadable++
			case r.Blueprint == name && !r.CreatedAt.Before(since):
				runs = append(runs, r)
			}
		}
	}
}

func writeBlueprintWhatIf(w io.Writer, rep *whatif.RunReport, name, file string, from record.Start) {
	for _, p := range rep.Changed {
		fmt.Fprintf(w, "run %s: %s%s\n", p.RunID, stepOf(p), p.Reason)
	}
	for _, id := range rep.Unfinished {
		fmt.Fprintf(w, "run %s: not finished yet (not compared)\n", id)
	}
	fmt.Fprintf(w, "%d of %d recorded runs of %s would take another path with %s (runs created %s)",
		len(rep.Changed), rep.Runs, name, file, runsFrom(from))
	var notes []string
	if n := len(rep.Unfinished); n > 0 {
		notes = append(notes, fmt.Sprintf("%s not finished yet, not compared", plural(n, "run")))
	}
	if rep.Unreadable > 0 {
		notes = append(notes, fmt.Sprintf("%s skipped", plural(rep.Unreadable, "unreadable run")))
	}
	if len(notes) > 0 {
		fmt.Fprintf(w, "; %s", strings.Join(notes, "; "))
	}
	fmt.Fprintln(w)
}

// stepOf names where a run's path parts: "step 1 logistics_urge: ", or "end: ".
func stepOf(p whatif.RunPath) string {
	if p.Step == "" {
		return "end: "
	}
	return "step " + p.Step + " " + p.Tool + ": "
}

// runsFrom says which runs were read: "since 2026-03-16T09:00:00Z", or "at any time".
func runsFrom(from record.Start) string {
	if from.Time.IsZero() {
		return "at any time"
	}
	return from.String()
}

func writeBlueprintWhatIfJSON(w io.Writer, rep *whatif.RunReport, name, file string, from record.Start) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	type run struct {
		Kind      string    `json:"kind"` // changed or unfinished
		RunID     string    `json:"run_id"`
		Version   int       `json:"version,omitempty"`
		CreatedAt time.Time `json:"created_at,omitzero"`
		Step      string    `json:"step,omitempty"`
		Tool      string    `json:"tool,omitempty"`
		Reason    string    `json:"reason,omitempty"`
	}
	for _, p := range rep.Changed {
		if err := enc.Encode(run{Kind: "changed", RunID: p.RunID, Version: p.Version, CreatedAt: p.CreatedAt.UTC(), Step: p.Step, Tool: p.Tool, Reason: p.Reason}); err != nil {
			return err
		}
	}
	for _, id := range rep.Unfinished {
		if err := enc.Encode(run{Kind: "unfinished", RunID: id}); err != nil {
			return err
		}
	}
	return enc.Encode(struct {
		Kind       string `json:"kind"`
		Blueprint  string `json:"blueprint"`
		File       string `json:"file"`
		From       string `json:"from"`
		Runs       int    `json:"runs"`
		Changed    int    `json:"changed"`
		Unfinished int    `json:"unfinished"`
		Unreadable int    `json:"unreadable"`
	}{"summary", name, file, runsFrom(from), rep.Runs, len(rep.Changed), len(rep.Unfinished), rep.Unreadable})
}
