package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

const cancelUsage = `hermes cancel [--url URL | --nats URL] [--reason TEXT] REQUEST_ID

Cancels a request: its calls not started never start, running ones are stopped (their tools'
requests aborted), and it is answered with CANCELLED results for what did not finish. Prints
the request's response. Exit status: 0 cancelled (or cancelled before), 1 it had finished
already (its response is printed), 2 trouble (unknown request, bad flags, Hermes unreachable)`

// RunCancel cancels a request through a gateway (--url) or straight on the bus (--nats):
// hermes cancel.
func RunCancel(ctx context.Context, args []string, env Env) error {
	fs := newFlagSet("cancel", cancelUsage, env.Stderr)
	gw := fs.String("url", envOr("HERMES_URL", "http://127.0.0.1:8080"), "gateway base URL (env HERMES_URL)")
	natsURL := natsFlags(fs, "", "cancel on the bus directly, through this NATS server, instead of a gateway")
	reason := fs.String("reason", "", "why, recorded with the cancellation")
	var key keyFlag
	key.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	usage := func(format string, a ...any) error {
		return &ExitError{Code: 2, Err: fmt.Errorf("cancel: "+format, a...)}
	}
	if fs.NArg() != 1 {
		return usage("give the request_id to cancel (see -h)")
	}
	id := fs.Arg(0)
	if err := protocol.CheckID("request_id", id); err != nil {
		return usage("%v", err)
	}
	if natsURL.url != "" {
		return cancelOnBus(ctx, env, natsURL, id, *reason)
	}
	target := strings.TrimRight(*gw, "/") + "/v1/requests/" + id
	if *reason != "" {
		target += "?reason=" + url.QueryEscape(*reason)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, target, nil)
	if err != nil {
		return usage("%v", err)
	}
	if err := key.authorize(req); err != nil {
		return &ExitError{Code: 2, Err: fmt.Errorf("cancel: %w", err)}
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return &ExitError{Code: 2, Err: fmt.Errorf("cancel: %w (is Hermes running? start it with: go run ./cmd/hermes up)", err)}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	fmt.Fprintf(env.Stderr, "HTTP %d\n", resp.StatusCode)
	writePretty(env, body)
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusConflict:
		return &ExitError{Code: 1}
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests:
		return &ExitError{Code: 2, Err: fmt.Errorf("cancel: gateway answered %s: %s", resp.Status, key.refused(resp.StatusCode))}
	default:
		return &ExitError{Code: 2, Err: fmt.Errorf("cancel: gateway answered %s", resp.Status)}
	}
}

// cancelOnBus cancels id through a Submitter of this process's own.
func cancelOnBus(ctx context.Context, env Env, natsURL *natsTarget, id, reason string) error {
	log, _ := newLogger(env.Stderr, "warn")
	opts, err := natsURL.auth.cliOptions()
	if err != nil {
		return err
	}
	nc, b, err := Connect(ctx, natsURL.url, "hermes-cancel", bus.Config{OpenOnly: true}, log, opts...)
	if err != nil {
		return &ExitError{Code: 2, Err: fmt.Errorf("cancel: %w", err)}
	}
	defer nc.Close()
	s, err := submit.New(submit.Config{Conn: nc, Bus: b, Sender: protocol.Sender{Role: protocol.RoleCLI, Instance: defaultInstance("cli")}, Logger: log})
	if err != nil {
		return err
	}
	resp, _, err := s.Cancel(ctx, id, submit.Cancellation{By: cliCaller(), Reason: reason})
	if resp != nil {
		out, _ := json.Marshal(resp)
		writePretty(env, out)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, submit.ErrFinished):
		fmt.Fprintf(env.Stderr, "request %s had finished; nothing was cancelled\n", id)
		return &ExitError{Code: 1}
	default:
		return &ExitError{Code: 2, Err: fmt.Errorf("cancel: %w", err)}
	}
}

// cliCaller names the person at this terminal for the record: user@host.
func cliCaller() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, _ := os.Hostname()
	by := "cli " + name + "@" + host
	if len(by) > protocol.MaxCancelTextBytes {
		by = by[:protocol.MaxCancelTextBytes]
	}
	return by
}

// writePretty writes a JSON body indented, or as it is when it is not JSON.
func writePretty(env Env, body []byte) {
	var pretty bytes.Buffer
	if json.Indent(&pretty, body, "", "  ") == nil {
		body = append(pretty.Bytes(), '\n')
	}
	_, _ = env.Stdout.Write(body)
}
