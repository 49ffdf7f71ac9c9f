package app

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"strings"
	"testing"
)

func TestCheckNATSListen(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	taken := busy.Addr().String()

	// The default address, taken: a free loopback port instead, and say which was taken.
	at, was, err := checkNATSListen(taken, false)
	if err != nil || at != "127.0.0.1:0" || was != taken {
		t.Fatalf("default taken: %q, %q, %v", at, was, err)
	}
	// An address asked for explicitly, taken: a clear error.
	if _, _, err := checkNATSListen(taken, true); err == nil || !strings.Contains(err.Error(), "--nats-listen "+taken) {
		t.Fatalf("explicit taken: %v", err)
	}
	// Free, or none at all: as asked.
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := free.Addr().String()
	free.Close()
	if at, was, err := checkNATSListen(addr, true); err != nil || at != addr || was != "" {
		t.Fatalf("free: %q, %q, %v", at, was, err)
	}
	if at, was, err := checkNATSListen("", false); err != nil || at != "" || was != "" {
		t.Fatalf("none: %q, %q, %v", at, was, err)
	}
}

func TestExecExitCodes(t *testing.T) {
	for _, c := range []struct {
		err    error
		code   int
		stderr string
	}{
		{nil, 0, ""},
		{flag.ErrHelp, 0, ""},
		{errors.New("boom"), 1, "hermes: boom\n"},
		{&ExitError{Code: 1}, 1, ""},
		{&ExitError{Code: 2, Err: errors.New("replay: bad flag")}, 2, "hermes: replay: bad flag\n"},
	} {
		var stderr bytes.Buffer
		code := Exec(func(context.Context, []string, Env) error { return c.err }, nil, Env{Stdout: &bytes.Buffer{}, Stderr: &stderr})
		if code != c.code || stderr.String() != c.stderr {
			t.Errorf("%v: exit %d, stderr %q; want %d, %q", c.err, code, stderr.String(), c.code, c.stderr)
		}
	}
}

func TestReplayAndTailUsage(t *testing.T) {
	for _, c := range []struct {
		cmd  Command
		args []string
		want string
	}{
		{RunReplay, nil, "give --session S"},
		{RunReplay, []string{"--session", "*"}, "--session must hold only letters"},
		{RunReplay, []string{"--session", "s", "--since", "2h", "--from-seq", "1"}, "not both"},
		{RunReplay, []string{"--routes", "/does/not/exist.yaml"}, "no such file"},
		{RunReplay, []string{"--blueprint", "b.json", "--routes", "r.yaml"}, "only one of"},
		{RunReplay, []string{"--blueprint", "b.json", "--session", "s"}, "give --since, not --session"},
		{RunReplay, []string{"--blueprint", "/does/not/exist.json"}, "no such file"},
		{RunTail, []string{"--session", "a.b"}, "--session must hold only letters"},
		{RunTail, []string{"--bogus"}, "flag provided but not defined"},
	} {
		var stderr bytes.Buffer
		code := Exec(c.cmd, c.args, Env{Stdout: &bytes.Buffer{}, Stderr: &stderr})
		if code != 2 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", c.args, code, stderr.String(), c.want)
		}
	}
}

// hermes up with a setting a service refuses (an --allow-env name bound to no origin) fails
// with that service's error, having shut down what it had started, rather than crash; and the
// same data dir starts cleanly right after.
func TestUpRefusesABadSettingCleanly(t *testing.T) {
	dir := t.TempDir()
	cfg := SystemConfig{DataDir: dir, HTTPAddr: "127.0.0.1:0", Worker: WorkerConfig{AllowEnv: []string{"POLICY_TOKEN"}},
		ToolWorkers: 1, Instance: "t"}
	cfg.Routes, _, _, _ = loadRoutes(defaultRoutes)
	_, err := StartSystem(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "POLICY_TOKEN") {
		t.Fatalf("got %v, want the unbound name refused", err)
	}
	cfg.Worker.AllowEnv = nil
	sys, err := StartSystem(context.Background(), cfg)
	if err != nil {
		t.Fatalf("the same data dir after a refused start: %v", err)
	}
	sys.close()
}

// A pool size in the environment that is not a number, or out of bounds, is refused naming it.
func TestBadPoolSizesAreRefused(t *testing.T) {
	t.Setenv("HERMES_POOL_H", "lots")
	var wf workerFlags
	fs := newFlagSet("t", "", io.Discard)
	wf.register(fs)
	if _, err := wf.config("w"); err == nil || !strings.Contains(err.Error(), `HERMES_POOL_H="lots"`) {
		t.Fatalf("a pool size that is not a number: %v", err)
	}
	t.Setenv("HERMES_POOL_H", "")
	wf = workerFlags{}
	fs = newFlagSet("t", "", io.Discard)
	wf.register(fs)
	if err := fs.Parse([]string{"--pool-l", "0"}); err != nil {
		t.Fatal(err)
	}
	if _, err := wf.config("w"); err == nil || !strings.Contains(err.Error(), "--pool-l 0") {
		t.Fatalf("a pool of 0: %v", err)
	}
}
