package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/hermesbus/hermes/internal/agent"
	"github.com/hermesbus/hermes/internal/chat"
	"github.com/hermesbus/hermes/internal/llm"
	"github.com/hermesbus/hermes/internal/memory"
	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/internal/scriptedllm"
)

// llmFlags configure the agent loop behind POST /v1/chat/completions (the gateway's, and hermes
// up's): a config file in seed 001's shape, flags over it, or --llm scripted for the built-in
// scripted model (the seed's meeting assistant, no model needed).
type llmFlags struct {
	mode, file                                 string
	baseURL, model, keyEnv                     string
	selectorURL, selectorModel, selectorKeyEnv string
	fallbackURL, fallbackModel, fallbackKeyEnv string
	embeddingsModel                            string
	timeout, runTimeout                        time.Duration
	maxTurns, prefilterTopK, summarizeEvery    int
	prefilterThreshold, minSimilarity          float64
	// memoryFile is --memory-config; memoryDefault the configuration taken without it (hermes
	// up's example), nil for none: no memory in the loop.
	memoryFile    string
	memoryDefault []byte
}

func (l *llmFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.mode, "llm", os.Getenv("HERMES_LLM"), `the agent loop's model: "scripted" for the built-in scripted one (the seed's meeting assistant; no model needed), "none" for no /v1/chat/completions, or empty to take --llm-config / --llm-base-url (hermes up with its demo tools and neither: scripted) (env HERMES_LLM)`)
	fs.StringVar(&l.file, "llm-config", os.Getenv("HERMES_LLM_CONFIG"), "config file in seed 001's shape (an llm block: provider, base_url, model, api_key_env, fallback, selector); the flags below override it (env HERMES_LLM_CONFIG)")
	fs.StringVar(&l.baseURL, "llm-base-url", os.Getenv("HERMES_LLM_BASE_URL"), "OpenAI-compatible API of the model, e.g. http://127.0.0.1:11434/v1 (Ollama) (env HERMES_LLM_BASE_URL)")
	fs.StringVar(&l.model, "llm-model", os.Getenv("HERMES_LLM_MODEL"), "the model asked (env HERMES_LLM_MODEL)")
	fs.StringVar(&l.keyEnv, "llm-api-key-env", os.Getenv("HERMES_LLM_API_KEY_ENV"), "environment variable holding the backend's key (its value is never logged or recorded) (env HERMES_LLM_API_KEY_ENV)")
	fs.StringVar(&l.selectorURL, "llm-selector-base-url", os.Getenv("HERMES_LLM_SELECTOR_BASE_URL"), "API of a faster model that chooses tools and fills arguments (default: --llm-base-url) (env HERMES_LLM_SELECTOR_BASE_URL)")
	fs.StringVar(&l.selectorKeyEnv, "llm-selector-api-key-env", os.Getenv("HERMES_LLM_SELECTOR_API_KEY_ENV"), "environment variable holding the selector's key (default: the backend's, when the selector is at the backend's URL) (env HERMES_LLM_SELECTOR_API_KEY_ENV)")
	fs.StringVar(&l.selectorModel, "llm-selector-model", os.Getenv("HERMES_LLM_SELECTOR_MODEL"), "the faster model choosing tools; the main model answers (env HERMES_LLM_SELECTOR_MODEL)")
	fs.StringVar(&l.fallbackURL, "llm-fallback-base-url", os.Getenv("HERMES_LLM_FALLBACK_BASE_URL"), "API asked when the backend gives up (429, 5xx, no answer) (env HERMES_LLM_FALLBACK_BASE_URL)")
	fs.StringVar(&l.fallbackModel, "llm-fallback-model", os.Getenv("HERMES_LLM_FALLBACK_MODEL"), "the fallback's model (default: --llm-model) (env HERMES_LLM_FALLBACK_MODEL)")
	fs.StringVar(&l.fallbackKeyEnv, "llm-fallback-api-key-env", os.Getenv("HERMES_LLM_FALLBACK_API_KEY_ENV"), "environment variable holding the fallback's key (env HERMES_LLM_FALLBACK_API_KEY_ENV)")
	fs.DurationVar(&l.timeout, "llm-timeout", 0, "bound on each try of a completion (default 60s; retried with backoff on 429 and 5xx)")
	fs.DurationVar(&l.runTimeout, "llm-run-timeout", 5*time.Minute, "bound on a whole chat run: the model's turns and the tools'")
	fs.IntVar(&l.prefilterTopK, "llm-prefilter-top-k", envInt("HERMES_LLM_PREFILTER_TOP_K", 5), "offer the model only the registered tools the message is about: the k best by the lexical prefilter, every tool while there are no more than k (0: every tool, always) (env HERMES_LLM_PREFILTER_TOP_K)")
	fs.Float64Var(&l.prefilterThreshold, "llm-prefilter-threshold", 0, "the prefilter's least score (BM25) for a tool to be offered")
	fs.StringVar(&l.embeddingsModel, "llm-embeddings-model", os.Getenv("HERMES_LLM_EMBEDDINGS_MODEL"), "an embedding model at the backend's API (/v1/embeddings): the prefilter ranks by meaning too (the built-in scripted model serves \"scripted-embed\") (env HERMES_LLM_EMBEDDINGS_MODEL)")
	fs.Float64Var(&l.minSimilarity, "llm-prefilter-min-similarity", 0.5, "the semantic prefilter's least cosine similarity for a tool to be offered")
	fs.IntVar(&l.summarizeEvery, "llm-summarize-every", envInt("HERMES_LLM_SUMMARIZE_EVERY", 10), "run the summarizer: every n messages of a session the model compresses the conversation, and /v1/chat's next prompt is the summary and the messages since (0: no summarizer in this process) (env HERMES_LLM_SUMMARIZE_EVERY)")
	fs.IntVar(&l.maxTurns, "llm-max-turns", 8, "the model's turns in one chat run at most (a request's max_turns may lower it)")
	fs.StringVar(&l.memoryFile, "memory-config", os.Getenv("HERMES_MEMORY_CONFIG"), `memory and intents for the agent loop: a file with a memory: section (filters: include_tags, exclude_patterns) and an intent: section (confidence_threshold, decay by domain); the model may then remember fragments (memory_write) and each prompt carries those that match ("none": no memory in the loop; hermes up's default: examples/memory.yaml) (env HERMES_MEMORY_CONFIG)`)
}

// enabled reports whether the flags ask for the agent loop.
func (l *llmFlags) enabled() bool {
	return l.mode != "none" && (l.mode != "" || l.file != "" || l.baseURL != "")
}

// chat builds the front door's configuration; with --llm scripted it starts the scripted model
// on a loopback port until ctx ends or stop is called. desc says what it is, for banners.
func (l *llmFlags) chat(ctx context.Context, m *metrics.Metrics, log *slog.Logger) (cfg *ChatConfig, desc string, stop func(), err error) {
	stop = func() {}
	if !l.enabled() {
		return nil, "", stop, nil
	}
	cfg, desc, err = l.build(ctx, m, log, &stop)
	if err != nil {
		stop()
	}
	return cfg, desc, stop, err
}

func (l *llmFlags) build(ctx context.Context, m *metrics.Metrics, log *slog.Logger, stop *func()) (cfg *ChatConfig, desc string, err error) {
	var c llm.Config
	switch l.mode {
	case "":
	case "scripted":
		if l.file != "" || l.baseURL != "" {
			return nil, "", errors.New("--llm scripted runs the built-in model: give no --llm-config or --llm-base-url with it")
		}
		base, halt, err := startScripted(ctx, log)
		if err != nil {
			return nil, "", err
		}
		*stop = halt
		c.Backend = llm.Backend{Name: "scripted", BaseURL: base, Model: "scripted"}
	default:
		return nil, "", fmt.Errorf("--llm %q: \"scripted\", \"none\", or empty with --llm-config or --llm-base-url", l.mode)
	}
	if l.file != "" {
		f, err := llm.LoadFile(l.file)
		if err != nil {
			return nil, "", fmt.Errorf("--llm-config: %w", err)
		}
		c = f.Config()
		if c.Backend.APIKey != "" {
			log.Warn("the LLM config file holds the backend's key itself (api_key); it is used and never logged, but api_key_env keeps it out of files", "file", l.file)
		}
	}
	over := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	over(&c.Backend.BaseURL, l.baseURL)
	over(&c.Backend.Model, l.model)
	over(&c.Backend.KeyEnv, l.keyEnv)
	if l.timeout > 0 {
		c.Backend.Timeout = l.timeout
	}
	if l.selectorModel != "" || l.selectorURL != "" {
		s := llm.Backend{Name: "selector", BaseURL: c.Backend.BaseURL, Model: c.Backend.Model, Timeout: c.Backend.Timeout}
		if c.Selector != nil {
			s = *c.Selector
		}
		over(&s.BaseURL, l.selectorURL)
		over(&s.Model, l.selectorModel)
		over(&s.KeyEnv, l.selectorKeyEnv)
		if s.KeyEnv == "" && s.APIKey == "" && s.BaseURL == c.Backend.BaseURL {
			// The backend's own API: its key. A key never goes to another origin unasked.
			s.KeyEnv, s.APIKey = c.Backend.KeyEnv, c.Backend.APIKey
		}
		c.Selector = &s
	}
	if l.embeddingsModel != "" {
		e := llm.Backend{Name: "embeddings"}
		if c.Embeddings != nil {
			e = *c.Embeddings
		}
		e.Model = l.embeddingsModel
		c.Embeddings = &e
	}
	if l.fallbackURL != "" || l.fallbackModel != "" {
		f := llm.Backend{Name: "fallback", Model: c.Backend.Model, Timeout: c.Backend.Timeout}
		if c.Fallback != nil {
			f = *c.Fallback
		}
		over(&f.BaseURL, l.fallbackURL)
		over(&f.Model, l.fallbackModel)
		over(&f.KeyEnv, l.fallbackKeyEnv)
		c.Fallback = &f
	}
	c.Observe = func(call llm.Call, u openai.CompletionUsage, err error) {
		outcome := "ok"
		var le *llm.Error
		switch {
		case errors.As(err, &le) && le.Status() != 0:
			outcome = strconv.Itoa(le.Status())
		case err != nil:
			outcome = "error"
		}
		m.Completed(call.Backend, call.Model, outcome, call.Latency, u.PromptTokens, u.CompletionTokens)
	}
	client, err := llm.New(c)
	if err != nil {
		return nil, "", fmt.Errorf("the agent loop's model: %w", err)
	}
	desc = fmt.Sprintf("%s at %s", c.Backend.Model, c.Backend.BaseURL)
	if l.mode == "scripted" {
		desc = "the built-in scripted model (the seed's meeting assistant) at " + c.Backend.BaseURL
	}
	if c.Selector != nil {
		desc += fmt.Sprintf("; %s chooses tools", c.Selector.Model)
	}
	if c.Fallback != nil {
		desc += fmt.Sprintf("; fallback %s at %s", c.Fallback.Model, c.Fallback.BaseURL)
	}
	if err := badEnvInts("HERMES_LLM_PREFILTER_TOP_K", "HERMES_LLM_SUMMARIZE_EVERY"); err != nil {
		return nil, "", err
	}
	if l.prefilterTopK < 0 || l.prefilterTopK > agent.MaxCallsPerTurn || l.prefilterThreshold < 0 || l.minSimilarity < 0 || l.minSimilarity > 1 {
		return nil, "", fmt.Errorf("--llm-prefilter-top-k must be 0 to %d, --llm-prefilter-threshold not negative and --llm-prefilter-min-similarity 0 to 1", agent.MaxCallsPerTurn)
	}
	if l.summarizeEvery < 0 || l.summarizeEvery > 10000 {
		return nil, "", fmt.Errorf("--llm-summarize-every %d: give 0 (no summarizer) to 10000 messages", l.summarizeEvery)
	}
	if l.summarizeEvery > 0 {
		desc += fmt.Sprintf("; summaries every %d messages", l.summarizeEvery)
	}
	pf := chat.PrefilterConfig{TopK: l.prefilterTopK, Threshold: l.prefilterThreshold, MinSimilarity: l.minSimilarity}
	if l.prefilterTopK > 0 {
		desc += fmt.Sprintf("; prefilter: the %d best tools", l.prefilterTopK)
		if client.HasEmbeddings() {
			pf.Embedder = client
			desc += fmt.Sprintf(", by words and by meaning (%s)", c.Embeddings.Model)
		}
	} else if client.HasEmbeddings() {
		log.Warn("an embedding model is configured but the prefilter is off (--llm-prefilter-top-k 0): it is not asked")
	}
	mem, err := l.memory()
	if err != nil {
		return nil, "", err
	}
	if mem != nil {
		desc += "; memory"
		if len(mem.Intent.Decay) > 0 {
			desc += fmt.Sprintf(" and intents (%d domains)", len(mem.Intent.Decay))
		}
	}
	return &ChatConfig{Config: chat.Config{LLM: client, Model: c.Backend.Model, MaxTurns: l.maxTurns, RunTimeout: l.runTimeout, Prefilter: pf},
		SummarizeEvery: l.summarizeEvery, Memory: mem}, desc, nil
}

// memory is the loop's memory configuration: --memory-config's, else the default; nil for
// none.
func (l *llmFlags) memory() (*memory.Config, error) {
	data := l.memoryDefault
	switch l.memoryFile {
	case "none":
		return nil, nil
	case "":
	default:
		b, err := os.ReadFile(l.memoryFile)
		if err != nil {
			return nil, fmt.Errorf("--memory-config: %w", err)
		}
		data = b
	}
	if data == nil {
		return nil, nil
	}
	c, err := memory.LoadConfig(data)
	if err != nil {
		return nil, fmt.Errorf("--memory-config %s: %w", l.memoryFile, err)
	}
	return c, nil
}

// startScripted serves the scripted model (the seed's meeting assistant) on a loopback port
// until ctx ends or stop is called (which returns once it has stopped), and returns its API's
// base URL.
func startScripted(ctx context.Context, log *slog.Logger) (base string, stop func(), err error) {
	srv, err := scriptedllm.New(scriptedllm.Meeting(), "")
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("the scripted model: %w", err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := scriptedllm.Serve(ctx, ln, srv, log.With("service", "scripted-llm")); err != nil && ctx.Err() == nil {
			log.Error("the scripted model stopped", "err", err)
		}
	}()
	return "http://" + ln.Addr().String() + "/v1", func() { cancel(); <-done }, nil
}
