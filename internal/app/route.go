package app

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/hermesbus/hermes/examples"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// RunRoute posts a HermesRequest to a gateway and prints the response: hermes route.
func RunRoute(ctx context.Context, args []string, env Env) error {
	fset := newFlagSet("route", "hermes route -f request.json [flags]", env.Stderr)
	file := fset.String("f", "", "request file (JSON HermesRequest); - reads standard input")
	url := fset.String("url", envOr("HERMES_URL", "http://127.0.0.1:8080"), "gateway base URL (env HERMES_URL)")
	wait := fset.Duration("timeout", 0, "how long the gateway waits for the response (default: the gateway's)")
	traceID := fset.String("trace-id", "", "X-Trace-ID to send")
	natsURL := natsFlags(fset, "", "submit on the bus directly, through this NATS server, instead of a gateway")
	var key keyFlag
	key.register(fset)
	if err := fset.Parse(args); err != nil {
		return err
	}
	if *file == "" {
		fset.Usage()
		return errors.New("route: -f is required")
	}
	body, err := readRequestFile(*file)
	if err != nil {
		return err
	}
	if natsURL.url != "" {
		return routeOnBus(ctx, env, natsURL, body, *wait, *traceID)
	}
	target := strings.TrimRight(*url, "/") + "/v1/route"
	if *wait > 0 {
		target += "?timeout=" + wait.String()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if err := key.authorize(req); err != nil {
		return fmt.Errorf("route: %w", err)
	}
	if *traceID != "" {
		req.Header.Set("X-Trace-ID", *traceID)
	}
	client := &http.Client{Timeout: max(*wait, 30*time.Second) + 10*time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("route: %w (is Hermes running? start it with: go run ./cmd/hermes up)", err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("route: read response: %w", err)
	}
	fmt.Fprintf(env.Stderr, "HTTP %d  X-Trace-ID: %s\n", resp.StatusCode, resp.Header.Get("X-Trace-ID"))
	writePretty(env, out)
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests:
		return fmt.Errorf("route: gateway answered %s: %s", resp.Status, key.refused(resp.StatusCode))
	}
	return fmt.Errorf("route: gateway answered %s", resp.Status)
}

// routeOnBus submits body on the bus through a Submitter of this process's own and prints the
// response, as the gateway would.
func routeOnBus(ctx context.Context, env Env, natsURL *natsTarget, body []byte, wait time.Duration, traceID string) error {
	req, err := protocol.DecodeRequestJSON(body, protocol.Limits{})
	if err != nil {
		return fmt.Errorf("route: %w", err)
	}
	if wait <= 0 {
		wait = 30 * time.Second
	}
	log, _ := newLogger(env.Stderr, "warn")
	opts, err := natsURL.auth.cliOptions()
	if err != nil {
		return err
	}
	nc, b, err := Connect(ctx, natsURL.url, "hermes-route", bus.Config{OpenOnly: true}, log, opts...)
	if err != nil {
		return fmt.Errorf("route: %w", err)
	}
	defer nc.Close()
	s, err := submit.New(submit.Config{Conn: nc, Bus: b, Sender: protocol.Sender{Role: protocol.RoleCLI, Instance: defaultInstance("cli")}, Logger: log})
	if err != nil {
		return err
	}
	stop, err := s.Listen()
	if err != nil {
		return fmt.Errorf("route: %w", err)
	}
	defer func() { _ = stop() }()
	if traceID == "" {
		traceID = randomTraceID()
	}
	out, err := s.Submit(ctx, submit.Submission{Request: req, Trace: protocol.TraceContext{TraceID: traceID}, Wait: wait, Size: len(body)})
	if err != nil {
		return fmt.Errorf("route: %w", err)
	}
	fmt.Fprintf(env.Stderr, "X-Trace-ID: %s\n", out.TraceID)
	if out.Pending {
		return fmt.Errorf("route: no response within %s; the request keeps running (hermes replay --session %s shows it)", wait, req.Session())
	}
	data, err := json.Marshal(out.Response)
	if err != nil {
		return err
	}
	writePretty(env, data)
	return nil
}

// randomTraceID is a fresh W3C-sized trace id.
func randomTraceID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// readRequestFile reads path, "-" for stdin, or an example's built-in copy when path names one
// under examples/ that is not on disk.
func readRequestFile(path string) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(io.LimitReader(os.Stdin, 64<<20))
	}
	b, err := os.ReadFile(path)
	if err == nil {
		return b, nil
	}
	if name, ok := strings.CutPrefix(path, "examples/"); ok && errors.Is(err, fs.ErrNotExist) {
		if eb, eerr := examples.Files.ReadFile(name); eerr == nil {
			return eb, nil
		}
	}
	return nil, fmt.Errorf("route: %w", err)
}
