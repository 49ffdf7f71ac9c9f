package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hermesbus/hermes/internal/gateway"
	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/pkg/contract"
)

// desired is one contract a file names.
type desired struct {
	c      *contract.Contract
	source []byte
	at     string // file:line
}

// RunApply makes the registered contracts what files say: hermes apply.
func RunApply(ctx context.Context, args []string, env Env) error {
	fset := newFlagSet("apply", "hermes apply -f DIR_OR_FILE [--dry-run] [--prune] [flags]", env.Stderr)
	var api gatewayAPI
	api.register(fset)
	var files listFlag
	fset.Var(&files, "f", "a contract file (YAML or JSON, several documents allowed) or a directory of them (*.yaml, *.yml, *.json, read recursively); repeatable")
	dry := fset.Bool("dry-run", false, "print what would change, change nothing")
	prune := fset.Bool("prune", false, "remove the contracts of tools the files no longer name")
	var try tryFlags
	try.register(fset)
	if err := fset.Parse(args); err != nil {
		return err
	}
	if len(files) == 0 {
		fset.Usage()
		return errors.New("apply: -f is required")
	}
	want, err := readDesired(files)
	if err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	var have toolList
	if err := api.do(ctx, http.MethodGet, "/api/v1/tools", "", nil, &have); err != nil {
		return fmt.Errorf("apply: read what is registered: %w", err)
	}
	registered := map[string]gateway.ToolView{}
	for _, t := range have.Tools {
		registered[t.Name] = t
	}
	plan := diffContracts(want, registered, have.Damaged, *prune)
	for _, line := range plan.lines {
		fmt.Fprintln(env.Stdout, line)
	}
	fmt.Fprintf(env.Stdout, "%d to register, %d to change, %d to remove, %d unchanged\n", len(plan.create), len(plan.update), len(plan.remove), plan.same)
	if *dry {
		fmt.Fprintln(env.Stdout, "(dry run: nothing changed)")
		return nil
	}
	var failed []string
	for _, d := range append(plan.create, plan.update...) {
		v, err := api.registerContract(ctx, d.source, d.at, try.query(true))
		if err != nil {
			failed = append(failed, d.c.Name)
			fmt.Fprintf(env.Stderr, "%s (%s): %v\n", d.c.Name, d.at, refusal(env, err))
			continue
		}
		fmt.Fprintf(env.Stdout, "%s: version %d registered\n", v.Name, v.Version)
		printReport(env, v.Sandbox)
	}
	for _, name := range plan.remove {
		var v gateway.ToolView
		if err := api.do(ctx, http.MethodDelete, "/api/v1/tools/"+url.PathEscape(name), "", nil, &v); err != nil {
			failed = append(failed, name)
			fmt.Fprintf(env.Stderr, "%s: %v\n", name, err)
			continue
		}
		fmt.Fprintf(env.Stdout, "%s: removed\n", name)
	}
	if len(failed) > 0 {
		return fmt.Errorf("apply: %d of %d changes failed: %s", len(failed), len(plan.create)+len(plan.update)+len(plan.remove), strings.Join(failed, ", "))
	}
	return nil
}

// readDesired reads every contract the paths name; a document that is not a contract, a
// contract that does not compile, or a tool named twice is an error naming file and line.
func readDesired(paths []string) ([]desired, error) {
	var files []string
	for _, p := range paths {
		info, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !info.IsDir() {
			files = append(files, p)
			continue
		}
		err = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			switch strings.ToLower(filepath.Ext(path)) {
			case ".yaml", ".yml", ".json":
				if !d.IsDir() {
					files = append(files, path)
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	var out []desired
	seen := map[string]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		docs, err := registry.Split(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for _, d := range docs {
			at := fmt.Sprintf("%s:%d", f, d.Node.Line)
			if kind := registry.KindOf(d.Node); kind != registry.Kind {
				if kind == "" {
					return nil, fmt.Errorf("%s: not a contract (it names no input_schema, output_schema, execution_policy, effects or reach; say kind: contract)", at)
				}
				return nil, fmt.Errorf("%s: kind %q; hermes apply takes contracts", at, kind)
			}
			c, err := registry.ParseDocument(d)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if first, dup := seen[c.Name]; dup {
				return nil, fmt.Errorf("%s: tool %s is named again (first at %s)", at, c.Name, first)
			}
			seen[c.Name] = at
			out = append(out, desired{c: c, source: d.Source, at: at})
		}
	}
	return out, nil
}

// applyPlan is what apply would do, and the lines that say so.
type applyPlan struct {
	create, update []desired
	remove         []string
	same           int
	lines          []string
}

func diffContracts(want []desired, have map[string]gateway.ToolView, damaged []string, prune bool) applyPlan {
	var p applyPlan
	named := map[string]bool{}
	for _, d := range want {
		named[d.c.Name] = true
		cur, ok := have[d.c.Name]
		switch {
		case slices.Contains(damaged, d.c.Name):
			p.update = append(p.update, d)
			p.lines = append(p.lines, fmt.Sprintf("~ %s (its record is damaged; registered again from %s)", d.c.Name, d.at))
		case !ok || cur.Contract == nil:
			p.create = append(p.create, d)
			p.lines = append(p.lines, fmt.Sprintf("+ %s (new, from %s)", d.c.Name, d.at))
		default:
			before, after := canonical(cur.Contract), canonical(d.c)
			if before == after {
				p.same++
				p.lines = append(p.lines, fmt.Sprintf("= %s (version %d, unchanged)", d.c.Name, cur.Version))
				continue
			}
			p.update = append(p.update, d)
			p.lines = append(p.lines, fmt.Sprintf("~ %s (version %d → %d, from %s)", d.c.Name, cur.Version, cur.Version+1, d.at))
			for _, l := range lineDiff(strings.Split(before, "\n"), strings.Split(after, "\n")) {
				p.lines = append(p.lines, "    "+l)
			}
		}
	}
	names := make([]string, 0, len(have))
	for n := range have {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if named[n] {
			continue
		}
		if prune {
			p.remove = append(p.remove, n)
			p.lines = append(p.lines, fmt.Sprintf("- %s (version %d; no file names it)", n, have[n].Version))
		} else {
			p.lines = append(p.lines, fmt.Sprintf("  %s (version %d; no file names it, kept: --prune removes it)", n, have[n].Version))
		}
	}
	return p
}

// canonical is a contract as indented JSON, the form apply compares and shows.
func canonical(c *contract.Contract) string {
	var v any
	data, _ := json.Marshal(c)
	_ = json.Unmarshal(data, &v)
	out, _ := json.MarshalIndent(v, "", "  ")
	return string(out)
}

// lineDiff lists the lines only a or only b has, in order, as "- line" and "+ line" (a longest
// common subsequence of lines; contracts are small).
func lineDiff(a, b []string) []string {
	n, m := len(a), len(b)
	if n*m > 4<<20 {
		return []string{fmt.Sprintf("(%d lines → %d lines: too long to show line by line)", n, m)}
	}
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []string
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			i++
			j++
		case i < n && (j == m || lcs[i+1][j] >= lcs[i][j+1]):
			out = append(out, "- "+a[i]) // what goes, before what comes in its place
			i++
		default:
			out = append(out, "+ "+b[j])
			j++
		}
	}
	return out
}
