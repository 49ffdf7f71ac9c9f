package app

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hermesbus/hermes/examples"
	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/pkg/blueprint"
)

// readStartBlueprints reads what hermes up registers at start: from (a file, or a directory of
// *.json and *.yaml files); by default the example blueprints when the demo tools run (demo);
// "none" for none.
func readStartBlueprints(from string, demo bool) ([][]byte, error) {
	switch {
	case from == "none" || from == "" && !demo:
		return nil, nil
	case from == "":
		return readBlueprintFiles(examples.Files, "blueprints")
	}
	st, err := os.Stat(from)
	if err != nil {
		return nil, fmt.Errorf("--blueprints: %w", err)
	}
	if !st.IsDir() {
		data, err := os.ReadFile(from)
		if err != nil {
			return nil, fmt.Errorf("--blueprints: %w", err)
		}
		return [][]byte{data}, nil
	}
	return readBlueprintFiles(os.DirFS(from), ".")
}

// readBlueprintFiles reads every *.json, *.yaml and *.yml file of dir in fsys, by name.
func readBlueprintFiles(fsys fs.FS, dir string) ([][]byte, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("--blueprints: %w", err)
	}
	var out [][]byte
	for _, e := range entries {
		ext := strings.ToLower(filepath.Ext(e.Name()))
		if e.IsDir() || !slices.Contains([]string{".json", ".yaml", ".yml"}, ext) {
			continue
		}
		data, err := fs.ReadFile(fsys, filepath.ToSlash(filepath.Join(dir, e.Name())))
		if err != nil {
			return nil, fmt.Errorf("--blueprints: %w", err)
		}
		out = append(out, data)
	}
	return out, nil
}

// applyStartBlueprints registers each of docs whose name never had a blueprint (one changed or
// removed since is left as it is), and says what it did. A document that does not compile
// stops the start, naming the step and field.
func applyStartBlueprints(ctx context.Context, lib *blueprints.Library, docs [][]byte) (string, error) {
	var applied, kept []string
	for _, doc := range docs {
		b, err := blueprint.Load(doc, nil)
		if err != nil {
			return "", fmt.Errorf("the start's blueprints: %w", err)
		}
		if _, err := lib.History(ctx, b.Name); err == nil {
			kept = append(kept, b.Name)
			continue
		} else if !errors.Is(err, blueprints.ErrNotFound) {
			return "", err
		}
		if _, _, err := lib.Apply(ctx, b, "hermes up"); err != nil {
			return "", fmt.Errorf("register blueprint %s: %w", b.Name, err)
		}
		applied = append(applied, b.Name)
	}
	slices.Sort(applied)
	desc := strings.Join(applied, ", ") + " registered"
	if len(applied) == 0 {
		desc = "none registered"
	}
	if len(kept) > 0 {
		slices.Sort(kept)
		desc += "; kept as changed since: " + strings.Join(kept, ", ")
	}
	return desc, nil
}
