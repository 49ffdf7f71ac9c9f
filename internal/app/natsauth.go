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
	fs := newFlagSet("nats-auth", "hermes nats-auth --out DIR [--client NAME]... [--tls-host NAMES]", env.Stderr)
	out := fs.String("out", "", "directory to write into (created mode 0700); what is there already is kept, so running it again adds only what is missing")
	var clients listFlag
	fs.Var(&clients, "client", "an external client to make a user for (may publish requests only; the name is its identity), repeatable or comma-separated")
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
	}
	if err := os.MkdirAll(*out, 0o700); err != nil {
		return err
	}
	var users []bus.User
	var lines []string
	add := func(name string, role bus.Role) error {
		u, path, err := bus.LoadOrNewUser(*out, name, role)
		if err != nil {
			return err
		}
		users = append(users, u)
		line := fmt.Sprintf("  %-12s role %-10s seed %s", name, role, path)
		if a, err := u.Access(); err == nil && role != bus.RoleAdmin {
			line += "  (connect with --nats-inbox " + a.Inbox + ")"
		}
		lines = append(lines, line)
		return nil
	}
	for _, r := range bus.Roles {
		if r != bus.RoleClient {
			if err := add(string(r), r); err != nil {
				return err
			}
		}
	}
	for _, c := range clients {
		if err := add(c, bus.RoleClient); err != nil {
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
			if err := add(name, bus.RoleClient); err != nil {
				return err
			}
		}
	}
	conf, err := bus.AuthConf(users)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, authConfFile), []byte(conf), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "NATS users in %s (include it in the server's configuration):\n%s\n", filepath.Join(*out, authConfFile), strings.Join(lines, "\n"))
	sealLines, err := makeSeals(*out)
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

// sealKeys are the seal keys nats-auth makes beside the users: each service's, and the tools
// whose results a key may seal ("": any tool, a router's or gateway's; "*": a worker trusted
// with every tool).
var sealKeys = []struct{ name, tools string }{{"router", ""}, {"gateway", ""}, {"toolworker", "*"}}

// trustedSealsFile lists the public lines of the keys nats-auth made: every service's
// --trusted-seals.
const trustedSealsFile = "trusted-seals"

// makeSeals writes a seal key per service (NAME.seal, kept if there) and the trusted-seals file
// naming their public keys, and returns lines saying so.
func makeSeals(dir string) ([]string, error) {
	var public, said []string
	for _, k := range sealKeys {
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
		said = append(said, fmt.Sprintf("%-12s %s (--seal-key)", k.name, path))
	}
	path := filepath.Join(dir, trustedSealsFile)
	if err := os.WriteFile(path, []byte(strings.Join(public, "\n")+"\n"), 0o644); err != nil {
		return nil, err
	}
	return append(said, fmt.Sprintf("%-12s %s (every service's --trusted-seals)", "trusted", path)), nil
}
