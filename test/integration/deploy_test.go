package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"gopkg.in/yaml.v3"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// The deployment's NATS configuration, with the users and certificates hermes nats-auth makes,
// runs on a real server: nobody gets in without a user, nobody without TLS, each user is
// allowed its role's subjects only, hermes provision sets the bus up as admin, and services
// connect with the flags the compose files give them.
func TestDeployConfigLetsInOnlyHermesUsers(t *testing.T) {
	t.Parallel()
	dir := madeAuth(t)
	auth := filepath.Join(dir, "auth")
	for _, f := range []string{"admin.nk", "gateway.nk", "router.nk", "toolworker.nk", "eraser.nk", "auditor.nk", "crm.nk", "auth.conf", "ca.pem", "server-cert.pem", "server-key.pem",
		"router.seal", "gateway.seal", "toolworker.seal", "trusted-seals"} {
		if _, err := os.Stat(filepath.Join(auth, f)); err != nil {
			t.Fatalf("nats-auth wrote no %s: %v", f, err)
		}
	}
	if entries, _ := os.ReadDir(auth); len(entries) != 15 {
		t.Fatalf("nats-auth wrote %d files, want those 15 (no CA key)", len(entries))
	}
	if st, _ := os.Stat(filepath.Join(auth, "router.seal")); st.Mode().Perm() != 0o600 {
		t.Fatalf("a seal key is mode %v", st.Mode().Perm())
	}
	if st, _ := os.Stat(filepath.Join(auth, "gateway.nk")); st.Mode().Perm() != 0o600 {
		t.Fatalf("a seed is mode %v", st.Mode().Perm())
	}
	// Run again: what is there is kept.
	before, _ := os.ReadFile(filepath.Join(auth, "gateway.nk"))
	if code, _, errOut := hermes(t, app.RunNATSAuth, "--out", auth); code != 0 {
		t.Fatal(errOut)
	}
	if after, _ := os.ReadFile(filepath.Join(auth, "gateway.nk")); !bytes.Equal(before, after) {
		t.Fatal("running nats-auth again replaced a seed")
	}
	if conf, _ := os.ReadFile(filepath.Join(auth, "auth.conf")); !strings.Contains(string(conf), "# crm (role client)") {
		t.Fatalf("running nats-auth again forgot the client crm:\n%s", conf)
	}

	opts := loadDeployConf(t, "../../deploy/nats.conf", dir)
	if len(opts.Nkeys) != 7 || opts.TLSConfig == nil {
		t.Fatalf("deploy/nats.conf: %d users, TLS %v", len(opts.Nkeys), opts.TLSConfig != nil)
	}
	var refusals sync.Map
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetLoggerV2(&refusalLog{&refusals}, false, false, false)
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	url := strings.Replace(srv.ClientURL(), "nats://", "tls://", 1)
	ca := filepath.Join(auth, "ca.pem")
	if nc, err := nats.Connect(url, nats.RootCAs(ca)); err == nil {
		nc.Close()
		t.Fatal("connected without a user")
	}
	gw, _ := nats.NkeyOptionFromSeed(filepath.Join(auth, "gateway.nk"))
	if nc, err := nats.Connect(srv.ClientURL(), gw); err == nil {
		nc.Close()
		t.Fatal("connected without TLS")
	}
	if code, out, errOut := hermes(t, app.RunProvision, "--nats", url, "--nats-nkey", filepath.Join(auth, "admin.nk"), "--nats-ca", ca); code != 0 {
		t.Fatalf("provision as admin: exit %d: %s %s", code, out, errOut)
	}
	// Each service connects as the compose files say, and may do its part only.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for role, forbidden := range map[string]string{
		"gateway":    "$JS.API.STREAM.DELETE." + protocol.StreamName,
		"router":     protocol.SubjectEvent(protocol.EventCancel, "s1"),
		"toolworker": protocol.SubjectToolCall(protocol.ActionHTTP, "echo", "s1"),
		"crm":        protocol.SubjectResult("r1", "c1", "s1"),
		"eraser":     "$JS.API.STREAM.PURGE." + protocol.DLQStreamName,
		"auditor":    protocol.SubjectRequest("s1"),
	} {
		creds := bus.Credentials{NKeyFile: filepath.Join(auth, role+".nk"), CAFile: ca}
		// Without the inbox its permissions name, a user is refused at once.
		o, err := creds.Options()
		if err != nil {
			t.Fatal(err)
		}
		if nc, err := bus.Connect(ctx, url, "deploy-"+role, nil, append(o, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))...); !errors.Is(err, bus.ErrInboxRefused) {
			if err == nil {
				nc.Close()
			}
			t.Fatalf("%s connected under _INBOX: %v", role, err)
		}
		creds.Inbox = bus.InboxOf(role)
		if o, err = creds.Options(); err != nil {
			t.Fatal(err)
		}
		nc, err := bus.Connect(ctx, url, "deploy-"+role, nil, append(o, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))...)
		if err != nil {
			t.Fatalf("%s: %v", role, err)
		}
		if role != "crm" {
			bc, _, err := app.Connect(ctx, url, "deploy-"+role, bus.Config{NoProvision: true}, nil, o...)
			if err != nil {
				t.Fatalf("%s cannot open the bus: %v", role, err)
			}
			bc.Close()
		}
		if err := nc.Publish(forbidden, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
		waitFor(t, role+" refused "+forbidden, func() bool { _, ok := refusals.Load(forbidden); return ok })
		nc.Close()
	}

	// The cluster's nodes: the same users, TLS to clients and between the nodes.
	for n := 1; n <= 3; n++ {
		o := loadDeployConf(t, filepath.Join("../../deploy/nats-cluster", "nats-"+string(rune('0'+n))+".conf"), dir)
		if len(o.Nkeys) != 7 || o.TLSConfig == nil || o.Cluster.TLSConfig == nil || o.Cluster.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
			t.Fatalf("nats-%d.conf: %d users, TLS %v, route TLS %v", n, len(o.Nkeys), o.TLSConfig != nil, o.Cluster.TLSConfig != nil)
		}
	}

	// The compose files give each service the seed of its role, the CA, and a TLS URL, and
	// publish no NATS port.
	for _, file := range []string{"../../docker-compose.yml", "../../docker-compose.cluster.yml"} {
		checkComposeAuth(t, file, auth)
	}
}

// madeAuth runs hermes nats-auth as the compose files' comments say (with the client crm), into
// DIR/auth, and returns DIR.
func madeAuth(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	code, out, errOut := hermes(t, app.RunNATSAuth, "--out", filepath.Join(dir, "auth"), "--tls-host", "localhost,127.0.0.1,nats,nats-1,nats-2,nats-3", "--client", "crm")
	if code != 0 {
		t.Fatalf("nats-auth: exit %d: %s %s", code, out, errOut)
	}
	return dir
}

// loadDeployConf is deployConf on loopback ports of its own.
func loadDeployConf(t *testing.T, path, dir string) *server.Options {
	t.Helper()
	opts := deployConf(t, path, dir)
	opts.Host, opts.Port, opts.HTTPPort, opts.NoSigs = "127.0.0.1", server.RANDOM_PORT, 0, true
	opts.Cluster.Port, opts.Routes = 0, nil
	return opts
}

// deployConf reads a configuration of deploy/ as the server would in its container, with
// /etc/nats/ and /data moved under dir (where auth/ holds what hermes nats-auth made).
func deployConf(t *testing.T, path, dir string) *server.Options {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	conf := strings.ReplaceAll(string(data), "/etc/nats/", dir+"/")
	conf = strings.ReplaceAll(conf, "store_dir: /data", "store_dir: "+filepath.Join(dir, "data"))
	local := filepath.Join(dir, filepath.Base(path))
	if err := os.WriteFile(local, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(local)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return opts
}

func checkComposeAuth(t *testing.T, file, auth string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Environment map[string]string `yaml:"environment"`
			Ports       []string          `yaml:"ports"`
			Command     []string          `yaml:"command"`
			Volumes     []string          `yaml:"volumes"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &compose); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"provision": "admin", "router": "router", "toolworker": "toolworker", "gateway": "gateway", "demo-tools": "toolworker", "audit": "auditor"}
	for name, svc := range compose.Services {
		if strings.HasPrefix(name, "nats") && len(svc.Ports) > 0 {
			t.Errorf("%s: NATS service %s publishes %v", file, name, svc.Ports)
		}
		for _, v := range svc.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if src == "./deploy/auth" || src == "./deploy/auth/" || strings.Contains(src, "ca-key") {
				t.Errorf("%s: %s mounts %s: each service gets its own seed and the CA certificate only", file, name, src)
			}
		}
		role, ok := want[name]
		if !ok {
			continue
		}
		env := svc.Environment
		seed := "./deploy/auth/" + role + ".nk:" + env["HERMES_NATS_NKEY"] + ":ro"
		if !slices.Contains(svc.Volumes, seed) {
			t.Errorf("%s: %s connects with %q, which is not %s's seed (volumes %v)", file, name, env["HERMES_NATS_NKEY"], role, svc.Volumes)
		} else if _, err := os.Stat(filepath.Join(auth, role+".nk")); err != nil {
			t.Errorf("%s: %s: hermes nats-auth makes no %s.nk", file, name, role)
		}
		for _, v := range svc.Volumes {
			if strings.HasSuffix(v, ".nk:"+env["HERMES_NATS_NKEY"]+":ro") && v != seed {
				t.Errorf("%s: %s is given another seed too: %s", file, name, v)
			}
		}
		if filepath.Base(env["HERMES_NATS_CA"]) != "ca.pem" {
			t.Errorf("%s: %s has no CA to verify the server (HERMES_NATS_CA=%q)", file, name, env["HERMES_NATS_CA"])
		}
		for _, u := range strings.Split(env["HERMES_NATS_URL"], ",") {
			if !strings.HasPrefix(u, "tls://") {
				t.Errorf("%s: %s reaches NATS at %q, not over TLS", file, name, u)
			}
		}
		if inbox := env["HERMES_NATS_INBOX"]; role == "admin" && inbox != "" || role != "admin" && inbox != bus.InboxOf(role) {
			t.Errorf("%s: %s receives replies under HERMES_NATS_INBOX=%q, not its user's inbox", file, name, inbox)
		}
		if (env["HERMES_NO_PROVISION"] == "true") == (name == "provision") {
			t.Errorf("%s: %s: HERMES_NO_PROVISION=%q", file, name, env["HERMES_NO_PROVISION"])
		}
	}
	if missing := slices.DeleteFunc([]string{"provision", "router", "toolworker", "gateway", "audit"}, func(n string) bool {
		_, ok := compose.Services[n]
		return ok
	}); len(missing) > 0 {
		t.Errorf("%s: no %v service", file, missing)
	}
}

// refusalLog notes the subjects the server refused.
type refusalLog struct{ subjects *sync.Map }

var refusedSubject = regexp.MustCompile(`Violation - (?:Subject|Subscription) "([^"]+)"`)

func (l *refusalLog) Noticef(string, ...any) {}
func (l *refusalLog) Warnf(string, ...any)   {}
func (l *refusalLog) Fatalf(string, ...any)  {}
func (l *refusalLog) Debugf(string, ...any)  {}
func (l *refusalLog) Tracef(string, ...any)  {}
func (l *refusalLog) Errorf(format string, v ...any) {
	if m := refusedSubject.FindStringSubmatch(fmt.Sprintf(format, v...)); m != nil {
		l.subjects.Store(m[1], true)
	}
}
