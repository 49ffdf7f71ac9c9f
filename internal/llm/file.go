package llm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// File is a config file in seed 001's shape (../seed-examples/agent-meeting.yaml): an llm block
// naming the backend, and the seed's other keys, which later features read.
//
//	llm:
//	  provider: openai_compatible     # or openai, ollama, vllm, tgi: all spoken to the same way
//	  base_url: http://127.0.0.1:11434/v1
//	  model: qwen2.5-14b
//	  api_key_env: LLM_API_KEY        # or api_key: the key itself (api_key_env is the better place)
//	  timeout: 60s
//	  max_retries: 2
//	  fallback: {base_url: …, model: …}
//	  selector: {base_url: …, model: …}   # a faster model for choosing tools (seed 001 §5.1)
//	  embeddings: {model: nomic-embed-text} # the semantic prefilter's model (base_url and key: the backend's unless given)
type File struct {
	LLM fileLLM `yaml:"llm"`
	// The seed's other keys: accepted, and not used by the loop itself.
	RouterStrategy string    `yaml:"router_strategy"`
	ContextPolicy  string    `yaml:"context_policy"`
	Tools          yaml.Node `yaml:"tools"`
	Conversation   yaml.Node `yaml:"conversation"`
}

type fileLLM struct {
	Provider string `yaml:"provider"`
	Backend  `yaml:",inline"`
	Fallback *Backend `yaml:"fallback"`
	Selector *Backend `yaml:"selector"`
	// Embeddings is the model the semantic prefilter asks for vectors (/v1/embeddings).
	Embeddings *Backend `yaml:"embeddings"`
}

// Providers are the provider names a file may give: each speaks the OpenAI-compatible API.
var Providers = []string{"openai_compatible", "openai", "ollama", "vllm", "tgi"}

// MaxFileBytes bounds a config file.
const MaxFileBytes = 1 << 20

// ParseFile reads a config file: unknown keys are refused, naming their line.
func ParseFile(data []byte) (*File, error) {
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("the file is %d bytes; at most %d are read", len(data), MaxFileBytes)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f File
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the file is empty: it needs an llm block (base_url, model)")
		}
		return nil, err
	}
	if f.LLM.Provider != "" && !slices.Contains(Providers, f.LLM.Provider) {
		return nil, fmt.Errorf("llm.provider %q: Hermes speaks the OpenAI-compatible API: %s", f.LLM.Provider, strings.Join(Providers, ", "))
	}
	return &f, nil
}

// LoadFile reads the config file at path.
func LoadFile(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f, err := ParseFile(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Config is the file's backends as a Config.
func (f *File) Config() Config {
	return Config{Backend: f.LLM.Backend, Fallback: f.LLM.Fallback, Selector: f.LLM.Selector, Embeddings: f.LLM.Embeddings}
}
