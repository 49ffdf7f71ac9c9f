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
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/hermesbus/hermes/internal/demotools"
	"github.com/hermesbus/hermes/internal/router"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
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

// readTrustedSeals reads a trusted keys file: the routers' keys, whose calls a worker runs.
func readTrustedSeals(path string) (map[string]ed25519.PublicKey, error) {
	t, err := readTrust(path)
	if err != nil {
		return nil, err
	}
	if len(t.calls) == 0 {
		return nil, fmt.Errorf("trusted seal keys %s: no router's key (a line without tools=)", path)
	}
	return t.calls, nil
}

// trust is what a trusted keys file says. A line "hermes-seal-public <id> <key>" is a router's
// (or another Hermes service's) key: it seals tool calls, which workers run, and results of any
// tool. A line ending in "tools=a,b" is a worker's key: it seals results of those tools' calls
// only ("tools=*": of any tool), never a call.
type trust struct {
	calls   map[string]ed25519.PublicKey
	results protocol.ResultKeys
}

// readTrust reads a trusted keys file.
func readTrust(path string) (trust, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return trust{}, fmt.Errorf("trusted seal keys: %w", err)
	}
	t := trust{calls: map[string]ed25519.PublicKey{}, results: protocol.ResultKeys{}}
	want := fmt.Sprintf("want %q", sealPublicTag+" <id> <base64 public key> [tools=NAME,NAME|tools=*]")
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#") // a comment, whole-line or trailing
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		if (len(f) != 3 && len(f) != 4) || f[0] != sealPublicTag || !sealKeyID.MatchString(f[1]) {
			return trust{}, fmt.Errorf("trusted seal keys %s:%d: %s", path, n, want)
		}
		pub, err := base64.StdEncoding.DecodeString(f[2])
		if err != nil || len(pub) != ed25519.PublicKeySize {
			return trust{}, fmt.Errorf("trusted seal keys %s:%d: the key is not %d base64 bytes", path, n, ed25519.PublicKeySize)
		}
		if _, dup := t.results[f[1]]; dup {
			return trust{}, fmt.Errorf("trusted seal keys %s:%d: key id %q named twice", path, n, f[1])
		}
		if len(f) == 3 {
			t.calls[f[1]] = pub
			t.results[f[1]] = protocol.ResultSigner{Key: pub}
			continue
		}
		tools, err := parseTools(f[3])
		if err != nil {
			return trust{}, fmt.Errorf("trusted seal keys %s:%d: %w", path, n, err)
		}
		t.results[f[1]] = protocol.ResultSigner{Key: pub, Tools: tools}
	}
	if err := sc.Err(); err != nil {
		return trust{}, fmt.Errorf("trusted seal keys %s: %w", path, err)
	}
	if len(t.results) == 0 {
		return trust{}, fmt.Errorf("trusted seal keys %s: no key", path)
	}
	return t, nil
}

// parseTools reads a worker key's "tools=a,b" ("tools=*": any tool; nil then).
func parseTools(s string) ([]string, error) {
	list, ok := strings.CutPrefix(s, "tools=")
	if !ok || list == "" {
		return nil, fmt.Errorf("%q: a worker's key ends in tools=NAME,NAME (or tools=*)", protocol.Shorten(s, 64))
	}
	if list == "*" {
		return nil, nil
	}
	var tools []string
	for _, t := range strings.Split(list, ",") {
		if err := protocol.CheckToolName("tools", t); err != nil {
			return nil, fmt.Errorf("tools=%s: %w", protocol.Shorten(list, 128), err)
		}
		tools = append(tools, t)
	}
	return tools, nil
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
	tools := fs.String("tools", "", "a worker's key: the tools whose results it may seal, comma-separated, or * for any tool (empty: a router's or gateway's key)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("seal-key: --out FILE is required")
	}
	suffix := ""
	if *tools != "" {
		if _, err := parseTools("tools=" + *tools); err != nil {
			return fmt.Errorf("seal-key --tools: %w", err)
		}
		suffix = " tools=" + *tools
	}
	line, err := newSealKey(*out, *id)
	if err != nil {
		return err
	}
	if suffix == "" {
		fmt.Fprintf(env.Stderr, "wrote the private key to %s; give it to a router or gateway (--seal-key %s) and this line to every service's --trusted-seals FILE:\n", *out, *out)
	} else {
		fmt.Fprintf(env.Stderr, "wrote the private key to %s; give it to the worker serving %s (--seal-key %s) and this line to every service's --trusted-seals FILE:\n", *out, *tools, *out)
	}
	fmt.Fprintln(env.Stdout, line+suffix)
	return nil
}

// sealFlags are a service's --seal-key and --trusted-seals.
type sealFlags struct {
	key, trusted string
	// role is the service's: a worker's key must be in the trusted keys, for the tools it
	// serves; a router's or gateway's is trusted with any tool.
	role bus.Role
	// registered: the service takes these flags.
	registered bool
}

func (s *sealFlags) register(fs *flag.FlagSet, role bus.Role) {
	s.role, s.registered = role, true
	what := "results it records"
	if role == bus.RoleRouter {
		what = "every tool call and result it sends"
	}
	fs.StringVar(&s.key, "seal-key", os.Getenv("HERMES_SEAL_KEY"), "private key file (hermes seal-key) to seal "+what+" with (env HERMES_SEAL_KEY)")
	fs.StringVar(&s.trusted, "trusted-seals", os.Getenv("HERMES_TRUSTED_SEALS"), "file of trusted public seal keys (hermes seal-key prints them): workers run only tool calls a router's key sealed, and a result counts only when a key trusted for its tool sealed it (env HERMES_TRUSTED_SEALS)")
}

// load reads the flags' files: the key (nil when none) and the trusted keys (zero when none).
func (s *sealFlags) load() (*router.SealKey, trust, error) {
	var k *router.SealKey
	var t trust
	var err error
	if s.key != "" {
		if k, err = readSealKey(s.key); err != nil {
			return nil, trust{}, err
		}
	}
	if s.trusted != "" {
		if t, err = readTrust(s.trusted); err != nil {
			return nil, trust{}, err
		}
	}
	return k, t, nil
}

// apply makes b seal the results it records with k and check those it reads against t. A
// router's or gateway's own key is trusted with any tool. A worker checks results only when it
// seals its own (its key must then be among the trusted, or its results would not count even
// for itself): one that records unsealed results must not take them for none.
func (s *sealFlags) apply(b *bus.Bus, k *router.SealKey, t trust, log *slog.Logger) error {
	if k != nil {
		b.SealResults(k.ID, k.Key)
	}
	if t.results == nil {
		switch {
		case k != nil && s.role == bus.RoleWorker:
			// The trusted keys name this worker's own (a key no one trusts seals results no
			// router counts) and the routers' it checks calls against.
			return fmt.Errorf("--seal-key needs --trusted-seals: this worker must know which results count")
		case k != nil:
			log.Warn("results are not checked: give --trusted-seals to refuse results no trusted key sealed")
		}
		return nil
	}
	if s.role == bus.RoleWorker && len(t.calls) == 0 {
		return fmt.Errorf("--trusted-seals %s: no router's key (a line without tools=): this worker would run no call", s.trusted)
	}
	keys := maps.Clone(t.results)
	switch {
	case k == nil && s.role == bus.RoleWorker:
		log.Warn("this worker's results are unsealed (no --seal-key): routers checking results refuse them")
		return nil
	case k == nil:
		// Checking results without sealing its own, it would refuse what it records itself.
		return fmt.Errorf("--trusted-seals needs --seal-key: the results this service records must be sealed to count")
	case s.role == bus.RoleWorker:
		have, ok := keys[k.ID]
		if !ok || !bytes.Equal(have.Key, k.Key.Public().(ed25519.PublicKey)) {
			return fmt.Errorf("--seal-key %s: key %q is not among --trusted-seals %s (as hermes seal-key --tools printed it): no one would take this worker's results", s.key, k.ID, s.trusted)
		}
	default:
		if have, ok := keys[k.ID]; ok && !bytes.Equal(have.Key, k.Key.Public().(ed25519.PublicKey)) {
			return fmt.Errorf("--seal-key %s: --trusted-seals %s has another key under id %q", s.key, s.trusted, k.ID)
		}
		keys[k.ID] = protocol.ResultSigner{Key: k.Key.Public().(ed25519.PublicKey)}
	}
	b.TrustResults(keys)
	return nil
}

// meetingKeyID names the key hermes up's Go meeting tools seal their results with.
const meetingKeyID = "hermes-up-meeting-tools"

// upResultKeys returns the keys hermes up trusts to seal results — its own (any tool), those
// t adds, and a key made for this run for the Go meeting tools, trusted with their tools only —
// and that key.
func upResultKeys(own *router.SealKey, t trust) (protocol.ResultKeys, *router.SealKey, error) {
	keys := protocol.ResultKeys{own.ID: {Key: own.Key.Public().(ed25519.PublicKey)}}
	for id, k := range t.results {
		if id == own.ID || id == meetingKeyID {
			return nil, nil, fmt.Errorf("--trusted-seals names key id %q, which is hermes up's own", id)
		}
		keys[id] = k
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	keys[meetingKeyID] = protocol.ResultSigner{Key: pub, Tools: slices.Clone(demotools.MeetingToolNames)}
	return keys, &router.SealKey{ID: meetingKeyID, Key: priv}, nil
}
