// Package mcptest finds the third-party MCP servers the tests run against: the ones test/mcp's
// npm ci installs (pinned by its lockfile).
package mcptest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// Everything returns the path of @modelcontextprotocol/server-everything's entry point (run it
// with node). Without it (or without node) the test is skipped, and under CI=true it fails: CI
// installs it.
func Everything(tb testing.TB) string {
	tb.Helper()
	_, here, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(here), "..", "..", "test", "mcp", "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js")
	_, err := os.Stat(path)
	if err == nil {
		_, err = exec.LookPath("node")
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("no MCP test servers: npm ci --prefix test/mcp, and node (%v)", err)
		}
		tb.Skip("no MCP test servers (npm ci --prefix test/mcp) or no node")
	}
	return path
}
