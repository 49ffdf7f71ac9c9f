package app

import (
	"context"
	"flag"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/hermesbus/hermes/internal/metrics"
)

func llmFlagsOf(t *testing.T, args ...string) *llmFlags {
	t.Helper()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var l llmFlags
	l.register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &l
}

// hermes up --llm scripted: the agent loop behind /v1/chat/completions asks the built-in
// scripted model, the meeting assistant; its completions are counted in /metrics.
func TestUpWithTheScriptedModel(t *testing.T) {
	dir := t.TempDir()
	cfg := SystemConfig{DataDir: dir, HTTPAddr: "127.0.0.1:0", DemoAddr: "127.0.0.1:0", ToolWorkers: 1, Instance: "llm-up",
		LLM: *llmFlagsOf(t, "--llm", "scripted")}
	cfg.Routes, _, _, _ = loadRoutes(defaultRoutes)
	ctx, cancel := context.WithCancel(context.Background())
	sys, err := StartSystem(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = sys.Run(ctx); close(done) }()
	hc := &http.Client{}
	t.Cleanup(func() { hc.CloseIdleConnections(); cancel(); <-done })
	if !strings.Contains(sys.LLM, "scripted") {
		t.Errorf("banner: %q", sys.LLM)
	}
	client := openai.NewClient(option.WithBaseURL(sys.GatewayURL+"/v1/"), option.WithAPIKey(sys.Key.Key), option.WithHTTPClient(hc), option.WithMaxRetries(0))
	var answer string
	deadline := time.Now().Add(30 * time.Second)
	for {
		// The meeting tools register their contracts through the gateway once it is up.
		resp, err := client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "scripted",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("请帮我安排一个项目讨论会，时间定在明天上午，联系张伟和李娜")}})
		if err == nil {
			answer = resp.Choices[0].Message.Content
			if strings.Contains(answer, "9点到10点") {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer: %v %q", err, answer)
		}
		time.Sleep(200 * time.Millisecond)
	}
	req, _ := http.NewRequest("GET", sys.GatewayURL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+sys.Key.Key)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`hermes_llm_requests_total{backend="scripted",model="scripted",outcome="ok"}`,
		`hermes_llm_tokens_total{backend="scripted",kind="prompt",model="scripted"}`, `hermes_llm_request_duration_seconds_count{backend="scripted",model="scripted"}`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// Flags that cannot make a model are refused, naming what is wrong; none asks for no loop.
func TestLLMFlagsRefuseWhatCannotWork(t *testing.T) {
	m := metrics.New(nil)
	log := orDiscard(nil)
	if cfg, _, stop, err := llmFlagsOf(t).chat(t.Context(), m, log); cfg != nil || err != nil {
		t.Fatalf("no flags: %v %v", cfg, err)
	} else {
		stop()
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--llm", "gpt"}, `--llm "gpt"`},
		{[]string{"--llm", "scripted", "--llm-base-url", "http://127.0.0.1:1/v1"}, "no --llm-config or --llm-base-url"},
		{[]string{"--llm-base-url", "http://127.0.0.1:1/v1"}, "llm.model"},
		{[]string{"--llm-base-url", "ftp://x", "--llm-model", "m"}, "llm.base_url"},
		{[]string{"--llm-base-url", "http://127.0.0.1:1/v1", "--llm-model", "m", "--llm-api-key-env", "HERMES_TEST_UNSET_KEY"}, "HERMES_TEST_UNSET_KEY is not set"},
		{[]string{"--llm-config", "/nonexistent/llm.yaml"}, "--llm-config"},
	} {
		_, _, stop, err := llmFlagsOf(t, tc.args...).chat(t.Context(), m, log)
		stop()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	cfg, desc, stop, err := llmFlagsOf(t, "--llm-base-url", "http://127.0.0.1:1/v1", "--llm-model", "big", "--llm-selector-model", "small",
		"--llm-fallback-base-url", "http://127.0.0.1:2/v1").chat(t.Context(), m, log)
	stop()
	if err != nil || cfg.Model != "big" || !cfg.LLM.HasSelector() || !strings.Contains(desc, "small chooses tools") || !strings.Contains(desc, "fallback big at http://127.0.0.1:2/v1") {
		t.Fatalf("%v %q", err, desc)
	}
}
