package llm_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/hermesbus/hermes/internal/llm"
	"github.com/hermesbus/hermes/internal/scriptedllm"
	"github.com/hermesbus/hermes/internal/scriptedllm/scriptedllmtest"
)

const key = "sk-scripted-9b1d"

func scripted(t *testing.T, s *scriptedllm.Script) (*scriptedllm.Server, string) {
	return scriptedllmtest.Start(t, s, key)
}

func env(name string) (string, bool) {
	if name == "HERMES_TEST_LLM_KEY" {
		return key, true
	}
	return "", false
}

func ask(text string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(text)}}
}

func retries(n int) *int { return &n }

// The backend answers with its model; a 503 is retried with backoff; a backend that gives up
// is followed by the fallback; a refusal is not tried elsewhere.
func TestCompletions(t *testing.T) {
	script := &scriptedllm.Script{Conversations: []scriptedllm.Conversation{
		{Name: "hello", Match: "hello", Turns: []scriptedllm.Turn{{Content: "hi"}}},
		{Name: "flaky", Match: "flaky", Turns: []scriptedllm.Turn{{Status: 503, Times: 1}, {Step: new(int), Content: "recovered"}}},
		// It says when to try again (Retry-After-Ms, as OpenAI's API does): its six tries
		// follow one another without the client's backoff.
		{Name: "down", Match: "down", Turns: []scriptedllm.Turn{{Status: 500, Message: "boom", RetryAfterMS: 10}}},
	}}
	_, base := scripted(t, script)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String() + "/v1"
	ln.Close()
	c, err := llm.New(llm.Config{LookupEnv: env,
		Backend:  llm.Backend{Name: "main", BaseURL: base, Model: "qwen2.5-14b", KeyEnv: "HERMES_TEST_LLM_KEY", MaxRetries: retries(2)},
		Fallback: &llm.Backend{Name: "spare", BaseURL: base, Model: "spare-model", KeyEnv: "HERMES_TEST_LLM_KEY"}})
	if err != nil {
		t.Fatal(err)
	}
	resp, call, err := c.Complete(t.Context(), ask("hello"), llm.Answer)
	if err != nil || resp.Choices[0].Message.Content != "hi" || resp.Model != "qwen2.5-14b" || call.Tries != 1 || call.FellBack {
		t.Fatalf("%v %+v %+v", err, resp, call)
	}
	resp, call, err = c.Complete(t.Context(), ask("flaky"), llm.Answer)
	if err != nil || resp.Choices[0].Message.Content != "recovered" || call.Tries != 2 || call.FellBack {
		t.Fatalf("flaky: %v %+v", err, call)
	}
	// The main backend fails every try (500 ×3): the fallback answers — here the same server,
	// whose conversation fails too, so the error names both.
	_, call, err = c.Complete(t.Context(), ask("down"), llm.Answer)
	if err == nil || !call.FellBack || call.Tries != 6 || !strings.Contains(err.Error(), "HTTP 500: boom") || !strings.Contains(err.Error(), "spare") {
		t.Fatalf("down: %v %+v", err, call)
	}
	// A refusal (no scripted answer: 400) is not tried again, nor elsewhere.
	_, call, err = c.Complete(t.Context(), ask("nothing scripted"), llm.Answer)
	if err == nil || call.FellBack || call.Tries != 1 || llm.GaveUp(err) {
		t.Fatalf("refused: %v %+v", err, call)
	}
	// A main backend nobody listens at: the fallback answers.
	c2, err := llm.New(llm.Config{LookupEnv: env,
		Backend:  llm.Backend{BaseURL: dead, Model: "m", MaxRetries: retries(0)},
		Fallback: &llm.Backend{Name: "spare", BaseURL: base, Model: "spare-model", KeyEnv: "HERMES_TEST_LLM_KEY"}})
	if err != nil {
		t.Fatal(err)
	}
	resp, call, err = c2.Complete(t.Context(), ask("hello"), llm.Answer)
	if err != nil || !call.FellBack || call.Backend != "spare" || resp.Choices[0].Message.Content != "hi" {
		t.Fatalf("dead main: %v %+v", err, call)
	}
}

// Each try has its timeout; the request's own deadline ends everything.
func TestTimeouts(t *testing.T) {
	_, base := scripted(t, &scriptedllm.Script{Conversations: []scriptedllm.Conversation{
		{Name: "slow", Turns: []scriptedllm.Turn{{DelayMS: 3000, Content: "late"}}}}})
	c, err := llm.New(llm.Config{LookupEnv: env,
		Backend: llm.Backend{BaseURL: base, Model: "m", KeyEnv: "HERMES_TEST_LLM_KEY", Timeout: 200 * time.Millisecond, MaxRetries: retries(1)}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, call, err := c.Complete(t.Context(), ask("slow"), llm.Answer)
	if err == nil || call.Tries != 2 || time.Since(start) > 2500*time.Millisecond || !llm.GaveUp(err) {
		t.Fatalf("%v %+v after %v", err, call, time.Since(start))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, _, err := c.Complete(ctx, ask("slow"), llm.Answer); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}
}

// The selector answers choosing turns; the key reaches the backend and nothing else; a bad
// configuration is refused naming the field, and a missing key naming its variable only.
func TestSelectorKeysAndConfig(t *testing.T) {
	srv, base := scripted(t, &scriptedllm.Script{Conversations: []scriptedllm.Conversation{
		{Name: "any", Turns: []scriptedllm.Turn{{Status: 400, Message: "your key " + key + " is not welcome"}}}}})
	c, err := llm.New(llm.Config{LookupEnv: env,
		Backend:  llm.Backend{BaseURL: base, Model: "strong", KeyEnv: "HERMES_TEST_LLM_KEY"},
		Selector: &llm.Backend{BaseURL: base, Model: "fast", KeyEnv: "HERMES_TEST_LLM_KEY"}})
	if err != nil {
		t.Fatal(err)
	}
	_, call, err := c.Complete(t.Context(), ask("x"), llm.Choose)
	if call.Model != "fast" || err == nil || strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "[redacted]") {
		t.Fatalf("%+v %v", call, err)
	}
	if reqs := srv.Requests(); len(reqs) != 1 || reqs[0].Model != "fast" {
		t.Fatalf("%+v", reqs)
	}
	for _, bad := range []llm.Config{
		{Backend: llm.Backend{BaseURL: "ftp://x/v1", Model: "m"}},
		{Backend: llm.Backend{BaseURL: "http://user:pw@x/v1", Model: "m"}},
		{Backend: llm.Backend{BaseURL: base}},
		{Backend: llm.Backend{BaseURL: base, Model: "m", KeyEnv: "HERMES_TEST_UNSET_KEY"}},
		{Backend: llm.Backend{BaseURL: base, Model: "m"}, Fallback: &llm.Backend{BaseURL: "nope", Model: "m"}},
	} {
		_, err := llm.New(llm.Config{LookupEnv: env, Backend: bad.Backend, Fallback: bad.Fallback})
		if err == nil {
			t.Errorf("%+v: accepted", bad)
		}
	}
}

// A backend that echoes the key where the error text is cut: the key is redacted before the
// cut, so that no part of it survives.
func TestNoPartOfTheKeySurvivesTheCut(t *testing.T) {
	const secret = "sk-live-0123456789abcdefghijklmnopqrstuvwxyz"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(401)
		msg := strings.Repeat("x", 280) + " bad key " + strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		_, _ = w.Write([]byte(`{"error":{"message":"` + msg + `","type":"invalid_request_error"}}`))
	}))
	defer srv.Close()
	c, err := llm.New(llm.Config{LookupEnv: func(string) (string, bool) { return secret, true },
		Backend: llm.Backend{BaseURL: srv.URL + "/v1", Model: "m", KeyEnv: "K", MaxRetries: new(int)}})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = c.Complete(t.Context(), ask("hi"), llm.Answer)
	if err == nil {
		t.Fatal("no error")
	}
	t.Logf("error: %s", err)
	if strings.Contains(err.Error(), secret[:8]) {
		t.Errorf("a prefix of the key reaches Error(): %q", err.Error()[len(err.Error())-40:])
	}
}

// Embeddings go to the embedding model at the backend's API with its key unless told
// otherwise: one vector per text, in order; a 503 is not retried unless asked; a backend
// without embeddings is an error naming it.
func TestEmbeddings(t *testing.T) {
	srv, base := scripted(t, &scriptedllm.Script{Otherwise: &scriptedllm.Turn{Content: "hi"},
		Embeddings: &scriptedllm.Embeddings{Concepts: [][]string{{"天气", "下雨"}}, Status: 503, Times: 2}})
	c, err := llm.New(llm.Config{LookupEnv: env, Backend: llm.Backend{BaseURL: base, Model: "m", KeyEnv: "HERMES_TEST_LLM_KEY"},
		Embeddings: &llm.Backend{Model: "embed"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Embed(t.Context(), []string{"x"}); err == nil || !strings.Contains(err.Error(), "HTTP 503") {
		t.Fatalf("retried: %v", err)
	}
	c, _ = llm.New(llm.Config{LookupEnv: env, Backend: llm.Backend{BaseURL: base, Model: "m", KeyEnv: "HERMES_TEST_LLM_KEY"},
		Embeddings: &llm.Backend{Model: "embed", MaxRetries: retries(1)}})
	if !c.HasEmbeddings() || !strings.HasSuffix(c.EmbeddingModel(), "/embed") {
		t.Fatal(c.EmbeddingModel())
	}
	vs, err := c.Embed(t.Context(), []string{"今天天气", "会下雨吗", "hello"})
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != 3 || len(vs[0]) != 64 || vs[0][0] == 0 || vs[1][0] == 0 || vs[2][0] != 0 || func() bool { n, _ := srv.Embedded(); return n != 3 }() {
		t.Errorf("%d vectors: %v", len(vs), vs)
	}
	_, none := scripted(t, &scriptedllm.Script{Otherwise: &scriptedllm.Turn{Content: "hi"}})
	c, _ = llm.New(llm.Config{LookupEnv: env, Backend: llm.Backend{Name: "plain", BaseURL: none, Model: "m", KeyEnv: "HERMES_TEST_LLM_KEY"},
		Embeddings: &llm.Backend{Name: "plain", Model: "embed", MaxRetries: retries(0)}})
	if _, err := c.Embed(t.Context(), []string{"x"}); err == nil || !strings.Contains(err.Error(), "embed at plain answered HTTP 404") {
		t.Errorf("%v", err)
	}
	c, _ = llm.New(llm.Config{Backend: llm.Backend{BaseURL: none, Model: "m"}})
	if _, err := c.Embed(t.Context(), []string{"x"}); err == nil || c.HasEmbeddings() {
		t.Error("embedded without a model")
	}
}
