// Package scriptedllm is an OpenAI-compatible chat completions server that answers from a script
// instead of a model: what tests and `hermes up --llm scripted` talk to where no model can run.
// It speaks the real wire format — POST /v1/chat/completions with and without `stream: true`
// (server-sent chunks, tool calls streamed as id and name first, then argument fragments, usage
// in a last chunk when asked), GET /v1/models, OpenAI-style errors — and can be told to fail,
// stall, answer broken JSON, call tools nobody offered or pass arguments that are not JSON.
//
// A script is a list of conversations. A request belongs to the first whose Match is part of
// its first user message; its step is the number of assistant messages in its history (each
// answer of the server is one), and the step's first turn whose condition holds answers it.
package scriptedllm

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"gopkg.in/yaml.v3"
)

// Script is what the server answers.
type Script struct {
	// Models are the model names served; a request for another is 404 model_not_found.
	// Empty: any model.
	Models []string `yaml:"models" json:"models"`
	// Conversations are tried in order.
	Conversations []Conversation `yaml:"conversations" json:"conversations"`
	// Otherwise answers a request no conversation matches; nil: 400 naming the problem.
	Otherwise *Turn `yaml:"otherwise" json:"otherwise"`
	// Embeddings says how /v1/embeddings answers; nil: 404, as a backend without embeddings.
	Embeddings *Embeddings `yaml:"embeddings" json:"embeddings,omitempty"`
	// Intents answer requests for an intent as structured output (response_format
	// json_schema named IntentSchema): the first whose Contains is part of the last user
	// message; none: {"domain": "other", "confidence": 1}.
	Intents []Intent `yaml:"intents" json:"intents,omitempty"`
}

// IntentSchema names the structured output Hermes asks an intent in (chat.IntentSchemaName).
const IntentSchema = "hermes_intent"

// Intent is a scripted intent: a message holding Contains is of Domain, with Confidence.
type Intent struct {
	Contains   string  `yaml:"contains" json:"contains"`
	Domain     string  `yaml:"domain" json:"domain"`
	Confidence float64 `yaml:"confidence" json:"confidence"`
}

// intentOf is the intent of message, as JSON.
func (s *Script) intentOf(message string) string {
	in := Intent{Domain: "other", Confidence: 1}
	for _, i := range s.Intents {
		if strings.Contains(message, i.Contains) {
			in = i
			break
		}
	}
	b, _ := json.Marshal(map[string]any{"domain": in.Domain, "confidence": in.Confidence})
	return string(b)
}

// seen is what a turn's conditions read of the request: its last tool and user messages and
// its system messages.
type seen struct {
	lastTool, lastUser, system string
}

// holds reports whether t's conditions hold for what the request holds.
func (t *Turn) holds(s seen) bool {
	return (t.IfLastToolContains == "" || strings.Contains(s.lastTool, t.IfLastToolContains)) &&
		(t.IfSystemContains == "" || strings.Contains(s.system, t.IfSystemContains)) &&
		(t.IfSystemLacks == "" || !strings.Contains(s.system, t.IfSystemLacks)) &&
		(t.IfLastUserContains == "" || strings.Contains(s.lastUser, t.IfLastUserContains))
}

// Embeddings makes deterministic vectors in place of a model's: a dimension for each group
// of Concepts (words that mean alike: a text holding any of them counts there), the text's
// other words hashed into the rest; unit length.
type Embeddings struct {
	// Dimensions is the vectors' length; 0 means 64.
	Dimensions int `yaml:"dimensions" json:"dimensions,omitempty"`
	// Concepts are groups of words that mean alike.
	Concepts [][]string `yaml:"concepts" json:"concepts,omitempty"`
	// Status, when set, fails requests with this HTTP status (the first Times when Times > 0).
	Status int `yaml:"status" json:"status,omitempty"`
	Times  int `yaml:"times" json:"times,omitempty"`
	// BatchDelayMS, when set, delays each request of more than one text (an index being
	// built) this long: what runs meanwhile sees the vectors still coming.
	BatchDelayMS int `yaml:"batch_delay_ms" json:"batch_delay_ms,omitempty"`
}

// Conversation is one scripted exchange.
type Conversation struct {
	Name string `yaml:"name" json:"name"`
	// Match is a part of the conversation's first user message; "" matches any.
	Match string `yaml:"match" json:"match"`
	// Turns answer the steps, in order; a turn's Step, when set, places it (several turns may
	// answer one step: the first whose condition holds does).
	Turns []Turn `yaml:"turns" json:"turns"`
	// Then, when set, answers every step no turn answers: the person's follow-ups.
	Then *Turn `yaml:"then" json:"then,omitempty"`
}

// Turn is one answer, or one fault.
type Turn struct {
	// Step is the number of assistant messages before this answer; unset, the previous turn's
	// step + 1. Turns given the same step are alternatives, tried in order.
	Step *int `yaml:"step" json:"step,omitempty"`
	// AnyStep makes the turn answer at whatever step its conditions hold (a follow-up, whose
	// step depends on how much history the client sends); it places no turn after it.
	AnyStep bool `yaml:"any_step" json:"any_step,omitempty"`
	// IfLastToolContains makes the turn answer only when the last tool message holds this text
	// (an error the model is to recover from, say).
	IfLastToolContains string `yaml:"if_last_tool_contains" json:"if_last_tool_contains,omitempty"`
	// IfSystemContains makes the turn answer only when the prompt's system messages hold this
	// text (what Hermes remembered about the person, say); IfSystemLacks only when they do
	// not.
	IfSystemContains string `yaml:"if_system_contains" json:"if_system_contains,omitempty"`
	IfSystemLacks    string `yaml:"if_system_lacks" json:"if_system_lacks,omitempty"`
	// IfLastUserContains makes the turn answer only when the last user message holds this
	// text: a follow-up the client sends with the answers' text alone.
	IfLastUserContains string `yaml:"if_last_user_contains" json:"if_last_user_contains,omitempty"`

	// Content is the assistant's text.
	Content string `yaml:"content" json:"content,omitempty"`
	// ToolCalls are the tools the assistant calls.
	ToolCalls []ToolCall `yaml:"tool_calls" json:"tool_calls,omitempty"`

	// Status, when set, answers this HTTP status with an OpenAI-style error (429, 500, 503…),
	// the first Times requests only when Times > 0.
	Status  int    `yaml:"status" json:"status,omitempty"`
	Message string `yaml:"message" json:"message,omitempty"`
	Times   int    `yaml:"times" json:"times,omitempty"`
	// RetryAfterMS, with Status, says when to try again in a Retry-After-Ms header (as
	// OpenAI's API does); 0 sends none, and a client waits out its own backoff.
	RetryAfterMS int `yaml:"retry_after_ms" json:"retry_after_ms,omitempty"`
	// DelayMS stalls this long before answering (between a stream's chunks too, spread).
	DelayMS int `yaml:"delay_ms" json:"delay_ms,omitempty"`
	// Raw is sent as the whole body instead (broken JSON, say), with status 200.
	Raw string `yaml:"raw" json:"raw,omitempty"`
	// Summarize answers as a summarizer would, deterministically: the last user message's
	// "Summary so far:" line and each line of a person's or an assistant's message (lines
	// "user: …", "assistant: …"), cut to 40 characters, joined; the latest 400 characters.
	Summarize bool `yaml:"summarize" json:"summarize,omitempty"`
}

// ToolCall is one call the assistant makes.
type ToolCall struct {
	// ID is the call's id; "" makes call_<step>_<index>.
	ID string `yaml:"id" json:"id,omitempty"`
	// NoID sends the call without an id, as Ollama does.
	NoID bool   `yaml:"no_id" json:"no_id,omitempty"`
	Name string `yaml:"name" json:"name"`
	// Arguments are the call's arguments, a JSON object written as YAML or JSON.
	Arguments any `yaml:"arguments" json:"arguments,omitempty"`
	// ArgumentsRaw, when set, is sent as the arguments text as it is (not JSON, say).
	ArgumentsRaw string `yaml:"arguments_raw" json:"arguments_raw,omitempty"`
}

// argumentsText is the arguments as the wire carries them: a JSON text in a string.
func (c ToolCall) argumentsText() (string, error) {
	if c.ArgumentsRaw != "" {
		return c.ArgumentsRaw, nil
	}
	if c.Arguments == nil {
		return "{}", nil
	}
	b, err := json.Marshal(normalize(c.Arguments))
	if err != nil {
		return "", fmt.Errorf("tool call %s: arguments: %w", c.Name, err)
	}
	return string(b), nil
}

// normalize turns YAML's map[string]any (and nested) into values encoding/json writes.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = normalize(e)
		}
		return out
	case map[any]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[fmt.Sprint(k)] = normalize(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalize(e)
		}
		return out
	}
	return v
}

// Load reads a script from a YAML (or JSON) file.
func Load(path string) (*Script, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Parse reads a script and checks it: every turn answers or fails, every tool call has a name
// and arguments that encode.
func Parse(data []byte) (*Script, error) {
	var s Script
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("script: %w", err)
	}
	return &s, s.Check()
}

// Check says what is wrong with s, naming the conversation and turn.
func (s *Script) Check() error {
	check := func(where string, t *Turn) error {
		if t.Status == 0 && t.Raw == "" && t.Content == "" && len(t.ToolCalls) == 0 && t.DelayMS == 0 && !t.Summarize {
			return fmt.Errorf("%s: says nothing: give content, tool_calls, status, raw, delay_ms or summarize", where)
		}
		if t.Status != 0 && (t.Status < 400 || t.Status > 599) {
			return fmt.Errorf("%s: status %d is not an error status (400 to 599)", where, t.Status)
		}
		if t.RetryAfterMS < 0 || t.RetryAfterMS > 0 && t.Status == 0 {
			return fmt.Errorf("%s: retry_after_ms %d: a wait of 0 or more, with a status only", where, t.RetryAfterMS)
		}
		for i, c := range t.ToolCalls {
			if c.Name == "" {
				return fmt.Errorf("%s: tool_calls[%d]: a name is required", where, i)
			}
			if _, err := c.argumentsText(); err != nil {
				return fmt.Errorf("%s: tool_calls[%d]: %w", where, i, err)
			}
		}
		return nil
	}
	for i, c := range s.Conversations {
		if len(c.Turns) == 0 {
			return fmt.Errorf("conversations[%d] (%s): no turns", i, c.Name)
		}
		for j := range c.Turns {
			if err := check(fmt.Sprintf("conversations[%d] (%s) turns[%d]", i, c.Name, j), &c.Turns[j]); err != nil {
				return err
			}
		}
		if c.Then != nil {
			if err := check(fmt.Sprintf("conversations[%d] (%s) then", i, c.Name), c.Then); err != nil {
				return err
			}
		}
	}
	if e := s.Embeddings; e != nil {
		if e.Dimensions < 0 || e.Dimensions > 4096 || e.Dimensions != 0 && e.Dimensions <= len(e.Concepts) {
			return fmt.Errorf("embeddings.dimensions %d: must be 0 (64) or more than the %d concepts, at most 4096", e.Dimensions, len(e.Concepts))
		}
		if e.Dimensions == 0 && len(e.Concepts) >= 64 {
			return fmt.Errorf("embeddings: %d concepts need more dimensions than 64", len(e.Concepts))
		}
		if e.Status != 0 && (e.Status < 400 || e.Status > 599) {
			return fmt.Errorf("embeddings.status %d is not an error status (400 to 599)", e.Status)
		}
	}
	for i, in := range s.Intents {
		if in.Contains == "" || in.Domain == "" || in.Confidence < 0 || in.Confidence > 1 {
			return fmt.Errorf("intents[%d]: contains and domain are required, and a confidence from 0 to 1", i)
		}
	}
	if s.Otherwise != nil {
		return check("otherwise", s.Otherwise)
	}
	return nil
}

// errNoTurn is a request the script has no answer for.
var errNoTurn = errors.New("no turn")

// pick finds the conversation and turn that answer a request with the given first user
// message, number of assistant messages and last tool message; a follow-up (a summarized
// conversation) only a conversation's then, or otherwise.
func (s *Script) pick(firstUser string, step int, seen seen, followUp bool) (conv int, turn int, t *Turn, err error) {
	for ci := range s.Conversations {
		c := &s.Conversations[ci]
		if c.Match != "" && !strings.Contains(firstUser, c.Match) {
			continue
		}
		if followUp {
			if c.Then != nil {
				return ci, len(c.Turns), c.Then, nil
			}
			break
		}
		at := -1
		for ti := range c.Turns {
			tt := &c.Turns[ti]
			if tt.AnyStep {
				if tt.holds(seen) {
					return ci, ti, tt, nil
				}
				continue
			}
			if tt.Step != nil {
				at = *tt.Step
			} else {
				at++
			}
			if at != step {
				continue
			}
			if !tt.holds(seen) {
				continue
			}
			return ci, ti, tt, nil
		}
		if c.Then != nil {
			return ci, len(c.Turns), c.Then, nil
		}
		return ci, -1, nil, fmt.Errorf("conversation %q has no turn for step %d (the history holds %d assistant messages)", c.Name, step, step)
	}
	if s.Otherwise != nil {
		return -1, -1, s.Otherwise, nil
	}
	return -1, -1, nil, errNoTurn
}
