// Package scriptedllmtest starts scripted OpenAI-compatible backends for tests.
package scriptedllmtest

import (
	"net/http/httptest"
	"testing"

	"github.com/hermesbus/hermes/internal/scriptedllm"
)

// Start serves s (with key, when not empty) on a loopback port until tb ends, and returns the
// server and its API base URL (http://127.0.0.1:PORT/v1).
func Start(tb testing.TB, s *scriptedllm.Script, key string) (*scriptedllm.Server, string) {
	tb.Helper()
	srv, err := scriptedllm.New(s, key)
	if err != nil {
		tb.Fatal(err)
	}
	h := httptest.NewServer(srv)
	tb.Cleanup(h.Close)
	return srv, h.URL + "/v1"
}
