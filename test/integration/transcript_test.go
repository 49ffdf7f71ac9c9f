package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/bus"
)

// natsCLI is the nats CLI (.ci/run installs the pinned one in bin/): CI must have it;
// elsewhere the test is skipped without it.
func natsCLI(t *testing.T) string {
	t.Helper()
	if p, err := filepath.Abs("../../bin/nats"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("nats"); err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no nats CLI: GOBIN=$PWD/bin go install github.com/nats-io/natscli/nats@v0.5.0")
	}
	t.Skip("no nats CLI (GOBIN=$PWD/bin go install github.com/nats-io/natscli/nats@v0.5.0)")
	return ""
}

// transcript is the README's nats CLI transcript: each command with the output it shows.
type step struct {
	command string
	output  []string
}

func readmeTranscript(t *testing.T) []step {
	t.Helper()
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "<!-- transcript: nats -->\n```console\n")
	block, _, ok2 := strings.Cut(rest, "```\n<!-- /transcript -->")
	if !ok || !ok2 {
		t.Fatal("README.md has no nats transcript")
	}
	var steps []step
	for _, line := range strings.Split(block, "\n") {
		if cmd, ok := strings.CutPrefix(line, "$ "); ok {
			steps = append(steps, step{command: cmd})
			continue
		}
		if len(steps) > 0 {
			steps[len(steps)-1].output = append(steps[len(steps)-1].output, line)
		}
	}
	return steps
}

// words splits a command line as a shell would: on spaces, but not inside single quotes.
func words(line string) []string {
	var out []string
	var cur strings.Builder
	quoted, have := false, false
	for _, r := range line {
		switch {
		case r == '\'':
			quoted, have = !quoted, true
		case r == ' ' && !quoted:
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	if have {
		out = append(out, cur.String())
	}
	return out
}

var (
	clockPrefix = regexp.MustCompile(`^\d\d:\d\d:\d\d `)
	nuid        = regexp.MustCompile(`\b[0-9A-Za-z]{22}\b`)
	traceHex    = regexp.MustCompile(`\b[0-9a-f]{32}\b`)
	duration    = regexp.MustCompile(`\b\d+(\.\d+)?(ns|µs|ms|s)\b`)
	instance    = regexp.MustCompile(`instance: \S+`)
	contractV   = regexp.MustCompile(`,"contract_version":\d+`)
	execTime    = regexp.MustCompile(`"execution_time_ms":\d+`)
	boxes       = regexp.MustCompile(`[╭╮╰╯─│├┤┬┴┼]+`)
	spaces      = regexp.MustCompile(`\s+`)
)

// normal is output as the transcript is compared: without what differs from run to run (clock
// times, ids, trace ids, durations, instance names, whether a contract was registered yet),
// table borders and widths, and blank lines; as a sorted list (the services answer discovery
// in any order).
func normal(lines []string) []string {
	var out []string
	for _, l := range lines {
		l = clockPrefix.ReplaceAllString(l, "")
		l = nuid.ReplaceAllString(l, "<id>")
		l = traceHex.ReplaceAllString(l, "<trace>")
		l = duration.ReplaceAllString(l, "<duration>")
		l = instance.ReplaceAllString(l, "instance: <instance>")
		l = contractV.ReplaceAllString(l, "")
		l = execTime.ReplaceAllString(l, `"execution_time_ms":<ms>`)
		l = boxes.ReplaceAllString(l, " ")
		l = strings.TrimSpace(spaces.ReplaceAllString(l, " "))
		if l != "" {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out
}

// The README's transcript of the nats CLI against hermes up, replayed: each command, run as
// the README runs it, prints what the README shows.
func TestTheREADMEsNATSTranscript(t *testing.T) {
	long(t, "the nats CLI transcript")
	cli := natsCLI(t)
	steps := readmeTranscript(t)
	if len(steps) < 3 {
		t.Fatalf("%d steps in the transcript", len(steps))
	}
	sys, _ := startUp(t, "transcript")
	// The README runs beside hermes up's data directory, hermes-data.
	dir := t.TempDir()
	if err := os.Symlink(filepath.Dir(filepath.Dir(sys.Seeds[bus.RoleAdmin])), filepath.Join(dir, "hermes-data")); err != nil {
		t.Fatal(err)
	}
	if sys.ClientURL == "" {
		t.Fatal("hermes up serves no NATS clients")
	}
	run := func(s step) []string {
		args := words(s.command)
		if len(args) == 0 || args[0] != "nats" {
			t.Fatalf("not a nats command: %s", s.command)
		}
		cmdCtx, stop := context.WithTimeout(t.Context(), 30*time.Second)
		defer stop()
		cmd := exec.CommandContext(cmdCtx, cli, args[1:]...)
		cmd.Dir = dir // hermes-data/ as in the README
		cmd.Env = append(os.Environ(), "NATS_URL="+sys.ClientURL, "NO_COLOR=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", s.command, err, out)
		}
		return strings.Split(string(out), "\n")
	}
	for _, s := range steps {
		want := normal(s.output)
		var got []string
		// Every service answers discovery once it runs: the first may come before the last
		// has, so discovery is asked again for a while; anything else is run once.
		deadline := time.Now().Add(20 * time.Second)
		for {
			got = normal(run(s))
			if slices.Equal(got, want) || !strings.HasPrefix(s.command, "nats micro ") || time.Now().After(deadline) {
				break
			}
			time.Sleep(300 * time.Millisecond)
		}
		if !slices.Equal(got, want) {
			t.Errorf("$ %s\ngot:\n  %s\nthe README shows:\n  %s", s.command, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
	}
}
