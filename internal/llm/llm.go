// Package llm reaches the models the agent loop asks: any OpenAI-compatible backend (Ollama,
// vLLM, TGI, a hosted one) by base URL, key and model, through the official client
// (openai-go). Each try has a timeout; a try that fails as another may not (408, 409, 429, 5xx,
// a connection error) is retried with backoff by the client itself, Retry-After honoured; a
// backend that gives up so is followed by the fallback backend, when there is one. A request
// the backend refuses (any other 4xx) is not tried again anywhere: it would be refused again.
//
// A key is read from the environment variable its backend names, once, and goes nowhere but
// the Authorization header of that backend's requests: not into errors, logs or the record.
// A backend (or a proxy before it) that echoes a key — its own or another backend's of the
// client — in what it answers passes none on: every key is redacted (egress.Redact: as sent,
// escaped, encoded) from each answer's bytes before they are read, so neither the answer's
// text, its tool calls, nor the message given back to the model and kept on the record holds
// one.
package llm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/tracing"
	"github.com/hermesbus/hermes/pkg/worker/egress"
)

// Backend is one OpenAI-compatible endpoint and the model asked there.
type Backend struct {
	// Name names it in logs, metrics and the record; default: its host.
	Name string `yaml:"name" json:"name,omitempty"`
	// BaseURL is the API's base, e.g. http://127.0.0.1:11434/v1 (Ollama) or .../v1 (vLLM).
	BaseURL string `yaml:"base_url" json:"base_url"`
	// Model is the model asked.
	Model string `yaml:"model" json:"model"`
	// KeyEnv names the environment variable holding the key; "" sends none.
	KeyEnv string `yaml:"api_key_env" json:"api_key_env,omitempty"`
	// APIKey is the key itself, as a config file in the seed's shape may write it (KeyEnv is
	// the better place); never written out again.
	APIKey string `yaml:"api_key" json:"-"`
	// Timeout bounds each try; 0 means DefaultTimeout.
	Timeout time.Duration `yaml:"timeout" json:"timeout,omitempty"`
	// MaxRetries is how many times a try that may succeed later is repeated; nil means
	// DefaultMaxRetries.
	MaxRetries *int `yaml:"max_retries" json:"max_retries,omitempty"`
}

// Defaults for a Backend.
const (
	DefaultTimeout      = 60 * time.Second
	DefaultMaxRetries   = 2
	DefaultEmbedTimeout = 10 * time.Second
)

// Purpose says what a completion is for: choosing tools and filling their arguments may go to
// a faster model than answering (seed 001 §5.1).
type Purpose int

const (
	// Answer is any turn, the final answer included.
	Answer Purpose = iota
	// Choose is a turn that chooses tools and fills arguments.
	Choose
)

// Config is where the loop's completions go.
type Config struct {
	// Backend answers. Required.
	Backend Backend
	// Fallback, when set, is asked when Backend gives up.
	Fallback *Backend
	// Selector, when set, is asked for Choose completions (a faster model).
	Selector *Backend
	// Embeddings, when set, is the model asked for vectors (/v1/embeddings): the semantic
	// prefilter's. Its base URL and key, when not given, are Backend's; its timeout defaults
	// to DefaultEmbedTimeout and its retries to none (a prefilter that waits long is no
	// prefilter: it ranks lexically instead).
	Embeddings *Backend
	// LookupEnv reads keys; nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// HTTPClient makes the requests; nil means a client of its own.
	HTTPClient *http.Client
	// Observe, when set, hears of every completion asked of a backend (each backend's own,
	// the fallback's too) and every embeddings request: for metrics.
	Observe func(c Call, usage openai.CompletionUsage, err error)
}

// Client completes chats on the configured backends. It is safe for concurrent use.
type Client struct {
	main, fallback, selector, embeddings *backend
	observe                              func(Call, openai.CompletionUsage, error)
}

type backend struct {
	cfg    Backend
	client openai.Client
	key    string    // its own, sent in the Authorization header of its requests
	keys   *[]string // the client's keys, every backend's: redacted from whatever it says back
}

// secrets are the keys redacted from what b says back.
func (b *backend) secrets() []string { return *b.keys }

// redactAnswer is the middleware of b's requests that redacts the client's keys from the
// answer's body, whatever its status, before the client reads it. An answer over
// maxAnswerBytes is refused: it is read whole to be redacted.
func (b *backend) redactAnswer(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	resp, err := next(r)
	if err != nil || resp == nil || resp.Body == nil || len(b.secrets()) == 0 {
		return resp, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	resp.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	if len(body) > maxAnswerBytes {
		return nil, fmt.Errorf("the answer is over %d MiB", maxAnswerBytes>>20)
	}
	body = egress.Redact(body, b.secrets())
	resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return resp, nil
}

// maxAnswerBytes bounds what a backend's answer may hold.
const maxAnswerBytes = 64 << 20

// Call says how a completion went: who answered, in how long, after how many tries, and
// whether the fallback did.
type Call struct {
	Backend, Model string
	Tries          int
	Latency        time.Duration
	FellBack       bool
}

// New checks cfg and returns its client: base URLs absolute http(s), models named, each key's
// variable set (named when it is not; its value never).
func New(cfg Config) (*Client, error) {
	lookup := cfg.LookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 32,
			DialContext: (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext, IdleConnTimeout: 90 * time.Second}}
	}
	var (
		c    Client
		keys []string
	)
	build := func(field string, b *Backend) (*backend, error) {
		if b == nil {
			return nil, nil
		}
		u, err := url.Parse(b.BaseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			return nil, fmt.Errorf("%s.base_url %q: must be an http(s) URL such as http://127.0.0.1:11434/v1, without credentials", field, b.BaseURL)
		}
		if strings.TrimSpace(b.Model) == "" {
			return nil, fmt.Errorf("%s.model: name the model to ask", field)
		}
		if b.Timeout < 0 || (b.MaxRetries != nil && (*b.MaxRetries < 0 || *b.MaxRetries > 10)) {
			return nil, fmt.Errorf("%s: timeout must not be negative and max_retries must be 0 to 10", field)
		}
		c := *b
		if c.Name == "" {
			c.Name = u.Host
		}
		if c.Timeout == 0 {
			c.Timeout = DefaultTimeout
		}
		retries := DefaultMaxRetries
		if c.MaxRetries != nil {
			retries = *c.MaxRetries
		}
		// Each try's timeout is its HTTP client's: a try that runs out is then retried like any
		// other that got no answer (the SDK's own request timeout would end the call instead).
		tc := *hc
		tc.Timeout = c.Timeout
		opts := []option.RequestOption{option.WithBaseURL(strings.TrimSuffix(b.BaseURL, "/") + "/"), option.WithHTTPClient(&tc),
			option.WithMaxRetries(retries)}
		key := b.APIKey
		if b.KeyEnv != "" && b.APIKey != "" {
			return nil, fmt.Errorf("%s: give api_key_env or api_key, not both", field)
		}
		if b.KeyEnv != "" {
			var ok bool
			key, ok = lookup(b.KeyEnv)
			if !ok || key == "" {
				return nil, fmt.Errorf("%s.api_key_env: the variable %s is not set", field, b.KeyEnv)
			}
		}
		if key != "" && !slices.Contains(keys, key) {
			keys = append(keys, key)
		}
		built := &backend{cfg: c, key: key, keys: &keys}
		built.client = openai.NewClient(append(opts, option.WithAPIKey(key), option.WithMiddleware(built.redactAnswer))...)
		return built, nil
	}
	var err error
	if c.main, err = build("llm", &cfg.Backend); err != nil {
		return nil, err
	}
	if c.fallback, err = build("llm.fallback", cfg.Fallback); err != nil {
		return nil, err
	}
	if c.selector, err = build("llm.selector", cfg.Selector); err != nil {
		return nil, err
	}
	if e := cfg.Embeddings; e != nil {
		ec := *e
		if ec.BaseURL == "" {
			ec.BaseURL = cfg.Backend.BaseURL
			if ec.KeyEnv == "" && ec.APIKey == "" {
				ec.KeyEnv, ec.APIKey = cfg.Backend.KeyEnv, cfg.Backend.APIKey
			}
		}
		if ec.Timeout == 0 {
			ec.Timeout = DefaultEmbedTimeout
		}
		if ec.MaxRetries == nil {
			ec.MaxRetries = new(0) // the prefilter ranks lexically rather than wait
		}
		if c.embeddings, err = build("llm.embeddings", &ec); err != nil {
			return nil, err
		}
	}
	c.observe = cfg.Observe
	return &c, nil
}

// HasEmbeddings reports whether an embedding model is configured.
func (c *Client) HasEmbeddings() bool { return c.embeddings != nil }

// EmbeddingModel names the embedding model ("" when none): vectors of another are not
// compared.
func (c *Client) EmbeddingModel() string {
	if c.embeddings == nil {
		return ""
	}
	return c.embeddings.cfg.Name + "/" + c.embeddings.cfg.Model
}

// Embed asks the embedding model for texts' vectors, one each, in order (prefilter.Embedder).
// Retried as completions are; no fallback (the prefilter falls back to ranking lexically).
func (c *Client) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	b := c.embeddings
	if b == nil {
		return nil, errors.New("llm: no embedding model is configured")
	}
	ctx, span := tracing.Tracer().Start(ctx, "llm embeddings "+b.cfg.Model, oteltrace.WithSpanKind(oteltrace.SpanKindClient),
		oteltrace.WithAttributes(attribute.String("gen_ai.operation.name", "embeddings"), attribute.String("gen_ai.request.model", b.cfg.Model),
			attribute.String("hermes.llm.backend", b.cfg.Name), attribute.Int("hermes.llm.inputs", len(texts))))
	defer span.End()
	var tries atomic.Int32
	count := option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		tries.Add(1)
		return next(r)
	})
	start := time.Now()
	resp, err := b.client.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: b.cfg.Model,
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: texts}, EncodingFormat: openai.EmbeddingNewParamsEncodingFormatFloat}, count)
	if c.observe != nil {
		var usage openai.CompletionUsage
		if resp != nil {
			usage.PromptTokens = resp.Usage.PromptTokens
		}
		var oerr error
		if err != nil {
			oerr = &Error{Backend: b.cfg.Name, Model: b.cfg.Model, err: err, keys: b.secrets()}
		}
		c.observe(Call{Backend: b.cfg.Name, Model: b.cfg.Model, Tries: int(tries.Load()), Latency: time.Since(start)}, usage, oerr)
	}
	if err != nil {
		err = &Error{Backend: b.cfg.Name, Model: b.cfg.Model, err: err, keys: b.secrets()}
		span.SetStatus(codes.Error, err.Error())
		return nil, err
	}
	out := make([][]float32, len(texts))
	for _, d := range resp.Data {
		if d.Index < 0 || int(d.Index) >= len(out) || out[d.Index] != nil {
			err = &Error{Backend: b.cfg.Name, Model: b.cfg.Model, err: fmt.Errorf("the answer's vector index %d is not one of the %d texts, or repeated", d.Index, len(texts))}
			span.SetStatus(codes.Error, err.Error())
			return nil, err
		}
		v := make([]float32, len(d.Embedding))
		for i, x := range d.Embedding {
			v[i] = float32(x)
		}
		out[d.Index] = v
	}
	for i, v := range out {
		if v == nil {
			err = &Error{Backend: b.cfg.Name, Model: b.cfg.Model, err: fmt.Errorf("the answer holds no vector for text %d", i)}
			span.SetStatus(codes.Error, err.Error())
			return nil, err
		}
	}
	return out, nil
}

// HasSelector reports whether Choose completions go to a model of their own.
func (c *Client) HasSelector() bool { return c.selector != nil }

// Complete asks for one completion of p (its Model set to the backend's) for purpose: on the
// selector for Choose when there is one, else the backend; on the fallback when that gives up.
func (c *Client) Complete(ctx context.Context, p openai.ChatCompletionNewParams, purpose Purpose) (*openai.ChatCompletion, Call, error) {
	first := c.main
	if purpose == Choose && c.selector != nil {
		first = c.selector
	}
	resp, call, err := c.complete(ctx, first, p)
	if err == nil || c.fallback == nil || ctx.Err() != nil || !GaveUp(err) {
		return resp, call, err
	}
	resp, fb, ferr := c.complete(ctx, c.fallback, p)
	fb.FellBack, fb.Tries, fb.Latency = true, fb.Tries+call.Tries, fb.Latency+call.Latency
	if ferr != nil {
		return nil, fb, fmt.Errorf("%w; the fallback %s: %w", err, c.fallback.cfg.Name, ferr)
	}
	return resp, fb, nil
}

// complete asks b, in a span of its own, and tells Observe.
func (c *Client) complete(ctx context.Context, b *backend, p openai.ChatCompletionNewParams) (*openai.ChatCompletion, Call, error) {
	ctx, span := tracing.Tracer().Start(ctx, "llm chat "+b.cfg.Model, oteltrace.WithSpanKind(oteltrace.SpanKindClient),
		oteltrace.WithAttributes(attribute.String("gen_ai.operation.name", "chat"), attribute.String("gen_ai.request.model", b.cfg.Model),
			attribute.String("hermes.llm.backend", b.cfg.Name)))
	defer span.End()
	resp, call, err := b.complete(ctx, p)
	var usage openai.CompletionUsage
	if resp != nil {
		usage = resp.Usage
	}
	span.SetAttributes(attribute.Int("hermes.llm.tries", call.Tries), attribute.Int64("gen_ai.usage.input_tokens", usage.PromptTokens),
		attribute.Int64("gen_ai.usage.output_tokens", usage.CompletionTokens))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	if c.observe != nil {
		c.observe(call, usage, err)
	}
	return resp, call, err
}

func (b *backend) complete(ctx context.Context, p openai.ChatCompletionNewParams) (*openai.ChatCompletion, Call, error) {
	p.Model = b.cfg.Model
	var tries atomic.Int32
	count := option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		tries.Add(1)
		return next(r)
	})
	start := time.Now()
	resp, err := b.client.Chat.Completions.New(ctx, p, count)
	call := Call{Backend: b.cfg.Name, Model: b.cfg.Model, Tries: int(tries.Load()), Latency: time.Since(start)}
	if err != nil {
		return nil, call, &Error{Backend: b.cfg.Name, Model: b.cfg.Model, err: err, keys: b.secrets()}
	}
	if len(resp.Choices) == 0 {
		return nil, call, &Error{Backend: b.cfg.Name, Model: b.cfg.Model, err: errors.New("the answer holds no choices")}
	}
	return resp, call, nil
}

// Error is a completion that failed: which backend, and why (its status, when it answered one).
type Error struct {
	Backend, Model string
	err            error
	keys           []string
}

// Error says which backend failed and why, the client's keys redacted wherever it echoed one
// (before the text is cut, so that no part of it survives a cut).
func (e *Error) Error() string {
	redact := func(s string) string { return cut(string(egress.Redact([]byte(s), e.keys))) }
	var api *openai.Error
	if errors.As(e.err, &api) {
		msg := api.Message
		if msg == "" {
			msg = http.StatusText(api.StatusCode)
		}
		return fmt.Sprintf("the model %s at %s answered HTTP %d: %s", e.Model, e.Backend, api.StatusCode, redact(msg))
	}
	return fmt.Sprintf("the model %s at %s: %s", e.Model, e.Backend, redact(e.err.Error()))
}

func (e *Error) Unwrap() error { return e.err }

// Status is the HTTP status the backend answered, 0 when it answered none.
func (e *Error) Status() int {
	var api *openai.Error
	if errors.As(e.err, &api) {
		return api.StatusCode
	}
	return 0
}

// GaveUp reports whether err is a backend giving up on a request another backend may answer:
// no answer, a timeout, 408, 409, 429 or 5xx — not a request it refused.
func GaveUp(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	switch s := e.Status(); {
	case s == 0:
		return true
	case s == http.StatusRequestTimeout || s == http.StatusConflict || s == http.StatusTooManyRequests || s >= 500:
		return true
	}
	return false
}

func cut(s string) string { return protocol.Shorten(s, 300) }
