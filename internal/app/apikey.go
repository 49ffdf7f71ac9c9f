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

	"github.com/hermesbus/hermes/internal/auth"
)

// adminKeyFile is the file in hermes up's data dir that holds the admin key it made.
const adminKeyFile = "admin.key"

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
	if path != "" {
		data, err := os.ReadFile(path)
		switch {
		case err == nil:
			key := strings.TrimSpace(string(data))
			_, verr := keys.Verify(ctx, key)
			switch {
			case verr == nil:
				return SystemKey{Key: key, Path: path}, nil
			case errors.Is(verr, auth.ErrUnauthenticated):
				return SystemKey{Path: path, Problem: fmt.Sprintf("the key in %s names no caller on this bus (revoked, or made for another); delete the file to make a new admin key, or use hermes keys create", path)}, nil
			default:
				return SystemKey{}, fmt.Errorf("check the admin key in %s: %w", path, verr)
			}
		case !errors.Is(err, fs.ErrNotExist):
			return SystemKey{}, fmt.Errorf("read the admin key: %w", err)
		}
	}
	key, _, err := keys.Create(ctx, auth.NewKey{Name: "hermes-up-admin", Role: auth.RoleAdmin, CreatedBy: "hermes up"})
	if err != nil {
		return SystemKey{}, err
	}
	if path == "" {
		return SystemKey{Key: key, Made: true}, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return SystemKey{}, fmt.Errorf("keep the admin key: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return SystemKey{}, fmt.Errorf("keep the admin key: %w", err)
	}
	_, err = f.WriteString(key + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return SystemKey{}, fmt.Errorf("keep the admin key: %w", err)
	}
	return SystemKey{Key: key, Made: true, Path: path}, nil
}

// keyFlag is how a command that calls a gateway finds its API key: HERMES_API_KEY, else the
// file --key-file names (by default hermes up's admin key). The key itself is never a flag, so
// it does not show in process lists or shell history.
type keyFlag struct{ file string }

func (k *keyFlag) register(fs *flag.FlagSet) {
	fs.StringVar(&k.file, "key-file", envOr("HERMES_KEY_FILE", defaultKeyFile),
		"file holding the API key, used when HERMES_API_KEY is not set (env HERMES_KEY_FILE)")
}

// key returns the API key to send; empty when there is none (the gateway will say 401).
func (k *keyFlag) key() (string, error) {
	if v := strings.TrimSpace(os.Getenv("HERMES_API_KEY")); v != "" {
		return v, nil
	}
	data, err := os.ReadFile(k.file)
	switch {
	case err == nil:
		return strings.TrimSpace(string(data)), nil
	case errors.Is(err, fs.ErrNotExist):
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

// unauthorized explains a gateway's 401 or 403 to someone at a terminal.
func (k *keyFlag) unauthorized(status int) string {
	if status == http.StatusForbidden {
		return "the API key's role may not do this"
	}
	if os.Getenv("HERMES_API_KEY") != "" {
		return "the gateway did not accept HERMES_API_KEY"
	}
	return fmt.Sprintf("give an API key: set HERMES_API_KEY, or --key-file (hermes up keeps its admin key in %s)", defaultKeyFile)
}
