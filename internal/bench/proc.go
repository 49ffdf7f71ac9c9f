package bench

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process is a Hermes process started by the benchmark.
type Process struct {
	Cmd *exec.Cmd
	// Ready is how long it took from exec until it said it was ready.
	Ready time.Duration
	done  chan struct{}
}

// StartProcess execs bin with args and waits until a line of its output contains readyLine,
// or timeout.
func StartProcess(bin string, args []string, readyLine string, timeout time.Duration) (*Process, error) {
	cmd := exec.Command(bin, args...)
	out, w, err := os.Pipe() // standard output and error together: some commands announce readiness on one, some on the other
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = w, w
	t0 := time.Now()
	err = cmd.Start()
	w.Close()
	if err != nil {
		out.Close()
		return nil, err
	}
	p := &Process{Cmd: cmd, done: make(chan struct{})}
	ready := make(chan time.Duration, 1)
	go func() {
		defer out.Close()
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			if !sent && strings.Contains(sc.Text(), readyLine) {
				ready <- time.Since(t0)
				sent = true
			}
		}
	}()
	go func() { _ = cmd.Wait(); close(p.done) }()
	select {
	case p.Ready = <-ready:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("bench: %s %s exited before it was ready", bin, strings.Join(args, " "))
	case <-time.After(timeout):
		p.Stop()
		return nil, fmt.Errorf("bench: %s %s not ready within %s", bin, strings.Join(args, " "), timeout)
	}
}

// Stop asks the process to stop (SIGTERM) and waits, killing it after 10 s.
func (p *Process) Stop() {
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
}

// Memory reads the process's resident set now and at its peak, in MiB.
func (p *Process) Memory() (rss, peak float64) {
	return procMemory(p.Cmd.Process.Pid)
}

// CPU is the process's user + system CPU time so far.
func (p *Process) CPU() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+2:]
	}
	f := strings.Fields(s)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100) // clock ticks, 100 Hz on Linux
}

func procMemory(pid int) (rss, peak float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb / 1024
		case "VmHWM:":
			peak = kb / 1024
		}
	}
	return rss, peak
}

// SelfMemory reads this process's resident set now and at its peak, in MiB.
func SelfMemory() (rss, peak float64) { return procMemory(os.Getpid()) }
