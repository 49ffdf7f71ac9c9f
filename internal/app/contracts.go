package app

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/hermesbus/hermes/examples"
	"github.com/hermesbus/hermes/internal/registry"
)

// defaultContracts is the directory of contracts hermes up registers when none is named: the
// demo tools'.
const defaultContracts = "examples/contracts"

// upRegistrar is who the registry says registered what hermes up registers.
const upRegistrar = "hermes up"

// contractFiles reads dir's contract documents; the default directory falls back to the copy
// built into the binary when it is not there.
func contractFiles(dir string) ([]desired, string, error) {
	if _, err := os.Stat(dir); err == nil || dir != defaultContracts || !errors.Is(err, fs.ErrNotExist) {
		want, err := readDesired([]string{dir})
		return want, dir, err
	}
	names, err := fs.Glob(examples.Files, "contracts/*.yaml")
	if err != nil {
		return nil, "", err
	}
	var out []desired
	for _, name := range names {
		data, err := examples.Files.ReadFile(name)
		if err != nil {
			return nil, "", err
		}
		c, err := registry.Parse(data)
		if err != nil {
			return nil, "", fmt.Errorf("%s (built in): %w", name, err)
		}
		out = append(out, desired{c: c, source: data, at: name})
	}
	return out, dir + " (built-in copy)", nil
}

// registerContracts registers dir's contracts as hermes up's: a tool that never had a contract
// gets the file's, and one whose contract hermes up registered gets the file's if it changed; a
// contract someone else registered, changed or removed since (tools register, rm, apply) is
// left as it is. It returns what
// it registered and what it left.
func registerContracts(ctx context.Context, store *registry.Store, dir string) (desc string, registered, left []string, err error) {
	want, desc, err := contractFiles(dir)
	if err != nil {
		return "", nil, nil, fmt.Errorf("--contracts %s: %w", dir, err)
	}
	for _, d := range want {
		hist, err := store.History(ctx, d.c.Name)
		switch {
		case err == nil && hist[len(hist)-1].By != upRegistrar:
			// Registered, changed or removed by someone else since: theirs stands.
			left = append(left, d.c.Name)
			continue
		case err != nil && !errors.Is(err, registry.ErrNotFound):
			return "", nil, nil, err
		}
		if _, _, err := store.Register(ctx, d.c, d.source, upRegistrar); err != nil {
			return "", nil, nil, fmt.Errorf("register %s (%s): %w", d.c.Name, d.at, err)
		}
		registered = append(registered, d.c.Name)
	}
	return desc, registered, left, nil
}
