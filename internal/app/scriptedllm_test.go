package app

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// syncBuffer is a bytes.Buffer safe to write from the command and read from the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// hermes scripted-llm serves the meeting assistant, or a script file, to any OpenAI client, with
// the key --api-key-env names; it stops on its context; bad flags name the problem.
func TestScriptedLLMCommand(t *testing.T) {
	t.Setenv("HERMES_TEST_SCRIPTED_KEY", "sk-local")
	script := filepath.Join(t.TempDir(), "s.yaml")
	if err := os.WriteFile(script, []byte("models: [tiny]\notherwise: {content: hello from the script}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- RunScriptedLLM(ctx, []string{"--listen", "127.0.0.1:0", "--script", script, "--api-key-env", "HERMES_TEST_SCRIPTED_KEY", "--log-level", "error"},
			Env{Stdout: &out, Stderr: &out})
	}()
	addr := regexp.MustCompile(`http://[0-9.:]+/v1`)
	deadline := time.Now().Add(10 * time.Second)
	for addr.FindString(out.String()) == "" {
		if time.Now().After(deadline) {
			t.Fatalf("no address: %s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	client := openai.NewClient(option.WithBaseURL(addr.FindString(out.String())), option.WithAPIKey("sk-local"), option.WithMaxRetries(0))
	resp, err := client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "tiny",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	if err != nil || resp.Choices[0].Message.Content != "hello from the script" {
		t.Fatalf("%v %+v", err, resp)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for args, want := range map[string]string{
		"--script /nonexistent.yaml":       "--script",
		"--api-key-env HERMES_UNSET_KEY_X": "HERMES_UNSET_KEY_X",
	} {
		err := RunScriptedLLM(context.Background(), append(strings.Fields(args), "--listen", "127.0.0.1:0"), Env{Stdout: &out, Stderr: &out})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", args, err)
		}
	}
}
