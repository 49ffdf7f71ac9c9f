package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Files hermes nats-auth writes in its --out directory.
const (
	authConfFile   = "auth.conf"
	caCertFile     = "ca.pem"
	serverCertFile = "server-cert.pem"
	serverKeyFile  = "server-key.pem"
)

// RunNATSAuth makes the NATS users of a deployment and, with --tls-host, its TLS certificates:
// hermes nats-auth.
func RunNATSAuth(_ context.Context, args []string, env Env) error {
	fs := newFlagSet("nats-auth", "hermes nats-auth --out DIR [--client NAME]... [--worker NAME=TOOL,TOOL]... [--tls-host NAMES]", env.Stderr)
	out := fs.String("out", "", "directory to write into (created mode 0700); what is there already is kept, so running it again adds only what is missing")
	var clients listFlag
	fs.Var(&clients, "client", "an external client to make a user for (may publish requests only; the name is its identity), repeatable or comma-separated")
	workers := workerFlag{tools: map[string][]string{}}
	fs.Var(&workers, "worker", "a tool worker user that serves the tools named only (NAME=TOOL,TOOL; repeatable): it takes, acks and creates only their consumers, lists only them, receives replies under _INBOX_NAME, and its seal key NAME.seal is trusted with their results only")
	tlsHosts := fs.String("tls-host", "", "names and addresses the NATS server is reached by, comma-separated (e.g. nats,localhost): makes a CA and a server certificate for them; empty makes none")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return &ExitError{Code: 2, Err: errors.New("nats-auth: --out is required")}
	}
	for _, c := range clients {
		if err := protocol.CheckID("--client", c); err != nil {
			return &ExitError{Code: 2, Err: fmt.Errorf("nats-auth: %w", err)}
		}
		if _, err := bus.ParseRole(strings.ToLower(c)); err == nil {
			return &ExitError{Code: 2, Err: fmt.Errorf("nats-auth: --client %s is the name of a service role; pick another", c)}
		}
		if _, ok := workers.tools[c]; ok {
			return &ExitError{Code: 2, Err: fmt.Errorf("nats-auth: %s is named by both --client and --worker", c)}
		}
	}
	// Worker users made by an earlier run stay as they were, unless --worker names them again.
	made, err := readWorkers(*out)
	if err != nil {
		return err
	}
	for _, name := range workers.names {
		if _, was := made.tools[name]; !was {
			if _, err := os.Stat(filepath.Join(*out, name+".nk")); err == nil {
				return &ExitError{Code: 2, Err: fmt.Errorf("nats-auth: --worker %s: a user %s made earlier is an external client; pick another name", name, name)}
			}
			made.names = append(made.names, name)
		}
		made.tools[name] = workers.tools[name]
	}
	for _, c := range clients {
		if _, ok := made.tools[c]; ok {
			return &ExitError{Code: 2, Err: fmt.Errorf("nats-auth: --client %s: a worker user %s was made earlier; pick another name", c, c)}
		}
	}
	if err := os.MkdirAll(*out, 0o700); err != nil {
		return err
	}
	var users []bus.User
	var lines []string
	add := func(name string, role bus.Role, tools []string) error {
		u, path, err := bus.LoadOrNewUser(*out, name, role)
		if err != nil {
			return err
		}
		u.Tools = tools
		a, err := u.Access()
		if err != nil {
			return err
		}
		users = append(users, u)
		line := fmt.Sprintf("  %-12s role %-10s seed %s", name, role, path)
		switch {
		case len(tools) > 0:
			line += fmt.Sprintf("  (connect with --nats-inbox %s; serves %s only: run with --tools %s)", a.Inbox, strings.Join(tools, ","), strings.Join(tools, ","))
		case role != bus.RoleAdmin:
			line += "  (connect with --nats-inbox " + a.Inbox + ")"
		}
		lines = append(lines, line)
		return nil
	}
	for _, r := range bus.Roles {
		if r != bus.RoleClient {
			if err := add(string(r), r, nil); err != nil {
				return err
			}
		}
	}
	for _, name := range made.names {
		if err := add(name, bus.RoleWorker, made.tools[name]); err != nil {
			return err
		}
	}
	if err := writeWorkers(*out, made); err != nil {
		return err
	}
	for _, c := range clients {
		if err := add(c, bus.RoleClient, nil); err != nil {
			return err
		}
	}
	// Users made by an earlier run for clients not named now stay users: keep them listed.
	if entries, err := os.ReadDir(*out); err == nil {
		for _, e := range entries {
			name, ok := strings.CutSuffix(e.Name(), ".nk")
			if !ok || slices.ContainsFunc(users, func(u bus.User) bool { return u.Name == name }) {
				continue
			}
			if err := add(name, bus.RoleClient, nil); err != nil {
				return err
			}
		}
	}
	conf, err := bus.AuthConf(users, Buckets(bus.Config{}))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, authConfFile), []byte(conf), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "NATS users in %s (include it in the server's configuration):\n%s\n", filepath.Join(*out, authConfFile), strings.Join(lines, "\n"))
	keys := slices.Clone(sealKeys)
	for _, name := range made.names {
		keys = append(keys, sealKeyOf{name, strings.Join(made.tools[name], ",")})
	}
	sealLines, err := makeSeals(*out, keys)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "seal keys: %s\n", strings.Join(sealLines, "\n           "))
	if *tlsHosts != "" {
		if err := makeTLS(*out, strings.Split(*tlsHosts, ",")); err != nil {
			return err
		}
		fmt.Fprintf(env.Stdout, "TLS: %s signs %s (for %s); services verify the server with --nats-ca %s\n",
			filepath.Join(*out, caCertFile), filepath.Join(*out, serverCertFile), *tlsHosts, filepath.Join(*out, caCertFile))
	}
	return nil
}

// makeTLS writes a CA and a server certificate it signs, for hosts (valid for serving and for
// the routes between cluster nodes, which are clients of each other), unless a certificate for
// the same hosts is there. The CA's key is not kept: nothing else is ever signed with it (run
// again for other hosts, and a new CA signs the new certificate).
func makeTLS(dir string, hosts []string) error {
	if sameHosts(filepath.Join(dir, serverCertFile), hosts) {
		return nil
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "Hermes NATS CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(5, 0, 0),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	leaf := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "Hermes NATS"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(2, 0, 0),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if ip := net.ParseIP(h); ip != nil {
			leaf.IPAddresses = append(leaf.IPAddresses, ip)
		} else if h != "" {
			leaf.DNSNames = append(leaf.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	for _, f := range []struct {
		name, kind string
		der        []byte
		mode       os.FileMode
	}{
		{caCertFile, "CERTIFICATE", caDER, 0o644},
		{serverCertFile, "CERTIFICATE", der, 0o644},
		{serverKeyFile, "EC PRIVATE KEY", mustEC(key), 0o600},
	} {
		data := pem.EncodeToMemory(&pem.Block{Type: f.kind, Bytes: f.der})
		if err := os.WriteFile(filepath.Join(dir, f.name), data, f.mode); err != nil {
			return err
		}
	}
	return nil
}

// sameHosts reports whether the certificate in path is for exactly hosts, and good for a month
// at least.
func sameHosts(path string, hosts []string) bool {
	data, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return false
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil || time.Until(c.NotAfter) < 30*24*time.Hour {
		return false // unreadable, or about to expire: a new one is made
	}
	var have []string
	have = append(have, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		have = append(have, ip.String())
	}
	var want []string
	for _, h := range hosts {
		if h = strings.TrimSpace(h); h != "" {
			if ip := net.ParseIP(h); ip != nil {
				h = ip.String()
			}
			want = append(want, h)
		}
	}
	slices.Sort(have)
	slices.Sort(want)
	return slices.Equal(have, want)
}

func mustEC(k *ecdsa.PrivateKey) []byte {
	b, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		panic(err) // a P-256 key always marshals
	}
	return b
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// sealKeyOf is a seal key nats-auth makes: its name (and id), and the tools whose results it
// may seal ("": any tool, and calls, a router's or gateway's; "*": a worker trusted with every
// tool; "a,b": a worker user's of those tools).
type sealKeyOf struct{ name, tools string }

// sealKeys are the seal keys nats-auth makes beside the users: each service's. A worker user
// made for some tools (--worker) has one too, trusted with those tools' results only.
var sealKeys = []sealKeyOf{{"router", ""}, {"gateway", ""}, {"toolworker", "*"}}

// trustedSealsFile lists the public lines of the keys nats-auth made: every service's
// --trusted-seals.
const trustedSealsFile = "trusted-seals"

// makeSeals writes the seal keys (NAME.seal, kept if there) and the trusted-seals file naming
// their public keys, and returns lines saying so.
func makeSeals(dir string, keys []sealKeyOf) ([]string, error) {
	var public, said []string
	for _, k := range keys {
		path := filepath.Join(dir, k.name+".seal")
		line := ""
		if key, err := readSealKey(path); err == nil {
			line = fmt.Sprintf("%s %s %s", sealPublicTag, key.ID, base64.StdEncoding.EncodeToString(key.Key.Public().(ed25519.PublicKey)))
		} else if errors.Is(err, fs.ErrNotExist) {
			if line, err = newSealKey(path, k.name); err != nil {
				return nil, err
			}
		} else {
			return nil, err
		}
		if k.tools != "" {
			line += " tools=" + k.tools
		}
		public = append(public, line)
		if k.tools != "" && k.tools != "*" {
			said = append(said, fmt.Sprintf("%-12s %s (--seal-key; trusted with the results of %s only)", k.name, path, k.tools))
		} else {
			said = append(said, fmt.Sprintf("%-12s %s (--seal-key)", k.name, path))
		}
	}
	path := filepath.Join(dir, trustedSealsFile)
	if err := os.WriteFile(path, []byte(strings.Join(public, "\n")+"\n"), 0o644); err != nil {
		return nil, err
	}
	return append(said, fmt.Sprintf("%-12s %s (every service's --trusted-seals)", "trusted", path)), nil
}

// workersFile lists, in nats-auth's --out, the worker users made for some tools only
// (--worker), one "NAME=TOOL,TOOL" a line, so that a later run keeps each as it was made.
const workersFile = "workers"

// workerUsers are worker users and their tools, in the order they were made.
type workerUsers struct {
	names []string
	tools map[string][]string
}

// workerFlag collects --worker NAME=TOOL,TOOL.
type workerFlag workerUsers

func (w *workerFlag) String() string {
	var parts []string
	for _, n := range w.names {
		parts = append(parts, n+"="+strings.Join(w.tools[n], ","))
	}
	return strings.Join(parts, " ")
}

func (w *workerFlag) Set(v string) error {
	name, tools, err := parseWorker(v)
	if err != nil {
		return err
	}
	if _, dup := w.tools[name]; dup {
		return fmt.Errorf("worker %s named twice", name)
	}
	w.names, w.tools[name] = append(w.names, name), tools
	return nil
}

// parseWorker reads "NAME=TOOL,TOOL": a worker user's name (an id of at most 64 characters,
// its seal key's id too, and no role's) and the tools it serves (bus.WorkerAccessFor).
func parseWorker(v string) (string, []string, error) {
	name, list, ok := strings.Cut(strings.TrimSpace(v), "=")
	if !ok || list == "" {
		return "", nil, fmt.Errorf("%q: want NAME=TOOL,TOOL", protocol.Shorten(v, 64))
	}
	var tools []string
	for _, t := range strings.Split(list, ",") {
		tools = append(tools, strings.TrimSpace(t))
	}
	if _, err := bus.WorkerAccessFor(name, tools); err != nil {
		return "", nil, err
	}
	if _, err := bus.ParseRole(strings.ToLower(name)); err == nil {
		return "", nil, fmt.Errorf("worker %s has the name of a service role; pick another", name)
	}
	if !sealKeyID.MatchString(name) {
		return "", nil, fmt.Errorf("worker %s: a name of at most 64 characters (its seal key's id)", protocol.Shorten(name, 80))
	}
	return name, tools, nil
}

// readWorkers reads dir's workers file; none is no worker.
func readWorkers(dir string) (workerUsers, error) {
	w := workerUsers{tools: map[string][]string{}}
	path := filepath.Join(dir, workersFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return w, nil
	}
	if err != nil {
		return w, err
	}
	for n, line := range strings.Split(string(data), "\n") {
		line, _, _ = strings.Cut(line, "#")
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		name, tools, err := parseWorker(line)
		if err != nil {
			return w, fmt.Errorf("%s:%d: %w", path, n+1, err)
		}
		if _, dup := w.tools[name]; dup {
			return w, fmt.Errorf("%s:%d: worker %s named twice", path, n+1, name)
		}
		w.names, w.tools[name] = append(w.names, name), tools
	}
	return w, nil
}

// writeWorkers writes w to dir's workers file; with no worker, it writes none.
func writeWorkers(dir string, w workerUsers) error {
	if len(w.names) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("# Worker users that serve these tools only (hermes nats-auth --worker NAME=TOOL,TOOL).\n")
	for _, n := range w.names {
		fmt.Fprintf(&b, "%s=%s\n", n, strings.Join(w.tools[n], ","))
	}
	return os.WriteFile(filepath.Join(dir, workersFile), []byte(b.String()), 0o644)
}
