package app

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/hermesbus/hermes/internal/router"
)

// Seal key files. A private key file holds one line, "hermes-seal-key <id> <base64 seed>"; a
// trusted keys file holds "hermes-seal-public <id> <base64 public key>" lines (# comments and
// blank lines allowed), so that keys can be rotated: trust the new one, then sign with it.
const (
	sealKeyTag    = "hermes-seal-key"
	sealPublicTag = "hermes-seal-public"
	// sealKeyFile and sealPublicFile are hermes up's, in its data dir.
	sealKeyFile    = "seal.key"
	sealPublicFile = "seal.pub"
)

var sealKeyID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// readSealKey reads a private seal key file.
func readSealKey(path string) (*router.SealKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("seal key: %w", err)
	}
	f := strings.Fields(string(data))
	if len(f) != 3 || f[0] != sealKeyTag || !sealKeyID.MatchString(f[1]) {
		return nil, fmt.Errorf("seal key %s: not a %s file (make one with hermes seal-key --out FILE)", path, sealKeyTag)
	}
	seed, err := base64.StdEncoding.DecodeString(f[2])
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("seal key %s: the key is not %d base64 bytes", path, ed25519.SeedSize)
	}
	return &router.SealKey{ID: f[1], Key: ed25519.NewKeyFromSeed(seed)}, nil
}

// readTrustedSeals reads a trusted keys file.
func readTrustedSeals(path string) (map[string]ed25519.PublicKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("trusted seal keys: %w", err)
	}
	keys := map[string]ed25519.PublicKey{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		var pub []byte
		if len(f) == 3 && f[0] == sealPublicTag && sealKeyID.MatchString(f[1]) {
			pub, err = base64.StdEncoding.DecodeString(f[2])
		}
		if len(f) != 3 || f[0] != sealPublicTag || !sealKeyID.MatchString(f[1]) || err != nil || len(pub) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("trusted seal keys %s:%d: want %q", path, n, sealPublicTag+" <id> <base64 public key>")
		}
		keys[f[1]] = ed25519.PublicKey(pub)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("trusted seal keys %s: no key", path)
	}
	return keys, nil
}

// newSealKey writes a new private key file at path (mode 0600, never over an existing file)
// and returns its public line.
func newSealKey(path, id string) (string, error) {
	if !sealKeyID.MatchString(id) {
		return "", fmt.Errorf("seal key id %q: 1 to 64 letters, digits, '.', '_' or '-'", id)
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	f, err := takeSecretFile(path)
	if err != nil {
		return "", fmt.Errorf("seal key: %w", err)
	}
	_, err = fmt.Fprintf(f, "%s %s %s\n", sealKeyTag, id, base64.StdEncoding.EncodeToString(priv.Seed()))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return "", err
	}
	return fmt.Sprintf("%s %s %s", sealPublicTag, id, base64.StdEncoding.EncodeToString(pub)), nil
}

// upSealKeys returns hermes up's seal key pair, in dataDir: made on the first start, read after.
func upSealKeys(dataDir string) (*router.SealKey, map[string]ed25519.PublicKey, error) {
	if dataDir == "" { // kept nowhere: a pair for this run
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		return &router.SealKey{ID: "hermes-up", Key: priv}, map[string]ed25519.PublicKey{"hermes-up": pub}, nil
	}
	priv, pubPath := filepath.Join(dataDir, sealKeyFile), filepath.Join(dataDir, sealPublicFile)
	if _, err := os.Stat(priv); errors.Is(err, fs.ErrNotExist) {
		line, err := newSealKey(priv, "hermes-up")
		if err != nil {
			return nil, nil, err
		}
		if err := os.WriteFile(pubPath, []byte(line+"\n"), 0o644); err != nil {
			return nil, nil, err
		}
	}
	k, err := readSealKey(priv)
	if err != nil {
		return nil, nil, err
	}
	trusted, err := readTrustedSeals(pubPath)
	if err != nil {
		return nil, nil, err
	}
	return k, trusted, nil
}

// RunSealKey makes a router's seal key: hermes seal-key --out FILE [--id ID]. The private key
// goes to FILE (0600) for the router's --seal-key; the public line is printed, for the workers'
// --trusted-seals file.
func RunSealKey(_ context.Context, args []string, env Env) error {
	fs := flag.NewFlagSet("seal-key", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	out := fs.String("out", "", "file to write the private key to (must not exist)")
	id := fs.String("id", "router-1", "the key's id, named in every seal (letters, digits, '.', '_', '-')")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("seal-key: --out FILE is required")
	}
	line, err := newSealKey(*out, *id)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stderr, "wrote the private key to %s; give it to routers (--seal-key %s) and this line to workers (--trusted-seals FILE):\n", *out, *out)
	fmt.Fprintln(env.Stdout, line)
	return nil
}
