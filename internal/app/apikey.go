package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hermesbus/hermes/internal/auth"
)

// adminKeyFile is the file in hermes up's data dir that holds the admin key it made.
const adminKeyFile = "admin.key"

// abandonedAfter is how old an empty key file is when the start that made it is taken to have
// died before writing it.
const abandonedAfter = 10 * time.Second

// defaultKeyFile is where the CLI looks for a key when HERMES_API_KEY is not set: hermes up's
// admin key, in its default data dir.
var defaultKeyFile = filepath.Join("hermes-data", adminKeyFile)

// SystemKey is the admin API key a system starts with.
type SystemKey struct {
	// Key is the key; empty when the key file holds one that no longer names a caller.
	Key string
	// Made is set when the key was made by this start: it is shown once.
	Made bool
	// Path is the file it is kept in; empty when it is kept nowhere.
	Path string
	// Problem, when set, says why there is no usable key (for the banner).
	Problem string
}

// ensureAdminKey returns the admin key of a system: the one kept at path, or, when path holds
// none yet, a new one kept there (mode 0600, made only if absent, so two starts never overwrite
// each other's). An empty path makes a new key kept nowhere. A key at path that no longer names
// a caller (revoked, or from another bus) is reported, not replaced: revoking it must stick.
func ensureAdminKey(ctx context.Context, keys *auth.Keys, path string) (SystemKey, error) {
	if path == "" {
		key, _, err := keys.Create(ctx, auth.NewKey{Name: "hermes-up-admin", Role: auth.RoleAdmin, CreatedBy: "hermes up"})
		return SystemKey{Key: key, Made: err == nil}, err
	}
	for range 2 {
		if k, found, err := keptKey(ctx, keys, path); found || err != nil {
			return k, err
		}
		// The file is taken first (so that two starts never both make a key), then the key
		// made and written; a key that could not be kept is revoked, so none is left that
		// nobody holds.
		f, err := takeSecretFile(path)
		if errors.Is(err, fs.ErrExist) {
			continue // another start took it: read what it keeps
		}
		if err != nil {
			return SystemKey{}, fmt.Errorf("keep the admin key: %w", err)
		}
		// Not cut short by the caller: a key the store kept must reach the file, or be revoked.
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		key, k, err := keys.Create(kctx, auth.NewKey{Name: "hermes-up-admin", Role: auth.RoleAdmin, CreatedBy: "hermes up"})
		if err == nil {
			_, err = f.WriteString(key + "\n")
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(path)
			if k != nil {
				_, _ = keys.Revoke(kctx, k.ID)
			}
			cancel()
			return SystemKey{}, fmt.Errorf("keep the admin key: %w", err)
		}
		cancel()
		return SystemKey{Key: key, Made: true, Path: path}, nil
	}
	return SystemKey{}, fmt.Errorf("keep the admin key: %s is being written by another start; try again", path)
}

// keptKey reads the key kept at path: found false when there is no file (or an empty one,
// being written by another start).
func keptKey(ctx context.Context, keys *auth.Keys, path string) (SystemKey, bool, error) {
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return SystemKey{}, false, nil
	case err != nil:
		return SystemKey{}, false, fmt.Errorf("read the admin key: %w", err)
	}
	key := strings.TrimSpace(string(data))
	if key == "" {
		// Being written by another start, or left empty by one that died: after a while, the
		// latter, and out of the way.
		if fi, err := os.Stat(path); err == nil && time.Since(fi.ModTime()) > abandonedAfter {
			_ = os.Remove(path)
		}
		return SystemKey{}, false, nil
	}
	_, err = keys.Verify(ctx, key)
	switch {
	case err == nil:
		return SystemKey{Key: key, Path: path}, true, nil
	case errors.Is(err, auth.ErrUnauthenticated):
		return SystemKey{Path: path, Problem: fmt.Sprintf("the key in %s names no caller on this bus: revoked, or made for another bus "+
			"(with --nats, give --data a directory of its own); make one with hermes keys create, or move the file away to have a new admin key made", path)}, true, nil
	}
	return SystemKey{}, false, fmt.Errorf("check the admin key in %s: %w", path, err)
}

// keyFlag is how a command that calls a gateway finds its API key: HERMES_API_KEY, else the
// file --key-file names (by default hermes up's admin key). The key itself is never a flag, so
// it does not show in process lists or shell history.
type keyFlag struct {
	file string // as given; empty: HERMES_KEY_FILE, else defaultKeyFile, either of which may be missing
	used string // where the key sent came from, for messages
	// fixed, when set, is the key, whatever the environment says (a service's own).
	fixed string
}

func (k *keyFlag) register(fs *flag.FlagSet) {
	fs.StringVar(&k.file, "key-file", "",
		"file holding the API key, used when HERMES_API_KEY is not set (default: HERMES_KEY_FILE, else "+defaultKeyFile+", hermes up's admin key)")
}

// key returns the API key to send; empty when there is none (the gateway will say 401). A
// --key-file or HERMES_KEY_FILE that names no file is an error.
func (k *keyFlag) key() (string, error) {
	if k.fixed != "" {
		k.used = "the service's key"
		return k.fixed, nil
	}
	if v := strings.TrimSpace(os.Getenv("HERMES_API_KEY")); v != "" {
		k.used = "HERMES_API_KEY"
		return v, nil
	}
	path, explicit := k.file, true
	if path == "" {
		path = os.Getenv("HERMES_KEY_FILE")
	}
	if path == "" {
		path, explicit = defaultKeyFile, false
	}
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		k.used = path
		return strings.TrimSpace(string(data)), nil
	case errors.Is(err, fs.ErrNotExist) && !explicit:
		return "", nil
	default:
		return "", fmt.Errorf("read the API key: %w", err)
	}
}

// authorize sets r's Authorization from the key, if there is one.
func (k *keyFlag) authorize(r *http.Request) error {
	key, err := k.key()
	if err == nil && key != "" {
		r.Header.Set("Authorization", "Bearer "+key)
	}
	return err
}

// refused explains a gateway's 401, 403 or 429 to someone at a terminal; "" for other answers.
func (k *keyFlag) refused(status int) string {
	switch {
	case status == http.StatusForbidden:
		return "the API key's role may not do this"
	case status == http.StatusTooManyRequests:
		return "the gateway is slowing this caller or address down (too many requests, or failed keys); wait and retry"
	case status != http.StatusUnauthorized:
		return ""
	case k.used != "":
		return "the gateway did not take the key from " + k.used + " (revoked, or made for another Hermes?)"
	}
	return fmt.Sprintf("give an API key: set HERMES_API_KEY, or --key-file (hermes up keeps its admin key in %s)", defaultKeyFile)
}

// takeSecretFile creates path for a secret — its directory 0700 if missing, the file 0600 —
// and fails (wrapping fs.ErrExist) when the file exists: a secret is never written over.
func takeSecretFile(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
}
