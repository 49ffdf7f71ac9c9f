package app

import (
	"bytes"
	"context"
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
)

// RunRoute posts a HermesRequest to a gateway and prints the response: hermes route.
func RunRoute(ctx context.Context, args []string, env Env) error {
	fset := newFlagSet("route", "hermes route -f request.json [flags]", env.Stderr)
	file := fset.String("f", "", "request file (JSON HermesRequest); - reads standard input")
	url := fset.String("url", envOr("HERMES_URL", "http://127.0.0.1:8080"), "gateway base URL (env HERMES_URL)")
	wait := fset.Duration("timeout", 0, "how long the gateway waits for the response (default: the gateway's)")
	traceID := fset.String("trace-id", "", "X-Trace-ID to send")
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
	target := strings.TrimRight(*url, "/") + "/v1/route"
	if *wait > 0 {
		target += "?timeout=" + wait.String()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
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
	var pretty bytes.Buffer
	if json.Indent(&pretty, out, "", "  ") == nil {
		out = append(pretty.Bytes(), '\n')
	}
	fmt.Fprintf(env.Stderr, "HTTP %d  X-Trace-ID: %s\n", resp.StatusCode, resp.Header.Get("X-Trace-ID"))
	_, _ = env.Stdout.Write(out)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("route: gateway answered %s", resp.Status)
	}
	return nil
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
