package llm

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// The seed's own file loads unchanged: its backend, its key written in it.
func TestTheSeedsFileLoads(t *testing.T) {
	// ../shared/seed-examples beside the repository, else its byte-for-byte copy in testdata.
	_, here, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(here), "..", "..", "..", "shared", "seed-examples", "agent-meeting.yaml")
	if _, err := os.Stat(path); err != nil {
		path = filepath.Join("testdata", "agent-meeting.yaml")
	}
	f, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b := f.LLM.Backend
	if b.BaseURL != "http://localhost:8000/v1" || b.Model != "qwen2.5-14b" || b.APIKey == "" || f.RouterStrategy != "coarse_then_fine" {
		t.Fatalf("%+v", f.LLM)
	}
	c, err := New(f.Config())
	if err != nil || c.main.key != b.APIKey {
		t.Fatal(err)
	}
}

func TestFileErrorsNameTheKey(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"", "empty"},
		{"llm:\n  base_url: http://x/v1\n  modle: m\n", "field modle not found"},
		{"llm:\n  provider: anthropic\n", `llm.provider "anthropic"`},
		{"llm: [1]\n", "cannot unmarshal"},
	} {
		_, err := ParseFile([]byte(tc.file))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.file, err, tc.want)
		}
	}
	f, err := ParseFile([]byte("llm:\n  base_url: http://127.0.0.1:1/v1\n  model: m\n  timeout: 5s\n  max_retries: 0\n  api_key_env: K\n  selector: {base_url: http://127.0.0.1:2/v1, model: fast}\n  fallback: {base_url: http://127.0.0.1:3/v1, model: other}\n"))
	if err != nil || f.LLM.Timeout != 5*time.Second || *f.LLM.MaxRetries != 0 || f.LLM.Selector.Model != "fast" || f.LLM.Fallback.Model != "other" {
		t.Fatalf("%v %+v", err, f)
	}
	if _, err := New(Config{Backend: Backend{BaseURL: "http://x/v1", Model: "m", KeyEnv: "K", APIKey: "k"}}); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Errorf("both keys: %v", err)
	}
}
